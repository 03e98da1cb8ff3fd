/*
 * Block attention forward on the CPU.
 *
 *   q [B, Sq, Hq, D], k and v [B, Sk, Hkv, D]    F32, F16 or BF16 (one dtype), any row strides
 *   out_acc [B, Sq, Hq, D], lse_acc [B, Hq, Sq]  F32, dense: overwritten (merge = 0) or merged
 *
 * One work item is (batch, query head, tile of CTXPAR_CPU_TILE_Q query rows); OpenMP hands items
 * out statically and one thread computes an item from start to end, so nothing depends on the
 * thread count. Inside an item the query rows are the vector lanes: Q^T is packed once (scaled
 * by scale*log2(e), so the softmax runs in base 2), then for each key tile of CTXPAR_CPU_TILE_K
 * rows, in increasing order from the start of the K/V block:
 *   S = Q^T-rows x K (register-tiled), mask if the tile is PARTIAL, online softmax, O^T += P V.
 * Every step treats each lane alone (cpu_kernels.h), so a query row's result depends only on
 * its q row, its position and the K/V rows: not on the other rows of the call or its place in
 * the tile (what makes the all-gather algorithm bitwise equal to one rank). SKIP tiles are left
 * out, which is bit-neutral: a masked tile would add exact zeros and rescale by exactly 1.
 */
#include <float.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "backends/cpu/cpu_internal.h"

#define LOG2E 1.44269504088896340736
#define LN2 0.693147180559945309417

#define TQ CTXPAR_CPU_TILE_Q
#define TK CTXPAR_CPU_TILE_K

// Per-thread workspace, in floats, each part a multiple of 16 (64 bytes).
typedef struct fwd_ws {
    float *qt;  // [D, lanes]  Q^T, scaled
    float *ot;  // [D, lanes]  unnormalised O^T
    float *s;   // [TK, lanes] scores, then probabilities
    float *m, *l, *alpha; // [lanes] running max, sum, rescale factor
    float *kbuf, *vbuf;   // [TK, D] K and V rows as F32 (16-bit dtypes)
    float *row;           // [D]   one converted q row / one output row
} fwd_ws;

static size_t round16(size_t n) { return (n + 15) / 16 * 16; }

static size_t fwd_ws_floats(int64_t dim) {
    size_t d = (size_t)dim;
    return 2 * round16(d * TQ) + round16((size_t)TK * TQ) + 3 * round16(TQ) +
           2 * round16((size_t)TK * d) + round16(d);
}

static fwd_ws fwd_ws_at(float *base, int64_t dim) {
    size_t d = (size_t)dim;
    fwd_ws w;
    w.qt = base;
    w.ot = w.qt + round16(d * TQ);
    w.s = w.ot + round16(d * TQ);
    w.m = w.s + round16((size_t)TK * TQ);
    w.l = w.m + round16(TQ);
    w.alpha = w.l + round16(TQ);
    w.kbuf = w.alpha + round16(TQ);
    w.vbuf = w.kbuf + round16((size_t)TK * d);
    w.row = w.vbuf + round16((size_t)TK * d);
    return w;
}

// Writes (or merges) the finished rows of one work item.
static void fwd_store(const ctxpar_cpu_plan *p, const fwd_ws *w, int64_t b, int64_t h, int64_t i0,
                      int64_t nq, int64_t lanes, float *out_acc, float *lse_acc, int merge) {
    const int64_t dim = p->dim;
    for (int64_t r = 0; r < nq; r++) {
        int64_t i = i0 + r;
        float *out = out_acc + ((b * p->seq_q + i) * p->heads_q + h) * dim;
        float *lse = lse_acc + (b * p->heads_q + h) * p->seq_q + i;
        float *dst = merge ? w->row : out;
        float sum = w->l[r], lse_b = -INFINITY;
        if (sum == 0.0f) { // no visible key
            memset(dst, 0, (size_t)dim * sizeof *dst);
        } else {
            for (int64_t d = 0; d < dim; d++)
                dst[d] = w->ot[d * lanes + r] / sum;
            lse_b = (float)(((double)w->m[r] + log2((double)sum)) * LN2);
        }
        if (merge)
            ctxpar_cpu_merge_row(out, lse, dst, lse_b, dim);
        else
            *lse = lse_b;
    }
}

