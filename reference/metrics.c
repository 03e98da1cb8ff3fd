/*
 * metrics.c - error of a result against the float64 oracle; bitwise comparison of two results.
 */
#include "reference/metrics.h"

#include <math.h>
#include <string.h>

#include "reference/data.h"

// |got - ref|, infinite for NaN on either side or an infinity the other side does not share.
static double elem_error(double got, double ref) {
    if (isnan(got) || isnan(ref))
        return INFINITY;
    if (isinf(got) || isinf(ref))
        return got == ref ? 0.0 : INFINITY;
    return fabs(got - ref);
}

static void stats_add(cpt_error_stats *st, double got, double ref) {
    double e = elem_error(got, ref);
    if (isinf(e))
        st->nonfinite++;
    if (st->worst < 0 || e > st->max_abs) {
        st->max_abs = e;
        st->worst = (int64_t)st->count;
    }
    if (isfinite(ref) && fabs(ref) > st->max_ref)
        st->max_ref = fabs(ref);
    st->count++;
}

static void stats_finish(cpt_error_stats *st) {
    st->rel = st->max_ref > 0.0 ? st->max_abs / st->max_ref : st->max_abs;
}

static cpt_error_stats stats_init(void) {
    cpt_error_stats st = {0};
    st.worst = -1;
    return st;
}

cpt_error_stats cpt_compare_f32(const float *got, const double *ref, size_t n) {
    cpt_error_stats st = stats_init();
    for (size_t i = 0; i < n; i++)
        stats_add(&st, got[i], ref[i]);
    stats_finish(&st);
    return st;
}

cpt_error_stats cpt_compare_tensor(const ctxpar_tensor *got, const double *ref) {
    cpt_error_stats st = stats_init();
    const int64_t B = got->shape[0], S = got->shape[1], H = got->shape[2], D = got->shape[3];
    for (int64_t b = 0; b < B; b++)
        for (int64_t s = 0; s < S; s++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t d = 0; d < D; d++)
                    stats_add(&st, cpt_test_get(got, b, s, h, d), ref[st.count]);
    stats_finish(&st);
    return st;
}

double cpt_rel_error_rows(const float *got, const double *ref, size_t rows, size_t row_len,
                             int64_t *worst_row_out) {
    double worst = 0.0;
    int64_t at = rows ? 0 : -1;
    for (size_t r = 0; r < rows; r++) {
        double e = cpt_compare_f32(got + r * row_len, ref + r * row_len, row_len).rel;
        if (isnan(e) || e > worst) {
            worst = isnan(e) ? INFINITY : e;
            at = (int64_t)r;
        }
    }
    if (worst_row_out)
        *worst_row_out = at;
    return worst;
}

double cpt_max_abs_error(const float *got, const double *ref, size_t n) {
    return cpt_compare_f32(got, ref, n).max_abs;
}

double cpt_rel_error(const float *got, const double *ref, size_t n) {
    return cpt_compare_f32(got, ref, n).rel;
}

// Position of f on the number line of floats: consecutive floats map to consecutive integers,
// and +0 and -0 both map to 0.
static int64_t float_ordinal(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    int64_t mag = (int64_t)(u & 0x7fffffffu);
    return (u >> 31) ? -mag : mag;
}

uint64_t cpt_ulp_distance_f32(float a, float b) {
    if (isnan(a) || isnan(b))
        return UINT64_MAX;
    int64_t d = float_ordinal(a) - float_ordinal(b);
    return (uint64_t)(d < 0 ? -d : d);
}

cpt_ulp_stats cpt_ulp_f32(const float *got, const double *ref, size_t n) {
    cpt_ulp_stats st = {0, 0.0, -1};
    double sum = 0.0;
    size_t finite = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t d = cpt_ulp_distance_f32(got[i], (float)ref[i]);
        if (st.worst < 0 || d > st.max) {
            st.max = d;
            st.worst = (int64_t)i;
        }
        if (d != UINT64_MAX) {
            sum += (double)d;
            finite++;
        }
    }
    st.mean = finite ? sum / (double)finite : 0.0;
    return st;
}

size_t cpt_bitwise_diff(const void *a, const void *b, size_t n, size_t elem_size,
                           int64_t *first_out) {
    const unsigned char *pa = a, *pb = b;
    size_t diff = 0;
    int64_t first = -1;
    for (size_t i = 0; i < n; i++) {
        if (memcmp(pa + i * elem_size, pb + i * elem_size, elem_size) != 0) {
            if (first < 0)
                first = (int64_t)i;
            diff++;
        }
    }
    if (first_out)
        *first_out = first;
    return diff;
}

size_t cpt_bitwise_diff_tensor(const ctxpar_tensor *a, const ctxpar_tensor *b,
                                  int64_t *first_out) {
    if (first_out)
        *first_out = -1;
    if (a->dtype != b->dtype || memcmp(a->shape, b->shape, sizeof a->shape) != 0)
        return SIZE_MAX;
    const size_t es = ctxpar_dtype_size(a->dtype);
    const unsigned char *pa = a->data, *pb = b->data;
    size_t diff = 0, i = 0;
    for (int64_t bb = 0; bb < a->shape[0]; bb++)
        for (int64_t s = 0; s < a->shape[1]; s++)
            for (int64_t h = 0; h < a->shape[2]; h++)
                for (int64_t d = 0; d < a->shape[3]; d++, i++) {
                    int64_t oa =
                        bb * a->stride[0] + s * a->stride[1] + h * a->stride[2] + d * a->stride[3];
                    int64_t ob =
                        bb * b->stride[0] + s * b->stride[1] + h * b->stride[2] + d * b->stride[3];
                    if (memcmp(pa + oa * (int64_t)es, pb + ob * (int64_t)es, es) != 0) {
                        if (first_out && *first_out < 0)
                            *first_out = (int64_t)i;
                        diff++;
                    }
                }
    return diff;
}
