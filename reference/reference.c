/*
 * reference.c - the fast float64 reference (reference.h): three blocked passes over tiles of rows.
 *
 *   forward (query tiles): out and lse, an online softmax in float64;
 *   rows    (query tiles): the bound's forward magnitudes, delta and its magnitudes, dsinks'
 *                          parts, and dq with its magnitudes (they need the row's final out, lse);
 *   keys    (key tiles):   dk, dv and their magnitudes (they need every query row's lse, delta).
 *
 * Each output element is summed by the one work item that owns its row, so the passes recompute
 * the scores rather than share them across threads: the results are the same for any thread
 * count. The tile math and the mask are in reference_tile.c and reference_problem.c.
 */
#include "reference/reference.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "reference/reference_tile.h"

// Progress is counted in (item, key tile) steps.
typedef struct ref_run {
    const ref_problem *p;
    const cpt_ref_progress *progress;
    int64_t done, total;
} ref_run;

static void tick(ref_run *run) {
    int64_t d;
#pragma omp atomic capture
    d = ++run->done;
    if (run->progress && run->progress->report && omp_get_thread_num() == 0)
        run->progress->report(run->progress->user, d, run->total);
}

static int64_t tiles(int64_t n) { return (n + CPT_REF_TILE - 1) / CPT_REF_TILE; }

/* ------------------------------------------------------------------ the three passes */

// out [B, n, Hq, Dv] and lse [B, Hq, n] of query tile t (slots of R) of head h.
static void fwd_item(ref_run *run, ref_ws *w, int64_t b, int64_t h, int64_t t,
                     const ref_rowset *R, double *out, double *lse) {
    const ref_problem *p = run->p;
    const int64_t H = p->sh.heads_q, Hk = p->sh.heads_kv, D = p->sh.head_dim, Dv = p->dv;
    const int64_t a0 = t * CPT_REF_TILE, nI = ref_tile_len(R->n, t), hk = h / p->group;
    const ref_rowset K = {NULL, p->sh.seq_k};
    ref_geometry(p, b, R, a0, nI, 1, &w->qg);
    ref_gather(p->q, p->sh.seq_q, H, D, b, R, a0, nI, h, w->qt, NULL);
    for (int64_t a = 0; a < nI; a++) { // the sink enters each row once, as a key with no value
        w->m[a] = p->sinks ? p->sinks[h] : -INFINITY;
        w->l[a] = p->sinks ? 1.0 : 0.0;
    }
    memset(w->acc, 0, sizeof(double) * (size_t)(nI * Dv));
    for (int64_t u = 0; u < tiles(K.n); u++) {
        const int64_t c0 = u * CPT_REF_TILE, nJ = ref_tile_len(K.n, u);
        const double *vis;
        tick(run); // every tile, seen or skipped: the total counts them all
        ref_geometry(p, b, &K, c0, nJ, 0, &w->kg);
        if (!ref_visibility(p, &w->qg, &w->kg, w->vis, &vis))
            continue;
        ref_gather(p->k, p->sh.seq_k, Hk, D, b, &K, c0, nJ, hk, w->kt, NULL);
        const int vfin = ref_gather(p->v, p->sh.seq_k, Hk, Dv, b, &K, c0, nJ, hk, w->vt, NULL);
        ref_scores(p, w, nI, nJ, vis);
        ref_online_softmax(w, nI, nJ, Dv);
        ref_pair_gemm(0, nI, Dv, nJ, 1.0, w->pm, w->vt, w->acc, vis, vfin);
    }
    for (int64_t a = 0; a < nI; a++) {
        const int64_t slot = a0 + a;
        const double l = w->l[a];
        double *o = out + ((b * R->n + slot) * H + h) * Dv;
        // l = 0: no key and no sink (out 0, lse -inf); l NaN: a NaN reached the row.
        for (int64_t d = 0; d < Dv; d++)
            o[d] = l == 0.0 ? 0.0 : w->acc[a * Dv + d] / l;
        lse[(b * H + h) * R->n + slot] = l == 0.0 ? -INFINITY : w->m[a] + log(l);
    }
}