static void fwd_item(const ctxpar_cpu_plan *p, const ctxpar_cpu_kernels *kern, const fwd_ws *w,
                     int64_t b, int64_t h, int64_t qt, float *out_acc, float *lse_acc, int merge) {
    const ctxpar_attn_block *blk = p->blk;
    const int64_t dim = p->dim, hk = h / p->group;
    const int64_t i0 = qt * TQ, nq = p->seq_q - i0 < TQ ? p->seq_q - i0 : TQ;
    const int64_t lanes = (nq + kern->lane_block - 1) / kern->lane_block * kern->lane_block;
    const float c = (float)(blk->scale * LOG2E);
    const float *krows[TK], *vrows[TK];

    for (int64_t r = 0; r < lanes; r++) {
        if (r < nq)
            kern->to_f32(w->row, ctxpar_cpu_row(&blk->q, b, i0 + r, h), blk->q.dtype, dim);
        for (int64_t d = 0; d < dim; d++)
            w->qt[d * lanes + r] = r < nq ? w->row[d] * c : 0.0f;
        w->m[r] = -FLT_MAX;
        w->l[r] = 0.0f;
    }
    memset(w->ot, 0, (size_t)(dim * lanes) * sizeof *w->ot);

    for (int64_t kt = 0; kt < p->k_tiles; kt++) {
        ctxpar_block_class cls = ctxpar_cpu_plan_classify(p, qt, kt);
        if (cls == CTXPAR_BLOCK_SKIP)
            continue;
        const int64_t j0 = kt * TK, nk = p->seq_k - j0 < TK ? p->seq_k - j0 : TK;
        ctxpar_cpu_rows_f32(kern, &blk->k, b, j0, nk, hk, w->kbuf, krows);
        ctxpar_cpu_rows_f32(kern, &blk->v, b, j0, nk, hk, w->vbuf, vrows);
        kern->scores(w->s, lanes, w->qt, lanes, krows, nk, lanes, dim);
        if (cls == CTXPAR_BLOCK_PARTIAL)
            ctxpar_cpu_plan_mask(p, w->s, lanes, i0, j0, nk, nq, 1);
        kern->softmax_step(w->s, lanes, nk, lanes, w->m, w->l, w->alpha);
        kern->accum(w->ot, lanes, w->alpha, w->s, lanes, vrows, nk, lanes, dim);
    }
    fwd_store(p, w, b, h, i0, nq, lanes, out_acc, lse_acc, merge);
}

// The whole block pair is masked: every row is empty (out 0, lse -inf), which merges to nothing.
static void fwd_empty(const ctxpar_cpu_plan *p, float *out_acc, float *lse_acc, int merge) {
    if (merge)
        return;
    size_t rows = (size_t)(p->batch * p->seq_q * p->heads_q);
    memset(out_acc, 0, rows * (size_t)p->dim * sizeof *out_acc);
    for (size_t i = 0; i < rows; i++)
        lse_acc[i] = -INFINITY;
}

ctxpar_status ctxpar_cpu_attn_block_fwd(ctxpar_device *dev, const ctxpar_attn_block *blk,
                                        float *out_acc, float *lse_acc, int merge,
                                        ctxpar_stream *stream) {
    (void)stream; // synchronous device
    const ctxpar_cpu_device *cpu = dev->impl;
    ctxpar_cpu_plan p;
    CTXPAR_CHECK(ctxpar_cpu_plan_init(blk, "attn_block_fwd", &p));
    ctxpar_status st = CTXPAR_OK;
    if (merge != 0 && merge != 1) {
        st = CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "attn_block_fwd: merge (%d) must be 0 or 1",
                          merge);
        goto done;
    }
    const int64_t items = p.batch * p.heads_q * p.q_tiles;
    if (items > 0 && (!out_acc || !lse_acc)) {
        st = CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "attn_block_fwd: out_acc (%p) or lse_acc (%p) "
                          "is NULL", (void *)out_acc, (void *)lse_acc);
        goto done;
    }
    if (items == 0)
        goto done;
    if (p.whole == CTXPAR_BLOCK_SKIP) {
        fwd_empty(&p, out_acc, lse_acc, merge);
        goto done;
    }
    const int nt = ctxpar_cpu_threads(cpu);
    const size_t per_thread = fwd_ws_floats(p.dim);
    float *ws = ctxpar_cpu_aligned_alloc((size_t)nt * per_thread * sizeof(float));
    if (!ws) {
        st = CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY,
                          "attn_block_fwd: cannot allocate %d workspaces of %zu bytes", nt,
                          per_thread * sizeof(float));
        goto done;
    }
    const ctxpar_cpu_kernels *kern = cpu->kern;
#pragma omp parallel num_threads(nt)
    {
        fwd_ws w = fwd_ws_at(ws + (size_t)omp_get_thread_num() * per_thread, p.dim);
        // Round-robin items: causal tiles differ in cost, neighbours in the order cost alike.
#pragma omp for schedule(static, 1)
        for (int64_t it = 0; it < items; it++) {
            int64_t qt = it % p.q_tiles, h = (it / p.q_tiles) % p.heads_q;
            int64_t b = it / (p.q_tiles * p.heads_q);
            fwd_item(&p, kern, &w, b, h, qt, out_acc, lse_acc, merge);
        }
    }
    free(ws);
done:
    ctxpar_cpu_plan_release(&p);
    return st;
}
