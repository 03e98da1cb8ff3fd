/*
 * oracle.c - full attention in float64 on the host: the reference every test compares against.
 *
 * Deliberately plain: one query row at a time against every key, no tiling, and a mask predicate
 * written here rather than taken from the library, so that a bug in the code under test cannot
 * hide in a shared helper. Every output element is written by exactly one loop iteration, so the
 * results do not depend on the OpenMP thread count.
 */
#include "reference/oracle.h"

#include <math.h>
#include <stdlib.h>

// Everything one attention problem needs, resolved once: shapes, inputs, the mask.
typedef struct oracle_problem {
    cpt_oracle_shape sh;
    const double *q, *k, *v;
    const int64_t *q_pos, *k_pos; // NULL: row i is at position i
    int causal;
    int64_t window, window_right;
    int64_t *q_doc, *k_doc; // [B, S] document of each row; NULL without documents
    double scale, softcap;
    const double *sinks; // [Hq] or NULL
    int64_t dim_v;       // head_dim of v, out, dout, dv
    int64_t group;       // query heads per K/V head
} oracle_problem;

// Four independent partial sums keep the loop from being one long chain of dependent adds (the
// oracle runs at seq 4096); in float64 the summation order is far below every tolerance.
static double dot(const double *a, const double *b, int64_t n) {
    double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0;
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        s0 += a[i] * b[i];
        s1 += a[i + 1] * b[i + 1];
        s2 += a[i + 2] * b[i + 2];
        s3 += a[i + 3] * b[i + 3];
    }
    for (; i < n; i++)
        s0 += a[i] * b[i];
    return (s0 + s1) + (s2 + s3);
}

// restrict and simd let -O2 vectorise this without a runtime aliasing check.
static void axpy(double alpha, const double *restrict x, double *restrict y, int64_t n) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++)
        y[i] += alpha * x[i];
}

// Document holding global position pos: the last boundary cu[d] <= pos (so an empty document,
// whose start equals the next one's, holds no position).
static int64_t doc_of(const int32_t *cu, int64_t num_docs, int64_t pos) {
    int64_t doc = 0;
    for (int64_t d = 1; d < num_docs; d++)
        if (cu[d] <= pos)
            doc = d;
    return doc;
}

// Whether query row i sees key row j of batch row b: causal k <= q, left window q - k < W,
// right window k - q <= R, same document.
static int visible(const oracle_problem *p, int64_t b, int64_t i, int64_t j) {
    int64_t qp = p->q_pos ? p->q_pos[i] : i;
    int64_t kp = p->k_pos ? p->k_pos[j] : j;
    if (p->causal && kp > qp)
        return 0;
    if (p->window > 0 && qp - kp >= p->window)
        return 0;
    if (p->window_right > 0 && kp - qp > p->window_right)
        return 0;
    if (p->q_doc && p->q_doc[b * p->sh.seq_q + i] != p->k_doc[b * p->sh.seq_k + j])
        return 0;
    return 1;
}

// The score of a visible pair from x = scale q.k: x, or C tanh(x / C) with soft-capping.
static double score(const oracle_problem *p, double x) {
    return p->softcap > 0.0 ? p->softcap * tanh(x / p->softcap) : x;
}

// d score / d x.
static double score_slope(const oracle_problem *p, double x) {
    if (p->softcap <= 0.0)
        return 1.0;
    double t = tanh(x / p->softcap);
    return 1.0 - t * t;
}

// Row pointers into the dense BSHD inputs.
static const double *q_row(const oracle_problem *p, int64_t b, int64_t i, int64_t h) {
    return p->q + ((b * p->sh.seq_q + i) * p->sh.heads_q + h) * p->sh.head_dim;
}

static const double *k_row(const oracle_problem *p, int64_t b, int64_t j, int64_t hk) {
    return p->k + ((b * p->sh.seq_k + j) * p->sh.heads_kv + hk) * p->sh.head_dim;
}

static const double *v_row(const oracle_problem *p, int64_t b, int64_t j, int64_t hk) {
    return p->v + ((b * p->sh.seq_k + j) * p->sh.heads_kv + hk) * p->dim_v;
}

static int64_t q_elems(const cpt_oracle_shape *s, int64_t dim) {
    return s->batch * s->seq_q * s->heads_q * dim;
}

static int64_t kv_elems(const cpt_oracle_shape *s, int64_t dim) {
    return s->batch * s->seq_k * s->heads_kv * dim;
}

