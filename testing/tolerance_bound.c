/*
 * tolerance_bound.c - the per-element error bound (tolerance.h): the magnitudes each element's
 * float computation goes through, in float64, and the bound's check. The derivation is in
 * docs/numerics.md ("A bound per element").
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "testing/tolerance.h"

typedef struct bound_problem {
    const cpt_oracle_shape *sh;
    const double *q, *k, *v;
    const uint8_t *vis;
    double scale;
} bound_problem;

static const double *brow(const bound_problem *b, const double *t, int64_t bi, int64_t s,
                          int64_t h, int64_t seq, int64_t heads) {
    (void)b;
    return t + ((bi * seq + s) * heads + h) * b->sh->head_dim;
}

// One query row: p[j] (exact softmax, 0 where masked), w[j] = 1 + sigma_ij + |lse_i| (how much
// the float exponent of p_ij can be off, in units of u); returns lse (-inf: no key).
static double row_softmax(const bound_problem *b, int64_t bi, int64_t h, int64_t i, double *p,
                          double *w) {
    const cpt_oracle_shape *sh = b->sh;
    const int64_t D = sh->head_dim, hk = h / (sh->heads_q / sh->heads_kv);
    const double *qi = brow(b, b->q, bi, i, h, sh->seq_q, sh->heads_q);
    double m = -INFINITY;
    for (int64_t j = 0; j < sh->seq_k; j++) {
        p[j] = -INFINITY;
        w[j] = 0.0;
        if (b->vis && !b->vis[i * sh->seq_k + j])
            continue;
        const double *kj = brow(b, b->k, bi, j, hk, sh->seq_k, sh->heads_kv);
        double s = 0.0, a = 0.0;
        for (int64_t d = 0; d < D; d++) {
            s += qi[d] * kj[d];
            a += fabs(qi[d] * kj[d]);
        }
        p[j] = b->scale * s;
        w[j] = 1.0 + fabs(b->scale) * a;
        m = fmax(m, p[j]);
    }
    if (m == -INFINITY) {
        for (int64_t j = 0; j < sh->seq_k; j++)
            p[j] = 0.0;
        return -INFINITY;
    }
    double sum = 0.0;
    for (int64_t j = 0; j < sh->seq_k; j++)
        sum += p[j] = p[j] == -INFINITY ? 0.0 : exp(p[j] - m);
    const double lse = m + log(sum);
    for (int64_t j = 0; j < sh->seq_k; j++) {
        p[j] /= sum;
        w[j] += fabs(lse);
    }
    return lse;
}

ctxpar_status cpt_bound_magnitudes(const cpt_oracle_shape *sh, const double *q,
                                      const double *k, const double *v, const double *dout,
                                      const uint8_t *vis, double scale, cpt_magnitudes *m) {
    if (!sh || !q || !k || !v || !m || !m->t[0] || !m->t[1] ||
        (dout && (!m->t[2] || !m->t[3] || !m->t[4])))
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "bound: NULL input or output");
    const bound_problem b = {sh, q, k, v, vis, scale};
    const int64_t B = sh->batch, Sq = sh->seq_q, Sk = sh->seq_k, H = sh->heads_q;
    const int64_t Hk = sh->heads_kv, D = sh->head_dim, group = H / Hk;
    double *p = malloc(sizeof(double) * (size_t)(2 * Sk + 2 * D + 1));
    if (!p)
        return CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "bound: row buffers");
    double *w = p + Sk, *out = w + Sk, *mout = out + D;
    const size_t nk = (size_t)(B * Sk * Hk * D);
    if (dout) {
        memset(m->t[3], 0, nk * sizeof(double));
        memset(m->t[4], 0, nk * sizeof(double));
    }
    for (int64_t bi = 0; bi < B; bi++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < Sq; i++) {
                const int64_t hk = h / group, off = ((bi * Sq + i) * H + h) * D;
                const double lse = row_softmax(&b, bi, h, i, p, w);
                // out_d = sum_j p_j v_jd: |p v| terms, and p's relative errors (w_j u) times the
                // spread |v_jd - out_d| they move the average by. lse: |lse| + sum p sigma.
                double ml = isinf(lse) ? 0.0 : fabs(lse) + 1.0;
                for (int64_t d = 0; d < D; d++)
                    out[d] = mout[d] = 0.0;
                for (int64_t j = 0; j < Sk; j++) {
                    if (p[j] == 0.0)
                        continue;
                    const double *vj = brow(&b, v, bi, j, hk, Sk, Hk);
                    for (int64_t d = 0; d < D; d++)
                        out[d] += p[j] * vj[d];
                    ml += p[j] * w[j];
                }
                for (int64_t j = 0; j < Sk; j++) {
                    if (p[j] == 0.0)
                        continue;
                    const double *vj = brow(&b, v, bi, j, hk, Sk, Hk);
                    for (int64_t d = 0; d < D; d++)
                        mout[d] += p[j] * (fabs(vj[d]) + w[j] * fabs(vj[d] - out[d]));
                }
                memcpy(m->t[0] + off, mout, (size_t)D * sizeof(double));
                m->t[1][(bi * H + h) * Sq + i] = ml;
                if (!dout)
                    continue;
                // dS_ij = p_ij (dP_ij - delta_i): its magnitude mu_ij counts p's error (w), dP's
                // |dO . v| terms, and delta = dO . out with out's own error (mout).
                const double *doi = dout + off;
                double delta = 0.0, mdelta = 0.0;
                for (int64_t d = 0; d < D; d++) {
                    delta += doi[d] * out[d];
                    mdelta += fabs(doi[d]) * (fabs(out[d]) + mout[d]);
                }
                double *mdq = m->t[2] + off;
                for (int64_t d = 0; d < D; d++)
                    mdq[d] = 0.0;
                const double *qi = q + off;
                for (int64_t j = 0; j < Sk; j++) {
                    if (p[j] == 0.0)
                        continue;
                    const double *vj = brow(&b, v, bi, j, hk, Sk, Hk);
                    const double *kj = brow(&b, k, bi, j, hk, Sk, Hk);
                    double dp = 0.0, mdp = 0.0;
                    for (int64_t d = 0; d < D; d++) {
                        dp += doi[d] * vj[d];
                        mdp += fabs(doi[d] * vj[d]);
                    }
                    const double mu = p[j] * (fabs(dp - delta) * w[j] + mdp + mdelta);
                    double *mdk = m->t[3] + ((bi * Sk + j) * Hk + hk) * D;
                    double *mdv = m->t[4] + ((bi * Sk + j) * Hk + hk) * D;
                    for (int64_t d = 0; d < D; d++) {
                        mdq[d] += fabs(scale) * mu * fabs(kj[d]);
                        mdk[d] += fabs(scale) * mu * fabs(qi[d]);
                        mdv[d] += p[j] * w[j] * fabs(doi[d]);
                    }
                }
            }
    free(p);
    return CTXPAR_OK;
}

double cpt_bound_elem(ctxpar_dtype dtype, int is_lse, double magnitude, double ref) {
    // Storage rounding of the result (lse is always F32), then F32 accumulation.
    double u_store = is_lse || dtype == CTXPAR_DTYPE_F32 ? 0x1p-24
                     : dtype == CTXPAR_DTYPE_F16        ? 0x1p-11
                                                        : 0x1p-8;
    return CPT_BOUND_C * 0x1p-24 * magnitude + 2.0 * u_store * fabs(ref);
}

cpt_bound_stats cpt_bound_check(const float *got, const double *ref, const double *mag,
                                      size_t n, ctxpar_dtype dtype, int is_lse) {
    cpt_bound_stats st = {0.0, -1};
    for (size_t x = 0; x < n; x++) {
        double r;
        if (isnan(got[x]) || isnan(ref[x]))
            r = INFINITY;
        else if (isinf(got[x]) || isinf(ref[x]))
            r = got[x] == ref[x] ? 0.0 : INFINITY;
        else {
            double e = fabs(got[x] - ref[x]), bnd = cpt_bound_elem(dtype, is_lse, mag[x], ref[x]);
            r = e == 0.0 ? 0.0 : bnd > 0.0 ? e / bnd : INFINITY;
        }
        if (st.worst < 0 || r > st.max_ratio) {
            st.max_ratio = r;
            st.worst = (int64_t)x;
        }
    }
    return st;
}
