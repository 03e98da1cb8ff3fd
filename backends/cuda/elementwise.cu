// Row-wise and element-wise kernels: merge of partial results, the backward's delta, cast,
// add, fill and the transfer checksum.
#include <math.h>

#include "cuda_kernels.h"
#include "dtype.cuh"
#include "merge.cuh"

namespace ctxpar_cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarpsPerBlock = kThreads / 32;

unsigned blocks_for(int64_t n, int64_t per_block) {
    int64_t b = (n + per_block - 1) / per_block;
    const int64_t cap = 65535LL * 16; // grid-stride loops cover the rest
    return (unsigned)(b < 1 ? 1 : (b > cap ? cap : b));
}

/*
 * One warp per row (b, s, h) of out_acc [B, S, H, D] F32 / lse_acc [B, H, S] F32, merged with
 * (merge = 1) or overwritten by (merge = 0) the same row of out_b (dense [B, S, H, D], TB) and
 * lse_b [B, H, S]. grid-stride over the B*S*H rows.
 */
template <typename TB>
__global__ void merge_kernel(float *out_acc, float *lse_acc, const TB *out_b, const float *lse_b,
                             int64_t batch, int64_t seq, int64_t heads, int64_t head_dim,
                             int merge) {
    const int lane = threadIdx.x % 32;
    const int64_t rows = batch * seq * heads;
    for (int64_t row = (int64_t)blockIdx.x * kWarpsPerBlock + threadIdx.x / 32; row < rows;
         row += (int64_t)gridDim.x * kWarpsPerBlock) {
        const int64_t h = row % heads, s = (row / heads) % seq, b = row / (heads * seq);
        const int64_t li = (b * heads + h) * seq + s;
        const float lb = lse_b[li];
        merge_weights w = {0.0f, 1.0f, lb};
        if (merge)
            w = merge_weights_of(lse_acc[li], lb);
        __syncwarp(); // every lane has read lse_acc[li] before lane 0 writes it
        float *o = out_acc + row * head_dim;
        const TB *ob = out_b + row * head_dim;
        for (int64_t d = lane; d < head_dim; d += 32) {
            const float xb = to_f32(ob[d]);
            o[d] = merge ? merge_value(w, o[d], xb) : xb;
        }
        if (lane == 0)
            lse_acc[li] = w.lse;
    }
}

/*
 * delta [B, H, S] = sum over d of out * dout, out [B, S, H, D] of TO and dout [B, S, H, D] of
 * TG (any strides with d innermost). One warp per row (b, s, h); the lane partial sums are
 * combined in a fixed tree, so the result is deterministic. grid-stride over the B*S*H rows.
 */
template <typename TO, typename TG>
__global__ void bwd_prep_kernel(ctxpar_cuda_view out, ctxpar_cuda_view dout, int64_t batch,
                                int64_t seq, int64_t heads, int64_t head_dim, float *delta) {
    const int lane = threadIdx.x % 32;
    const int64_t rows = batch * seq * heads;
    for (int64_t row = (int64_t)blockIdx.x * kWarpsPerBlock + threadIdx.x / 32; row < rows;
         row += (int64_t)gridDim.x * kWarpsPerBlock) {
        const int64_t h = row % heads, s = (row / heads) % seq, b = row / (heads * seq);
        const TO *o =
            (const TO *)out.data + b * out.stride[0] + s * out.stride[1] + h * out.stride[2];
        const TG *g =
            (const TG *)dout.data + b * dout.stride[0] + s * dout.stride[1] + h * dout.stride[2];
        float acc = 0.0f;
        for (int64_t d = lane; d < head_dim; d += 32)
            acc = fmaf(to_f32(o[d]), to_f32(g[d]), acc);
        for (int off = 16; off > 0; off >>= 1)
            acc += __shfl_xor_sync(0xffffffffu, acc, off);
        if (lane == 0)
            delta[(b * heads + h) * seq + s] = acc;
    }
}

struct strides4 {
    int64_t s[4];
};

/*
 * dst = src converted element by element over shape [n0, n1, n2, n3], with the bits
 * api/ctxpar_half.h gives (NaN payloads included); strides in elements (innermost 1 for both).
 * grid-stride over the elements in row-major order.
 */
