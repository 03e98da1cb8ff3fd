// JSON output for the tool: strings and numbers.
#include <math.h>

#include "commands.h"

void cpt_json_string(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c < 0x20)
            fprintf(f, "\\u%04x", c);
        else
            fputc(c, f);
    }
    fputc('"', f);
}

void cpt_json_num(FILE *f, double x) {
    if (isfinite(x))
        fprintf(f, "%.12g", x);
    else
        fputs("null", f); // JSON has no NaN or infinity
}
