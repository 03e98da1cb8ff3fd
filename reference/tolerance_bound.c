/*
 * tolerance_bound.c - the per-element error bound (tolerance.h): the magnitudes each element's
 * float computation goes through, in float64, and the bound's check. The derivation is in
 * docs/numerics.md ("A bound per element").
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "reference/data.h"
#include "reference/tolerance.h"

typedef struct bound_problem {
    const cpt_oracle_shape *sh;
    const double *q, *k, *v, *dout;
    const uint8_t *vis; /* [Sq, Sk], or NULL: each row's from the oracle's mask (below) */
    const int64_t *q_pos, *k_pos;
    const ctxpar_mask_desc *mask;
    double scale;
    int64_t dv;           /* head_dim of v, out, dout, dv */
    double softcap;       /* 0: none */
    const double *sinks;  /* [Hq] or NULL */
    double *mdsinks, *mdsinks16; /* [B * Hq] per (batch, head) parts, summed by the caller */
} bound_problem;

// Per-thread row buffers.
typedef struct bound_rows {
    double *p, *w, *out, *mout, *tc; /* tc: tanh of the capped scores (softcap) */
    uint8_t *vis;
} bound_rows;

// Row (bi, s, h) of a dense tensor of q/k's head_dim; vrow: of v/out/dout's.
static const double *brow(const bound_problem *b, const double *t, int64_t bi, int64_t s,
                          int64_t h, int64_t seq, int64_t heads) {
    return t + ((bi * seq + s) * heads + h) * b->sh->head_dim;
}
static const double *vrow(const bound_problem *b, const double *t, int64_t bi, int64_t s,
                          int64_t h, int64_t seq, int64_t heads) {
    return t + ((bi * seq + s) * heads + h) * b->dv;
}

// One query row: p[j] (exact softmax, 0 where masked), w[j] = 1 + sigma_ij + |lse_i| (how much
// the float exponent of p_ij can be off, in units of u); returns lse (-inf: no key).
static double row_softmax(const bound_problem *b, int64_t bi, int64_t h, int64_t i, double *p,
                          double *w, double *tc, const uint8_t *vis, double *p_sink) {
    const cpt_oracle_shape *sh = b->sh;
    const int64_t D = sh->head_dim, hk = h / (sh->heads_q / sh->heads_kv);
    const double *qi = brow(b, b->q, bi, i, h, sh->seq_q, sh->heads_q);
    double m = -INFINITY;
    for (int64_t j = 0; j < sh->seq_k; j++) {
        p[j] = -INFINITY;
        w[j] = 0.0;
        if (vis && !vis[j])
            continue;
        const double *kj = brow(b, b->k, bi, j, hk, sh->seq_k, sh->heads_kv);
        double s = 0.0, a = 0.0;
        for (int64_t d = 0; d < D; d++) {
            s += qi[d] * kj[d];
            a += fabs(qi[d] * kj[d]);
        }
        p[j] = b->scale * s;
        w[j] = 1.0 + fabs(b->scale) * a;
        tc[j] = 0.0;
        if (b->softcap > 0.0) { // the capped score and its own rounding
            tc[j] = tanh(p[j] / b->softcap);
            p[j] = b->softcap * tc[j];
            w[j] += fabs(p[j]);
        }
        m = fmax(m, p[j]);
    }
    const double sink = b->sinks ? b->sinks[h] : -INFINITY;
    *p_sink = 0.0;
    if (m == -INFINITY) {
        for (int64_t j = 0; j < sh->seq_k; j++)
            p[j] = 0.0;
        if (b->sinks)
            *p_sink = 1.0;
        return sink; // -inf without sinks
    }
    m = fmax(m, sink);
    double sum = b->sinks ? exp(sink - m) : 0.0;
    for (int64_t j = 0; j < sh->seq_k; j++)
        sum += p[j] = p[j] == -INFINITY ? 0.0 : exp(p[j] - m);
    const double lse = m + log(sum);
    if (b->sinks)
        *p_sink = exp(sink - lse);
    for (int64_t j = 0; j < sh->seq_k; j++) {
        p[j] /= sum;
        w[j] += fabs(lse);
    }
    return lse;
}