// The rows pass over query tile t of head h (needs out and lse of R's slots).
static void rows_item(ref_run *run, ref_ws *w, int64_t b, int64_t h, int64_t t,
                      const ref_rowset *R, const double *out, const double *lse,
                      const ref_rows_dst *dst) {
    const ref_problem *p = run->p;
    const int64_t H = p->sh.heads_q, Hk = p->sh.heads_kv, D = p->sh.head_dim, Dv = p->dv;
    const int64_t a0 = t * CPT_REF_TILE, nI = ref_tile_len(R->n, t), hk = h / p->group;
    const ref_rowset K = {NULL, p->sh.seq_k};
    const int bwd = p->dout != NULL;
    ref_geometry(p, b, R, a0, nI, 1, &w->qg);
    ref_gather(p->q, p->sh.seq_q, H, D, b, R, a0, nI, h, w->qt, w->qa);
    if (bwd)
        ref_gather(p->dout, p->sh.seq_q, H, Dv, b, R, a0, nI, h, w->dot, w->doa);
    ref_gather_slots(out, b, R->n, a0, nI, h, H, Dv, w->ot);
    for (int64_t a = 0; a < nI; a++) {
        w->lse[a] = lse[(b * H + h) * R->n + a0 + a];
        w->ml[a] = isinf(w->lse[a]) ? 0.0 : fabs(w->lse[a]) + 1.0;
        double delta = 0.0;
        for (int64_t d = 0; bwd && d < Dv; d++)
            delta += w->dot[a * Dv + d] * w->ot[a * Dv + d];
        w->delta[a] = delta;
    }
    ref_zero_row_accumulators(w, nI, D, Dv);
    for (int64_t u = 0; u < tiles(K.n); u++) {
        const int64_t c0 = u * CPT_REF_TILE, nJ = ref_tile_len(K.n, u);
        const double *vis;
        tick(run); // every tile, seen or skipped: the total counts them all
        ref_geometry(p, b, &K, c0, nJ, 0, &w->kg);
        if (!ref_visibility(p, &w->qg, &w->kg, w->vis, &vis))
            continue;
        const int kfin = ref_gather(p->k, p->sh.seq_k, Hk, D, b, &K, c0, nJ, hk, w->kt, w->ka);
        const int vfin = ref_gather(p->v, p->sh.seq_k, Hk, Dv, b, &K, c0, nJ, hk, w->vt, w->va);
        ref_scores(p, w, nI, nJ, vis);
        ref_abs_scores(w, nI, nJ, D);
        ref_probabilities(p, w, nI, nJ, vis);
        for (int64_t a = 0; a < nI; a++)
            for (int64_t c = 0; c < nJ; c++)
                w->ml[a] += w->pw[a * nJ + c];
        ref_pair_gemm(0, nI, Dv, nJ, 1.0, w->pm, w->va, w->u, vis, vfin);
        ref_spread(p, w, nI, nJ, vis);
        if (dst->dq) {
            const double as = fabs(p->scale);
            ref_grad_scores(p, w, nI, nJ, vis, 0);
            ref_pair_gemm(0, nI, D, nJ, p->scale, w->ds, w->kt, w->dqa, vis, kfin);
            ref_pair_gemm(0, nI, D, nJ, as, w->mu, w->ka, w->mdqa, vis, kfin);
            ref_pair_gemm(0, nI, D, nJ, 1.0, w->pd, w->ka, w->x, vis, kfin);
            if (dst->mdq16)
                ref_pair_gemm(0, nI, D, nJ, as, w->mu16, w->ka, w->mdqa16, vis, kfin);
        }
    }
    ref_finish_rows(p, w, b, h, a0, nI, R->n, dst);
}