// After a failure: NaN in every output whose size the shape still tells.
static void fill_nan(const cpt_oracle_shape *s, double *x, int64_t n) {
    if (!x || s->batch < 0 || s->seq_q < 0 || s->seq_k < 0 || s->heads_q < 0 || s->heads_kv < 0 ||
        s->head_dim < 0 || n < 0)
        return;
    for (int64_t i = 0; i < n; i++)
        x[i] = NAN;
}

static void problem_free(oracle_problem *p) {
    free(p->q_doc);
    free(p->k_doc);
    p->q_doc = p->k_doc = NULL;
}

// The documents of every row of every batch row: from the features' per-row boundaries, or the
// mask's (the same for every batch row).
static ctxpar_status init_docs(oracle_problem *p, const ctxpar_mask_desc *mask,
                               const cpt_oracle_features *f) {
    const cpt_oracle_shape *s = &p->sh;
    const int per_row = f && f->row_cu_seqlens;
    const int32_t *cu = per_row ? f->row_cu_seqlens : mask ? mask->cu_seqlens : NULL;
    const int64_t n = per_row ? f->row_num_docs : mask ? mask->num_docs : 0;
    if (!cu)
        return CTXPAR_OK;
    if (n < 1)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "oracle: %lld documents with boundaries",
                            (long long)n);
    p->q_doc = malloc(sizeof(int64_t) * (size_t)(s->batch * s->seq_q + 1));
    p->k_doc = malloc(sizeof(int64_t) * (size_t)(s->batch * s->seq_k + 1));
    if (!p->q_doc || !p->k_doc)
        return CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY,
                            "oracle: document tables for %lld + %lld rows", (long long)s->seq_q,
                            (long long)s->seq_k);
    for (int64_t b = 0; b < s->batch; b++) {
        const int32_t *row = per_row ? cu + b * (n + 1) : cu;
        for (int64_t i = 0; i < s->seq_q; i++)
            p->q_doc[b * s->seq_q + i] = doc_of(row, n, p->q_pos ? p->q_pos[i] : i);
        for (int64_t j = 0; j < s->seq_k; j++)
            p->k_doc[b * s->seq_k + j] = doc_of(row, n, p->k_pos ? p->k_pos[j] : j);
    }
    return CTXPAR_OK;
}

// Checks the arguments and precomputes the document of every row.
static ctxpar_status problem_init(oracle_problem *p, const cpt_oracle_shape *shape,
                                  const double *q, const double *k, const double *v,
                                  const int64_t *q_pos, const int64_t *k_pos,
                                  const ctxpar_mask_desc *mask, const cpt_oracle_features *f,
                                  double scale) {
    *p = (oracle_problem){0};
    if (!shape)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "oracle: shape is NULL");
    const cpt_oracle_shape *s = shape;
    p->sh = *s;
    p->dim_v = f && f->head_dim_v > 0 ? f->head_dim_v : s->head_dim;
    if (s->batch < 0 || s->seq_q < 0 || s->seq_k < 0 || s->heads_q < 1 || s->heads_kv < 1 ||
        s->head_dim < 1 || s->heads_q % s->heads_kv != 0 || (f && f->head_dim_v < 0))
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG,
                            "oracle: bad shape batch %lld seq_q %lld seq_k %lld heads_q %lld "
                            "heads_kv %lld head_dim %lld head_dim_v %lld",
                            (long long)s->batch, (long long)s->seq_q, (long long)s->seq_k,
                            (long long)s->heads_q, (long long)s->heads_kv, (long long)s->head_dim,
                            (long long)(f ? f->head_dim_v : 0));
    if (!q || !k || !v)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "oracle: q, k or v is NULL");
    if (f && !(f->softcap >= 0.0))
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "oracle: softcap %g", f->softcap);
    if (mask && (mask->window_left < 0 || mask->window_right < 0))
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "oracle: window_left %lld, window_right %lld",
                            (long long)mask->window_left, (long long)mask->window_right);
    p->q = q;
    p->k = k;
    p->v = v;
    p->q_pos = q_pos;
    p->k_pos = k_pos;
    p->scale = scale;
    p->group = s->heads_q / s->heads_kv;
    if (f) {
        p->softcap = f->softcap;
        p->sinks = f->sinks;
    }
    if (mask) {
        p->causal = mask->causal;
        p->window = mask->window_left;
        p->window_right = mask->window_right;
    }
    ctxpar_status st = init_docs(p, mask, f);
    if (st != CTXPAR_OK)
        problem_free(p);
    return st;
}

