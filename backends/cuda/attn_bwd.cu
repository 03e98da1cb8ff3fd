// Block attention backward on CUDA cores in F32, deterministic: no atomics. dK/dV are owned by
// key tiles that loop over the query tiles (and over the query heads of a GQA group in order);
// dQ is owned by query tiles that loop over the key tiles. P and dS are recomputed in each.
// Masked pairs are selected away, never multiplied by 0: P and dS are exactly 0 there by
// selection, and every product (dV += P^T dO, dK += dS^T Q, dQ += dS K) keeps its accumulator as
// it was for them, so a NaN or inf in a row the pair does not see (0 x NaN = NaN) never leaks.
#include <math.h>

#include "cuda_kernels.h"
#include "dtype.cuh"
#include "simt_tile.cuh"
#include "tile.cuh"

namespace ctxpar_cuda {
namespace {

constexpr float kLog2e = 1.4426950408889634f;
constexpr int kPLd = kSimtRows + 1;

// Shared memory of both kernels: Q, dO, K, V tiles [32][D | 1] and P, dS [32][33], F32.
struct bwd_smem {
    float *sq, *sdo, *sk, *sv, *sp, *sds;
};

__device__ __forceinline__ bwd_smem carve_bwd_smem(float *base, int ld) {
    bwd_smem s;
    s.sq = base;
    s.sdo = s.sq + kSimtRows * ld;
    s.sk = s.sdo + kSimtRows * ld;
    s.sv = s.sk + kSimtRows * ld;
    s.sp = s.sv + kSimtRows * ld;
    s.sds = s.sp + kSimtRows * kPLd;
    return s;
}

/*
 * P and dS of one (32 query rows) x (32 keys) tile pair into sp/sds [query][key]:
 *   P = exp(scale q.k - lse) (0 where masked, for padding rows/keys and for rows with lse -inf)
 *   dS = P (dO.v - delta)
 * and s_vis[query] (bit = key) the pairs that count: the products select on it. Thread (r, c)
 * does query row r and keys c, c + 8, c + 16, c + 24. q0/k0 are the first local rows of the
 * tiles, for the bounds.
 */
__device__ __forceinline__ void p_ds_tile(const ctxpar_cuda_attn_args &a, const bwd_smem &s, int ld,
                                          const float *s_lse, const float *s_delta, uint32_t *s_vis,
                                          int cls, const tile_rows<kSimtRows, true> &qrows,
                                          const tile_rows<kSimtRows, false> &krows, int64_t q0,
                                          int64_t k0) {
    const int D = (int)a.head_dim;
    const int r = threadIdx.x / 8, c = threadIdx.x % 8;
    const bool row_ok = q0 + r < a.seq_q && s_lse[r] != -INFINITY;
    const float lse_log2 = s_lse[r] * kLog2e;
    const float scale_log2 = a.scale * kLog2e;
    uint32_t seen = 0;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int j = c + 8 * i;
        bool vis = row_ok && k0 + j < a.seq_k;
        if (vis && cls == CTXPAR_BLOCK_PARTIAL)
            vis = sees(qrows, r, krows.pos[j]);
        float p = 0.0f, ds = 0.0f;
        if (vis) {
            const float *qr = s.sq + r * ld, *kr = s.sk + j * ld;
            const float *dor = s.sdo + r * ld, *vr = s.sv + j * ld;
            float dot = 0.0f, dp = 0.0f;
            for (int d = 0; d < D; d++) {
                dot = fmaf(qr[d], kr[d], dot);
                dp = fmaf(dor[d], vr[d], dp);
            }
            p = exp2f(dot * scale_log2 - lse_log2);
            ds = p * (dp - s_delta[r]);
        }
        s.sp[r * kPLd + j] = p;
        s.sds[r * kPLd + j] = ds;
        // The 8 lanes of row r are lanes 8 (r % 4) .. 8 (r % 4) + 7 of this warp.
        const uint32_t lanes = __ballot_sync(0xffffffffu, vis);
        seen |= ((lanes >> (8 * (r % 4))) & 0xffu) << (8 * i);
    }
    if (c == 0)
        s_vis[r] = seen;
}

// lse and delta of query rows [q0, q0 + 32) of head h; padding rows get lse -inf (P = 0).
__device__ __forceinline__ void load_row_stats(float *s_lse, float *s_delta,
                                               const ctxpar_cuda_attn_args &a,
                                               const ctxpar_cuda_bwd_args &g, int64_t b, int64_t h,
                                               int64_t q0) {
    if (threadIdx.x < kSimtRows) {
        const int64_t row = q0 + threadIdx.x;
        const int64_t idx = (b * a.heads_q + h) * a.seq_q + row;
        s_lse[threadIdx.x] = row < a.seq_q ? g.lse[idx] : -INFINITY;
        s_delta[threadIdx.x] = row < a.seq_q ? g.delta[idx] : 0.0f;
    }
}

/*
 * dK, dV of one key tile: keys [k0, k0 + 32) of one (batch, K/V head) against every query row
 * of the Hq / Hkv query heads that share the K/V head, in head order, query tiles in order.
 *   q, dout [B, Sq, Hq, D]   k, v [B, Sk, Hkv, D]   lse, delta [B, Hq, Sq]
 *   dk_acc, dv_acc [B, Sk, Hkv, D] F32 (+=, either may be NULL)
 * grid = (ceil(Sk / 32), Hkv, B), block = 256: thread (kr, c) owns key kr, columns c, c + 8, ...
 */
template <typename T>
__global__ void __launch_bounds__(kSimtThreads)
    attn_bwd_dkdv_kernel(const ctxpar_cuda_attn_args a, const ctxpar_cuda_bwd_args g) {
    extern __shared__ float smem[];
    __shared__ tile_rows<kSimtRows, true> qrows;
    __shared__ tile_rows<kSimtRows, false> krows;
    __shared__ float s_lse[kSimtRows], s_delta[kSimtRows];
    __shared__ uint32_t s_vis[kSimtRows];
    const int D = (int)a.head_dim, ld = simt_ld(D);
    const bwd_smem s = carve_bwd_smem(smem, ld);
    const int64_t k0 = (int64_t)blockIdx.x * kSimtRows;
    const int64_t hk = blockIdx.y, b = blockIdx.z;
    const int64_t group = a.heads_q / a.heads_kv;
    const int kr = threadIdx.x / 8, c = threadIdx.x % 8;
    const bool full = a.block_full != 0;

    const T *kg = (const T *)a.k.data + b * a.k.stride[0] + hk * a.k.stride[2];
    const T *vg = (const T *)a.v.data + b * a.v.stride[0] + hk * a.v.stride[2];
    if (!full)
        fill_tile_rows(krows, a.k_pos, a.mask, k0, a.seq_k);
    load_rows_f32(s.sk, kg, a.k.stride[1], k0, a.seq_k, D);
    load_rows_f32(s.sv, vg, a.v.stride[1], k0, a.seq_k, D);

    float dk[kSimtMaxChunks], dv[kSimtMaxChunks];
#pragma unroll
    for (int jj = 0; jj < kSimtMaxChunks; jj++)
        dk[jj] = dv[jj] = 0.0f;

    for (int64_t hh = 0; hh < group; hh++) {
        const int64_t h = hk * group + hh;
        const T *qg = (const T *)a.q.data + b * a.q.stride[0] + h * a.q.stride[2];
        const T *dog = (const T *)g.dout.data + b * g.dout.stride[0] + h * g.dout.stride[2];
        for (int64_t q0 = 0; q0 < a.seq_q; q0 += kSimtRows) {
            int cls = CTXPAR_BLOCK_FULL;
            if (!full) {
                fill_tile_rows(qrows, a.q_pos, a.mask, q0, a.seq_q);
                cls = tile_class(qrows, krows);
                if (cls == CTXPAR_BLOCK_SKIP)
                    continue;
            } else {
                __syncthreads(); // the previous tile's sq/sdo/sp/sds are no longer read
            }
            load_rows_f32(s.sq, qg, a.q.stride[1], q0, a.seq_q, D);
            load_rows_f32(s.sdo, dog, g.dout.stride[1], q0, a.seq_q, D);
            load_row_stats(s_lse, s_delta, a, g, b, h, q0);
            __syncthreads();
            p_ds_tile(a, s, ld, s_lse, s_delta, s_vis, cls, qrows, krows, q0, k0);
            __syncthreads();
            for (int q = 0; q < kSimtRows; q++) {
                const float p = s.sp[q * kPLd + kr], ds = s.sds[q * kPLd + kr];
                const bool seen = (s_vis[q] >> kr) & 1u;
#pragma unroll
                for (int jj = 0; jj < kSimtMaxChunks; jj++) {
                    const int d = c + 8 * jj;
                    if (d < D) {
                        dv[jj] = seen ? fmaf(p, s.sdo[q * ld + d], dv[jj]) : dv[jj];
                        dk[jj] = seen ? fmaf(ds, s.sq[q * ld + d], dk[jj]) : dk[jj];
                    }
                }
            }
        }
    }

    const int64_t key = k0 + kr;
    if (key >= a.seq_k)
        return;
    const int64_t off = ((b * a.seq_k + key) * a.heads_kv + hk) * (int64_t)D;
#pragma unroll
    for (int jj = 0; jj < kSimtMaxChunks; jj++) {
        const int d = c + 8 * jj;
        if (d < D) {
            if (g.dk)
                g.dk[off + d] += a.scale * dk[jj];
            if (g.dv)
                g.dv[off + d] += dv[jj];
        }
    }
}

/*
 * dQ of one query tile: rows [q0, q0 + 32) of one (batch, query head) against every key tile in
 * order.
 *   q, dout [B, Sq, Hq, D]   k, v [B, Sk, Hkv, D]   lse, delta [B, Hq, Sq]
 *   dq_acc [B, Sq, Hq, D] F32 (+=)
 * grid = (ceil(Sq / 32), Hq, B), block = 256: thread (r, c) owns row r, columns c, c + 8, ...
 */
template <typename T>
__global__ void __launch_bounds__(kSimtThreads)
    attn_bwd_dq_kernel(const ctxpar_cuda_attn_args a, const ctxpar_cuda_bwd_args g) {
    extern __shared__ float smem[];
    __shared__ tile_rows<kSimtRows, true> qrows;
    __shared__ tile_rows<kSimtRows, false> krows;
    __shared__ float s_lse[kSimtRows], s_delta[kSimtRows];
    __shared__ uint32_t s_vis[kSimtRows];
    const int D = (int)a.head_dim, ld = simt_ld(D);
    const bwd_smem s = carve_bwd_smem(smem, ld);
    const int64_t q0 = (int64_t)blockIdx.x * kSimtRows;
    const int64_t h = blockIdx.y, b = blockIdx.z;
    const int64_t hk = h / (a.heads_q / a.heads_kv);
    const int r = threadIdx.x / 8, c = threadIdx.x % 8;
    const bool full = a.block_full != 0;

    const T *qg = (const T *)a.q.data + b * a.q.stride[0] + h * a.q.stride[2];
    const T *dog = (const T *)g.dout.data + b * g.dout.stride[0] + h * g.dout.stride[2];
    const T *kg = (const T *)a.k.data + b * a.k.stride[0] + hk * a.k.stride[2];
    const T *vg = (const T *)a.v.data + b * a.v.stride[0] + hk * a.v.stride[2];
    if (!full)
        fill_tile_rows(qrows, a.q_pos, a.mask, q0, a.seq_q);
    load_rows_f32(s.sq, qg, a.q.stride[1], q0, a.seq_q, D);
    load_rows_f32(s.sdo, dog, g.dout.stride[1], q0, a.seq_q, D);
    load_row_stats(s_lse, s_delta, a, g, b, h, q0);

    float dq[kSimtMaxChunks];
#pragma unroll
    for (int jj = 0; jj < kSimtMaxChunks; jj++)
        dq[jj] = 0.0f;

    for (int64_t k0 = 0; k0 < a.seq_k; k0 += kSimtRows) {
        int cls = CTXPAR_BLOCK_FULL;
        if (!full) {
            fill_tile_rows(krows, a.k_pos, a.mask, k0, a.seq_k);
            cls = tile_class(qrows, krows);
            if (cls == CTXPAR_BLOCK_SKIP && rest_is_masked(a, qrows, krows))
                break;
            if (cls == CTXPAR_BLOCK_SKIP)
                continue;
        } else {
            __syncthreads();
        }
        load_rows_f32(s.sk, kg, a.k.stride[1], k0, a.seq_k, D);
        load_rows_f32(s.sv, vg, a.v.stride[1], k0, a.seq_k, D);
        __syncthreads();
        p_ds_tile(a, s, ld, s_lse, s_delta, s_vis, cls, qrows, krows, q0, k0);
        __syncwarp(); // row r's dS and s_vis come from the 8 lanes of this row, all in this warp
        const uint32_t seen = s_vis[r];
#pragma unroll
        for (int jj = 0; jj < kSimtMaxChunks; jj++) {
            const int d = c + 8 * jj;
            if (d < D) {
                float acc = dq[jj];
                for (int j = 0; j < kSimtRows; j++)
                    acc = (seen >> j) & 1u ? fmaf(s.sds[r * kPLd + j], s.sk[j * ld + d], acc) : acc;
                dq[jj] = acc;
            }
        }
    }

    const int64_t row = q0 + r;
    if (row >= a.seq_q)
        return;
    float *dq_p = g.dq + ((b * a.seq_q + row) * a.heads_q + h) * (int64_t)D;
#pragma unroll
    for (int jj = 0; jj < kSimtMaxChunks; jj++) {
        const int d = c + 8 * jj;
        if (d < D)
            dq_p[d] += a.scale * dq[jj];
    }
}

template <typename T>
cudaError_t launch_bwd(const ctxpar_cuda_attn_args *a, const ctxpar_cuda_bwd_args *g,
                       cudaStream_t stream) {
    // The shared-memory limit was raised once at device creation (simt_bwd_configure).
    const size_t smem = ctxpar_cuda_simt_bwd_smem(a->head_dim);
    cudaError_t e;
    if (g->dk || g->dv) {
        dim3 grid((unsigned)((a->seq_k + kSimtRows - 1) / kSimtRows), (unsigned)a->heads_kv,
                  (unsigned)a->batch);
        attn_bwd_dkdv_kernel<T><<<grid, kSimtThreads, smem, stream>>>(*a, *g);
        if ((e = cudaGetLastError()) != cudaSuccess)
            return e;
    }
    if (g->dq) {
        dim3 grid((unsigned)((a->seq_q + kSimtRows - 1) / kSimtRows), (unsigned)a->heads_q,
                  (unsigned)a->batch);
        attn_bwd_dq_kernel<T><<<grid, kSimtThreads, smem, stream>>>(*a, *g);
        if ((e = cudaGetLastError()) != cudaSuccess)
            return e;
    }
    return cudaSuccess;
}

template <typename T> cudaError_t allowed_smem(size_t *bytes) {
    return lower_to_smem_limit(bytes, attn_bwd_dkdv_kernel<T>, attn_bwd_dq_kernel<T>);
}

} // namespace
} // namespace ctxpar_cuda

