/*
 * Block attention backward on the CPU.
 *
 *   q, dout [B, Sq, Hq, D], k, v [B, Sk, Hkv, D]   one dtype (F32, F16, BF16), any row strides
 *   lse, delta [B, Hq, Sq]                          F32, dense: final forward LSE, rowsum(dO*O)
 *   dq_acc [B, Sq, Hq, D], dk_acc, dv_acc [B, Sk, Hkv, D]   F32, dense, accumulated (each may
 *                                                   be NULL)
 * With P = exp(scale*QK^T + mask - lse), dP = dO V^T, dS = P * (dP - delta):
 *   dq += scale dS K,   dk += scale dS^T Q,   dv += P^T dO
 *
 * Two passes, each a sum with one owner per output and a fixed order, no atomics:
 *  - dq: items (batch, query head, query tile); query rows are the lanes (as in the forward);
 *    key tiles in increasing order.
 *  - dk, dv: items (batch, K/V head, key tile); key rows are the lanes; for each query head of
 *    the GQA group in order, query tiles in increasing order.
 * P is recomputed in both passes (base 2: Q or K is pre-scaled by scale*log2(e)).
 */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "backends/cpu/cpu_internal.h"

#define LOG2E 1.44269504088896340736

#define TQ CTXPAR_CPU_TILE_Q
#define TK CTXPAR_CPU_TILE_K

typedef struct bwd_args {
    const ctxpar_cpu_plan *p;
    const ctxpar_cpu_kernels *kern;
    const ctxpar_tensor *dout;
    const float *lse, *delta;
    float *dq, *dk, *dv;
} bwd_args;

// Per-thread workspace of either pass: 3 transposed tiles of D x 64, 2 score tiles, 2 row
// buffers of 64 x D, 2 vectors of 64.
typedef struct bwd_ws {
    float *t0, *t1, *t2, *t3; // [D, 64]
    float *s, *dp;            // [64, 64]
    float *buf0, *buf1;       // [64, D]
    float *vec0, *vec1;       // [64]
} bwd_ws;

static size_t round16(size_t n) { return (n + 15) / 16 * 16; }

static size_t bwd_ws_floats(int64_t dim) {
    size_t tile = round16((size_t)dim * 64);
    return 6 * tile + 2 * round16(64 * 64) + 2 * round16(64);
}

static bwd_ws bwd_ws_at(float *base, int64_t dim) {
    size_t tile = round16((size_t)dim * 64);
    bwd_ws w;
    w.t0 = base;
    w.t1 = w.t0 + tile;
    w.t2 = w.t1 + tile;
    w.t3 = w.t2 + tile;
    w.s = w.t3 + tile;
    w.dp = w.s + round16(64 * 64);
    w.buf0 = w.dp + round16(64 * 64);
    w.buf1 = w.buf0 + tile;
    w.vec0 = w.buf1 + tile;
    w.vec1 = w.vec0 + round16(64);
    return w;
}

// dst[d*lanes + r] = rows r of t (b, s0 + r, h) times mul, r < n; 0 for n <= r < lanes.
static void pack_t(const ctxpar_cpu_kernels *kern, const ctxpar_tensor *t, int64_t b, int64_t s0,
                   int64_t n, int64_t h, int64_t lanes, float mul, float *row, float *dst) {
    const int64_t dim = t->shape[3];
    for (int64_t r = 0; r < lanes; r++) {
        if (r < n)
            kern->to_f32(row, ctxpar_cpu_row(t, b, s0 + r, h), t->dtype, dim);
        for (int64_t d = 0; d < dim; d++)
            dst[d * lanes + r] = r < n ? row[d] * mul : 0.0f;
    }
}

// lse in base 2 for exp2(s - lse2); an empty row (lse = -inf) gets +inf so that P = 0.
static float lse_base2(float lse) { return lse == -INFINITY ? INFINITY : (float)(lse * LOG2E); }