/*
 * One query row: q_i [D] of head h against keys k_j [D] of K/V head h/group, j < Sk.
 * With scores s_ij = score(scale q_i.k_j) and the head's sink logit sigma (when given),
 *   lse_i = log(sum_j exp(s_ij) + exp(sigma)),  out_i [Dv] = sum_j exp(s_ij - lse_i) v_j:
 * the sink adds to the denominator once and has no value. Without a sink and with no visible
 * key, lse_i = -inf and out_i = 0. The row maximum is subtracted before exp (no overflow).
 */
static double fwd_row(const oracle_problem *p, int64_t b, int64_t h, int64_t i, double *out_i) {
    const int64_t D = p->sh.head_dim, Dv = p->dim_v, hk = h / p->group;
    const double *qi = q_row(p, b, i, h);
    const double sink = p->sinks ? p->sinks[h] : -INFINITY;
    double m = sink;
    int any = p->sinks != NULL;
    for (int64_t j = 0; j < p->sh.seq_k; j++) {
        if (!visible(p, b, i, j))
            continue;
        double s = score(p, p->scale * dot(qi, k_row(p, b, j, hk), D));
        if (!any || s > m)
            m = s;
        any = 1;
    }
    for (int64_t d = 0; d < Dv; d++)
        out_i[d] = 0.0;
    if (!any)
        return -INFINITY;
    double sum = p->sinks ? exp(sink - m) : 0.0;
    for (int64_t j = 0; j < p->sh.seq_k; j++) {
        if (!visible(p, b, i, j))
            continue;
        double w = exp(score(p, p->scale * dot(qi, k_row(p, b, j, hk), D)) - m);
        sum += w;
        axpy(w, v_row(p, b, j, hk), out_i, Dv);
    }
    for (int64_t d = 0; d < Dv; d++)
        out_i[d] /= sum;
    return m + log(sum);
}

// out [B, Sq, Hq, Dv], lse [B, Hq, Sq] (may be NULL): every row, rows spread over threads.
static void fwd_all(const oracle_problem *p, double *out, double *lse) {
    const int64_t Sq = p->sh.seq_q, H = p->sh.heads_q, Dv = p->dim_v;
    const int64_t rows = p->sh.batch * H * Sq;
#pragma omp parallel for schedule(dynamic, 16)
    for (int64_t r = 0; r < rows; r++) {
        int64_t b = r / (H * Sq), h = r / Sq % H, i = r % Sq;
        double l = fwd_row(p, b, h, i, out + ((b * Sq + i) * H + h) * Dv);
        if (lse)
            lse[r] = l;
    }
}

void cpt_oracle_fwd_ex(const cpt_oracle_shape *shape, const double *q, const double *k,
                       const double *v, const int64_t *q_pos, const int64_t *k_pos,
                       const ctxpar_mask_desc *mask, const cpt_oracle_features *features,
                       double scale, double *out, double *lse) {
    oracle_problem p;
    ctxpar_status st = problem_init(&p, shape, q, k, v, q_pos, k_pos, mask, features, scale);
    if (st == CTXPAR_OK && !out)
        st = CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "oracle: out is NULL");
    if (st != CTXPAR_OK) {
        // A reference that could not be computed must fail every comparison, never pass one.
        fill_nan(&p.sh, out, q_elems(&p.sh, p.dim_v));
        fill_nan(&p.sh, lse, p.sh.batch * p.sh.heads_q * p.sh.seq_q);
        problem_free(&p);
        return;
    }
    fwd_all(&p, out, lse);
    problem_free(&p);
}

void cpt_oracle_fwd(const cpt_oracle_shape *shape, const double *q, const double *k,
                    const double *v, const int64_t *q_pos, const int64_t *k_pos,
                    const ctxpar_mask_desc *mask, double scale, double *out, double *lse) {
    cpt_oracle_fwd_ex(shape, q, k, v, q_pos, k_pos, mask, NULL, scale, out, lse);
}