extern "C" cudaError_t ctxpar_cuda_simt_bwd_configure(size_t limit, size_t *set_out) {
    using namespace ctxpar_cuda;
    return configure_smem(ctxpar_cuda_simt_bwd_smem(CTXPAR_CUDA_MAX_HEAD_DIM), limit, set_out,
                          [](auto t, size_t bytes) {
                              using T = decltype(t);
                              return set_smem_limit(bytes, attn_bwd_dkdv_kernel<T>,
                                                    attn_bwd_dq_kernel<T>);
                          });
}

// For ctxpar_cuda_simt_smem_allowed (attn_fwd_simt.cu).
cudaError_t ctxpar_cuda_simt_bwd_allowed(size_t *bytes) {
    using namespace ctxpar_cuda;
    return for_each_dtype([&](auto t) { return allowed_smem<decltype(t)>(bytes); });
}

extern "C" size_t ctxpar_cuda_simt_bwd_smem(int64_t head_dim) {
    using namespace ctxpar_cuda;
    const size_t ld = (size_t)simt_ld(head_dim);
    return sizeof(float) * (4 * kSimtRows * ld + 2 * (size_t)kSimtRows * kPLd);
}

extern "C" cudaError_t ctxpar_cuda_launch_attn_bwd(const ctxpar_cuda_attn_args *a,
                                                   const ctxpar_cuda_bwd_args *g,
                                                   cudaStream_t stream) {
    using namespace ctxpar_cuda;
    return CTXPAR_CUDA_DISPATCH_DTYPE(a->dtype, launch_bwd, a, g, stream);
}
