/*
 * ctxpar_count.h - checked element and byte counts.
 *
 * Every size product of the library (validation, the algorithms' buffers, the backends'
 * workspaces) goes through these, so that a shape near the int64 limits is an error and never a
 * wrapped, too small size. The front door rejects problems whose counts do not fit
 * (INVALID_ARG); past it a count cannot overflow, and if one did the result would be SIZE_MAX,
 * which no allocation satisfies: OUT_OF_MEMORY rather than a short buffer.
 * Host code only (gcc and clang builtins).
 */
#ifndef CTXPAR_COUNT_H
#define CTXPAR_COUNT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* *out = a * b * c * d; 0 (and *out = SIZE_MAX) when a factor is negative or the product does
 * not fit in a size_t, 1 otherwise. Pass 1 for unused factors. */
static inline int ctxpar_count_checked(size_t *out, int64_t a, int64_t b, int64_t c, int64_t d) {
    size_t ab, abc;
    if (a < 0 || b < 0 || c < 0 || d < 0 || __builtin_mul_overflow(a, b, &ab) ||
        __builtin_mul_overflow(ab, (size_t)c, &abc) ||
        __builtin_mul_overflow(abc, (size_t)d, out)) {
        *out = SIZE_MAX;
        return 0;
    }
    return 1;
}

/* a * b * c * d, or SIZE_MAX when it does not fit (see above). */
static inline size_t ctxpar_count(int64_t a, int64_t b, int64_t c, int64_t d) {
    size_t n;
    ctxpar_count_checked(&n, a, b, c, d);
    return n;
}

/* a * b for sizes already counted (bytes = count x element size), saturating at SIZE_MAX. */
static inline size_t ctxpar_count_mul(size_t a, size_t b) {
    size_t n;
    return __builtin_mul_overflow(a, b, &n) ? SIZE_MAX : n;
}

#ifdef __cplusplus
}
#endif

#endif /* CTXPAR_COUNT_H */
