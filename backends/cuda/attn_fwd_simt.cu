// Block attention forward on CUDA cores in F32 (the path for F32 inputs and for 16-bit inputs
// whose head_dim is not a multiple of 8), and the forward launcher that picks a path.
#include <math.h>

#include "cuda_kernels.h"
#include "dtype.cuh"
#include "merge.cuh"
#include "simt_tile.cuh"
#include "tile.cuh"

namespace ctxpar_cuda {
namespace {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr int kPLd = kSimtRows + 1; // row stride of the P tile

/*
 * One thread block: 32 query rows of one (batch, query head) against all Sk keys, key tiles of
 * 32 in increasing order, online softmax in F32.
 *   q [B, Sq, Hq, D]   k, v [B, Sk, Hkv, D]   (T any dtype, D <= 256)
 *   out_acc [B, Sq, Hq, D] F32, lse_acc [B, Hq, Sq] F32: overwritten or merged (merge)
 * grid = (ceil(Sq / 32), Hq, B), block = 256: thread (r, c) owns query row r, the scores of keys
 * c, c + 8, c + 16, c + 24 and the output columns c, c + 8, ...
 * Dynamic shared memory: Q, K, V tiles [32][D | 1] F32 and the P tile [32][33].
 * Masked pairs are selected away, never multiplied by 0: their score is -inf and their P exactly
 * 0 by selection (whatever Q.K gave, NaN included), and P V keeps the accumulator as it was for
 * them (0 x NaN or 0 x inf from a V row the query does not see would be NaN).
 */
template <typename T>
__global__ void __launch_bounds__(kSimtThreads)
    attn_fwd_simt_kernel(const ctxpar_cuda_attn_args a, float *out_acc, float *lse_acc, int merge) {
    extern __shared__ float smem[];
    __shared__ tile_rows<kSimtRows, true> qrows;
    __shared__ tile_rows<kSimtRows, false> krows;
    const int D = (int)a.head_dim, ld = simt_ld(D);
    float *sq = smem, *sk = sq + kSimtRows * ld, *sv = sk + kSimtRows * ld;
    float *sp = sv + kSimtRows * ld;

    const int64_t Sq = a.seq_q, Sk = a.seq_k;
    const int64_t q0 = (int64_t)blockIdx.x * kSimtRows;
    const int64_t h = blockIdx.y, b = blockIdx.z;
    const int64_t hk = h / (a.heads_q / a.heads_kv);
    const int r = threadIdx.x / 8, c = threadIdx.x % 8;
    const bool full = a.block_full != 0;
    const T *qg = (const T *)a.q.data + b * a.q.stride[0] + h * a.q.stride[2];
    const T *kg = (const T *)a.k.data + b * a.k.stride[0] + hk * a.k.stride[2];
    const T *vg = (const T *)a.v.data + b * a.v.stride[0] + hk * a.v.stride[2];

    if (!full)
        fill_tile_rows(qrows, a.q_pos, a.mask, q0, Sq);
    load_rows_f32(sq, qg, a.q.stride[1], q0, Sq, D);

    const float scale_log2 = a.scale * kLog2e;
    float m_run = -INFINITY, l_run = 0.0f;
    float o[kSimtMaxChunks];
#pragma unroll
    for (int j = 0; j < kSimtMaxChunks; j++)
        o[j] = 0.0f;

    for (int64_t k0 = 0; k0 < Sk; k0 += kSimtRows) {
        int cls = CTXPAR_BLOCK_FULL;
        if (!full) {
            fill_tile_rows(krows, a.k_pos, a.mask, k0, Sk);
            cls = tile_class(qrows, krows);
            if (cls == CTXPAR_BLOCK_SKIP && rest_is_masked(a, qrows, krows))
                break;
            if (cls == CTXPAR_BLOCK_SKIP)
                continue;
        } else {
            __syncthreads();
        }
        load_rows_f32(sk, kg, a.k.stride[1], k0, Sk, D);
        load_rows_f32(sv, vg, a.v.stride[1], k0, Sk, D);
        __syncthreads();

        float x[4];
        float mx = m_run;
        uint32_t seen = 0; // bit j: this row sees key j of the tile
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int j = c + 8 * i;
            const float *qr = sq + r * ld, *kr = sk + j * ld;
            float dot = 0.0f;
            for (int d = 0; d < D; d++)
                dot = fmaf(qr[d], kr[d], dot);
            bool vis = true;
            if (cls == CTXPAR_BLOCK_PARTIAL || k0 + kSimtRows > Sk) {
                vis = k0 + j < Sk;
                if (vis && cls == CTXPAR_BLOCK_PARTIAL)
                    vis = sees(qrows, r, krows.pos[j]);
            }
            const float v = vis ? dot * scale_log2 : -INFINITY;
            x[i] = v;
            mx = fmaxf(mx, v);
            // The 8 lanes of row r are lanes 8 (r % 4) .. 8 (r % 4) + 7 of this warp.
            const uint32_t lanes = __ballot_sync(0xffffffffu, vis);
            seen |= ((lanes >> (8 * (r % 4))) & 0xffu) << (8 * i);
        }
        mx = row_max8(mx);
        const float base = mx == -INFINITY ? 0.0f : mx;
        const float alpha = exp2f(m_run - base);
        m_run = mx;
        float psum = 0.0f;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const float p = (seen >> (c + 8 * i)) & 1u ? exp2f(x[i] - base) : 0.0f;
            sp[r * kPLd + c + 8 * i] = p;
            psum += p;
        }
        l_run = l_run * alpha + psum;
        __syncwarp(); // row r's P comes from the 8 lanes of this row, all in this warp

#pragma unroll
        for (int jj = 0; jj < kSimtMaxChunks; jj++) {
            const int d = c + 8 * jj;
            if (d < D) {
                float acc = o[jj] * alpha;
                for (int j = 0; j < kSimtRows; j++)
                    acc = (seen >> j) & 1u ? fmaf(sp[r * kPLd + j], sv[j * ld + d], acc) : acc;
                o[jj] = acc;
            }
        }
    }