// The visibility of query row i (NULL: every key), from the matrix or the oracle's mask.
static const uint8_t *row_vis(const bound_problem *b, int64_t i, uint8_t *buf) {
    if (b->vis)
        return b->vis + i * b->sh->seq_k;
    if (!b->mask)
        return NULL;
    cpt_oracle_shape one = *b->sh;
    one.seq_q = 1;
    const int64_t pos = b->q_pos ? b->q_pos[i] : i;
    return cpt_oracle_visibility(&one, &pos, b->k_pos, b->mask, buf) == CTXPAR_OK ? buf : NULL;
}

// Every query head of K/V head hk in batch bi: out, lse and dq of those rows, and dk, dv of the
// K/V rows of hk (so one thread owns every element it writes).
static void bound_group(const bound_problem *b, int64_t bi, int64_t hk, const bound_rows *r,
                        cpt_magnitudes *m) {
    const cpt_oracle_shape *sh = b->sh;
    const int64_t Sq = sh->seq_q, Sk = sh->seq_k, H = sh->heads_q, Hk = sh->heads_kv;
    const int64_t Dqk = sh->head_dim, D = b->dv, group = H / Hk;
    const double scale = b->scale, *v = b->v, *k = b->k, *q = b->q, *dout = b->dout;
    double *p = r->p, *w = r->w, *out = r->out, *mout = r->mout, *tc = r->tc;
    for (int64_t h = hk * group; h < (hk + 1) * group; h++)
        for (int64_t i = 0; i < Sq; i++) {
            const int64_t off = ((bi * Sq + i) * H + h) * D, qoff = ((bi * Sq + i) * H + h) * Dqk;
            double p_sink;
            const double lse = row_softmax(b, bi, h, i, p, w, tc, row_vis(b, i, r->vis), &p_sink);
            // out_d = sum_j p_j v_jd: |p v| terms, and p's relative errors (w_j u) times the
            // spread |v_jd - out_d| they move the average by. lse: |lse| + sum p sigma.
            double ml = isinf(lse) ? 0.0 : fabs(lse) + 1.0;
            for (int64_t d = 0; d < D; d++)
                out[d] = mout[d] = 0.0;
            for (int64_t j = 0; j < Sk; j++) {
                if (p[j] == 0.0)
                    continue;
                const double *vj = vrow(b, v, bi, j, hk, Sk, Hk);
                for (int64_t d = 0; d < D; d++)
                    out[d] += p[j] * vj[d];
                ml += p[j] * w[j];
            }
            for (int64_t j = 0; j < Sk; j++) {
                if (p[j] == 0.0)
                    continue;
                const double *vj = vrow(b, v, bi, j, hk, Sk, Hk);
                for (int64_t d = 0; d < D; d++)
                    mout[d] += p[j] * (fabs(vj[d]) + w[j] * fabs(vj[d] - out[d]));
            }
            memcpy(m->t[0] + off, mout, (size_t)D * sizeof(double));
            m->t[1][(bi * H + h) * Sq + i] = ml;
            // 16-bit storage: one rounding of each operand (p, v, the stored out) in u_store.
            double *m16 = m->t16[0] ? m->t16[0] + off : NULL;
            if (m16) {
                for (int64_t d = 0; d < D; d++)
                    m16[d] = 0.0;
                for (int64_t j = 0; j < Sk; j++) {
                    if (p[j] == 0.0)
                        continue;
                    const double *vj = vrow(b, v, bi, j, hk, Sk, Hk);
                    for (int64_t d = 0; d < D; d++)
                        m16[d] += p[j] * (fabs(vj[d]) + fabs(vj[d] - out[d]));
                }
                m->t16[1][(bi * H + h) * Sq + i] = 0.0; // lse is F32 whatever the dtype
            }
            if (!dout)
                continue;
            // dS_ij = p_ij (dP_ij - delta_i): its magnitude mu_ij counts p's error (w), dP's
            // |dO . v| terms, and delta = dO . out with out's own error (mout).
            const double *doi = dout + off;
            double delta = 0.0, mdelta = 0.0, mdelta16 = 0.0;
            for (int64_t d = 0; d < D; d++) {
                delta += doi[d] * out[d];
                mdelta += fabs(doi[d]) * (fabs(out[d]) + mout[d]);
                if (m16)
                    mdelta16 += fabs(doi[d]) * (fabs(out[d]) + m16[d]);
            }
            // dsinks_h = -sum_i p_sink,i delta_i: p_sink's exponent error (1 + |lse|) times delta,
            // and delta's own.
            if (b->mdsinks && p_sink > 0.0) {
                b->mdsinks[bi * H + h] += p_sink * (fabs(delta) * (1.0 + fabs(lse)) + mdelta);
                if (b->mdsinks16)
                    b->mdsinks16[bi * H + h] += p_sink * (fabs(delta) + mdelta16);
            }
            double *mdq = m->t[2] + qoff, *mdq16 = m16 ? m->t16[2] + qoff : NULL;
            for (int64_t d = 0; d < Dqk; d++) {
                mdq[d] = 0.0;
                if (mdq16)
                    mdq16[d] = 0.0;
            }
            const double *qi = q + qoff;
            for (int64_t j = 0; j < Sk; j++) {
                if (p[j] == 0.0)
                    continue;
                const double *vj = vrow(b, v, bi, j, hk, Sk, Hk);
                const double *kj = brow(b, k, bi, j, hk, Sk, Hk);
                double dp = 0.0, mdp = 0.0;
                for (int64_t d = 0; d < D; d++) {
                    dp += doi[d] * vj[d];
                    mdp += fabs(doi[d] * vj[d]);
                }
                double mu = p[j] * (fabs(dp - delta) * w[j] + mdp + mdelta);
                double mu16 = p[j] * (fabs(dp - delta) + mdp + mdelta16);
                if (b->softcap > 0.0) { // dS times 1 - t^2, which is off by 2 |t| w u / C + u
                    const double dcap = 1.0 - tc[j] * tc[j];
                    const double cap_err = p[j] * fabs(dp - delta) *
                                           (2.0 * fabs(tc[j]) * w[j] / b->softcap + 1.0);
                    mu = mu * dcap + cap_err;
                    mu16 = mu16 * dcap + cap_err;
                }
                double *mdk = m->t[3] + ((bi * Sk + j) * Hk + hk) * Dqk;
                double *mdv = m->t[4] + ((bi * Sk + j) * Hk + hk) * D;
                for (int64_t d = 0; d < Dqk; d++) {
                    mdq[d] += fabs(scale) * mu * fabs(kj[d]);
                    mdk[d] += fabs(scale) * mu * fabs(qi[d]);
                }
                for (int64_t d = 0; d < D; d++)
                    mdv[d] += p[j] * w[j] * fabs(doi[d]);
                if (!mdq16)
                    continue;
                double *mdk16 = m->t16[3] + ((bi * Sk + j) * Hk + hk) * Dqk;
                double *mdv16 = m->t16[4] + ((bi * Sk + j) * Hk + hk) * D;
                for (int64_t d = 0; d < Dqk; d++) {
                    mdq16[d] += fabs(scale) * mu16 * fabs(kj[d]);
                    mdk16[d] += fabs(scale) * mu16 * fabs(qi[d]);
                }
                for (int64_t d = 0; d < D; d++)
                    mdv16[d] += p[j] * fabs(doi[d]);
            }
        }
}

