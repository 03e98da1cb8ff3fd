// Block attention forward on tensor cores (mma.sync m16n8k16, sm_80+), F16/BF16 inputs, F32
// accumulation, flash-attention style online softmax.
#include <math.h>

#include "cuda_kernels.h"
#include "dtype.cuh"
#include "merge.cuh"
#include "mma.cuh"
#include "tile.cuh"

namespace ctxpar_cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kBlockQ = 16 * kWarps; // each warp owns 16 query rows
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// The two 16-bit values of w with every infinity and NaN (all of `ebits` set) replaced by +0;
// sets `bad` when there was one.
__device__ __forceinline__ uint32_t finite_or_zero(uint32_t w, uint16_t ebits, bool &bad) {
    uint32_t keep = 0;
    if ((w & ebits) != ebits)
        keep |= 0xffffu;
    else
        bad = true;
    if (((w >> 16) & ebits) != ebits)
        keep |= 0xffff0000u;
    else
        bad = true;
    return w & keep;
}

// Copies rows [row0, row0 + ROWS) of a [*, D] 16-bit matrix (row stride in elements) into
// shared memory with row stride LD, columns DP; rows past `total` and columns past D are zero,
// so they add nothing to a product. D % 8 == 0. With bad_rows, infinities and NaNs (exponent
// bits `ebits`) are stored as 0 and bit r of *bad_rows is set for each row r that had one.
template <int ROWS, int DP, int LD>
__device__ __forceinline__ void
load_rows(uint16_t *dst, const uint16_t *src, int64_t row_stride, int64_t row0, int64_t total,
          int D, bool vec16, uint16_t ebits = 0, unsigned long long *bad_rows = nullptr) {
    static_assert(ROWS <= 64, "bad_rows has one bit per row");
    constexpr int kChunks = DP / 8; // 8 elements = 16 bytes
    for (int idx = threadIdx.x; idx < ROWS * kChunks; idx += kThreads) {
        int r = idx / kChunks, c = idx % kChunks;
        int64_t row = row0 + r;
        uint4 val = make_uint4(0, 0, 0, 0);
        if (row < total && c * 8 < D) {
            const uint16_t *p = src + row * row_stride + c * 8;
            if (vec16) {
                val = *reinterpret_cast<const uint4 *>(p);
            } else {
                val.x = join_pair(p[0], p[1]);
                val.y = join_pair(p[2], p[3]);
                val.z = join_pair(p[4], p[5]);
                val.w = join_pair(p[6], p[7]);
            }
            if (bad_rows) {
                bool bad = false;
                val.x = finite_or_zero(val.x, ebits, bad);
                val.y = finite_or_zero(val.y, ebits, bad);
                val.z = finite_or_zero(val.z, ebits, bad);
                val.w = finite_or_zero(val.w, ebits, bad);
                if (bad)
                    atomicOr(bad_rows, 1ull << r);
            }
        }
        *reinterpret_cast<uint4 *>(dst + r * LD + c * 8) = val;
    }
}

/*
 * O += P V for the infinities and NaNs of V that load_rows replaced by 0 (keys `bad`, a bit per
 * key of the tile), for the pairs this thread's rows see: a warp's rows g and g + 8 (local rl0,
 * rl1), O columns 8j + 2t, 8j + 2t + 1. seen: bit 4n + e of this thread's scores was visible;
 * pa: P as the MMA took it. Called by every thread of the block; ps (kBlockQ x BK 16-bit, may
 * alias the K tile) holds P while it runs.
 */
template <typename T, int DP, int BK>
__device__ void add_nonfinite_v(float (&o)[DP / 8][4], const uint32_t (&pa)[BK / 16][4],
                                uint32_t seen, unsigned long long bad, uint16_t *ps,
                                const uint16_t *vg, int64_t v_stride, int64_t k0, int D, int rl0,
                                int rl1, int t) {
    // This thread's visibility bits, gathered over the quad that shares rows g and g + 8.
    unsigned long long vis0 = 0, vis1 = 0;
#pragma unroll
    for (int n = 0; n < BK / 8; n++) {
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const unsigned long long bit = (unsigned long long)((seen >> (4 * n + e)) & 1u)
                                           << (n * 8 + 2 * t + (e & 1));
            if (e < 2)
                vis0 |= bit;
            else
                vis1 |= bit;
        }
    }