typedef struct keys_dst {
    double *dk, *dv, *mdk, *mdv, *mdk16, *mdv16; // [B, n_k, Hkv, D or Dv]; 16: NULL unwanted
} keys_dst;

// dk, dv of key tile u (slots of Ks) of K/V head hk: over every query row of R and every query
// head of the group (lse, delta and its magnitudes of R's rows in rs).
static void keys_item(ref_run *run, ref_ws *w, int64_t b, int64_t hk, int64_t u,
                      const ref_rowset *Ks, const ref_rowset *R, const ref_rows_dst *rs,
                      const double *lse, const keys_dst *ko) {
    const ref_problem *p = run->p;
    const int64_t H = p->sh.heads_q, Hk = p->sh.heads_kv, D = p->sh.head_dim, Dv = p->dv;
    const int64_t c0 = u * CPT_REF_TILE, nJ = ref_tile_len(Ks->n, u), n = Ks->n;
    const double as = fabs(p->scale);
    ref_geometry(p, b, Ks, c0, nJ, 0, &w->kg);
    ref_gather(p->k, p->sh.seq_k, Hk, D, b, Ks, c0, nJ, hk, w->kt, w->ka);
    ref_gather(p->v, p->sh.seq_k, Hk, Dv, b, Ks, c0, nJ, hk, w->vt, w->va);
    ref_zero_key_accumulators(w, nJ, D, Dv);
    for (int64_t h = hk * p->group; h < (hk + 1) * p->group; h++)
        for (int64_t t = 0; t < tiles(R->n); t++) {
            const int64_t a0 = t * CPT_REF_TILE, nI = ref_tile_len(R->n, t);
            const double *vis;
            tick(run);
            ref_geometry(p, b, R, a0, nI, 1, &w->qg);
            if (!ref_visibility(p, &w->qg, &w->kg, w->vis, &vis))
                continue;
            const int qfin = ref_gather(p->q, p->sh.seq_q, H, D, b, R, a0, nI, h, w->qt, w->qa);
            const int dfin =
                ref_gather(p->dout, p->sh.seq_q, H, Dv, b, R, a0, nI, h, w->dot, w->doa);
            for (int64_t a = 0; a < nI; a++) {
                const int64_t r = (b * H + h) * R->n + a0 + a;
                w->lse[a] = lse[r];
                w->delta[a] = rs->delta[r];
                w->mdelta[a] = rs->mdelta[r];
                w->mdelta16[a] = rs->mdelta16[r];
            }
            ref_scores(p, w, nI, nJ, vis);
            ref_abs_scores(w, nI, nJ, D);
            ref_probabilities(p, w, nI, nJ, vis);
            ref_grad_scores(p, w, nI, nJ, vis, 1);
            ref_pair_gemm(1, nJ, D, nI, p->scale, w->ds, w->qt, w->dka, vis, qfin);
            ref_pair_gemm(1, nJ, Dv, nI, 1.0, w->pm, w->dot, w->dva, vis, dfin);
            ref_pair_gemm(1, nJ, D, nI, as, w->mu, w->qa, w->mdka, vis, qfin);
            ref_pair_gemm(1, nJ, Dv, nI, 1.0, w->pw, w->doa, w->mdva, vis, dfin);
            if (ko->mdk16) {
                ref_pair_gemm(1, nJ, D, nI, as, w->mu16, w->qa, w->mdka16, vis, qfin);
                ref_pair_gemm(1, nJ, Dv, nI, 1.0, w->pm, w->doa, w->mdva16, vis, dfin);
            }
        }
    ref_scatter_slots(w->dka, ko->dk, b, n, c0, nJ, hk, Hk, D);
    ref_scatter_slots(w->dva, ko->dv, b, n, c0, nJ, hk, Hk, Dv);
    ref_scatter_slots(w->mdka, ko->mdk, b, n, c0, nJ, hk, Hk, D);
    ref_scatter_slots(w->mdva, ko->mdv, b, n, c0, nJ, hk, Hk, Dv);
    if (ko->mdk16) {
        ref_scatter_slots(w->mdka16, ko->mdk16, b, n, c0, nJ, hk, Hk, D);
        ref_scatter_slots(w->mdva16, ko->mdv16, b, n, c0, nJ, hk, Hk, Dv);
    }
}

