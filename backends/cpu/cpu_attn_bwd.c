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
 *  - dq: items (batch, query head, group of query tiles); query rows are the lanes (as in the
 *    forward); key tiles in increasing order, each loaded once for the group.
 *  - dk, dv: items (batch, K/V head, group of key tiles); key rows are the lanes; for each query
 *    head of the GQA group in order, query tiles in increasing order, each loaded once.
 * P is recomputed in both passes (base 2: Q or K is pre-scaled by scale*log2(e)). In a PARTIAL
 * tile every product selects the masked pairs away (dS is 0 there by selection, not P * (dP -
 * delta), and the sums skip them): a NaN or inf in a row a pair does not see never leaks in.
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

// Per-thread workspace of either pass. An item covers up to CTXPAR_CPU_GROUP tiles of its own
// side (query tiles for dq, key tiles for dk/dv), each with up to 4 transposed [D, 64] tiles and
// two [64] vectors; every tile of the other side is loaded once for the whole group.
typedef struct bwd_ws {
    float *t[CTXPAR_CPU_GROUP][4];   // [D, 64]
    float *vec[CTXPAR_CPU_GROUP][2]; // [64]
    float *s, *dp;                   // [64, 64]
    uint32_t *vis;                   // [64, 64] visibility of a PARTIAL tile (cpu_kernels.h)
    float *buf0, *buf1;              // [64, D]
    float *row;                      // [D]
} bwd_ws;

static size_t round16(size_t n) {
    return (n + 15) / 16 * 16;
}

// Lays the workspace out from base; with base NULL it only measures (*floats_out).
static bwd_ws bwd_ws_at(float *base, int64_t dim, size_t *floats_out) {
    const size_t d = (size_t)dim;
    size_t off = 0;
    bwd_ws w;
#define TAKE(ptr, n) ((ptr) = base ? (void *)(base + off) : NULL, off += round16(n))
    for (int g = 0; g < CTXPAR_CPU_GROUP; g++) {
        for (int i = 0; i < 4; i++)
            TAKE(w.t[g][i], d * 64);
        TAKE(w.vec[g][0], 64);
        TAKE(w.vec[g][1], 64);
    }
    TAKE(w.s, 64 * 64);
    TAKE(w.dp, 64 * 64);
    TAKE(w.vis, 64 * 64); // 32-bit words, counted as floats
    TAKE(w.buf0, 64 * d);
    TAKE(w.buf1, 64 * d);
    TAKE(w.row, d);
#undef TAKE
    *floats_out = off;
    return w;
}

static int64_t tile_rows(int64_t seq, int64_t t, int64_t tile) {
    return seq - t * tile < tile ? seq - t * tile : tile;
}

