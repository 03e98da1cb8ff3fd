// Shared-memory tiles of F32 for the SIMT kernels (forward for F32, backward for every dtype):
// 32 rows x D, any D <= 256, row stride D | 1 (odd, so that a column walk hits distinct banks).
#ifndef CTXPAR_CUDA_SIMT_TILE_CUH
#define CTXPAR_CUDA_SIMT_TILE_CUH

#include <stdint.h>

#include "dtype.cuh"

namespace ctxpar_cuda {

constexpr int kSimtRows = 32;     // rows of every SIMT tile (queries and keys alike)
constexpr int kSimtThreads = 256; // 32 rows x 8 threads; thread (r = tid / 8, c = tid % 8)
constexpr int kSimtMaxChunks = CTXPAR_CUDA_MAX_HEAD_DIM / 8; // columns c, c + 8, ... per thread

__host__ __device__ __forceinline__ int simt_ld(int64_t head_dim) {
    return (int)head_dim | 1;
}

// Rows [row0, row0 + 32) of a [*, D] matrix of T (row stride in elements) as F32 in dst (row
// stride simt_ld(D)); rows past `total` are zero.
template <typename T>
__device__ __forceinline__ void load_rows_f32(float *dst, const T *src, int64_t row_stride,
                                              int64_t row0, int64_t total, int D) {
    const int ld = simt_ld(D);
    for (int idx = threadIdx.x; idx < kSimtRows * D; idx += blockDim.x) {
        int r = idx / D, d = idx % D;
        int64_t row = row0 + r;
        dst[r * ld + d] = row < total ? to_f32(src[row * row_stride + d]) : 0.0f;
    }
}

// Sum over the 8 threads (c = 0..7) that share a row; they are 8 consecutive lanes.
__device__ __forceinline__ float row_sum8(float x) {
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    x += __shfl_xor_sync(0xffffffffu, x, 2);
    x += __shfl_xor_sync(0xffffffffu, x, 4);
    return x;
}
__device__ __forceinline__ float row_max8(float x) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 4));
    return x;
}

// Raises the dynamic shared-memory limit of each kernel to `bytes`.
template <class... K> cudaError_t set_smem_limit(size_t bytes, K... kernels) {
    cudaError_t e = cudaSuccess;
    auto one = [&](auto k) {
        if (e == cudaSuccess)
            e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
    };
    (one(kernels), ...);
    return e;
}

// Lowers *bytes to the smallest dynamic shared-memory limit the kernels have.
template <class... K> cudaError_t lower_to_smem_limit(size_t *bytes, K... kernels) {
    cudaError_t e = cudaSuccess;
    auto one = [&](auto k) {
        cudaFuncAttributes fa;
        if (e == cudaSuccess && (e = cudaFuncGetAttributes(&fa, k)) == cudaSuccess &&
            (size_t)fa.maxDynamicSharedSizeBytes < *bytes)
            *bytes = (size_t)fa.maxDynamicSharedSizeBytes;
    };
    (one(kernels), ...);
    return e;
}

// Sets min(need, limit) bytes on the kernels `set(dtype tag, bytes)` names, for every dtype.
template <class F> cudaError_t configure_smem(size_t need, size_t limit, size_t *set_out, F set) {
    const size_t bytes = need < limit ? need : limit;
    cudaError_t e = for_each_dtype([&](auto t) { return set(t, bytes); });
    if (e == cudaSuccess)
        *set_out = bytes;
    return e;
}

} // namespace ctxpar_cuda

#endif // CTXPAR_CUDA_SIMT_TILE_CUH
