// Positions and masks on the device: the twins of ctxpar_spans / ctxpar_mask_* in
// api/ctxpar_backend.h, which are host-only inline C. Keep the two in step: the host classifies
// whole blocks with the originals, the kernels classify tiles and single pairs with these.
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

// ctxpar_mask_doc_of: the last document whose first position is <= pos (0 without documents).
// Counting the boundaries 1..num_docs-1 that are <= pos gives the same index for a
// non-decreasing cu_seqlens.
__device__ __forceinline__ int64_t doc_of(const ctxpar_cuda_mask &m, int64_t pos) {
    if (m.num_docs <= 1)
        return 0;
    if (m.cu_list) {
        int64_t lo = 0, hi = m.num_docs - 1;
        while (lo < hi) {
            int64_t mid = (lo + hi + 1) / 2;
            if (m.cu_list[mid] <= pos)
                lo = mid;
            else
                hi = mid - 1;
        }
        return lo;
    }
    int64_t doc = 0;
#pragma unroll
    for (int j = 1; j < CTXPAR_CUDA_INLINE_BOUNDS - 1; j++)
        doc += (j < m.num_docs && m.cu_inline[j] <= pos) ? 1 : 0;
    return doc;
}

// ctxpar_mask_visible.
__device__ __forceinline__ bool visible(const ctxpar_cuda_mask &m, int64_t q, int64_t k,
                                        int64_t qdoc, int64_t kdoc) {
    if (m.causal && k > q)
        return false;
    if (m.window_left > 0 && q - k >= m.window_left)
        return false;
    if (m.window_right > 0 && k - q > m.window_right)
        return false;
    return qdoc == kdoc;
}

// ctxpar_mask_classify, with the documents of the four corners already looked up.
__device__ __forceinline__ int classify(const ctxpar_cuda_mask &m, int64_t qmin, int64_t qmax,
                                        int64_t kmin, int64_t kmax) {
    if (m.causal && kmin > qmax)
        return CTXPAR_BLOCK_SKIP;
    if (m.window_left > 0 && qmin - kmax >= m.window_left)
        return CTXPAR_BLOCK_SKIP;
    if (m.window_right > 0 && kmin - qmax > m.window_right)
        return CTXPAR_BLOCK_SKIP;
    bool full = true;
    if (m.causal && kmax > qmin)
        full = false;
    if (m.window_left > 0 && qmax - kmin >= m.window_left)
        full = false;
    if (m.window_right > 0 && kmax - qmin > m.window_right)
        full = false;
    if (m.num_docs > 0) {
        int64_t qd0 = doc_of(m, qmin), qd1 = doc_of(m, qmax);
        int64_t kd0 = doc_of(m, kmin), kd1 = doc_of(m, kmax);
        if (qd1 < kd0 || kd1 < qd0)
            return CTXPAR_BLOCK_SKIP;
        if (!(qd0 == qd1 && kd0 == kd1 && qd0 == kd0))
            full = false;
    }
    return full ? CTXPAR_BLOCK_FULL : CTXPAR_BLOCK_PARTIAL;
}

} // namespace ctxpar_cuda

#endif // CTXPAR_CUDA_MASK_CUH