template <typename TS, typename TD>
__global__ void cast_kernel(const TS *src, strides4 ss, TD *dst, strides4 ds, strides4 shape) {
    const int64_t n = shape.s[0] * shape.s[1] * shape.s[2] * shape.s[3];
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t rem = i;
        const int64_t i3 = rem % shape.s[3];
        rem /= shape.s[3];
        const int64_t i2 = rem % shape.s[2];
        rem /= shape.s[2];
        const int64_t i1 = rem % shape.s[1];
        const int64_t i0 = rem / shape.s[1];
        const float x = exact_to_f32(src[i0 * ss.s[0] + i1 * ss.s[1] + i2 * ss.s[2] + i3]);
        dst[i0 * ds.s[0] + i1 * ds.s[1] + i2 * ds.s[2] + i3] = exact_from_f32<TD>(x);
    }
}

// dst[i] += src[i] (F32), i < n, grid-stride.
__global__ void add_kernel(float *dst, const float *src, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dst[i] += src[i];
}

// dst[i] = value (F32), i < n, grid-stride.
__global__ void fill_kernel(float *dst, float value, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dst[i] = value;
}

// splitmix64's finaliser: a bijective mix of 64 bits.
__device__ __forceinline__ uint64_t mix64(uint64_t x) {
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}

/*
 * *sum += sum over 8-byte little-endian words w_i of mix64(w_i + i * golden), the last word
 * zero-padded. Addition modulo 2^64 is associative, so the integer atomics give one exact
 * result in any order, while the index in each term catches reordered data. bytes of data (any
 * alignment); grid-stride over the words.
 */
__global__ void checksum_kernel(const unsigned char *data, size_t bytes, uint64_t *sum) {
    const size_t words = (bytes + 7) / 8;
    const bool aligned = ((uintptr_t)data % 8) == 0;
    uint64_t acc = 0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < words;
         i += (size_t)gridDim.x * blockDim.x) {
        uint64_t w = 0;
        if (aligned && 8 * i + 8 <= bytes) {
            w = reinterpret_cast<const uint64_t *>(data)[i];
        } else {
            for (size_t k = 0; k < 8 && 8 * i + k < bytes; k++)
                w |= (uint64_t)data[8 * i + k] << (8 * k);
        }
        acc += mix64(w + (uint64_t)i * 0x9e3779b97f4a7c15ull);
    }
    for (int off = 16; off > 0; off >>= 1)
        acc += __shfl_xor_sync(0xffffffffu, acc, off);
    if (threadIdx.x % 32 == 0)
        atomicAdd((unsigned long long *)sum, (unsigned long long)acc);
}

template <typename TB>
cudaError_t launch_merge(float *out_acc, float *lse_acc, const void *out_b, const float *lse_b,
                         int64_t batch, int64_t seq, int64_t heads, int64_t head_dim, int merge,
                         cudaStream_t stream) {
    const unsigned grid = blocks_for(batch * seq * heads, kWarpsPerBlock);
    merge_kernel<TB><<<grid, kThreads, 0, stream>>>(out_acc, lse_acc, (const TB *)out_b, lse_b,
                                                    batch, seq, heads, head_dim, merge);
    return cudaGetLastError();
}

template <typename TO, typename TG>
cudaError_t launch_bwd_prep2(ctxpar_cuda_view out, ctxpar_cuda_view dout, int64_t batch,
                             int64_t seq, int64_t heads, int64_t head_dim, float *delta,
                             cudaStream_t stream) {
    const unsigned grid = blocks_for(batch * seq * heads, kWarpsPerBlock);
    bwd_prep_kernel<TO, TG>
        <<<grid, kThreads, 0, stream>>>(out, dout, batch, seq, heads, head_dim, delta);
    return cudaGetLastError();
}

template <typename TO>
cudaError_t launch_bwd_prep(ctxpar_cuda_view out, ctxpar_cuda_view dout, ctxpar_dtype dout_dtype,
                            int64_t batch, int64_t seq, int64_t heads, int64_t head_dim,
                            float *delta, cudaStream_t stream) {
    switch (dout_dtype) {
    case CTXPAR_DTYPE_F32:
        return launch_bwd_prep2<TO, float>(out, dout, batch, seq, heads, head_dim, delta, stream);
    case CTXPAR_DTYPE_F16:
        return launch_bwd_prep2<TO, __half>(out, dout, batch, seq, heads, head_dim, delta, stream);
    case CTXPAR_DTYPE_BF16:
        return launch_bwd_prep2<TO, __nv_bfloat16>(out, dout, batch, seq, heads, head_dim, delta,
                                                   stream);
    }
    return cudaErrorInvalidValue;
}

