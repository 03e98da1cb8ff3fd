// A text file of integers as an array (see text_ints.h).
#define _POSIX_C_SOURCE 200809L // getline: a list of thousands of documents may be one line
#include "tools/ctxpar/text_ints.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctxpar_backend.h"

typedef struct ints {
    int64_t *v;
    size_t n, cap;
} ints;

static int push(ints *a, int64_t x) {
    if (a->n == a->cap) {
        size_t cap = a->cap ? 2 * a->cap : 256;
        int64_t *more = realloc(a->v, cap * sizeof *more);
        if (!more)
            return 0;
        a->v = more, a->cap = cap;
    }
    a->v[a->n++] = x;
    return 1;
}

// Appends the numbers of one line to a; *count_out how many.
static ctxpar_status parse_line(const char *path, long line_no, char *line, ints *a,
                                long *count_out) {
    long count = 0;
    for (char *p = line;;) {
        while (*p && strchr(" \t\r\n,", *p))
            p++;
        if (!*p)
            break;
        char *end;
        errno = 0;
        long long x = strtoll(p, &end, 10);
        if (end == p || errno || (*end && !strchr(" \t\r\n,", *end))) {
            const size_t word = strcspn(p, " \t\r\n,");
            return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "%s:%ld: '%.*s' is not an integer", path,
                                line_no, (int)(word < 40 ? word : 40), p);
        }
        if (!push(a, (int64_t)x))
            return CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "%s: no memory for its numbers", path);
        count++;
        p = end;
    }
    *count_out = count;
    return CTXPAR_OK;
}

ctxpar_status cpt_text_ints_read(const char *path, cpt_npy_array *out) {
    FILE *f = fopen(path, "r");
    if (!f)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "%s: cannot open it (%s)", path,
                            strerror(errno));
    ints a = {NULL, 0, 0};
    char *line = NULL;
    size_t room = 0;
    long line_no = 0, rows = 0, width = 0, widest = 0;
    int ragged = 0;
    ctxpar_status st = CTXPAR_OK;
    while (st == CTXPAR_OK && getline(&line, &room, f) >= 0) {
        line_no++;
        long n = 0;
        st = parse_line(path, line_no, line, &a, &n);
        if (n > 0) {
            ragged |= rows > 0 && n != width;
            width = rows ? width : n;
            rows++;
            widest = n > widest ? n : widest;
        }
    }
    free(line);
    fclose(f);
    if (st == CTXPAR_OK && a.n == 0)
        st = CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "%s: holds no numbers", path);
    // Lines alike of several numbers each are rows; anything else is one list.
    const int table = rows > 1 && widest > 1 && !ragged;
    if (st != CTXPAR_OK) {
        free(a.v);
        return st;
    }
    memset(out, 0, sizeof *out);
    out->dtype = CPT_NPY_I64;
    out->ndim = table ? 2 : 1;
    out->shape[0] = table ? rows : (int64_t)a.n;
    out->shape[1] = table ? width : 0;
    out->count = a.n;
    out->data = a.v;
    return CTXPAR_OK;
}