#pragma unroll
    for (int x = 1; x <= 2; x <<= 1) {
        vis0 |= __shfl_xor_sync(0xffffffffu, vis0, x);
        vis1 |= __shfl_xor_sync(0xffffffffu, vis1, x);
    }
    __syncthreads(); // every warp is done with the K tile that ps overwrites
#pragma unroll
    for (int kc = 0; kc < BK / 16; kc++) {
        *reinterpret_cast<uint32_t *>(ps + rl0 * BK + kc * 16 + 2 * t) = pa[kc][0];
        *reinterpret_cast<uint32_t *>(ps + rl1 * BK + kc * 16 + 2 * t) = pa[kc][1];
        *reinterpret_cast<uint32_t *>(ps + rl0 * BK + kc * 16 + 8 + 2 * t) = pa[kc][2];
        *reinterpret_cast<uint32_t *>(ps + rl1 * BK + kc * 16 + 8 + 2 * t) = pa[kc][3];
    }
    __syncwarp(); // a warp reads back only its own rows
    const uint16_t ebits = exponent_bits<T>();
    for (unsigned long long m = bad; m; m &= m - 1) {
        const int col = __ffsll((long long)m) - 1;
        const bool see0 = (vis0 >> col) & 1u, see1 = (vis1 >> col) & 1u;
        const float p0 = bits_to_f32<T>(ps[rl0 * BK + col]);
        const float p1 = bits_to_f32<T>(ps[rl1 * BK + col]);
        const uint16_t *vr = vg + (k0 + col) * v_stride;
#pragma unroll
        for (int j = 0; j < DP / 8; j++) {
            if (j * 8 < D) {
                const int d = j * 8 + 2 * t;
                const uint16_t u0 = vr[d], u1 = vr[d + 1];
                const bool nf0 = (u0 & ebits) == ebits, nf1 = (u1 & ebits) == ebits;
                const float v0 = bits_to_f32<T>(u0), v1 = bits_to_f32<T>(u1);
                if (see0 && nf0)
                    o[j][0] += p0 * v0;
                if (see0 && nf1)
                    o[j][1] += p0 * v1;
                if (see1 && nf0)
                    o[j][2] += p1 * v0;
                if (see1 && nf1)
                    o[j][3] += p1 * v1;
            }
        }
    }
}

/*
 * One thread block: kBlockQ query rows of one (batch, query head) against all Sk keys, in key
 * tiles of BK visited in increasing order.
 *   q     [B, Sq, Hq, D]   k, v [B, Sk, Hkv, D]   (T = __half or __nv_bfloat16, D % 8 == 0,
 *                                                  D <= DP)
 *   out_acc [B, Sq, Hq, D] F32, lse_acc [B, Hq, Sq] F32: overwritten or merged (merge)
 * grid = (ceil(Sq / kBlockQ), Hq, B), block = kThreads. Warp w owns rows 16w..16w+15 of the
 * tile; Q fragments stay in registers, K and V tiles pass through shared memory (row stride
 * DP + 8 halves: 16-byte aligned rows whose fragment loads hit distinct banks).
 *
 * Masks and non-finite values: a masked pair's score is -inf and its P exactly 0 by selection,
 * whatever Q.K gave (a NaN in a K row only reaches its own column of S, which the select
 * overwrites). P V cannot select inside the MMA, where P = 0 times a NaN or inf in V is NaN, so
 * in a PARTIAL tile load_rows stores V's non-finite values as 0 (the MMA then adds exact zeros
 * for them) and add_nonfinite_v adds them back, p * v, for exactly the pairs that see them. A
 * finite output element never depends on that path: its bits are those of the plain MMA.
 * FULL tiles need none of it (every pair is seen), and their tail keys are zero rows.
 */