static void dq_item(const bwd_args *a, const bwd_ws *w, int64_t b, int64_t h, int64_t qt) {
    const ctxpar_cpu_plan *p = a->p;
    const ctxpar_cpu_kernels *kern = a->kern;
    const ctxpar_attn_block *blk = p->blk;
    const int64_t dim = p->dim, hk = h / p->group;
    const int64_t i0 = qt * TQ, nq = p->seq_q - i0 < TQ ? p->seq_q - i0 : TQ;
    const int64_t lanes = (nq + kern->lane_block - 1) / kern->lane_block * kern->lane_block;
    float *qt_s = w->t0, *dot = w->t1, *dqt = w->t2, *lse2 = w->vec0, *dl = w->vec1;
    const float *krows[TK], *vrows[TK];

    pack_t(kern, &blk->q, b, i0, nq, h, lanes, (float)(blk->scale * LOG2E), w->t3, qt_s);
    pack_t(kern, a->dout, b, i0, nq, h, lanes, 1.0f, w->t3, dot);
    for (int64_t r = 0; r < lanes; r++) {
        int64_t li = (b * p->heads_q + h) * p->seq_q + i0 + r;
        lse2[r] = r < nq ? lse_base2(a->lse[li]) : INFINITY;
        dl[r] = r < nq ? a->delta[li] : 0.0f;
    }
    memset(dqt, 0, (size_t)(dim * lanes) * sizeof *dqt);
    for (int64_t kt = 0; kt < p->k_tiles; kt++) {
        ctxpar_block_class cls = ctxpar_cpu_plan_classify(p, qt, kt);
        if (cls == CTXPAR_BLOCK_SKIP)
            continue;
        const int64_t j0 = kt * TK, nk = p->seq_k - j0 < TK ? p->seq_k - j0 : TK;
        ctxpar_cpu_rows_f32(kern, &blk->k, b, j0, nk, hk, w->buf0, krows);
        ctxpar_cpu_rows_f32(kern, &blk->v, b, j0, nk, hk, w->buf1, vrows);
        kern->scores(w->s, lanes, qt_s, lanes, krows, nk, lanes, dim);
        if (cls == CTXPAR_BLOCK_PARTIAL)
            ctxpar_cpu_plan_mask(p, w->s, lanes, i0, j0, nk, nq, 1);
        kern->exp2_sub(w->s, lanes, nk, lanes, lse2, NULL);
        kern->scores(w->dp, lanes, dot, lanes, vrows, nk, lanes, dim);
        kern->dsoftmax(w->dp, w->s, lanes, nk, lanes, dl, NULL);
        kern->accum(dqt, lanes, NULL, w->dp, lanes, krows, nk, lanes, dim);
    }
    for (int64_t r = 0; r < nq; r++) {
        float *dq = a->dq + ((b * p->seq_q + i0 + r) * p->heads_q + h) * dim;
        for (int64_t d = 0; d < dim; d++)
            dq[d] += blk->scale * dqt[d * lanes + r];
    }
}

static void dkv_item(const bwd_args *a, const bwd_ws *w, int64_t b, int64_t hk, int64_t kt) {
    const ctxpar_cpu_plan *p = a->p;
    const ctxpar_cpu_kernels *kern = a->kern;
    const ctxpar_attn_block *blk = p->blk;
    const int64_t dim = p->dim;
    const int64_t j0 = kt * TK, nk = p->seq_k - j0 < TK ? p->seq_k - j0 : TK;
    const int64_t lanes = (nk + kern->lane_block - 1) / kern->lane_block * kern->lane_block;
    float *kt_s = w->t0, *vt = w->t1, *dkt = w->t2, *dvt = w->t3;
    float *lse2 = w->vec0, *dl = w->vec1;
    const float *qrows[TQ], *orows[TQ];

    pack_t(kern, &blk->k, b, j0, nk, hk, lanes, (float)(blk->scale * LOG2E), w->buf0, kt_s);
    pack_t(kern, &blk->v, b, j0, nk, hk, lanes, 1.0f, w->buf0, vt);
    memset(dkt, 0, (size_t)(dim * lanes) * sizeof *dkt);
    memset(dvt, 0, (size_t)(dim * lanes) * sizeof *dvt);
    for (int64_t h = hk * p->group; h < (hk + 1) * p->group; h++) {
        for (int64_t qt = 0; qt < p->q_tiles; qt++) {
            ctxpar_block_class cls = ctxpar_cpu_plan_classify(p, qt, kt);
            if (cls == CTXPAR_BLOCK_SKIP)
                continue;
            const int64_t i0 = qt * TQ, nq = p->seq_q - i0 < TQ ? p->seq_q - i0 : TQ;
            ctxpar_cpu_rows_f32(kern, &blk->q, b, i0, nq, h, w->buf0, qrows);
            ctxpar_cpu_rows_f32(kern, a->dout, b, i0, nq, h, w->buf1, orows);
            for (int64_t r = 0; r < nq; r++) {
                int64_t li = (b * p->heads_q + h) * p->seq_q + i0 + r;
                lse2[r] = lse_base2(a->lse[li]);
                dl[r] = a->delta[li];
            }
            kern->scores(w->s, lanes, kt_s, lanes, qrows, nq, lanes, dim);
            if (cls == CTXPAR_BLOCK_PARTIAL)
                ctxpar_cpu_plan_mask(p, w->s, lanes, i0, j0, nq, nk, 0);
            kern->exp2_sub(w->s, lanes, nq, lanes, NULL, lse2);
            if (a->dv)
                kern->accum(dvt, lanes, NULL, w->s, lanes, orows, nq, lanes, dim);
            if (a->dk) {
                kern->scores(w->dp, lanes, vt, lanes, orows, nq, lanes, dim);
                kern->dsoftmax(w->dp, w->s, lanes, nq, lanes, NULL, dl);
                kern->accum(dkt, lanes, NULL, w->dp, lanes, qrows, nq, lanes, dim);
            }
        }
    }
    for (int64_t r = 0; r < nk; r++) {
        int64_t off = ((b * p->seq_k + j0 + r) * p->heads_kv + hk) * dim;
        for (int64_t d = 0; d < dim; d++) {
            if (a->dk)
                a->dk[off + d] += blk->scale * dkt[d * lanes + r];
            if (a->dv)
                a->dv[off + d] += dvt[d * lanes + r];
        }
    }
}

