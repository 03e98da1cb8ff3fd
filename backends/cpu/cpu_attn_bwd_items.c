// The CPU backward's work items (cpu_attn_bwd.h): two-pass dq and dk/dv items, and the fused
// item that gets all three gradients from one computation of P and dS.
#include <math.h>
#include <string.h>

#include "backends/cpu/cpu_attn_bwd.h"
#include "ctxpar_half.h"

#define TQ CTXPAR_CPU_TILE_Q
#define TK CTXPAR_CPU_TILE_K

static size_t round16(size_t n) {
    return (n + 15) / 16 * 16;
}

// Lays the workspace out from base; with base NULL it only measures (*floats_out).
ctxpar_bwd_ws ctxpar_bwd_ws_at(float *base, int64_t dim, int groups, size_t *floats_out) {
    const size_t d = (size_t)dim;
    size_t off = 0;
    ctxpar_bwd_ws w;
    memset(&w, 0, sizeof w);
#define TAKE(ptr, n) ((ptr) = base ? (void *)(base + off) : NULL, off += round16(n))
    for (int g = 0; g < groups; g++) {
        for (int i = 0; i < 2; i++)
            TAKE(w.t[g][i], d * 64);
        TAKE(w.acc[g][0], 2 * d * 64); // doubles, counted as 2 floats
        TAKE(w.acc[g][1], 2 * d * 64);
        TAKE(w.vec[g][0], 64);
        TAKE(w.vec[g][1], 64);
        TAKE(w.vec[g][2], 64);
        TAKE(w.krow[g], 64 * d);
    }
    TAKE(w.s, 64 * 64);
    TAKE(w.dp, 64 * 64);
    TAKE(w.dst, 64 * 64);
    TAKE(w.dcap, 64 * 64);
    TAKE(w.vis, 64 * 64); // 32-bit words, counted as floats
    TAKE(w.vist, 64 * 64);
    TAKE(w.buf0, 64 * d);
    TAKE(w.buf1, 64 * d);
    TAKE(w.row, d);
#undef TAKE
    *floats_out = off;
    return w;
}

// dS times the soft-cap's derivative, element by element (softcap > 0 only).
static void scale_by(float *ds, const float *dcap, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        ds[i] *= dcap[i];
}

int ctxpar_bwd_fused_group(int64_t dim) {
    int group = CTXPAR_BWD_GROUP_MAX;
    while (group > CTXPAR_CPU_GROUP && (int64_t)group * 64 * 28 * dim > (1 << 20))
        group /= 2;
    return group;
}

int64_t ctxpar_bwd_tile_rows(int64_t seq, int64_t t, int64_t tile) {
    return seq - t * tile < tile ? seq - t * tile : tile;
}

int64_t ctxpar_bwd_lanes(const ctxpar_cpu_kernels *kern, int64_t rows) {
    return (rows + kern->lane_block - 1) / kern->lane_block * kern->lane_block;
}

void ctxpar_bwd_pack_t(const ctxpar_cpu_kernels *kern, const ctxpar_tensor *t, int64_t b,
                       int64_t s0, int64_t n, int64_t h, int64_t lanes, float mul, float *row,
                       float *dst) {
    const int64_t dim = t->shape[3];
    for (int64_t r = 0; r < lanes; r++) {
        if (r < n)
            kern->to_f32(row, ctxpar_cpu_row(t, b, s0 + r, h), t->dtype, dim);
        for (int64_t d = 0; d < dim; d++)
            dst[d * lanes + r] = r < n ? row[d] * mul : 0.0f;
    }
}

int ctxpar_bwd_row_masked(const ctxpar_bwd_args *a, int64_t b, int64_t h, int64_t i) {
    return a->lse[(b * a->p->heads_q + h) * a->p->seq_q + i] == -INFINITY;
}

// Element (b, s, h, d) of a tensor the dispatch checked (F32, BF16 or F16).
static double element(const ctxpar_tensor *t, int64_t b, int64_t s, int64_t h, int64_t d) {
    const void *row = ctxpar_cpu_row(t, b, s, h);
    if (t->dtype == CTXPAR_DTYPE_F32)
        return ((const float *)row)[d];
    const uint16_t x = ((const uint16_t *)row)[d];
    return t->dtype == CTXPAR_DTYPE_BF16 ? ctxpar_bf16_to_f32(x) : ctxpar_f16_to_f32(x);
}