static ctxpar_status bound_all(const bound_problem *b, cpt_magnitudes *m) {
    const cpt_oracle_shape *sh = b->sh;
    if (!sh || !b->q || !b->k || !b->v || !m || !m->t[0] || !m->t[1] ||
        (b->dout && (!m->t[2] || !m->t[3] || !m->t[4])))
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "bound: NULL input or output");
    if (sh->batch < 0 || sh->seq_q < 0 || sh->seq_k < 0 || sh->heads_kv < 1 ||
        sh->head_dim < 1 || sh->heads_q % sh->heads_kv != 0)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "bound: bad shape");
    const int64_t Sk = sh->seq_k, D = b->dv > sh->head_dim ? b->dv : sh->head_dim;
    const int64_t groups = sh->batch * sh->heads_kv;
    if (m->t16[0] && (!m->t16[1] || (b->dout && (!m->t16[2] || !m->t16[3] || !m->t16[4]))))
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "bound: t16 given in part");
    if (b->dout) {
        const size_t nk = (size_t)(sh->batch * Sk * sh->heads_kv * sh->head_dim);
        const size_t nv = (size_t)(sh->batch * Sk * sh->heads_kv * b->dv);
        memset(m->t[3], 0, nk * sizeof(double));
        memset(m->t[4], 0, nv * sizeof(double));
        if (m->t16[0]) {
            memset(m->t16[3], 0, nk * sizeof(double));
            memset(m->t16[4], 0, nv * sizeof(double));
        }
    }
    int failed = 0;
    // Groups spread over threads; each element is written by one thread, in a fixed order.