template <typename TS, typename TD>
cudaError_t launch_cast2(const void *src, strides4 ss, void *dst, strides4 ds, strides4 shape,
                         cudaStream_t stream) {
    const int64_t n = shape.s[0] * shape.s[1] * shape.s[2] * shape.s[3];
    cast_kernel<TS, TD><<<blocks_for(n, kThreads), kThreads, 0, stream>>>((const TS *)src, ss,
                                                                          (TD *)dst, ds, shape);
    return cudaGetLastError();
}

template <typename TS>
cudaError_t launch_cast1(const void *src, strides4 ss, void *dst, ctxpar_dtype dst_dtype,
                         strides4 ds, strides4 shape, cudaStream_t stream) {
    switch (dst_dtype) {
    case CTXPAR_DTYPE_F32:
        return launch_cast2<TS, float>(src, ss, dst, ds, shape, stream);
    case CTXPAR_DTYPE_F16:
        return launch_cast2<TS, __half>(src, ss, dst, ds, shape, stream);
    case CTXPAR_DTYPE_BF16:
        return launch_cast2<TS, __nv_bfloat16>(src, ss, dst, ds, shape, stream);
    }
    return cudaErrorInvalidValue;
}

} // namespace
} // namespace ctxpar_cuda

using namespace ctxpar_cuda;

extern "C" cudaError_t ctxpar_cuda_launch_merge(float *out_acc, float *lse_acc, const void *out_b,
                                                ctxpar_dtype dtype_b, const float *lse_b,
                                                int64_t batch, int64_t seq, int64_t heads,
                                                int64_t head_dim, int merge, cudaStream_t stream) {
    return CTXPAR_CUDA_DISPATCH_DTYPE(dtype_b, launch_merge, out_acc, lse_acc, out_b, lse_b, batch,
                                      seq, heads, head_dim, merge, stream);
}

extern "C" cudaError_t ctxpar_cuda_launch_bwd_prep(ctxpar_cuda_view out, ctxpar_dtype out_dtype,
                                                   ctxpar_cuda_view dout, ctxpar_dtype dout_dtype,
                                                   int64_t batch, int64_t seq, int64_t heads,
                                                   int64_t head_dim, float *delta,
                                                   cudaStream_t stream) {
    return CTXPAR_CUDA_DISPATCH_DTYPE(out_dtype, launch_bwd_prep, out, dout, dout_dtype, batch, seq,
                                      heads, head_dim, delta, stream);
}

extern "C" cudaError_t ctxpar_cuda_launch_cast(const void *src, ctxpar_dtype src_dtype,
                                               const int64_t src_stride[4], void *dst,
                                               ctxpar_dtype dst_dtype, const int64_t dst_stride[4],
                                               const int64_t shape[4], cudaStream_t stream) {
    strides4 ss, ds, sh;
    for (int i = 0; i < 4; i++) {
        ss.s[i] = src_stride[i];
        ds.s[i] = dst_stride[i];
        sh.s[i] = shape[i];
    }
    return CTXPAR_CUDA_DISPATCH_DTYPE(src_dtype, launch_cast1, src, ss, dst, dst_dtype, ds, sh,
                                      stream);
}

extern "C" cudaError_t ctxpar_cuda_launch_add(float *dst, const float *src, size_t n,
                                              cudaStream_t stream) {
    add_kernel<<<blocks_for((int64_t)n, kThreads), kThreads, 0, stream>>>(dst, src, n);
    return cudaGetLastError();
}

extern "C" cudaError_t ctxpar_cuda_launch_fill(float *dst, float value, size_t n,
                                               cudaStream_t stream) {
    fill_kernel<<<blocks_for((int64_t)n, kThreads), kThreads, 0, stream>>>(dst, value, n);
    return cudaGetLastError();
}

extern "C" cudaError_t ctxpar_cuda_launch_checksum(const void *data, size_t bytes,
                                                   uint64_t *sum_dev, cudaStream_t stream) {
    cudaError_t e = cudaMemsetAsync(sum_dev, 0, sizeof *sum_dev, stream);
    if (e != cudaSuccess)
        return e;
    const int64_t words = (int64_t)((bytes + 7) / 8);
    checksum_kernel<<<blocks_for(words, kThreads), kThreads, 0, stream>>>(
        (const unsigned char *)data, bytes, sum_dev);
    return cudaGetLastError();
}
