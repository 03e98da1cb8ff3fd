// Positions and masks on the device: the data access behind the mask rule of
// api/ctxpar_backend.h (ctxpar_mask_interval, compiled for the device too): span positions, and
// documents from the inline or listed boundaries.
#ifndef CTXPAR_CUDA_MASK_CUH
#define CTXPAR_CUDA_MASK_CUH

#include <stdint.h>

#include "cuda_kernels.h"

namespace ctxpar_cuda {

// Global position of local row i (0 <= i < total of the spans). Inline spans are read with
// constant indices so that they stay in the kernel-parameter bank.
__device__ __forceinline__ int64_t position_of(const ctxpar_cuda_positions &p, int64_t i) {
    if (p.list) {
        for (int j = 0; j < p.count; j++) {
            ctxpar_span s = p.list[j];
            if (i < s.len)
                return s.start + i * s.stride;
            i -= s.len;
        }
        return 0;
    }
#pragma unroll
    for (int j = 0; j < CTXPAR_CUDA_INLINE_SPANS; j++) {
        if (j < p.count) {
            ctxpar_span s = p.inline_span[j];
            if (i < s.len)
                return s.start + i * s.stride;
            i -= s.len;
        }
    }
    return 0;
}

// ctxpar_mask_doc_bounds: the positions [first, last] of pos's document, the first reaching down
// to INT64_MIN and the last up to INT64_MAX. Of the inner boundaries (1..num_docs-1, non-
// decreasing), the largest <= pos starts it and the smallest above ends it.
__device__ __forceinline__ void doc_bounds(const ctxpar_cuda_mask &m, int64_t pos, int64_t *first,
                                           int64_t *last) {
    *first = INT64_MIN;
    *last = INT64_MAX;
    if (m.num_docs <= 1)
        return;
    if (m.cu_list) {
        int64_t lo = 0, hi = m.num_docs - 1;
        while (lo < hi) {
            int64_t mid = (lo + hi + 1) / 2;
            if (m.cu_list[mid] <= pos)
                lo = mid;
            else
                hi = mid - 1;
        }
        if (lo > 0)
            *first = m.cu_list[lo];
        if (lo + 1 < m.num_docs)
            *last = m.cu_list[lo + 1] - 1;
        return;
    }
#pragma unroll
    for (int j = 1; j < CTXPAR_CUDA_INLINE_BOUNDS - 1; j++) {
        if (j < m.num_docs) {
            const int64_t c = m.cu_inline[j];
            if (c <= pos)
                *first = c;
            else if (c - 1 < *last)
                *last = c - 1;
        }
    }
}

// ctxpar_mask_keys_of: the keys position q sees, [*lo, *hi].
__device__ __forceinline__ void keys_of(const ctxpar_cuda_mask &m, int64_t q, int64_t *lo,
                                        int64_t *hi) {
    int64_t first, last;
    doc_bounds(m, q, &first, &last);
    ctxpar_mask_interval(m.causal, m.window_left, m.window_right, first, last, q, lo, hi);
}

} // namespace ctxpar_cuda

#endif // CTXPAR_CUDA_MASK_CUH