    const float l = row_sum8(l_run);
    const int64_t row = q0 + r;
    const bool valid = row < Sq;
    const bool empty = l == 0.0f; // a NaN sum is a NaN row, not an empty one
    const float lse_b = empty ? -INFINITY : (m_run + log2f(l)) * kLn2;
    const float inv = empty ? 0.0f : 1.0f / l;
    float *lse_p = lse_acc + (b * a.heads_q + h) * Sq + row;
    float *out_p = out_acc + ((b * Sq + row) * a.heads_q + h) * (int64_t)D;
    merge_weights w = {0.0f, 1.0f, lse_b};
    if (valid && merge)
        w = merge_weights_of(*lse_p, lse_b);
    __syncwarp(); // the 8 lanes of the row have read lse_acc before lane c == 0 writes it
    if (!valid)
        return;
#pragma unroll
    for (int jj = 0; jj < kSimtMaxChunks; jj++) {
        const int d = c + 8 * jj;
        if (d < D) {
            // A row that saw nothing gives exactly 0, whatever o holds.
            const float val = empty ? 0.0f : o[jj] * inv;
            out_p[d] = merge ? merge_value(w, out_p[d], val) : val;
        }
    }
    if (c == 0)
        *lse_p = w.lse;
}

template <typename T>
cudaError_t launch_simt(const ctxpar_cuda_attn_args *a, float *out, float *lse, int merge,
                        cudaStream_t stream) {
    // The shared-memory limit was raised once at device creation (simt_fwd_configure).
    const size_t smem = ctxpar_cuda_simt_fwd_smem(a->head_dim);
    dim3 grid((unsigned)((a->seq_q + kSimtRows - 1) / kSimtRows), (unsigned)a->heads_q,
              (unsigned)a->batch);
    attn_fwd_simt_kernel<T><<<grid, kSimtThreads, smem, stream>>>(*a, out, lse, merge);
    return cudaGetLastError();
}

template <typename T> cudaError_t allowed_smem(size_t *bytes) {
    return lower_to_smem_limit(bytes, attn_fwd_simt_kernel<T>);
}

} // namespace
} // namespace ctxpar_cuda

extern "C" cudaError_t ctxpar_cuda_simt_fwd_configure(size_t limit, size_t *set_out) {
    using namespace ctxpar_cuda;
    return configure_smem(ctxpar_cuda_simt_fwd_smem(CTXPAR_CUDA_MAX_HEAD_DIM), limit, set_out,
                          [](auto t, size_t bytes) {
                              return set_smem_limit(bytes, attn_fwd_simt_kernel<decltype(t)>);
                          });
}

// In attn_bwd.cu: lowers *bytes to the smallest limit of the backward kernels.
cudaError_t ctxpar_cuda_simt_bwd_allowed(size_t *bytes);

extern "C" cudaError_t ctxpar_cuda_simt_smem_allowed(size_t *fwd_out, size_t *bwd_out) {
    using namespace ctxpar_cuda;
    size_t fwd = SIZE_MAX, bwd = SIZE_MAX;
    cudaError_t e = for_each_dtype([&](auto t) { return allowed_smem<decltype(t)>(&fwd); });
    if (e == cudaSuccess)
        e = ctxpar_cuda_simt_bwd_allowed(&bwd);
    if (e == cudaSuccess)
        *fwd_out = fwd, *bwd_out = bwd;
    return e;
}

extern "C" size_t ctxpar_cuda_simt_fwd_smem(int64_t head_dim) {
    using namespace ctxpar_cuda;
    const size_t ld = (size_t)simt_ld(head_dim);
    return sizeof(float) * (3 * kSimtRows * ld + (size_t)kSimtRows * kPLd);
}

extern "C" cudaError_t ctxpar_cuda_launch_attn_fwd(const ctxpar_cuda_attn_args *a,
                                                   ctxpar_cuda_fwd_path path, float *out_acc,
                                                   float *lse_acc, int merge, cudaStream_t stream) {
    using namespace ctxpar_cuda;
    if (path == CTXPAR_CUDA_FWD_MMA)
        return ctxpar_cuda_launch_attn_fwd_mma(a, out_acc, lse_acc, merge, stream);
    return CTXPAR_CUDA_DISPATCH_DTYPE(a->dtype, launch_simt, a, out_acc, lse_acc, merge, stream);
}
