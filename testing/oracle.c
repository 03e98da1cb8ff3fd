/*
 * oracle.c - full attention in float64 on the host: the reference every test compares against.
 *
 * Deliberately plain: one query row at a time against every key, no tiling, and a mask predicate
 * written here rather than taken from the library, so that a bug in the code under test cannot
 * hide in a shared helper. Every output element is written by exactly one loop iteration, so the
 * results do not depend on the OpenMP thread count.
 */
#include "testing/oracle.h"

#include <math.h>
#include <stdlib.h>

// Everything one attention problem needs, resolved once: shapes, inputs, the mask.
typedef struct oracle_problem {
    cpt_oracle_shape sh;
    const double *q, *k, *v;
    const int64_t *q_pos, *k_pos; // NULL: row i is at position i
    int causal;
    int64_t window;
    int64_t *q_doc, *k_doc; // document of each row; NULL without documents
    double scale;
    int64_t group; // query heads per K/V head
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

// Document holding global position pos: the last boundary cu_seqlens[d] <= pos.
static int64_t doc_of(const ctxpar_mask_desc *m, int64_t pos) {
    int64_t doc = 0;
    for (int64_t d = 1; d < m->num_docs; d++)
        if (m->cu_seqlens[d] <= pos)
            doc = d;
    return doc;
}

// Whether query row i sees key row j: causal k <= q, window q - k < W, same document.
static int visible(const oracle_problem *p, int64_t i, int64_t j) {
    int64_t qp = p->q_pos ? p->q_pos[i] : i;
    int64_t kp = p->k_pos ? p->k_pos[j] : j;
    if (p->causal && kp > qp)
        return 0;
    if (p->window > 0 && qp - kp >= p->window)
        return 0;
    if (p->q_doc && p->q_doc[i] != p->k_doc[j])
        return 0;
    return 1;
}

// Row pointers into the dense BSHD inputs.
static const double *q_row(const oracle_problem *p, int64_t b, int64_t i, int64_t h) {
    return p->q + ((b * p->sh.seq_q + i) * p->sh.heads_q + h) * p->sh.head_dim;
}

static const double *kv_row(const oracle_problem *p, const double *t, int64_t b, int64_t j,
                            int64_t hk) {
    return t + ((b * p->sh.seq_k + j) * p->sh.heads_kv + hk) * p->sh.head_dim;
}

static int64_t q_elems(const cpt_oracle_shape *s) {
    return s->batch * s->seq_q * s->heads_q * s->head_dim;
}

static int64_t kv_elems(const cpt_oracle_shape *s) {
    return s->batch * s->seq_k * s->heads_kv * s->head_dim;
}

// After a failure: NaN in every output whose size the shape still tells.
static void fill_nan(const cpt_oracle_shape *s, double *x, int64_t n) {
    if (!x || s->batch < 0 || s->seq_q < 0 || s->seq_k < 0 || s->heads_q < 0 || s->heads_kv < 0 ||
        s->head_dim < 0)
        return;
    for (int64_t i = 0; i < n; i++)
        x[i] = NAN;
}

static void problem_free(oracle_problem *p) {
    free(p->q_doc);
    free(p->k_doc);
    p->q_doc = p->k_doc = NULL;
}

// Checks the arguments and precomputes the document of every row.
static ctxpar_status problem_init(oracle_problem *p, const cpt_oracle_shape *shape,
                                  const double *q, const double *k, const double *v,
                                  const int64_t *q_pos, const int64_t *k_pos,
                                  const ctxpar_mask_desc *mask, double scale) {
    *p = (oracle_problem){0};
    if (!shape)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "oracle: shape is NULL");
    const cpt_oracle_shape *s = shape;
    p->sh = *s;
    if (s->batch < 0 || s->seq_q < 0 || s->seq_k < 0 || s->heads_q < 1 || s->heads_kv < 1 ||
        s->head_dim < 1 || s->heads_q % s->heads_kv != 0)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG,
                            "oracle: bad shape batch %lld seq_q %lld seq_k %lld heads_q %lld "
                            "heads_kv %lld head_dim %lld",
                            (long long)s->batch, (long long)s->seq_q, (long long)s->seq_k,
                            (long long)s->heads_q, (long long)s->heads_kv, (long long)s->head_dim);
    if (!q || !k || !v)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "oracle: q, k or v is NULL");
    if (mask && mask->cu_seqlens && mask->num_docs < 1)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "oracle: num_docs %lld with cu_seqlens",
                            (long long)mask->num_docs);
    p->q = q;
    p->k = k;
    p->v = v;
    p->q_pos = q_pos;
    p->k_pos = k_pos;
    p->scale = scale;
    p->group = s->heads_q / s->heads_kv;
    if (!mask)
        return CTXPAR_OK;
    p->causal = mask->causal;
    p->window = mask->window_left;
    if (!mask->cu_seqlens)
        return CTXPAR_OK;
    p->q_doc = malloc(sizeof(int64_t) * (size_t)(s->seq_q + 1));
    p->k_doc = malloc(sizeof(int64_t) * (size_t)(s->seq_k + 1));
    if (!p->q_doc || !p->k_doc) {
        problem_free(p);
        return CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY,
                            "oracle: document tables for %lld + %lld rows", (long long)s->seq_q,
                            (long long)s->seq_k);
    }
    for (int64_t i = 0; i < s->seq_q; i++)
        p->q_doc[i] = doc_of(mask, q_pos ? q_pos[i] : i);
    for (int64_t j = 0; j < s->seq_k; j++)
        p->k_doc[j] = doc_of(mask, k_pos ? k_pos[j] : j);
    return CTXPAR_OK;
}

