// Per-tile bookkeeping shared by the attention kernels: the global positions of a tile's rows and
// the keys each sees, in shared memory, their range, and the tile pair's mask class.
#ifndef CTXPAR_CUDA_TILE_CUH
#define CTXPAR_CUDA_TILE_CUH

#include <stdint.h>

#include <type_traits>

#include "mask.cuh"

namespace ctxpar_cuda {

// What a query tile keeps besides positions: the keys each row sees, and those of its first and
// last rows. Key tiles keep none of it.
template <int N> struct row_keys {
    int64_t key_lo[N], key_hi[N]; // row i sees keys [key_lo[i], key_hi[i]]; padding none
    int64_t lo0, hi0, lo1, hi1;   // the rows at lo and at hi see [lo0, hi0] and [lo1, hi1]
};
struct no_row_keys {};

// Positions of N consecutive local rows [row0, row0 + N) of a block; rows >= total are padding.
template <int N, bool kQuery>
struct tile_rows : std::conditional_t<kQuery, row_keys<N>, no_row_keys> {
    int64_t pos[N];
    int64_t lo, hi; // smallest and largest position of the valid rows
};

// Fills t for rows row0.. of a block with `total` rows. Called by every thread of the block;
// starts and ends with a barrier, so t may still be in use when it is called.
template <int N, bool kQuery>
__device__ void fill_tile_rows(tile_rows<N, kQuery> &t, const ctxpar_cuda_positions &p,
                               const ctxpar_cuda_mask &m, int64_t row0, int64_t total) {
    __syncthreads();
    for (int i = threadIdx.x; i < N; i += blockDim.x) {
        int64_t row = row0 + i;
        int64_t pos = row < total ? position_of(p, row) : 0;
        t.pos[i] = pos;
        if constexpr (kQuery) {
            t.key_lo[i] = 1;
            t.key_hi[i] = 0;
            if (row < total)
                keys_of(m, pos, &t.key_lo[i], &t.key_hi[i]);
        }
    }
    __syncthreads();
    if (threadIdx.x < 32) {
        int64_t lo = INT64_MAX, hi = INT64_MIN;
        for (int i = threadIdx.x; i < N; i += 32) {
            if (row0 + i < total) {
                lo = min(lo, t.pos[i]);
                hi = max(hi, t.pos[i]);
            }
        }
        for (int o = 16; o > 0; o >>= 1) {
            lo = min(lo, (int64_t)__shfl_xor_sync(0xffffffffu, (long long)lo, o));
            hi = max(hi, (int64_t)__shfl_xor_sync(0xffffffffu, (long long)hi, o));
        }
        if (threadIdx.x == 0) {
            t.lo = lo;
            t.hi = hi;
        }
        if constexpr (kQuery) {
            // The ends of the intervals grow with the position: the first row's are the least,
            // the last row's the largest.
            int64_t lo0 = INT64_MAX, hi0 = INT64_MAX, lo1 = INT64_MIN, hi1 = INT64_MIN;
            for (int i = threadIdx.x; i < N; i += 32) {
                if (row0 + i < total) {
                    lo0 = min(lo0, t.key_lo[i]);
                    hi0 = min(hi0, t.key_hi[i]);
                    lo1 = max(lo1, t.key_lo[i]);
                    hi1 = max(hi1, t.key_hi[i]);
                }
            }
            for (int o = 16; o > 0; o >>= 1) {
                lo0 = min(lo0, (int64_t)__shfl_xor_sync(0xffffffffu, (long long)lo0, o));
                hi0 = min(hi0, (int64_t)__shfl_xor_sync(0xffffffffu, (long long)hi0, o));
                lo1 = max(lo1, (int64_t)__shfl_xor_sync(0xffffffffu, (long long)lo1, o));
                hi1 = max(hi1, (int64_t)__shfl_xor_sync(0xffffffffu, (long long)hi1, o));
            }
            if (threadIdx.x == 0) {
                t.lo0 = lo0;
                t.hi0 = hi0;
                t.lo1 = lo1;
                t.hi1 = hi1;
            }
        }
    }
    __syncthreads();
}

// Class of a (query tile, key tile) pair (ctxpar_mask_classify for the one batch row a kernel
// sees); every thread computes the same value.
template <int NQ, int NK>
__device__ __forceinline__ int tile_class(const tile_rows<NQ, true> &q,
                                          const tile_rows<NK, false> &k) {
    return ctxpar_mask_classify_keys(q.lo0, q.hi0, q.lo1, q.hi1, k.lo, k.hi);
}

// Whether query row r of a tile sees key position k.
template <int N>
__device__ __forceinline__ bool sees(const tile_rows<N, true> &q, int r, int64_t k) {
    return q.key_lo[r] <= k && k <= q.key_hi[r];
}

// Whether no key tile from this one on can be visible: a causal mask with key positions that
// only grow, and this tile already wholly after the query tile.
template <int NQ, int NK>
__device__ __forceinline__ bool rest_is_masked(const ctxpar_cuda_attn_args &a,
                                               const tile_rows<NQ, true> &q,
                                               const tile_rows<NK, false> &k) {
    return a.k_increasing && a.mask.causal && k.lo > q.hi;
}

} // namespace ctxpar_cuda

#endif // CTXPAR_CUDA_TILE_CUH