typedef enum pass_kind { PASS_FWD, PASS_ROWS, PASS_KEYS } pass_kind;

typedef struct pass_args {
    pass_kind kind;
    const ref_rowset *R, *Ks; // query rows; key rows (keys pass)
    double *out, *lse;        // forward: written; rows and keys: read
    const ref_rows_dst *rows; // rows: written; keys: its delta and magnitudes read
    const keys_dst *keys;
} pass_args;

// Every (batch row, head, tile) item of a pass, spread over threads with a workspace each.
// Returns 0, or -1 when a workspace could not be allocated.
static int run_pass(ref_run *run, const pass_args *a) {
    const ref_problem *p = run->p;
    const int64_t heads = a->kind == PASS_KEYS ? p->sh.heads_kv : p->sh.heads_q;
    const int64_t nt = tiles(a->kind == PASS_KEYS ? a->Ks->n : a->R->n);
    const int64_t items = p->sh.batch * heads * nt;
    int failed = 0;
#pragma omp parallel reduction(| : failed)
    {
        ref_ws w;
        if (ref_ws_alloc(p, &w) != 0)
            failed = 1;
        // A thread without a workspace still meets the loop's implicit barrier.
#pragma omp for schedule(dynamic, 1)
        for (int64_t it = 0; it < items; it++) {
            if (failed)
                continue;
            const int64_t b = it / (heads * nt), h = it / nt % heads, t = it % nt;
            if (a->kind == PASS_FWD)
                fwd_item(run, &w, b, h, t, a->R, a->out, a->lse);
            else if (a->kind == PASS_ROWS)
                rows_item(run, &w, b, h, t, a->R, a->out, a->lse, a->rows);
            else
                keys_item(run, &w, b, h, t, a->Ks, a->R, a->rows, a->lse, a->keys);
        }
        ref_ws_free(&w);
    }
    return failed ? -1 : 0;
}

/* ------------------------------------------------------------------ buffers */

// The caller's array when given, else one of ours; a failed allocation is remembered.
typedef struct ref_buffers {
    double *own[32];
    int n, failed;
} ref_buffers;

static double *take(ref_buffers *bs, double *given, int64_t count) {
    if (given)
        return given;
    double *x = bs->n < 32 ? malloc(sizeof(double) * (size_t)(count > 0 ? count : 1)) : NULL;
    if (!x)
        bs->failed = 1;
    else
        bs->own[bs->n++] = x;
    return x;
}

static void release(ref_buffers *bs) {
    for (int i = 0; i < bs->n; i++)
        free(bs->own[i]);
    bs->n = 0;
}

// The rows pass's outputs over n rows: the caller's arrays where o has them (direct), else ours.
static ref_rows_dst rows_dst(ref_buffers *bs, const ref_problem *p, int64_t n, const cpt_ref_out *o,
                             int direct, int with_dq) {
    const int64_t B = p->sh.batch, H = p->sh.heads_q, D = p->sh.head_dim, Dv = p->dv;
    const int want16 = o->mag16[0] != NULL, bwd = p->dout != NULL;
    ref_rows_dst d = {0};
    d.mout = take(bs, direct ? o->mag[0] : NULL, B * n * H * Dv);
    d.mout16 = want16 ? take(bs, direct ? o->mag16[0] : NULL, B * n * H * Dv) : NULL;
    d.ml = take(bs, direct ? o->mag[1] : NULL, B * H * n);
    d.delta = take(bs, NULL, B * H * n);
    d.mdelta = take(bs, NULL, B * H * n);
    d.mdelta16 = take(bs, NULL, B * H * n);
    if (with_dq) {
        d.dq = take(bs, o->t[2], B * n * H * D);
        d.mdq = take(bs, o->mag[2], B * n * H * D);
        d.mdq16 = want16 ? take(bs, o->mag16[2], B * n * H * D) : NULL;
    }
    for (int j = 0; bwd && p->sinks && j < 3; j++)
        d.sink_part[j] = take(bs, NULL, B * H * n);
    return d;
}