/*
 * One query row: q_i [D] of head h against keys k_j [D] of K/V head h/group, j < Sk.
 * out_i [D] = sum_j softmax_j(scale q_i.k_j) v_j; returns lse_i (-inf, out_i = 0 when no key is
 * visible). The row maximum is subtracted before exp, so no score can overflow.
 */
static double fwd_row(const oracle_problem *p, int64_t b, int64_t h, int64_t i, double *out_i) {
    const int64_t D = p->sh.head_dim, hk = h / p->group;
    const double *qi = q_row(p, b, i, h);
    double m = -INFINITY;
    int any = 0;
    for (int64_t j = 0; j < p->sh.seq_k; j++) {
        if (!visible(p, i, j))
            continue;
        double s = p->scale * dot(qi, kv_row(p, p->k, b, j, hk), D);
        if (!any || s > m)
            m = s;
        any = 1;
    }
    for (int64_t d = 0; d < D; d++)
        out_i[d] = 0.0;
    if (!any)
        return -INFINITY;
    double sum = 0.0;
    for (int64_t j = 0; j < p->sh.seq_k; j++) {
        if (!visible(p, i, j))
            continue;
        double w = exp(p->scale * dot(qi, kv_row(p, p->k, b, j, hk), D) - m);
        sum += w;
        axpy(w, kv_row(p, p->v, b, j, hk), out_i, D);
    }
    for (int64_t d = 0; d < D; d++)
        out_i[d] /= sum;
    return m + log(sum);
}

// out [B, Sq, Hq, D], lse [B, Hq, Sq] (may be NULL): every row, rows spread over threads.
static void fwd_all(const oracle_problem *p, double *out, double *lse) {
    const int64_t Sq = p->sh.seq_q, H = p->sh.heads_q, D = p->sh.head_dim;
    const int64_t rows = p->sh.batch * H * Sq;
#pragma omp parallel for schedule(dynamic, 16)
    for (int64_t r = 0; r < rows; r++) {
        int64_t b = r / (H * Sq), h = r / Sq % H, i = r % Sq;
        double l = fwd_row(p, b, h, i, out + ((b * Sq + i) * H + h) * D);
        if (lse)
            lse[r] = l;
    }
}

void cpt_oracle_fwd(const cpt_oracle_shape *shape, const double *q, const double *k,
                       const double *v, const int64_t *q_pos, const int64_t *k_pos,
                       const ctxpar_mask_desc *mask, double scale, double *out, double *lse) {
    oracle_problem p;
    ctxpar_status st = problem_init(&p, shape, q, k, v, q_pos, k_pos, mask, scale);
    if (st == CTXPAR_OK && !out)
        st = CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "oracle: out is NULL");
    if (st != CTXPAR_OK) {
        // A reference that could not be computed must fail every comparison, never pass one.
        fill_nan(&p.sh, out, q_elems(&p.sh));
        fill_nan(&p.sh, lse, p.sh.batch * p.sh.heads_q * p.sh.seq_q);
        problem_free(&p);
        return;
    }
    fwd_all(&p, out, lse);
    problem_free(&p);
}

/*
 * Gradients with P_ij = exp(scale q_i.k_j - lse_i) over visible pairs, dP_ij = dout_i.v_j,
 * delta_i = dout_i.out_i, dS_ij = P_ij (dP_ij - delta_i):
 *   dq_i = scale sum_j dS_ij k_j                      [B, Sq, Hq, D], one row per iteration
 *   dk_j = scale sum_{h in group(j), i} dS_ij q_i     [B, Sk, Hkv, D], one row per iteration
 *   dv_j = sum_{h in group(j), i} P_ij dout_i
 * lse and delta are [B, Hq, Sq]; a row with lse = -inf sees nothing and contributes nothing.
 */
static void bwd_dq(const oracle_problem *p, const double *dout, const double *lse,
                   const double *delta, double *dq) {
    const int64_t Sq = p->sh.seq_q, H = p->sh.heads_q, D = p->sh.head_dim;
    const int64_t rows = p->sh.batch * H * Sq;
#pragma omp parallel for schedule(dynamic, 16)
    for (int64_t r = 0; r < rows; r++) {
        int64_t b = r / (H * Sq), h = r / Sq % H, i = r % Sq, hk = h / p->group;
        int64_t off = ((b * Sq + i) * H + h) * D;
        double *dq_i = dq + off;
        for (int64_t d = 0; d < D; d++)
            dq_i[d] = 0.0;
        if (lse[r] == -INFINITY)
            continue;
        for (int64_t j = 0; j < p->sh.seq_k; j++) {
            if (!visible(p, i, j))
                continue;
            const double *kj = kv_row(p, p->k, b, j, hk);
            double pij = exp(p->scale * dot(p->q + off, kj, D) - lse[r]);
            double dp = dot(dout + off, kv_row(p, p->v, b, j, hk), D);
            axpy(p->scale * pij * (dp - delta[r]), kj, dq_i, D);
        }
    }
}

