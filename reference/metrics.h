/*
 * metrics.h - how far a result is from the float64 oracle, and whether two results are bitwise
 * equal.
 *
 * The error of a tensor is reported relative to the tensor's scale: max |got - ref| / max |ref|
 * (docs/numerics.md). Non-finite values are handled so that a broken result can never
 * look good: a NaN anywhere in got (or ref) is an infinite error; +-inf matches only the same
 * infinity (a fully masked row has lse = -inf in both), otherwise the error is infinite.
 */
#ifndef CPT_TESTING_METRICS_H
#define CPT_TESTING_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "ctxpar.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cpt_error_stats {
    double max_abs;    /* max |got - ref| over all elements (INFINITY on a non-finite mismatch) */
    double max_ref;    /* max |ref| over the finite reference values */
    double rel;        /* max_abs / max_ref; max_abs itself when max_ref == 0 */
    int64_t worst;     /* flat index of the element giving max_abs; -1 when n == 0 */
    int64_t nonfinite; /* elements whose error is infinite (NaN, or an unmatched infinity) */
    size_t count;      /* elements compared */
} cpt_error_stats;

/* Compares n floats against n doubles. */
cpt_error_stats cpt_compare_f32(const float *got, const double *ref, size_t n);

/* Compares a host tensor (any dtype, any strides) against ref, densely packed [B, S, H, D] doubles
 * of the tensor's shape. */
cpt_error_stats cpt_compare_tensor(const ctxpar_tensor *got, const double *ref);

/* The per-row measure beside the per-tensor one: max over rows of max_row |got - ref| /
 * max_row |ref| (rows of row_len consecutive elements; a row whose ref is all 0 counts its
 * absolute error). A tensor whose rows differ in scale (a causal dq, small early rows) is judged
 * row by row instead of against its largest row. *worst_row_out (if not NULL): the row. */
double cpt_rel_error_rows(const float *got, const double *ref, size_t rows, size_t row_len,
                             int64_t *worst_row_out);

/* Shorthands: .max_abs and .rel of cpt_compare_f32. */
double cpt_max_abs_error(const float *got, const double *ref, size_t n);
double cpt_rel_error(const float *got, const double *ref, size_t n);

/* Distance in units in the last place between two floats: the number of representable floats
 * between them (0 when equal, +0 and -0 equal). UINT64_MAX when either is NaN. */
uint64_t cpt_ulp_distance_f32(float a, float b);

typedef struct cpt_ulp_stats {
    uint64_t max;  /* largest distance; UINT64_MAX if any element is NaN */
    double mean;   /* mean distance over the elements with a finite distance */
    int64_t worst; /* flat index of the largest distance; -1 when n == 0 */
} cpt_ulp_stats;

/* ULP distances between got and ref rounded to float, element by element. */
cpt_ulp_stats cpt_ulp_f32(const float *got, const double *ref, size_t n);

/* Number of elements (elem_size bytes each) of a and b whose bytes differ, over n elements;
 * *first_out (if not NULL) receives the index of the first one, or -1. */
size_t cpt_bitwise_diff(const void *a, const void *b, size_t n, size_t elem_size,
                           int64_t *first_out);

/* The same for two host tensors of one dtype and shape (any strides): elements compared in BSHD
 * order. Returns SIZE_MAX when dtype or shape differ. */
size_t cpt_bitwise_diff_tensor(const ctxpar_tensor *a, const ctxpar_tensor *b,
                                  int64_t *first_out);

#ifdef __cplusplus
}
#endif

#endif /* CPT_TESTING_METRICS_H */