template <typename T, int DP, int BK>
__global__ void __launch_bounds__(kThreads)
    attn_fwd_mma_kernel(const ctxpar_cuda_attn_args a, float *out_acc, float *lse_acc, int merge) {
    constexpr int LD = DP + 8;
    constexpr int kKvElems = 2 * BK * LD;
    constexpr int kQElems = kBlockQ * LD;
    constexpr int kSmemElems = kKvElems > kQElems ? kKvElems : kQElems;
    __shared__ __align__(16) uint16_t smem[kSmemElems];
    __shared__ tile_rows<kBlockQ, true> qrows;
    __shared__ tile_rows<BK, false> krows;
    __shared__ unsigned long long bad_rows; // keys of the tile whose V row has a non-finite value
    static_assert(kBlockQ <= LD, "P of a tile (kBlockQ x BK) fits where the K tile was");
    static_assert(BK / 8 * 4 <= 32, "a thread's scores of a tile fit in one 32-bit mask");

    const int D = (int)a.head_dim;
    const int64_t Sq = a.seq_q, Sk = a.seq_k;
    const int64_t q0 = (int64_t)blockIdx.x * kBlockQ;
    const int64_t h = blockIdx.y, b = blockIdx.z;
    const int64_t hk = h / (a.heads_q / a.heads_kv);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int g = lane / 4, t = lane % 4;
    const bool full = a.block_full != 0;

    const uint16_t *qg = (const uint16_t *)a.q.data + b * a.q.stride[0] + h * a.q.stride[2];
    const uint16_t *kg = (const uint16_t *)a.k.data + b * a.k.stride[0] + hk * a.k.stride[2];
    const uint16_t *vg = (const uint16_t *)a.v.data + b * a.v.stride[0] + hk * a.v.stride[2];
    const bool vec16 = a.aligned16 != 0;

    if (threadIdx.x == 0)
        bad_rows = 0; // ordered before the first use by the barrier after the Q staging
    if (!full)
        fill_tile_rows(qrows, a.q_pos, a.mask, q0, Sq);

    // Q tile -> registers (A fragments), staged through shared memory.
    load_rows<kBlockQ, DP, LD>(smem, qg, a.q.stride[1], q0, Sq, D, vec16);
    __syncthreads();
    uint32_t qa[DP / 16][4];
    {
        const uint16_t *r0 = smem + (warp * 16 + g) * LD + 2 * t;
#pragma unroll
        for (int kc = 0; kc < DP / 16; kc++) {
            qa[kc][0] = ld_pair(r0 + kc * 16);
            qa[kc][1] = ld_pair(r0 + 8 * LD + kc * 16);
            qa[kc][2] = ld_pair(r0 + kc * 16 + 8);
            qa[kc][3] = ld_pair(r0 + 8 * LD + kc * 16 + 8);
        }
    }

    uint16_t *sk = smem;
    uint16_t *sv = smem + BK * LD;
    const float scale_log2 = a.scale * kLog2e; // scores in log2 units: exp2 is one instruction
    float m_run[2] = {-INFINITY, -INFINITY};   // rows g and g + 8 of this warp
    float l_run[2] = {0.0f, 0.0f};             // this thread's part of the row sums
    float o[DP / 8][4];
#pragma unroll
    for (int j = 0; j < DP / 8; j++)
        o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
    const int rl0 = warp * 16 + g, rl1 = rl0 + 8; // local rows of this thread

    for (int64_t k0 = 0; k0 < Sk; k0 += BK) {
        int cls = CTXPAR_BLOCK_FULL;
        if (!full) {
            fill_tile_rows(krows, a.k_pos, a.mask, k0, Sk); // also the barrier for sk/sv reuse
            cls = tile_class(qrows, krows);
            if (cls == CTXPAR_BLOCK_SKIP && rest_is_masked(a, qrows, krows))
                break;
            if (cls == CTXPAR_BLOCK_SKIP)
                continue;
        } else {
            __syncthreads(); // every warp is done with the previous tile (and with Q staging)
        }
        const bool partial = cls == CTXPAR_BLOCK_PARTIAL;
        load_rows<BK, DP, LD>(sk, kg, a.k.stride[1], k0, Sk, D, vec16);
        load_rows<BK, DP, LD>(sv, vg, a.v.stride[1], k0, Sk, D, vec16, exponent_bits<T>(),
                              partial ? &bad_rows : nullptr);
        __syncthreads();

        // S = Q K^T for this warp's 16 rows and the BK keys.
        float s[BK / 8][4];
#pragma unroll
        for (int n = 0; n < BK / 8; n++)
            s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
        for (int kc = 0; kc < DP / 16; kc++) {
            if (kc * 16 < D) {
#pragma unroll
                for (int n = 0; n < BK / 8; n++) {
                    const uint16_t *kr = sk + (n * 8 + g) * LD + kc * 16 + 2 * t;
                    uint32_t bf[2] = {ld_pair(kr), ld_pair(kr + 8)};
                    mma_16816<T>(s[n], qa[kc], bf);
                }
            }
        }

        // Scale, mask, and the new running maximum of each row.
        const bool tail = k0 + BK > Sk;
        float mx[2] = {m_run[0], m_run[1]};
        uint32_t seen = 0xffffffffu; // bit 4n + e: score s[n][e] is of a visible pair
#pragma unroll
        for (int n = 0; n < BK / 8; n++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int rl = e < 2 ? rl0 : rl1;
                int col = n * 8 + 2 * t + (e & 1);
                float x = s[n][e] * scale_log2;
                if (partial || tail) {
                    bool vis = k0 + col < Sk;
                    if (vis && partial)
                        vis = sees(qrows, rl, krows.pos[col]);
                    if (!vis) {
                        x = -INFINITY;
                        seen &= ~(1u << (4 * n + e));
                    }
                }
                s[n][e] = x;
                mx[e / 2] = fmaxf(mx[e / 2], x);
            }
        }
        float alpha[2], base[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
            base[r] = mx[r] == -INFINITY ? 0.0f : mx[r]; // a row with nothing visible yet
            alpha[r] = exp2f(m_run[r] - base[r]);
            m_run[r] = mx[r];
        }

        // P = exp2(S - max), row sums, and P as A fragments (16-bit) for P V.
        uint32_t pa[BK / 16][4];
        float psum[2] = {0.0f, 0.0f};
#pragma unroll
        for (int n = 0; n < BK / 8; n++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                s[n][e] = (seen >> (4 * n + e)) & 1u ? exp2f(s[n][e] - base[e / 2]) : 0.0f;
                psum[e / 2] += s[n][e];
            }
        }