static void bwd_dkv(const oracle_problem *p, const double *dout, const double *lse,
                    const double *delta, double *dk, double *dv) {
    const int64_t Sq = p->sh.seq_q, Sk = p->sh.seq_k, H = p->sh.heads_q, Hk = p->sh.heads_kv;
    const int64_t D = p->sh.head_dim;
    const int64_t rows = p->sh.batch * Hk * Sk;
#pragma omp parallel for schedule(dynamic, 16)
    for (int64_t r = 0; r < rows; r++) {
        int64_t b = r / (Hk * Sk), hk = r / Sk % Hk, j = r % Sk;
        int64_t off = ((b * Sk + j) * Hk + hk) * D;
        double *dk_j = dk + off, *dv_j = dv + off;
        for (int64_t d = 0; d < D; d++)
            dk_j[d] = dv_j[d] = 0.0;
        for (int64_t h = hk * p->group; h < (hk + 1) * p->group; h++) {
            for (int64_t i = 0; i < Sq; i++) {
                int64_t row = (b * H + h) * Sq + i;
                if (lse[row] == -INFINITY || !visible(p, i, j))
                    continue;
                const double *qi = q_row(p, b, i, h);
                const double *dout_i = dout + ((b * Sq + i) * H + h) * D;
                double pij = exp(p->scale * dot(qi, p->k + off, D) - lse[row]);
                double dp = dot(dout_i, p->v + off, D);
                axpy(p->scale * pij * (dp - delta[row]), qi, dk_j, D);
                axpy(pij, dout_i, dv_j, D);
            }
        }
    }
}

void cpt_oracle_bwd(const cpt_oracle_shape *shape, const double *q, const double *k,
                       const double *v, const int64_t *q_pos, const int64_t *k_pos,
                       const ctxpar_mask_desc *mask, double scale, const double *dout, double *dq,
                       double *dk, double *dv) {
    oracle_problem p;
    double *out = NULL, *lse = NULL, *delta = NULL;
    ctxpar_status st = problem_init(&p, shape, q, k, v, q_pos, k_pos, mask, scale);
    if (st == CTXPAR_OK && (!dout || !dq || !dk || !dv))
        st = CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "oracle: dout, dq, dk or dv is NULL");
    if (st == CTXPAR_OK) {
        const int64_t rows = p.sh.batch * p.sh.heads_q * p.sh.seq_q;
        out = malloc(sizeof(double) * (size_t)(q_elems(&p.sh) + 1));
        lse = malloc(sizeof(double) * (size_t)(rows + 1));
        delta = malloc(sizeof(double) * (size_t)(rows + 1));
        if (!out || !lse || !delta)
            st = CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "oracle: forward buffers for %lld rows",
                              (long long)rows);
    }
    if (st != CTXPAR_OK) {
        fill_nan(&p.sh, dq, q_elems(&p.sh));
        fill_nan(&p.sh, dk, kv_elems(&p.sh));
        fill_nan(&p.sh, dv, kv_elems(&p.sh));
        goto done;
    }
    fwd_all(&p, out, lse);
    const int64_t D = p.sh.head_dim, H = p.sh.heads_q, Sq = p.sh.seq_q;
    for (int64_t r = 0; r < p.sh.batch * H * Sq; r++) {
        int64_t b = r / (H * Sq), h = r / Sq % H, i = r % Sq;
        int64_t off = ((b * Sq + i) * H + h) * D;
        delta[r] = dot(dout + off, out + off, D);
    }
    bwd_dq(&p, dout, lse, delta, dq);
    bwd_dkv(&p, dout, lse, delta, dk, dv);
done:
    free(out);
    free(lse);
    free(delta);
    problem_free(&p);
}

ctxpar_status cpt_oracle_visibility(const cpt_oracle_shape *shape, const int64_t *q_pos,
                                       const int64_t *k_pos, const ctxpar_mask_desc *mask,
                                       uint8_t *vis) {
    static const double no_data = 0.0; // the predicate reads positions and documents only
    oracle_problem p;
    CTXPAR_CHECK(problem_init(&p, shape, &no_data, &no_data, &no_data, q_pos, k_pos, mask, 1.0));
    if (!vis) {
        problem_free(&p);
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "oracle: vis is NULL");
    }
    for (int64_t i = 0; i < p.sh.seq_q; i++)
        for (int64_t j = 0; j < p.sh.seq_k; j++)
            vis[i * p.sh.seq_k + j] = (uint8_t)visible(&p, i, j);
    problem_free(&p);
    return CTXPAR_OK;
}
