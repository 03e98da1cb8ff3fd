// Numbers for people (see units.h).
#include "units.h"

#include <math.h>
#include <stdio.h>

const char *cpt_bytes_text(double bytes, char *buf, size_t n) {
    static const char *const unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    // Up a unit at 1024 of this one; 3 significant digits ("1023 KiB" would read as "1020").
    while (u < 4 && fabs(bytes) >= 1024.0) {
        bytes /= 1024.0;
        u++;
    }
    snprintf(buf, n, "%.*g %s", fabs(bytes) >= 1000.0 ? 4 : 3, bytes, unit[u]);
    return buf;
}

const char *cpt_seconds_text(double seconds, char *buf, size_t n) {
    const double a = fabs(seconds);
    if (!isfinite(seconds))
        snprintf(buf, n, "-");
    else if (a >= 1000.0) // whole seconds, never "1.23e+03 s"
        snprintf(buf, n, "%.0f s", seconds);
    else if (a >= 1.0 || a == 0.0)
        snprintf(buf, n, "%.3g s", seconds);
    else if (a >= 1e-3)
        snprintf(buf, n, "%.3g ms", seconds * 1e3);
    else
        snprintf(buf, n, "%.3g us", seconds * 1e6);
    return buf;
}
