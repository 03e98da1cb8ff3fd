/*
 * reference_problem.c - the fast reference's problem: argument checks, documents, the mask
 * predicate (written here, not taken from the library or oracle.c), tiles' geometry, and moving
 * rows between the dense inputs and the tile buffers.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "reference/reference_tile.h"

// Document holding position pos: the last boundary cu[d] <= pos for d >= 1, else 0 (an empty
// document, whose start equals the next one's, holds no position).
static int64_t doc_of(const int32_t *cu, int64_t num_docs, int64_t pos) {
    int64_t lo = 0, hi = num_docs - 1;
    while (lo < hi) {
        const int64_t mid = (lo + hi + 1) / 2;
        if (cu[mid] <= pos)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

static ctxpar_status init_docs(ref_problem *p, const ctxpar_mask_desc *mask,
                               const cpt_oracle_features *f) {
    const int per_row = f && f->row_cu_seqlens;
    const int32_t *cu = per_row ? f->row_cu_seqlens : mask ? mask->cu_seqlens : NULL;
    const int64_t n = per_row ? f->row_num_docs : mask ? mask->num_docs : 0;
    if (!cu)
        return CTXPAR_OK;
    if (n < 1)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "reference: %lld documents with boundaries",
                            (long long)n);
    p->doc_rows = per_row ? p->sh.batch : 1;
    for (int64_t r = 0; r < p->doc_rows; r++)
        for (int64_t d = 0; d < n; d++)
            if (cu[r * (n + 1) + d + 1] < cu[r * (n + 1) + d])
                return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG,
                                    "reference: document boundaries of row %lld decrease at %lld",
                                    (long long)r, (long long)d + 1);
    const int64_t Sq = p->sh.seq_q, Sk = p->sh.seq_k;
    p->q_doc = malloc(sizeof(int64_t) * (size_t)(p->doc_rows * Sq + 1));
    p->k_doc = malloc(sizeof(int64_t) * (size_t)(p->doc_rows * Sk + 1));
    if (!p->q_doc || !p->k_doc)
        return CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "reference: document tables");
    for (int64_t r = 0; r < p->doc_rows; r++) {
        const int32_t *row = cu + r * (n + 1);
        for (int64_t i = 0; i < Sq; i++)
            p->q_doc[r * Sq + i] = doc_of(row, n, p->q_pos ? p->q_pos[i] : i);
        for (int64_t j = 0; j < Sk; j++)
            p->k_doc[r * Sk + j] = doc_of(row, n, p->k_pos ? p->k_pos[j] : j);
    }
    return CTXPAR_OK;
}

// Sorted, distinct and in [0, n).
static int rows_ok(const int64_t *rows, int64_t count, int64_t n) {
    if (count < 0)
        return 0;
    for (int64_t x = 0; x < count; x++)
        if (rows[x] < 0 || rows[x] >= n || (x > 0 && rows[x] <= rows[x - 1]))
            return 0;
    return 1;
}

ctxpar_status ref_problem_init(ref_problem *p, const cpt_oracle_shape *s, const double *q,
                               const double *k, const double *v, const double *dout,
                               const int64_t *q_pos, const int64_t *k_pos,
                               const ctxpar_mask_desc *mask, const cpt_oracle_features *f,
                               double scale, const cpt_ref_select *sel) {
    *p = (ref_problem){0};
    if (!s)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "reference: shape is NULL");
    p->sh = *s;
    p->dv = f && f->head_dim_v > 0 ? f->head_dim_v : s->head_dim;
    if (s->batch < 0 || s->seq_q < 0 || s->seq_k < 0 || s->heads_q < 1 || s->heads_kv < 1 ||
        s->head_dim < 1 || s->heads_q % s->heads_kv != 0 || (f && f->head_dim_v < 0))
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG,
                            "reference: bad shape batch %lld seq_q %lld seq_k %lld heads_q %lld "
                            "heads_kv %lld head_dim %lld head_dim_v %lld",
                            (long long)s->batch, (long long)s->seq_q, (long long)s->seq_k,
                            (long long)s->heads_q, (long long)s->heads_kv,
                            (long long)s->head_dim, (long long)(f ? f->head_dim_v : 0));
    if (!q || !k || !v)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "reference: q, k or v is NULL");
    if (f && !(f->softcap >= 0.0))
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "reference: softcap %g", f->softcap);
    if (mask && (mask->window_left < 0 || mask->window_right < 0))
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG,
                            "reference: window_left %lld, window_right %lld",
                            (long long)mask->window_left, (long long)mask->window_right);
    if (sel && ((sel->q_rows && !rows_ok(sel->q_rows, sel->n_q, s->seq_q)) ||
                (sel->k_rows && !rows_ok(sel->k_rows, sel->n_k, s->seq_k))))
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG,
                            "reference: selected rows must be sorted, distinct and in range");
    *p = (ref_problem){.sh = *s,
                       .q = q,
                       .k = k,
                       .v = v,
                       .dout = dout,
                       .q_pos = q_pos,
                       .k_pos = k_pos,
                       .doc_rows = 1,
                       .scale = scale,
                       .dv = p->dv,
                       .group = s->heads_q / s->heads_kv};
    if (f) {
        p->softcap = f->softcap;
        p->sinks = f->sinks;
    }
    if (mask) {
        p->causal = mask->causal;
        p->window = mask->window_left;
        p->window_right = mask->window_right;
    }
    return init_docs(p, mask, f);
}

void ref_problem_free(ref_problem *p) {
    free(p->q_doc);
    free(p->k_doc);
    p->q_doc = p->k_doc = NULL;
}

int64_t ref_tile_len(int64_t n, int64_t t) {
    const int64_t left = n - t * CPT_REF_TILE;
    return left < CPT_REF_TILE ? left : CPT_REF_TILE;
}

void ref_geometry(const ref_problem *p, int64_t b, const ref_rowset *R, int64_t s0, int64_t n,
                  int is_query, ref_geo *g) {
    const int64_t *pos = is_query ? p->q_pos : p->k_pos;
    const int64_t *doc = is_query ? p->q_doc : p->k_doc;
    const int64_t seq = is_query ? p->sh.seq_q : p->sh.seq_k;
    const int64_t dr = p->doc_rows > 1 ? b : 0;
    g->n = n;
    g->pos_min = g->doc_min = INT64_MAX;
    g->pos_max = g->doc_max = INT64_MIN;
    for (int64_t x = 0; x < n; x++) {
        const int64_t row = R->rows ? R->rows[s0 + x] : s0 + x;
        g->pos[x] = pos ? pos[row] : row;
        g->doc[x] = doc ? doc[dr * seq + row] : 0;
        g->pos_min = g->pos[x] < g->pos_min ? g->pos[x] : g->pos_min;
        g->pos_max = g->pos[x] > g->pos_max ? g->pos[x] : g->pos_max;
        g->doc_min = g->doc[x] < g->doc_min ? g->doc[x] : g->doc_min;
        g->doc_max = g->doc[x] > g->doc_max ? g->doc[x] : g->doc_max;
    }
}

// The mask: query at position qp sees the key at kp when causal k <= q, left window q - k < W,
// right window k - q <= R, and both are in the same document.
static int visible(const ref_problem *p, int64_t qp, int64_t qd, int64_t kp, int64_t kd) {
    return (!p->causal || kp <= qp) && (p->window <= 0 || qp - kp < p->window) &&
           (p->window_right <= 0 || kp - qp <= p->window_right) && qd == kd;
}

int ref_visibility(const ref_problem *p, const ref_geo *qg, const ref_geo *kg, double *vis_buf,
                   const double **vis) {
    *vis = NULL;
    if (qg->n == 0 || kg->n == 0)
        return 0;
    // No pair: the ranges alone rule every one out.
    if ((p->causal && kg->pos_min > qg->pos_max) ||
        (p->window > 0 && qg->pos_min - kg->pos_max >= p->window) ||
        (p->window_right > 0 && kg->pos_min - qg->pos_max > p->window_right) ||
        kg->doc_max < qg->doc_min || kg->doc_min > qg->doc_max)
        return 0;
    // Every pair: the ranges alone let every one through.
    if ((!p->causal || kg->pos_max <= qg->pos_min) &&
        (p->window <= 0 || qg->pos_max - kg->pos_min < p->window) &&
        (p->window_right <= 0 || kg->pos_max - qg->pos_min <= p->window_right) &&
        qg->doc_min == qg->doc_max && kg->doc_min == kg->doc_max && qg->doc_min == kg->doc_min)
        return 1;
    int any = 0;
    for (int64_t a = 0; a < qg->n; a++)
        for (int64_t c = 0; c < kg->n; c++) {
            const int x = visible(p, qg->pos[a], qg->doc[a], kg->pos[c], kg->doc[c]);
            vis_buf[a * kg->n + c] = x ? 1.0 : 0.0; // doubles: the pair loops select on them
            any |= x;
        }
    *vis = vis_buf;
    return any;
}

CPT_REF_VECTOR int ref_gather(const double *src, int64_t seq, int64_t heads, int64_t dim, int64_t b,
               const ref_rowset *R, int64_t s0, int64_t n, int64_t h, double *dst,
               double *dst_abs) {
    int finite = 1;
    for (int64_t x = 0; x < n; x++) {
        const int64_t row = R->rows ? R->rows[s0 + x] : s0 + x;
        const double *r = src + ((b * seq + row) * heads + h) * dim;
        double *d = dst + x * dim;
        memcpy(d, r, sizeof(double) * (size_t)dim);
        for (int64_t e = 0; e < dim; e++)
            finite &= isfinite(d[e]) != 0;
        for (int64_t e = 0; dst_abs && e < dim; e++)
            dst_abs[x * dim + e] = fabs(d[e]);
    }
    return finite;
}

void ref_gather_slots(const double *src, int64_t b, int64_t slots, int64_t s0, int64_t n,
                      int64_t h, int64_t heads, int64_t dim, double *dst) {
    for (int64_t x = 0; x < n; x++)
        memcpy(dst + x * dim, src + ((b * slots + s0 + x) * heads + h) * dim,
               sizeof(double) * (size_t)dim);
}

void ref_scatter_slots(const double *src, double *dst, int64_t b, int64_t slots, int64_t s0,
                       int64_t n, int64_t h, int64_t heads, int64_t dim) {
    for (int64_t x = 0; x < n; x++)
        memcpy(dst + ((b * slots + s0 + x) * heads + h) * dim, src + x * dim,
               sizeof(double) * (size_t)dim);
}

void ref_select_rows(const ref_problem *p, const ref_rowset *R, const double *out_all,
                     const double *lse_all, double *out, double *lse) {
    const int64_t B = p->sh.batch, H = p->sh.heads_q, S = p->sh.seq_q, Dv = p->dv;
    for (int64_t b = 0; b < B; b++)
        for (int64_t x = 0; x < R->n; x++) {
            const int64_t i = R->rows[x];
            memcpy(out + (b * R->n + x) * H * Dv, out_all + (b * S + i) * H * Dv,
                   sizeof(double) * (size_t)(H * Dv));
            for (int64_t h = 0; h < H; h++)
                lse[(b * H + h) * R->n + x] = lse_all[(b * H + h) * S + i];
        }
}

// Every buffer of a workspace, by its size class.
int ref_ws_alloc(const ref_problem *p, ref_ws *w) {
    memset(w, 0, sizeof *w);
    const size_t T = CPT_REF_TILE, D = (size_t)(p->dv > p->sh.head_dim ? p->dv : p->sh.head_dim);
    double **rows[] = {&w->qt,  &w->qa,  &w->dot,  &w->doa,    &w->ot,   &w->kt,   &w->ka,
                       &w->vt,  &w->va,  &w->acc,  &w->u,      &w->mo,   &w->mo16, &w->dqa,
                       &w->mdqa, &w->mdqa16, &w->x, &w->dka, &w->dva, &w->mdka, &w->mdva,
                       &w->mdka16, &w->mdva16};
    double **pairs[] = {&w->s,  &w->a,  &w->tc, &w->pm, &w->wt,  &w->pw,
                        &w->dp, &w->bm, &w->ds, &w->mu, &w->mu16, &w->pd};
    double **vals[] = {&w->m, &w->l, &w->lse, &w->ml, &w->delta, &w->mdelta, &w->mdelta16};
    int ok = 1;
    for (size_t i = 0; i < sizeof rows / sizeof *rows; i++)
        ok &= (*rows[i] = malloc(sizeof(double) * T * D)) != NULL;
    for (size_t i = 0; i < sizeof pairs / sizeof *pairs; i++) // tc stays 0 without soft-capping
        ok &= (*pairs[i] = calloc(T * T, sizeof(double))) != NULL;
    for (size_t i = 0; i < sizeof vals / sizeof *vals; i++)
        ok &= (*vals[i] = malloc(sizeof(double) * T)) != NULL;
    ok &= (w->vis = malloc(sizeof(double) * T * T)) != NULL;
    ok &= (w->ones = malloc(sizeof(double) * T * T)) != NULL;
    for (size_t x = 0; w->ones && x < T * T; x++)
        w->ones[x] = 1.0;
    return ok ? 0 : -1;
}

void ref_ws_free(ref_ws *w) {
    double *all[] = {w->qt,   w->qa,  w->dot,    w->doa,   w->ot,   w->kt,     w->ka,
                     w->vt,   w->va,  w->acc,    w->u,     w->mo,   w->mo16,   w->dqa,
                     w->mdqa, w->mdqa16, w->x,   w->dka,   w->dva,  w->mdka,   w->mdva,
                     w->mdka16, w->mdva16, w->s, w->a,     w->tc,   w->pm,     w->wt,
                     w->pw,   w->dp,  w->bm,     w->ds,    w->mu,   w->mu16,   w->pd,
                     w->m,    w->l,   w->lse,    w->ml,    w->delta, w->mdelta, w->mdelta16};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        free(all[i]);
    free(w->vis);
    free(w->ones);
    memset(w, 0, sizeof *w);
}