/*
 * Gradients with x_ij = scale q_i.k_j, P_ij = exp(score(x_ij) - lse_i) over visible pairs,
 * dP_ij = dout_i.v_j, delta_i = dout_i.out_i, dS_ij = P_ij (dP_ij - delta_i) score'(x_ij):
 *   dq_i = scale sum_j dS_ij k_j                      [B, Sq, Hq, D], one row per iteration
 *   dk_j = scale sum_{h in group(j), i} dS_ij q_i     [B, Sk, Hkv, D], one row per iteration
 *   dv_j = sum_{h in group(j), i} P_ij dout_i         [B, Sk, Hkv, Dv]
 *   dsink_h = -sum_{b, i} exp(sigma_h - lse_i) delta_i (the sink's P times d lse)
 * lse and delta are [B, Hq, Sq]; a row with lse = -inf sees nothing and contributes nothing.
 */
static double ds_of(const oracle_problem *p, const double *qi, const double *kj,
                    const double *dout_i, const double *vj, double lse, double delta,
                    double *pij_out) {
    const double x = p->scale * dot(qi, kj, p->sh.head_dim);
    const double pij = exp(score(p, x) - lse);
    *pij_out = pij;
    return pij * (dot(dout_i, vj, p->dim_v) - delta) * score_slope(p, x);
}

static void bwd_dq(const oracle_problem *p, const double *dout, const double *lse,
                   const double *delta, double *dq) {
    const int64_t Sq = p->sh.seq_q, H = p->sh.heads_q, D = p->sh.head_dim, Dv = p->dim_v;
    const int64_t rows = p->sh.batch * H * Sq;
#pragma omp parallel for schedule(dynamic, 16)
    for (int64_t r = 0; r < rows; r++) {
        int64_t b = r / (H * Sq), h = r / Sq % H, i = r % Sq, hk = h / p->group;
        double *dq_i = dq + ((b * Sq + i) * H + h) * D;
        const double *dout_i = dout + ((b * Sq + i) * H + h) * Dv;
        for (int64_t d = 0; d < D; d++)
            dq_i[d] = 0.0;
        if (lse[r] == -INFINITY)
            continue;
        for (int64_t j = 0; j < p->sh.seq_k; j++) {
            if (!visible(p, b, i, j))
                continue;
            const double *kj = k_row(p, b, j, hk);
            double pij;
            double ds = ds_of(p, q_row(p, b, i, h), kj, dout_i, v_row(p, b, j, hk), lse[r],
                              delta[r], &pij);
            axpy(p->scale * ds, kj, dq_i, D);
        }
    }
}

static void bwd_dkv(const oracle_problem *p, const double *dout, const double *lse,
                    const double *delta, double *dk, double *dv) {
    const int64_t Sq = p->sh.seq_q, Sk = p->sh.seq_k, H = p->sh.heads_q, Hk = p->sh.heads_kv;
    const int64_t D = p->sh.head_dim, Dv = p->dim_v;
    const int64_t rows = p->sh.batch * Hk * Sk;
#pragma omp parallel for schedule(dynamic, 16)
    for (int64_t r = 0; r < rows; r++) {
        int64_t b = r / (Hk * Sk), hk = r / Sk % Hk, j = r % Sk;
        double *dk_j = dk + ((b * Sk + j) * Hk + hk) * D;
        double *dv_j = dv + ((b * Sk + j) * Hk + hk) * Dv;
        for (int64_t d = 0; d < D; d++)
            dk_j[d] = 0.0;
        for (int64_t d = 0; d < Dv; d++)
            dv_j[d] = 0.0;
        for (int64_t h = hk * p->group; h < (hk + 1) * p->group; h++) {
            for (int64_t i = 0; i < Sq; i++) {
                int64_t row = (b * H + h) * Sq + i;
                if (lse[row] == -INFINITY || !visible(p, b, i, j))
                    continue;
                const double *qi = q_row(p, b, i, h);
                const double *dout_i = dout + ((b * Sq + i) * H + h) * Dv;
                double pij;
                double ds = ds_of(p, qi, k_row(p, b, j, hk), dout_i, v_row(p, b, j, hk),
                                  lse[row], delta[row], &pij);
                axpy(p->scale * ds, qi, dk_j, D);
                axpy(pij, dout_i, dv_j, Dv);
            }
        }
    }
}

// dsinks [Hq]: per head, over batch and rows in order (one thread per head).
static void bwd_dsinks(const oracle_problem *p, const double *lse, const double *delta,
                       double *dsinks) {
    const int64_t Sq = p->sh.seq_q, H = p->sh.heads_q;
#pragma omp parallel for
    for (int64_t h = 0; h < H; h++) {
        double sum = 0.0;
        for (int64_t b = 0; b < p->sh.batch; b++)
            for (int64_t i = 0; i < Sq; i++) {
                int64_t row = (b * H + h) * Sq + i;
                sum -= exp(p->sinks[h] - lse[row]) * delta[row];
            }
        dsinks[h] = sum;
    }
}

