/*
 * Merging partial attention results by their log-sum-exp.
 *
 *   out_acc, out_b [B, S, H, D]   lse_acc, lse_b [B, H, S]   F32, dense
 *   lse' = logaddexp(lse_acc, lse_b)
 *   out_acc = e^(lse_acc - lse') out_acc + e^(lse_b - lse') out_b
 *
 * Per row, in double, then rounded: the merge is exact up to one rounding of each output, and
 * symmetric bit for bit (merging a into b gives the bits of merging b into a). A row with
 * lse = -inf is empty: merging it changes nothing, and two empty rows give (0, -inf), never NaN.
 */
#include <math.h>
#include <omp.h>
#include <string.h>

#include "backends/cpu/cpu_internal.h"

void ctxpar_cpu_merge_row(float *out, float *lse, float *lo, const float *out_b, const double *num,
                          int64_t stride, double den, double lse_b, int64_t dim) {
#define B(d) (out_b ? (double)out_b[d] : num[(d) * stride] / den)
    const float lse_a = *lse;
    if (lse_b == -INFINITY) {
        if (lse_a == -INFINITY)
            memset(out, 0, (size_t)dim * sizeof *out);
        return;
    }
    if (lse_a == -INFINITY) {
        for (int64_t d = 0; d < dim; d++)
            out[d] = (float)B(d);
        ctxpar_cpu_store_lse(lse, lo, lse_b);
        return;
    }
    // Comparisons, not fmax: a NaN on either side must come out as NaN.
    double a = (double)lse_a + (lo ? (double)*lo : 0.0), b = lse_b;
    double big = a > b ? a : b, small = a > b ? b : a;
    double lse_n = big + log1p(exp(small - big));
    double wa = exp(a - lse_n), wb = exp(b - lse_n);
    for (int64_t d = 0; d < dim; d++)
        out[d] = (float)(wa * out[d] + wb * B(d));
    ctxpar_cpu_store_lse(lse, lo, lse_n);
#undef B
}

ctxpar_status ctxpar_cpu_attn_merge(ctxpar_device *dev, float *out_acc, float *lse_acc,
                                    const float *out_b, const float *lse_b, int64_t batch,
                                    int64_t seq, int64_t heads, int64_t head_dim,
                                    ctxpar_stream *stream) {
    (void)stream;
    const int64_t rows = batch * seq * heads; // sizes and buffers checked by the dispatch
    const int nt = ctxpar_cpu_threads(dev->impl);
#pragma omp parallel for num_threads(nt) schedule(static) if (rows * head_dim > 16384)
    for (int64_t r = 0; r < rows; r++) {
        int64_t h = r % heads, s = (r / heads) % seq, b = r / (heads * seq);
        int64_t li = (b * heads + h) * seq + s;
        ctxpar_cpu_merge_row(out_acc + r * head_dim, lse_acc + li, NULL, out_b + r * head_dim,
                             NULL, 0, 1.0, lse_b[li], head_dim);
    }
    return CTXPAR_OK;
}