#pragma omp parallel reduction(| : failed)
    {
        bound_rows r;
        r.p = malloc(sizeof(double) * (size_t)(3 * Sk + 2 * D + 1));
        r.vis = malloc((size_t)Sk + 1);
        if (!r.p || !r.vis) {
            failed = 1;
        } else {
            r.w = r.p + Sk;
            r.out = r.w + Sk;
            r.mout = r.out + D;
            r.tc = r.mout + D;
#pragma omp for schedule(dynamic, 1)
            for (int64_t g = 0; g < groups; g++)
                bound_group(b, g / sh->heads_kv, g % sh->heads_kv, &r, m);
        }
        free(r.p);
        free(r.vis);
    }
    return failed ? CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "bound: row buffers") : CTXPAR_OK;
}

ctxpar_status cpt_bound_magnitudes(const cpt_oracle_shape *sh, const double *q,
                                      const double *k, const double *v, const double *dout,
                                      const uint8_t *vis, double scale, cpt_magnitudes *m) {
    const bound_problem b = {sh,    q, k, v, dout, vis, NULL, NULL, NULL, scale, sh->head_dim,
                             0.0, NULL, NULL, NULL};
    return bound_all(&b, m);
}

ctxpar_status cpt_bound_magnitudes_masked(const cpt_oracle_shape *sh, const double *q,
                                             const double *k, const double *v,
                                             const double *dout, const int64_t *q_pos,
                                             const int64_t *k_pos, const ctxpar_mask_desc *mask,
                                             double scale, cpt_magnitudes *m) {
    return cpt_bound_magnitudes_ex(sh, q, k, v, dout, q_pos, k_pos, mask, NULL, scale, m, NULL,
                                   NULL);
}

ctxpar_status cpt_bound_magnitudes_ex(const cpt_oracle_shape *sh, const double *q,
                                      const double *k, const double *v, const double *dout,
                                      const int64_t *q_pos, const int64_t *k_pos,
                                      const ctxpar_mask_desc *mask,
                                      const cpt_oracle_features *features, double scale,
                                      cpt_magnitudes *m, double *mdsinks, double *mdsinks16) {
    const cpt_oracle_features none = {0, 0.0, NULL, NULL, 0};
    const cpt_oracle_features *f = features ? features : &none;
    if (!sh || f->row_cu_seqlens || f->softcap < 0.0 || f->head_dim_v < 0)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG,
                            "bound: bad features (per-row documents are not supported)");
    const int64_t H = sh->heads_q, B = sh->batch;
    // Per (batch, head) parts, so that each is written by the thread that owns the head.
    double *parts = NULL;
    if (mdsinks && dout && f->sinks) {
        parts = calloc((size_t)(2 * B * H + 1), sizeof *parts);
        if (!parts)
            return CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "bound: dsinks parts");
    }
    const bound_problem b = {sh,
                             q,
                             k,
                             v,
                             dout,
                             NULL,
                             q_pos,
                             k_pos,
                             mask,
                             scale,
                             f->head_dim_v > 0 ? f->head_dim_v : sh->head_dim,
                             f->softcap,
                             f->sinks,
                             parts,
                             parts && mdsinks16 ? parts + B * H : NULL};
    ctxpar_status st = bound_all(&b, m);
    if (mdsinks)
        for (int64_t h = 0; h < H; h++) {
            mdsinks[h] = 0.0;
            if (mdsinks16)
                mdsinks16[h] = 0.0;
            for (int64_t bi = 0; parts && bi < B; bi++) {
                mdsinks[h] += parts[bi * H + h];
                if (mdsinks16)
                    mdsinks16[h] += parts[B * H + bi * H + h];
            }
        }
    free(parts);
    return st;
}