static ctxpar_status check_bwd(const ctxpar_cpu_plan *p, const ctxpar_tensor *dout,
                               const float *lse, const float *delta) {
    CTXPAR_CHECK(ctxpar_cpu_check_tensor(dout, "attn_block_bwd", "dout"));
    if (dout->dtype != p->blk->q.dtype)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG,
                            "attn_block_bwd: dout.dtype (%s) != q.dtype (%s)",
                            ctxpar_dtype_name(dout->dtype), ctxpar_dtype_name(p->blk->q.dtype));
    for (int i = 0; i < 4; i++)
        if (dout->shape[i] != p->blk->q.shape[i])
            return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG,
                                "attn_block_bwd: dout.shape[%d] (%lld) != q.shape[%d] (%lld)", i,
                                (long long)dout->shape[i], i, (long long)p->blk->q.shape[i]);
    if (p->batch * p->heads_q * p->seq_q > 0 && (!lse || !delta))
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG,
                            "attn_block_bwd: lse (%p) or delta (%p) is NULL", (const void *)lse,
                            (const void *)delta);
    return CTXPAR_OK;
}

ctxpar_status ctxpar_cpu_attn_block_bwd(ctxpar_device *dev, const ctxpar_attn_block *blk,
                                        const ctxpar_tensor *dout, const float *lse,
                                        const float *delta, float *dq_acc, float *dk_acc,
                                        float *dv_acc, ctxpar_stream *stream) {
    (void)stream;
    const ctxpar_cpu_device *cpu = dev->impl;
    ctxpar_cpu_plan p;
    CTXPAR_CHECK(ctxpar_cpu_plan_init(blk, "attn_block_bwd", &p));
    ctxpar_status st = check_bwd(&p, dout, lse, delta);
    const int64_t dq_items = dq_acc ? p.batch * p.heads_q * p.q_tiles : 0;
    const int64_t dkv_items = dk_acc || dv_acc ? p.batch * p.heads_kv * p.k_tiles : 0;
    if (st != CTXPAR_OK || p.whole == CTXPAR_BLOCK_SKIP || p.seq_q == 0 || p.seq_k == 0 ||
        dq_items + dkv_items == 0)
        goto done; // nothing visible: every gradient contribution is zero
    const int nt = ctxpar_cpu_threads(cpu);
    const size_t per_thread = bwd_ws_floats(p.dim);
    float *ws = ctxpar_cpu_aligned_alloc((size_t)nt * per_thread * sizeof(float));
    if (!ws) {
        st = CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY,
                          "attn_block_bwd: cannot allocate %d workspaces of %zu bytes", nt,
                          per_thread * sizeof(float));
        goto done;
    }
    const bwd_args a = {&p, cpu->kern, dout, lse, delta, dq_acc, dk_acc, dv_acc};
#pragma omp parallel num_threads(nt)
    {
        bwd_ws w = bwd_ws_at(ws + (size_t)omp_get_thread_num() * per_thread, p.dim);
#pragma omp for schedule(static, 1)
        for (int64_t it = 0; it < dq_items; it++) {
            int64_t qt = it % p.q_tiles, h = (it / p.q_tiles) % p.heads_q;
            dq_item(&a, &w, it / (p.q_tiles * p.heads_q), h, qt);
        }
#pragma omp for schedule(static, 1)
        for (int64_t it = 0; it < dkv_items; it++) {
            int64_t kt = it % p.k_tiles, hk = (it / p.k_tiles) % p.heads_kv;
            dkv_item(&a, &w, it / (p.k_tiles * p.heads_kv), hk, kt);
        }
    }
    free(ws);
done:
    ctxpar_cpu_plan_release(&p);
    return st;
}