static int64_t lanes_for(const ctxpar_cpu_kernels *kern, int64_t rows) {
    return (rows + kern->lane_block - 1) / kern->lane_block * kern->lane_block;
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
static float lse_base2(float lse) {
    return lse == -INFINITY ? INFINITY : (float)(lse * LOG2E);
}

// dq for query tiles qt0 .. qt0+ng-1 of (b, h); query rows are the lanes.
static void dq_item(const bwd_args *a, const bwd_ws *w, int64_t b, int64_t h, int64_t qt0, int ng) {
    const ctxpar_cpu_plan *p = a->p;
    const ctxpar_cpu_kernels *kern = a->kern;
    const ctxpar_attn_block *blk = p->blk;
    const int64_t dim = p->dim, hk = h / p->group;
    const float *krows[TK], *vrows[TK];
    ctxpar_block_class cls[CTXPAR_CPU_GROUP];
    for (int g = 0; g < ng; g++) { // t[g] = scaled Q^T, dO^T, dQ^T; vec[g] = lse2, delta
        const int64_t i0 = (qt0 + g) * TQ, nq = tile_rows(p->seq_q, qt0 + g, TQ);
        const int64_t lanes = lanes_for(kern, nq);
        pack_t(kern, &blk->q, b, i0, nq, h, lanes, (float)(blk->scale * LOG2E), w->row, w->t[g][0]);
        pack_t(kern, a->dout, b, i0, nq, h, lanes, 1.0f, w->row, w->t[g][1]);
        memset(w->t[g][2], 0, (size_t)(dim * lanes) * sizeof(float));
        for (int64_t r = 0; r < lanes; r++) {
            int64_t li = (b * p->heads_q + h) * p->seq_q + i0 + r;
            w->vec[g][0][r] = r < nq ? lse_base2(a->lse[li]) : INFINITY;
            w->vec[g][1][r] = r < nq ? a->delta[li] : 0.0f;
        }
    }
    for (int64_t kt = 0; kt < p->k_tiles; kt++) {
        int any = 0;
        for (int g = 0; g < ng; g++) {
            cls[g] = ctxpar_cpu_plan_classify(p, qt0 + g, kt);
            any |= cls[g] != CTXPAR_BLOCK_SKIP;
        }
        if (!any)
            continue;
        const int64_t j0 = kt * TK, nk = tile_rows(p->seq_k, kt, TK);
        ctxpar_cpu_load_rows(kern, &blk->k, b, j0, nk, hk, w->buf0, krows);
        ctxpar_cpu_load_rows(kern, &blk->v, b, j0, nk, hk, w->buf1, vrows);
        for (int g = 0; g < ng; g++) {
            if (cls[g] == CTXPAR_BLOCK_SKIP)
                continue;
            const int64_t i0 = (qt0 + g) * TQ, nq = tile_rows(p->seq_q, qt0 + g, TQ);
            const int64_t lanes = lanes_for(kern, nq);
            const uint32_t *vis = NULL; // FULL: nothing masked, no select
            kern->scores(w->s, lanes, w->t[g][0], lanes, krows, nk, lanes, dim);
            if (cls[g] == CTXPAR_BLOCK_PARTIAL) {
                ctxpar_cpu_plan_mask(p, w->s, w->vis, lanes, i0, j0, nk, nq, 1);
                vis = w->vis;
            }
            kern->exp2_sub(w->s, lanes, nk, lanes, w->vec[g][0], NULL);
            kern->scores(w->dp, lanes, w->t[g][1], lanes, vrows, nk, lanes, dim);
            kern->dsoftmax(w->dp, w->s, vis, lanes, nk, lanes, w->vec[g][1], NULL);
            kern->accum(w->t[g][2], lanes, NULL, w->dp, vis, lanes, krows, nk, lanes, dim);
        }
    }
    for (int g = 0; g < ng; g++) {
        const int64_t i0 = (qt0 + g) * TQ, nq = tile_rows(p->seq_q, qt0 + g, TQ);
        const int64_t lanes = lanes_for(kern, nq);
        for (int64_t r = 0; r < nq; r++) {
            float *dq = a->dq + ((b * p->seq_q + i0 + r) * p->heads_q + h) * dim;
            for (int64_t d = 0; d < dim; d++)
                dq[d] += blk->scale * w->t[g][2][d * lanes + r];
        }
    }
}

// dk, dv for key tiles kt0 .. kt0+ng-1 of (b, hk); key rows are the lanes. The query heads of the
// GQA group, then the query tiles, are visited in increasing order.
static void dkv_item(const bwd_args *a, const bwd_ws *w, int64_t b, int64_t hk, int64_t kt0,
                     int ng) {
    const ctxpar_cpu_plan *p = a->p;
    const ctxpar_cpu_kernels *kern = a->kern;
    const ctxpar_attn_block *blk = p->blk;
    const int64_t dim = p->dim;
    const float *qrows[TQ], *orows[TQ];
    float *lse2 = w->vec[0][0], *dl = w->vec[0][1];
    ctxpar_block_class cls[CTXPAR_CPU_GROUP];
    for (int g = 0; g < ng; g++) { // t[g] = scaled K^T, V^T, dK^T, dV^T
        const int64_t j0 = (kt0 + g) * TK, nk = tile_rows(p->seq_k, kt0 + g, TK);
        const int64_t lanes = lanes_for(kern, nk);
        pack_t(kern, &blk->k, b, j0, nk, hk, lanes, (float)(blk->scale * LOG2E), w->row,
               w->t[g][0]);
        pack_t(kern, &blk->v, b, j0, nk, hk, lanes, 1.0f, w->row, w->t[g][1]);
        memset(w->t[g][2], 0, (size_t)(dim * lanes) * sizeof(float));
        memset(w->t[g][3], 0, (size_t)(dim * lanes) * sizeof(float));
    }
    for (int64_t h = hk * p->group; h < (hk + 1) * p->group; h++) {
        for (int64_t qt = 0; qt < p->q_tiles; qt++) {
            int any = 0;
            for (int g = 0; g < ng; g++) {
                cls[g] = ctxpar_cpu_plan_classify(p, qt, kt0 + g);
                any |= cls[g] != CTXPAR_BLOCK_SKIP;
            }
            if (!any)
                continue;
            const int64_t i0 = qt * TQ, nq = tile_rows(p->seq_q, qt, TQ);
            ctxpar_cpu_load_rows(kern, &blk->q, b, i0, nq, h, w->buf0, qrows);
            ctxpar_cpu_load_rows(kern, a->dout, b, i0, nq, h, w->buf1, orows);
            for (int64_t r = 0; r < nq; r++) {
                int64_t li = (b * p->heads_q + h) * p->seq_q + i0 + r;
                lse2[r] = lse_base2(a->lse[li]);
                dl[r] = a->delta[li];
            }
            for (int g = 0; g < ng; g++) {
                if (cls[g] == CTXPAR_BLOCK_SKIP)
                    continue;
                const int64_t j0 = (kt0 + g) * TK, nk = tile_rows(p->seq_k, kt0 + g, TK);
                const int64_t lanes = lanes_for(kern, nk);
                const uint32_t *vis = NULL; // FULL: nothing masked, no select
                kern->scores(w->s, lanes, w->t[g][0], lanes, qrows, nq, lanes, dim);
                if (cls[g] == CTXPAR_BLOCK_PARTIAL) {
                    ctxpar_cpu_plan_mask(p, w->s, w->vis, lanes, i0, j0, nq, nk, 0);
                    vis = w->vis;
                }
                kern->exp2_sub(w->s, lanes, nq, lanes, NULL, lse2);
                if (a->dv)
                    kern->accum(w->t[g][3], lanes, NULL, w->s, vis, lanes, orows, nq, lanes, dim);
                if (a->dk) {
                    kern->scores(w->dp, lanes, w->t[g][1], lanes, orows, nq, lanes, dim);
                    kern->dsoftmax(w->dp, w->s, vis, lanes, nq, lanes, NULL, dl);
                    kern->accum(w->t[g][2], lanes, NULL, w->dp, vis, lanes, qrows, nq, lanes, dim);
                }
            }
        }
    }
    for (int g = 0; g < ng; g++) {
        const int64_t j0 = (kt0 + g) * TK, nk = tile_rows(p->seq_k, kt0 + g, TK);
        const int64_t lanes = lanes_for(kern, nk);
        for (int64_t r = 0; r < nk; r++) {
            int64_t off = ((b * p->seq_k + j0 + r) * p->heads_kv + hk) * dim;
            for (int64_t d = 0; d < dim; d++) {
                if (a->dk)
                    a->dk[off + d] += blk->scale * w->t[g][2][d * lanes + r];
                if (a->dv)
                    a->dv[off + d] += w->t[g][3][d * lanes + r];
            }
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
    const int64_t q_groups = (p.q_tiles + CTXPAR_CPU_GROUP - 1) / CTXPAR_CPU_GROUP;
    const int64_t k_groups = (p.k_tiles + CTXPAR_CPU_GROUP - 1) / CTXPAR_CPU_GROUP;
    const int64_t dq_items = dq_acc ? p.batch * p.heads_q * q_groups : 0;
    const int64_t dkv_items = dk_acc || dv_acc ? p.batch * p.heads_kv * k_groups : 0;
    if (st != CTXPAR_OK || p.whole == CTXPAR_BLOCK_SKIP || p.seq_q == 0 || p.seq_k == 0 ||
        dq_items + dkv_items == 0)
        goto done; // nothing visible: every gradient contribution is zero
    const int nt = ctxpar_cpu_threads(cpu);
    size_t per_thread;
    (void)bwd_ws_at(NULL, p.dim, &per_thread); // only measures
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
        size_t unused;
        bwd_ws w = bwd_ws_at(ws + (size_t)omp_get_thread_num() * per_thread, p.dim, &unused);
#pragma omp for schedule(static, 1)
        for (int64_t it = 0; it < dq_items; it++) {
            int64_t grp = it % q_groups, h = (it / q_groups) % p.heads_q;
            int64_t qt0 = grp * CTXPAR_CPU_GROUP;
            int ng = p.q_tiles - qt0 < CTXPAR_CPU_GROUP ? (int)(p.q_tiles - qt0) : CTXPAR_CPU_GROUP;
            dq_item(&a, &w, it / (q_groups * p.heads_q), h, qt0, ng);
        }
#pragma omp for schedule(static, 1)
        for (int64_t it = 0; it < dkv_items; it++) {
            int64_t grp = it % k_groups, hk = (it / k_groups) % p.heads_kv;
            int64_t kt0 = grp * CTXPAR_CPU_GROUP;
            int ng = p.k_tiles - kt0 < CTXPAR_CPU_GROUP ? (int)(p.k_tiles - kt0) : CTXPAR_CPU_GROUP;
            dkv_item(&a, &w, it / (k_groups * p.heads_kv), hk, kt0, ng);
        }
    }
    free(ws);
done:
    ctxpar_cpu_plan_release(&p);
    return st;
}