double cpt_bound_elem(ctxpar_dtype dtype, int is_lse, double magnitude, double magnitude16,
                         double ref) {
    // F32 accumulation, then (16-bit storage) one rounding of each stored operand, then the
    // storage rounding of the result (lse is always F32).
    // Storing rounds to u_store relative, or below the normal range to half the smallest
    // subnormal (F16's is 2^-24: a dv of 3e-7 stored in F16 is off by up to 3e-8).
    const int f32 = is_lse || dtype == CTXPAR_DTYPE_F32;
    double u_store = f32 ? 0x1p-24 : dtype == CTXPAR_DTYPE_F16 ? 0x1p-11 : 0x1p-8;
    double tiny = f32 ? 0x1p-149 : dtype == CTXPAR_DTYPE_F16 ? 0x1p-24 : 0x1p-133;
    double b = CPT_BOUND_C * 0x1p-24 * magnitude + 2.0 * u_store * fabs(ref) + tiny;
    return f32 ? b : b + CPT_BOUND_C16 * u_store * magnitude16;
}

double cpt_bound_ratio(double got, double ref, double magnitude, double magnitude16,
                          ctxpar_dtype dtype, int is_lse) {
    if (isnan(got) || isnan(ref))
        return INFINITY;
    if (isinf(got) || isinf(ref))
        return got == ref ? 0.0 : INFINITY;
    double e = fabs(got - ref), bnd = cpt_bound_elem(dtype, is_lse, magnitude, magnitude16, ref);
    return e == 0.0 ? 0.0 : bnd > 0.0 ? e / bnd : INFINITY;
}

static void keep(cpt_bound_stats *st, double r, int64_t x) {
    st->failing += !(r <= 1.0);
    if (st->worst < 0 || r > st->max_ratio) {
        st->max_ratio = r;
        st->worst = x;
    }
}

cpt_bound_stats cpt_bound_check(const float *got, const double *ref, const double *mag,
                                      const double *mag16, size_t n, ctxpar_dtype dtype,
                                      int is_lse) {
    cpt_bound_stats st = {0.0, -1, 0};
    for (size_t x = 0; x < n; x++)
        keep(&st,
             cpt_bound_ratio(got[x], ref[x], mag[x], mag16 ? mag16[x] : 0.0, dtype, is_lse),
             (int64_t)x);
    return st;
}

cpt_bound_stats cpt_bound_check_tensor(const ctxpar_tensor *got, const double *ref,
                                             const double *mag, const double *mag16) {
    cpt_bound_stats st = {0.0, -1, 0};
    const int64_t B = got->shape[0], S = got->shape[1], H = got->shape[2], D = got->shape[3];
    int64_t x = 0;
    for (int64_t b = 0; b < B; b++)
        for (int64_t s = 0; s < S; s++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t d = 0; d < D; d++, x++)
                    keep(&st,
                         cpt_bound_ratio(cpt_test_get(got, b, s, h, d), ref[x], mag[x],
                                            mag16 ? mag16[x] : 0.0, got->dtype, 0),
                         x);
    return st;
}