// dsinks [Hq] from the rows' parts [B, Hq, n], summed over batch and rows in order.
static void sum_sink_parts(const ref_problem *p, int64_t n, const ref_rows_dst *d,
                           cpt_ref_out *o) {
    double *dst[3] = {o->dsinks, o->mdsinks, o->mdsinks16};
    const int64_t H = p->sh.heads_q;
    for (int j = 0; j < 3; j++)
        for (int64_t h = 0; dst[j] && h < H; h++) {
            double s = 0.0;
            for (int64_t b = 0; d->sink_part[j] && b < p->sh.batch; b++)
                for (int64_t x = 0; x < n; x++)
                    s += d->sink_part[j][(b * H + h) * n + x];
            dst[j][h] = j == 2 && !p->want16 ? NAN : s; // M16 was not summed
        }
}

/* ------------------------------------------------------------------ the entry point */

static ctxpar_status compute(const ref_problem *p, const cpt_ref_select *sel,
                             const cpt_ref_progress *progress, cpt_ref_out *o) {
    const int64_t B = p->sh.batch, H = p->sh.heads_q, Hk = p->sh.heads_kv;
    const int64_t D = p->sh.head_dim, Dv = p->dv, Sk = p->sh.seq_k;
    const int bwd = p->dout != NULL;
    const ref_rowset all_q = {NULL, p->sh.seq_q}, all_k = {NULL, Sk};
    const ref_rowset Rq = sel && sel->q_rows ? (ref_rowset){sel->q_rows, sel->n_q} : all_q;
    const ref_rowset Ks = sel && sel->k_rows ? (ref_rowset){sel->k_rows, sel->n_k} : all_k;
    // dk, dv and dsinks need every query row's forward: with a backward and a selection of query
    // rows, every row runs first (stats only), then the selected ones again with dq.
    const int split = bwd && Rq.rows != NULL;
    const ref_rowset *R = split ? &all_q : &Rq;
    const int64_t n = R->n;
    ref_buffers bs = {{0}, 0, 0};
    double *out = take(&bs, split ? NULL : o->t[0], B * n * H * Dv);
    double *lse = take(&bs, split ? NULL : o->t[1], B * H * n);
    const ref_rows_dst rows = rows_dst(&bs, p, n, o, !split, bwd && !split);
    keys_dst keys = {0};
    if (bwd) {
        const int want16 = o->mag16[0] != NULL;
        keys = (keys_dst){take(&bs, o->t[3], B * Ks.n * Hk * D),
                          take(&bs, o->t[4], B * Ks.n * Hk * Dv),
                          take(&bs, o->mag[3], B * Ks.n * Hk * D),
                          take(&bs, o->mag[4], B * Ks.n * Hk * Dv),
                          want16 ? take(&bs, o->mag16[3], B * Ks.n * Hk * D) : NULL,
                          want16 ? take(&bs, o->mag16[4], B * Ks.n * Hk * Dv) : NULL};
    }
    ref_rows_dst sel_rows = {0};
    double *sel_out = NULL, *sel_lse = NULL;
    if (split) {
        sel_out = take(&bs, o->t[0], B * Rq.n * H * Dv);
        sel_lse = take(&bs, o->t[1], B * H * Rq.n);
        sel_rows = rows_dst(&bs, p, Rq.n, o, 1, 1);
    }
    if (bs.failed) {
        release(&bs);
        return CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "reference: buffers for %lld rows",
                            (long long)n);
    }
    const int64_t steps = tiles(Sk) * H * B;
    ref_run run = {p, progress, 0,
                   steps * (2 * tiles(n) + (split ? tiles(Rq.n) : 0)) +
                       (bwd ? B * H * tiles(n) * tiles(Ks.n) : 0)};
    int failed = run_pass(&run, &(pass_args){PASS_FWD, R, NULL, out, lse, NULL, NULL});
    if (!failed)
        failed = run_pass(&run, &(pass_args){PASS_ROWS, R, NULL, out, lse, &rows, NULL});
    if (!failed && bwd) {
        failed = run_pass(&run, &(pass_args){PASS_KEYS, R, &Ks, NULL, lse, &rows, &keys});
        sum_sink_parts(p, n, &rows, o);
    }
    if (!failed && split) {
        ref_select_rows(p, &Rq, out, lse, sel_out, sel_lse);
        failed = run_pass(&run, &(pass_args){PASS_ROWS, &Rq, NULL, sel_out, sel_lse, &sel_rows,
                                             NULL});
    }
    if (o->mag16[1]) // lse is stored in F32 whatever the dtype
        memset(o->mag16[1], 0, sizeof(double) * (size_t)(B * H * Rq.n));
    release(&bs);
    if (progress && progress->report)
        progress->report(progress->user, run.total, run.total);
    return failed ? CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "reference: tile workspaces")
                  : CTXPAR_OK;
}

