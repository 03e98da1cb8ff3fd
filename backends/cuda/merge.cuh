// The log-sum-exp merge of two partial attention results for one row, shared by the forward
// kernels' epilogues and the merge kernel:
//   lse' = logaddexp(lse_a, lse_b);  out' = e^(lse_a - lse') out_a + e^(lse_b - lse') out_b
// A side whose lse is -inf (no visible key) has weight exactly 0 and leaves the other unchanged;
// two empty sides give out 0 and lse -inf, whatever the accumulator held (as on the CPU device:
// a stale accumulator row must not survive a merge that saw no key at all).
#ifndef CTXPAR_CUDA_MERGE_CUH
#define CTXPAR_CUDA_MERGE_CUH

#include <math.h>

namespace ctxpar_cuda {

struct merge_weights {
    float wa, wb, lse;
};

__device__ __forceinline__ merge_weights merge_weights_of(float lse_a, float lse_b) {
    if (lse_b == -INFINITY)
        return {lse_a == -INFINITY ? 0.0f : 1.0f, 0.0f, lse_a};
    if (lse_a == -INFINITY)
        return {0.0f, 1.0f, lse_b};
    // Comparisons, not fmaxf/fminf (which drop a NaN): a NaN lse on either side gives NaN, as on
    // the CPU device.
    float hi = lse_a > lse_b ? lse_a : lse_b, lo = lse_a > lse_b ? lse_b : lse_a;
    float lse = hi + log1pf(expf(lo - hi));
    return {expf(lse_a - lse), expf(lse_b - lse), lse};
}

// out_a weighted by w.wa plus out_b by w.wb; a zero weight drops its side entirely, so that a
// stale value behind an lse of -inf can never leak through as 0 * inf.
__device__ __forceinline__ float merge_value(const merge_weights &w, float out_a, float out_b) {
    float a = w.wa == 0.0f ? 0.0f : w.wa * out_a;
    float b = w.wb == 0.0f ? 0.0f : w.wb * out_b;
    return a + b;
}

} // namespace ctxpar_cuda

#endif // CTXPAR_CUDA_MERGE_CUH