#pragma unroll
        for (int kc = 0; kc < BK / 16; kc++) {
            pa[kc][0] = pack2<T>(s[2 * kc][0], s[2 * kc][1]);
            pa[kc][1] = pack2<T>(s[2 * kc][2], s[2 * kc][3]);
            pa[kc][2] = pack2<T>(s[2 * kc + 1][0], s[2 * kc + 1][1]);
            pa[kc][3] = pack2<T>(s[2 * kc + 1][2], s[2 * kc + 1][3]);
        }
#pragma unroll
        for (int r = 0; r < 2; r++)
            l_run[r] = l_run[r] * alpha[r] + psum[r];

            // O = alpha O + P V.
#pragma unroll
        for (int j = 0; j < DP / 8; j++) {
            o[j][0] *= alpha[0];
            o[j][1] *= alpha[0];
            o[j][2] *= alpha[1];
            o[j][3] *= alpha[1];
            if (j * 8 < D) {
#pragma unroll
                for (int kc = 0; kc < BK / 16; kc++) {
                    const uint16_t *vr = sv + (kc * 16 + 2 * t) * LD + j * 8 + g;
                    uint32_t bf[2] = {join_pair(vr[0], vr[LD]), join_pair(vr[8 * LD], vr[9 * LD])};
                    mma_16816<T>(o[j], pa[kc], bf);
                }
            }
        }
        // Read after the barrier above and before the one in add_nonfinite_v: the same value in
        // every thread.
        const unsigned long long bad = partial ? bad_rows : 0ull;
        if (bad) { // rare: a PARTIAL tile with an infinity or a NaN in V
            add_nonfinite_v<T, DP, BK>(o, pa, seen, bad, sk, vg, a.v.stride[1], k0, D, rl0, rl1, t);
            if (threadIdx.x == 0)
                bad_rows = 0; // every thread read it before the barrier in add_nonfinite_v
        }
    }

    // Epilogue: finish the row sums across the quad, normalise, write or merge.