// Every wanted output, NaN: the result of a failed call.
static void fill_nan(const cpt_oracle_shape *sh, const cpt_oracle_features *f,
                     const cpt_ref_select *sel, int bwd, cpt_ref_out *o) {
    if (!sh || sh->batch < 0 || sh->seq_q < 0 || sh->seq_k < 0 || sh->heads_q < 0 ||
        sh->heads_kv < 0 || sh->head_dim < 0 || (f && f->head_dim_v < 0))
        return;
    const int64_t dv = f && f->head_dim_v > 0 ? f->head_dim_v : sh->head_dim;
    const int64_t nq = sel && sel->q_rows ? sel->n_q : sh->seq_q;
    const int64_t nk = sel && sel->k_rows ? sel->n_k : sh->seq_k;
    const int64_t B = sh->batch, H = sh->heads_q, Hk = sh->heads_kv, D = sh->head_dim;
    const int64_t count[5] = {B * nq * H * dv, B * H * nq, B * nq * H * D, B * nk * Hk * D,
                              B * nk * Hk * dv};
    for (int i = 0; i < 5 && (i < 2 || bwd); i++) {
        double *arr[3] = {o->t[i], o->mag[i], o->mag16[i]};
        for (int j = 0; j < 3; j++)
            for (int64_t x = 0; arr[j] && x < count[i]; x++)
                arr[j][x] = NAN;
    }
    double *ds[3] = {o->dsinks, o->mdsinks, o->mdsinks16};
    for (int j = 0; j < 3; j++)
        for (int64_t x = 0; bwd && ds[j] && x < H; x++)
            ds[j][x] = NAN;
}

ctxpar_status cpt_reference(const cpt_oracle_shape *shape, const double *q, const double *k,
                            const double *v, const double *dout, const int64_t *q_pos,
                            const int64_t *k_pos, const ctxpar_mask_desc *mask,
                            const cpt_oracle_features *features, double scale,
                            const cpt_ref_select *sel, const cpt_ref_progress *progress,
                            cpt_ref_out *o) {
    if (!o)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "reference: no outputs");
    ref_problem p;
    ctxpar_status st =
        ref_problem_init(&p, shape, q, k, v, dout, q_pos, k_pos, mask, features, scale, sel);
    p.want16 = o->mag16[0] != NULL;
    if (st == CTXPAR_OK) {
        // The threads are the reference's own: BLAS runs single-threaded inside each.
        const int blas_threads = ref_blas_single();
        st = compute(&p, sel, progress, o);
        ref_blas_restore(blas_threads);
    }
    ref_problem_free(&p);
    if (st != CTXPAR_OK)
        fill_nan(shape, features, sel, dout != NULL, o);
    return st;
}