int ctxpar_bwd_row_sees_only_neg_inf(const ctxpar_bwd_args *a, int64_t b, int64_t h, int64_t i) {
    const ctxpar_cpu_plan *p = a->p;
    const ctxpar_attn_block *blk = p->blk;
    if (blk->softcap > 0.0f) // C tanh(-inf) = -C: a capped score is never -inf
        return 0;
    const double sign = ctxpar_cpu_score_sign(blk->scale);
    for (int64_t j = 0; j < p->seq_k; j++) {
        if (!ctxpar_cpu_plan_sees(p, i, j))
            continue;
        double s = 0.0;
        for (int64_t d = 0; d < p->dim; d++)
            s += element(&blk->q, b, i, h, d) * element(&blk->k, b, j, h / p->group, d);
        if (!(sign * s == -INFINITY)) // finite, +inf or NaN: the row sees a key
            return 0;
    }
    return 1;
}

float ctxpar_bwd_lse2(const ctxpar_bwd_args *a, int64_t li, float *lo) {
    const float lse = a->lse[li];
    if (lse == -INFINITY) {
        *lo = 0.0f;
        return INFINITY;
    }
    const double x = ((double)lse + (a->lse_lo ? (double)a->lse_lo[li] : 0.0)) * CTXPAR_CPU_LOG2E;
    const float hi = (float)x;
    *lo = (float)(x - hi);
    return hi;
}

