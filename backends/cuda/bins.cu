// The binned accumulators of reproducible mode (api/ctxpar_bins.h) on the GPU: the SDK's
// __host__ __device__ functions, value by value. Each value of a block is read and written by
// exactly one thread of one launch (no atomics, no reductions across threads), so its bits are
// those of the SDK's functions on its terms in the order the ops add them, whatever the grid.
// Compiled with --fmad=false (BUILD): nvcc must not contract the header's a * b + c (the LSE's
// log(den) + e ln 2) into an FMA the host's compilation of the same function does not make.
//
//   bins_add:         src [B, len, H, width]                   into rows (b*seq + off + s)*H + h
//   bins_add_attn:    out_b [B, len, H, width - 1], lse_b, lse_lo_b [B, H, len]   (same rows)
//   bins_finish_attn: out [B, seq, H, width - 1], lse, lse_lo [B, H, seq]
#include <math.h>

#include "cuda_bins.h"

namespace ctxpar_cuda_bins {
namespace {

constexpr int kThreads = 256;

unsigned blocks_for(int64_t n) {
    int64_t b = (n + kThreads - 1) / kThreads;
    const int64_t cap = 65535LL * 16; // grid-stride loops cover the rest
    return (unsigned)(b < 1 ? 1 : (b > cap ? cap : b));
}

// Where source row r ([B, len, H]) of a bins op lands: its first value in the block's rows
// [B, seq, H] of `width`, and (li) its index in a [B, H, len] array such as an LSE (as the CPU's
// cpu_bins.c).
__device__ __forceinline__ int64_t land(const ctxpar_bins_shape &sh, int64_t r, int64_t *li) {
    const int64_t h = r % sh.heads, s = (r / sh.heads) % sh.len, b = r / (sh.heads * sh.len);
    *li = (b * sh.heads + h) * sh.len + s;
    return ((b * sh.seq + sh.off + s) * sh.heads + h) * sh.width;
}

#define GRID_STRIDE(i, n)                                                                          \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                      \
         i += (int64_t)gridDim.x * blockDim.x)

__global__ void clear_kernel(void *bins, int64_t rows, int64_t width) {
    const ctxpar_bins_view v = ctxpar_bins_at(bins, rows, width);
    GRID_STRIDE(i, rows * width) {
        ctxpar_bins_clear_value(v, i);
    }
}

// One thread per source value. ctxpar_bins_add_row puts finite terms and sends non-finite ones
// to the special sum: per value exactly ctxpar_bins_add_term.
__global__ void add_kernel(void *bins, const float *src, ctxpar_bins_shape sh) {
    const ctxpar_bins_view v = ctxpar_bins_at(bins, sh.batch * sh.seq * sh.heads, sh.width);
    GRID_STRIDE(i, sh.batch * sh.len * sh.heads * sh.width) {
        const int64_t r = i / sh.width, j = i % sh.width;
        int64_t li;
        ctxpar_bins_add_term(v, land(sh, r, &li) + j, src[i], 0);
    }
}

// One thread per value of a row. ctxpar_bins_add_attn_row computes a whole row's terms
// (ctxpar_bins_attn_terms) and adds them part by part; every term depends only on L and its own
// out_b[d], so the thread of value d calls ctxpar_bins_attn_terms for that d alone (n = 1: its
// three terms hi, lo, s_lo part in tmp[0..2], the same bits) and adds them in the row function's
// order; the denominator's thread (n = 0) adds den[0] then den[1]. Rows with a non-finite L get
// ctxpar_bins_attn_special's values.
__global__ void add_attn_kernel(void *bins, const float *out_b, const float *lse_b,
                                const float *lse_lo_b, ctxpar_bins_shape sh) {
    const ctxpar_bins_view v = ctxpar_bins_at(bins, sh.batch * sh.seq * sh.heads, sh.width);
    const int64_t n = sh.width - 1;
    GRID_STRIDE(i, sh.batch * sh.len * sh.heads * sh.width) {
        const int64_t r = i / sh.width, j = i % sh.width;
        int64_t li;
        const int64_t at = land(sh, r, &li) + j;
        const double L = (double)lse_b[li] + (lse_lo_b ? (double)lse_lo_b[li] : 0.0);
        float tmp[3], den[2];
        int64_t k = 0;
        if (j < n) {
            const int kind = ctxpar_bins_attn_terms(L, out_b + r * n + j, 1, 1, tmp, &k, den);
            if (kind < 0)
                ctxpar_bins_put_special(v.special + at, NAN);
            if (kind <= 0)
                continue;
            for (int part = 0; part < 3; part++)
                ctxpar_bins_add_term(v, at, tmp[part], k);
        } else {
            const int kind = ctxpar_bins_attn_terms(L, out_b + r * n, 1, 0, tmp, &k, den);
            if (kind < 0)
                ctxpar_bins_put_special(v.special + at, (float)L);
            if (kind <= 0)
                continue;
            ctxpar_bins_add_term(v, at, den[0], k);
            ctxpar_bins_add_term(v, at, den[1], k);
        }
    }
}

__global__ void merge_kernel(void *dst, const void *src, int64_t rows, int64_t width) {
    const ctxpar_bins_view to = ctxpar_bins_at(dst, rows, width);
    const ctxpar_bins_view from = ctxpar_bins_at(const_cast<void *>(src), rows, width); // read
    GRID_STRIDE(i, rows * width) {
        ctxpar_bins_merge_value(to, i, from, i);
    }
}

__global__ void finish_kernel(const void *bins, int64_t rows, int64_t width, float *dst) {
    const ctxpar_bins_view v = ctxpar_bins_at(const_cast<void *>(bins), rows, width);
    GRID_STRIDE(i, rows * width) {
        dst[i] = (float)ctxpar_bins_value(v, i);
    }
}

// One thread per row. The LSE double is stored as the CPU's ctxpar_cpu_store_lse stores it:
// lse = (float)L, lse_lo = (float)(L - lse) (0 where lse is infinite).
__global__ void finish_attn_kernel(const void *bins, ctxpar_bins_shape sh, float *out, float *lse,
                                   float *lse_lo) {
    const int64_t rows = sh.batch * sh.seq * sh.heads, width = sh.width;
    const ctxpar_bins_view v = ctxpar_bins_at(const_cast<void *>(bins), rows, width);
    GRID_STRIDE(r, rows) {
        const int64_t h = r % sh.heads, s = (r / sh.heads) % sh.seq, b = r / (sh.heads * sh.seq);
        const int64_t li = (b * sh.heads + h) * sh.seq + s;
        const double L = ctxpar_bins_finish_attn_row(v, r * width, width, out + r * (width - 1), 1);
        const float hi = (float)L;
        lse[li] = hi;
        if (lse_lo)
            lse_lo[li] = isinf(hi) ? 0.0f : (float)(L - (double)hi);
    }
}

} // namespace
} // namespace ctxpar_cuda_bins