#pragma unroll
    for (int r = 0; r < 2; r++) {
        l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 1);
        l_run[r] += __shfl_xor_sync(0xffffffffu, l_run[r], 2);
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int64_t row = q0 + (r == 0 ? rl0 : rl1);
        const bool valid = row < Sq;
        const bool empty = l_run[r] == 0.0f; // a NaN sum is a NaN row, not an empty one
        const float lse_b = empty ? -INFINITY : (m_run[r] + log2f(l_run[r])) * kLn2;
        const float inv = empty ? 0.0f : 1.0f / l_run[r];
        float *lse_p = lse_acc + (b * a.heads_q + h) * Sq + row;
        float *out_p = out_acc + ((b * Sq + row) * a.heads_q + h) * (int64_t)D;
        merge_weights w = {0.0f, 1.0f, lse_b};
        if (valid && merge)
            w = merge_weights_of(*lse_p, lse_b);
        __syncwarp(); // the quad has read lse_acc before lane t == 0 writes it
        if (!valid)
            continue;
#pragma unroll
        for (int j = 0; j < DP / 8; j++) {
            int d = j * 8 + 2 * t;
            if (d < D) {
                // A row that saw nothing gives exactly 0, whatever o holds.
                float b0 = empty ? 0.0f : o[j][2 * r] * inv;
                float b1 = empty ? 0.0f : o[j][2 * r + 1] * inv;
                out_p[d] = merge ? merge_value(w, out_p[d], b0) : b0;
                out_p[d + 1] = merge ? merge_value(w, out_p[d + 1], b1) : b1;
            }
        }
        if (t == 0)
            *lse_p = w.lse;
    }
}

template <typename T, int DP, int BK>
cudaError_t launch_dp(const ctxpar_cuda_attn_args &a, float *out, float *lse, int merge,
                      cudaStream_t stream) {
    dim3 grid((unsigned)((a.seq_q + kBlockQ - 1) / kBlockQ), (unsigned)a.heads_q,
              (unsigned)a.batch);
    attn_fwd_mma_kernel<T, DP, BK><<<grid, kThreads, 0, stream>>>(a, out, lse, merge);
    return cudaGetLastError();
}

template <typename T>
cudaError_t launch_typed(const ctxpar_cuda_attn_args &a, float *out, float *lse, int merge,
                         cudaStream_t stream) {
    if (a.head_dim <= 64)
        return launch_dp<T, 64, 64>(a, out, lse, merge, stream);
    if (a.head_dim <= 128)
        return launch_dp<T, 128, 64>(a, out, lse, merge, stream);
    return launch_dp<T, 256, 32>(a, out, lse, merge, stream);
}

} // namespace
} // namespace ctxpar_cuda

extern "C" cudaError_t ctxpar_cuda_launch_attn_fwd_mma(const ctxpar_cuda_attn_args *a,
                                                       float *out_acc, float *lse_acc, int merge,
                                                       cudaStream_t stream) {
    using namespace ctxpar_cuda;
    if (a->dtype == CTXPAR_DTYPE_F16)
        return launch_typed<__half>(*a, out_acc, lse_acc, merge, stream);
    if (a->dtype == CTXPAR_DTYPE_BF16)
        return launch_typed<__nv_bfloat16>(*a, out_acc, lse_acc, merge, stream);
    return cudaErrorInvalidValue;
}