void cpt_oracle_bwd_ex(const cpt_oracle_shape *shape, const double *q, const double *k,
                       const double *v, const int64_t *q_pos, const int64_t *k_pos,
                       const ctxpar_mask_desc *mask, const cpt_oracle_features *features,
                       double scale, const double *dout, double *dq, double *dk, double *dv,
                       double *dsinks) {
    oracle_problem p;
    double *out = NULL, *lse = NULL, *delta = NULL;
    ctxpar_status st = problem_init(&p, shape, q, k, v, q_pos, k_pos, mask, features, scale);
    if (st == CTXPAR_OK && (!dout || !dq || !dk || !dv))
        st = CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "oracle: dout, dq, dk or dv is NULL");
    if (st == CTXPAR_OK) {
        const int64_t rows = p.sh.batch * p.sh.heads_q * p.sh.seq_q;
        out = malloc(sizeof(double) * (size_t)(q_elems(&p.sh, p.dim_v) + 1));
        lse = malloc(sizeof(double) * (size_t)(rows + 1));
        delta = malloc(sizeof(double) * (size_t)(rows + 1));
        if (!out || !lse || !delta)
            st = CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "oracle: forward buffers for %lld rows",
                              (long long)rows);
    }
    if (st != CTXPAR_OK) {
        fill_nan(&p.sh, dq, q_elems(&p.sh, p.sh.head_dim));
        fill_nan(&p.sh, dk, kv_elems(&p.sh, p.sh.head_dim));
        fill_nan(&p.sh, dv, kv_elems(&p.sh, p.dim_v));
        fill_nan(&p.sh, dsinks, p.sh.heads_q);
        goto done;
    }
    fwd_all(&p, out, lse);
    const int64_t Dv = p.dim_v, H = p.sh.heads_q, Sq = p.sh.seq_q;
    for (int64_t r = 0; r < p.sh.batch * H * Sq; r++) {
        int64_t b = r / (H * Sq), h = r / Sq % H, i = r % Sq;
        int64_t off = ((b * Sq + i) * H + h) * Dv;
        delta[r] = dot(dout + off, out + off, Dv);
    }
    bwd_dq(&p, dout, lse, delta, dq);
    bwd_dkv(&p, dout, lse, delta, dk, dv);
    if (dsinks) {
        if (p.sinks)
            bwd_dsinks(&p, lse, delta, dsinks);
        else
            for (int64_t h = 0; h < H; h++)
                dsinks[h] = 0.0;
    }
done:
    free(out);
    free(lse);
    free(delta);
    problem_free(&p);
}

void cpt_oracle_bwd(const cpt_oracle_shape *shape, const double *q, const double *k,
                    const double *v, const int64_t *q_pos, const int64_t *k_pos,
                    const ctxpar_mask_desc *mask, double scale, const double *dout, double *dq,
                    double *dk, double *dv) {
    cpt_oracle_bwd_ex(shape, q, k, v, q_pos, k_pos, mask, NULL, scale, dout, dq, dk, dv, NULL);
}

ctxpar_mask_desc cpt_oracle_mask(const ctxpar_attn_params *p) {
    ctxpar_mask_desc m = {0};
    m.causal = p->mask == CTXPAR_MASK_CAUSAL;
    m.window_left = p->window_left;
    m.window_right = p->window_right;
    m.cu_seqlens = p->cu_seqlens;
    m.num_docs = p->num_docs;
    return m;
}

ctxpar_status cpt_oracle_visibility(const cpt_oracle_shape *shape, const int64_t *q_pos,
                                    const int64_t *k_pos, const ctxpar_mask_desc *mask,
                                    uint8_t *vis) {
    static const double no_data = 0.0; // the predicate reads positions and documents only
    oracle_problem p;
    CTXPAR_CHECK(
        problem_init(&p, shape, &no_data, &no_data, &no_data, q_pos, k_pos, mask, NULL, 1.0));
    if (!vis) {
        problem_free(&p);
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "oracle: vis is NULL");
    }
    for (int64_t i = 0; i < p.sh.seq_q; i++)
        for (int64_t j = 0; j < p.sh.seq_k; j++)
            vis[i * p.sh.seq_k + j] = (uint8_t)visible(&p, 0, i, j);
    problem_free(&p);
    return CTXPAR_OK;
}