using namespace ctxpar_cuda_bins;

extern "C" cudaError_t ctxpar_cuda_launch_bins_clear(void *bins, int64_t rows, int64_t width,
                                                     cudaStream_t stream) {
    clear_kernel<<<blocks_for(rows * width), kThreads, 0, stream>>>(bins, rows, width);
    return cudaGetLastError();
}

extern "C" cudaError_t ctxpar_cuda_launch_bins_add(void *bins, const float *src,
                                                   ctxpar_bins_shape shape, cudaStream_t stream) {
    const int64_t n = shape.batch * shape.len * shape.heads * shape.width;
    add_kernel<<<blocks_for(n), kThreads, 0, stream>>>(bins, src, shape);
    return cudaGetLastError();
}

extern "C" cudaError_t ctxpar_cuda_launch_bins_add_attn(void *bins, const float *out_b,
                                                        const float *lse_b, const float *lse_lo_b,
                                                        ctxpar_bins_shape shape,
                                                        cudaStream_t stream) {
    const int64_t n = shape.batch * shape.len * shape.heads * shape.width;
    add_attn_kernel<<<blocks_for(n), kThreads, 0, stream>>>(bins, out_b, lse_b, lse_lo_b, shape);
    return cudaGetLastError();
}

extern "C" cudaError_t ctxpar_cuda_launch_bins_merge(void *dst, const void *src, int64_t rows,
                                                     int64_t width, cudaStream_t stream) {
    merge_kernel<<<blocks_for(rows * width), kThreads, 0, stream>>>(dst, src, rows, width);
    return cudaGetLastError();
}

extern "C" cudaError_t ctxpar_cuda_launch_bins_finish(const void *bins, int64_t rows, int64_t width,
                                                      float *dst, cudaStream_t stream) {
    finish_kernel<<<blocks_for(rows * width), kThreads, 0, stream>>>(bins, rows, width, dst);
    return cudaGetLastError();
}

extern "C" cudaError_t ctxpar_cuda_launch_bins_finish_attn(const void *bins,
                                                           ctxpar_bins_shape shape, float *out,
                                                           float *lse, float *lse_lo,
                                                           cudaStream_t stream) {
    const int64_t rows = shape.batch * shape.seq * shape.heads;
    finish_attn_kernel<<<blocks_for(rows), kThreads, 0, stream>>>(bins, shape, out, lse, lse_lo);
    return cudaGetLastError();
}