void ctxpar_bwd_dq_item(const ctxpar_bwd_args *a, const ctxpar_bwd_ws *w, int64_t b, int64_t h,
                        int64_t qt0, int ng) {
    const ctxpar_cpu_plan *p = a->p;
    const ctxpar_cpu_kernels *kern = a->kern;
    const ctxpar_attn_block *blk = p->blk;
    const int64_t dim = p->dim, hk = h / p->group;
    const float *krows[TK], *vrows[TK];
    ctxpar_block_class cls[CTXPAR_CPU_GROUP];
    const double c = ctxpar_cpu_softmax_c(blk);
    const int capped = blk->softcap > 0.0f;
    for (int g = 0; g < ng; g++) { // t[g] = Q^T, dO^T; vec[g] = lse2, delta
        const int64_t i0 = (qt0 + g) * TQ, nq = ctxpar_bwd_tile_rows(p->seq_q, qt0 + g, TQ);
        const int64_t lanes = ctxpar_bwd_lanes(kern, nq);
        ctxpar_bwd_pack_t(kern, &blk->q, b, i0, nq, h, lanes, ctxpar_cpu_score_sign(blk->scale),
                          w->row, w->t[g][0]);
        ctxpar_bwd_pack_t(kern, a->dout, b, i0, nq, h, lanes, 1.0f, w->row, w->t[g][1]);
        memset(w->acc[g][0], 0, (size_t)(dim * lanes) * sizeof(double));
        for (int64_t r = 0; r < lanes; r++) {
            int64_t li = (b * p->heads_q + h) * p->seq_q + i0 + r;
            w->vec[g][2][r] = 0.0f;
            w->vec[g][0][r] = r < nq ? ctxpar_bwd_lse2(a, li, &w->vec[g][2][r]) : INFINITY;
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
        const int64_t j0 = kt * TK, nk = ctxpar_bwd_tile_rows(p->seq_k, kt, TK);
        ctxpar_cpu_load_rows(kern, &blk->k, b, j0, nk, hk, w->buf0, krows);
        ctxpar_cpu_load_rows(kern, &blk->v, b, j0, nk, hk, w->buf1, vrows);
        for (int g = 0; g < ng; g++) {
            if (cls[g] == CTXPAR_BLOCK_SKIP)
                continue;
            const int64_t i0 = (qt0 + g) * TQ, nq = ctxpar_bwd_tile_rows(p->seq_q, qt0 + g, TQ);
            const int64_t lanes = ctxpar_bwd_lanes(kern, nq);
            const uint32_t *vis = NULL; // FULL: nothing masked, no select
            kern->scores(w->s, lanes, w->t[g][0], lanes, krows, nk, lanes, dim);
            if (cls[g] == CTXPAR_BLOCK_PARTIAL) {
                ctxpar_cpu_plan_mask(p, w->s, w->vis, lanes, i0, j0, nk, nq, 1);
                vis = w->vis;
            }
            if (capped)
                ctxpar_cpu_softcap(kern, blk, w->s, w->dcap, vis, lanes, nk);
            kern->exp2_sub(w->s, lanes, nk, lanes, c, w->vec[g][0], w->vec[g][2], NULL, NULL);
            kern->scores(w->dp, lanes, w->t[g][1], lanes, vrows, nk, lanes, p->dim_v);
            kern->dsoftmax(w->dp, w->s, vis, lanes, nk, lanes, w->vec[g][1], NULL);
            if (capped)
                scale_by(w->dp, w->dcap, lanes * nk);
            kern->accum_f64(w->acc[g][0], lanes, w->dp, vis, lanes, krows, nk, lanes, dim);
        }
    }
    for (int g = 0; g < ng; g++) {
        const int64_t i0 = (qt0 + g) * TQ, nq = ctxpar_bwd_tile_rows(p->seq_q, qt0 + g, TQ);
        const int64_t lanes = ctxpar_bwd_lanes(kern, nq);
        for (int64_t r = 0; r < nq; r++) {
            if (ctxpar_bwd_row_masked(a, b, h, i0 + r))
                continue;
            int nan = 0;
            for (int64_t d = 0; d < dim; d++)
                nan |= isnan(w->acc[g][0][d * lanes + r]);
            if (nan && ctxpar_bwd_row_sees_only_neg_inf(a, b, h, i0 + r))
                continue;
            float *dq = a->dq + ((b * p->seq_q + i0 + r) * p->heads_q + h) * dim;
            for (int64_t d = 0; d < dim; d++) // the F64 sum rounded once, then accumulated
                dq[d] += (float)(blk->scale * w->acc[g][0][d * lanes + r]);
        }
    }
}

// dQ^T (F64 tile [D, 64] at dq_tile) += dS K for one tile pair, dS given with the key rows as lanes
// (ds [nq, kl], vis likewise or NULL): transposed first, so that the query rows are the lanes of
// the sum, as in the dq item. Masked pairs are selected away (vis transposed with dS).
static void add_dq(const ctxpar_cpu_kernels *kern, const ctxpar_bwd_ws *w, const float *ds,
                   const uint32_t *vis, int64_t kl, int64_t nq, int64_t nk,
                   const float *const *krows, int64_t dim, double *dq_tile) {
    const int64_t ql = ctxpar_bwd_lanes(kern, nq);
    kern->transpose(w->dst, ql, ds, kl, nq, nk, ql, 0); // padding lanes: dS = +0.0f
    if (vis)
        kern->transpose(w->vist, ql, vis, kl, nq, nk, ql, 0xffffffffu);
    kern->accum_f64(dq_tile, 64, w->dst, vis ? w->vist : NULL, ql, krows, nk, ql, dim);
}

void ctxpar_bwd_dkv_item(const ctxpar_bwd_args *a, const ctxpar_bwd_ws *w, int64_t b,
                         int64_t hk, int64_t kt0, int ng, double *dq_chunk) {
    const ctxpar_cpu_plan *p = a->p;
    const ctxpar_cpu_kernels *kern = a->kern;
    const ctxpar_attn_block *blk = p->blk;
    const int64_t dim = p->dim;
    const float *qrows[TQ], *orows[TQ], *krows[CTXPAR_BWD_GROUP_MAX][TK];
    const double c = ctxpar_cpu_softmax_c(blk);
    const int64_t dim_v = p->dim_v;
    const int capped = blk->softcap > 0.0f;
    float *lse2 = w->vec[0][0], *dl = w->vec[0][1], *lse2_lo = w->vec[0][2];
    const int need_ds = a->dk || dq_chunk;
    ctxpar_block_class cls[CTXPAR_BWD_GROUP_MAX];
    for (int g = 0; g < ng; g++) { // t[g] = K^T, V^T; krow[g] = K for dQ
        const int64_t j0 = (kt0 + g) * TK, nk = ctxpar_bwd_tile_rows(p->seq_k, kt0 + g, TK);
        const int64_t lanes = ctxpar_bwd_lanes(kern, nk);
        ctxpar_bwd_pack_t(kern, &blk->k, b, j0, nk, hk, lanes, ctxpar_cpu_score_sign(blk->scale),
                          w->row, w->t[g][0]);
        if (dq_chunk)
            ctxpar_cpu_load_rows(kern, &blk->k, b, j0, nk, hk, w->krow[g], krows[g]);
        ctxpar_bwd_pack_t(kern, &blk->v, b, j0, nk, hk, lanes, 1.0f, w->row, w->t[g][1]);
        memset(w->acc[g][0], 0, (size_t)(dim * lanes) * sizeof(double));
        memset(w->acc[g][1], 0, (size_t)(dim_v * lanes) * sizeof(double));
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
            const int64_t i0 = qt * TQ, nq = ctxpar_bwd_tile_rows(p->seq_q, qt, TQ);
            ctxpar_cpu_load_rows(kern, &blk->q, b, i0, nq, h, w->buf0, qrows);
            ctxpar_cpu_load_rows(kern, a->dout, b, i0, nq, h, w->buf1, orows);
            for (int64_t r = 0; r < nq; r++) {
                int64_t li = (b * p->heads_q + h) * p->seq_q + i0 + r;
                lse2[r] = ctxpar_bwd_lse2(a, li, &lse2_lo[r]);
                dl[r] = a->delta[li];
            }
            for (int g = 0; g < ng; g++) {
                if (cls[g] == CTXPAR_BLOCK_SKIP)
                    continue;
                const int64_t j0 = (kt0 + g) * TK, nk = ctxpar_bwd_tile_rows(p->seq_k, kt0 + g, TK);
                const int64_t lanes = ctxpar_bwd_lanes(kern, nk);
                const uint32_t *vis = NULL; // FULL: nothing masked, no select
                kern->scores(w->s, lanes, w->t[g][0], lanes, qrows, nq, lanes, dim);
                if (cls[g] == CTXPAR_BLOCK_PARTIAL) {
                    ctxpar_cpu_plan_mask(p, w->s, w->vis, lanes, i0, j0, nq, nk, 0);
                    vis = w->vis;
                }
                if (capped)
                    ctxpar_cpu_softcap(kern, blk, w->s, w->dcap, vis, lanes, nq);
                kern->exp2_sub(w->s, lanes, nq, lanes, c, NULL, NULL, lse2, lse2_lo);
                if (a->dv) {
                    kern->accum_f64(w->acc[g][1], lanes, w->s, vis, lanes, orows, nq, lanes, dim_v);
                }
                if (need_ds) {
                    kern->scores(w->dp, lanes, w->t[g][1], lanes, orows, nq, lanes, dim_v);
                    kern->dsoftmax(w->dp, w->s, vis, lanes, nq, lanes, NULL, dl);
                    if (capped)
                        scale_by(w->dp, w->dcap, lanes * nq);
                }
                if (a->dk) {
                    kern->accum_f64(w->acc[g][0], lanes, w->dp, vis, lanes, qrows, nq, lanes, dim);
                }
                if (dq_chunk)
                    add_dq(kern, w, w->dp, vis, lanes, nq, nk, krows[g], dim,
                           dq_chunk + ((b * p->heads_q + h) * p->q_tiles + qt) * dim * 64);
            }
        }
    }
    for (int g = 0; g < ng; g++) {
        const int64_t j0 = (kt0 + g) * TK, nk = ctxpar_bwd_tile_rows(p->seq_k, kt0 + g, TK);
        const int64_t lanes = ctxpar_bwd_lanes(kern, nk);
        for (int64_t r = 0; r < nk; r++) {
            const int64_t row = (b * p->seq_k + j0 + r) * p->heads_kv + hk;
            for (int64_t d = 0; a->dk && d < dim; d++) // the F64 sums rounded once, then added
                a->dk[row * dim + d] += (float)(blk->scale * w->acc[g][0][d * lanes + r]);
            for (int64_t d = 0; a->dv && d < dim_v; d++)
                a->dv[row * dim_v + d] += (float)w->acc[g][1][d * lanes + r];
        }
    }
}

void ctxpar_bwd_fused_item(const ctxpar_bwd_args *a, const ctxpar_bwd_ws *w, int64_t b,
                           int64_t hk, int64_t c) {
    const ctxpar_cpu_plan *p = a->p;
    double *dq_chunk = NULL; // without dq: the dk, dv items alone
    if (a->dq_part) {
        const size_t head = (size_t)(p->q_tiles * p->dim * 64); // one query head's tiles
        dq_chunk = a->dq_part + (size_t)(c * p->batch * p->heads_q) * head;
        for (int64_t h = hk * p->group; h < (hk + 1) * p->group; h++)
            memset(dq_chunk + (size_t)(b * p->heads_q + h) * head, 0, head * sizeof(double));
    }
    const int64_t end = (c + 1) * a->chunk_tiles < p->k_tiles ? (c + 1) * a->chunk_tiles
                                                               : p->k_tiles;
    for (int64_t kt0 = c * a->chunk_tiles; kt0 < end; kt0 += a->group) {
        const int ng = end - kt0 < a->group ? (int)(end - kt0) : a->group;
        ctxpar_bwd_dkv_item(a, w, b, hk, kt0, ng, dq_chunk);
    }
}
