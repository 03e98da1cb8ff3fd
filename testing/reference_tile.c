/*
 * reference_tile.c - the fast reference's float64 math on one tile of query rows (a) against one
 * tile of key rows (c). The formulas are those of oracle.c (values) and tolerance_bound.c (the
 * bound's magnitudes M, M16), docs/numerics.md "A bound per element", rearranged so that every
 * sum over pairs is a matrix product:
 *   w_ac  = 1 + |scale| (|Q| |K|^T)_ac + |lse_a| (+ |s_ac| with soft-capping)
 *   M(out) = P |V| + sum_c p w |v_c - out_a|       M16(out) = P |V| + sum_c p |v_c - out_a|
 *   mu_ac = p (|dP - delta| w + (|dO| |V|^T)_ac + M(delta_a))   (soft-capping: times 1 - t^2,
 *           plus the cap's own error)
 *   M(dq) = |scale| mu |K|, computed as |scale| (mu' |K| + M(delta) (P dcap) |K|) because
 *           M(delta) needs the row's finished M(out);  M(dk) = |scale| mu^T |Q|;
 *   M(dv) = (P w)^T |dO|,  M16(dv) = P^T |dO|.
 */
#include <cblas.h>
#include <math.h>
#include <string.h>

#include "testing/reference_tile.h"

void ref_scores(const ref_problem *p, ref_ws *w, int64_t nI, int64_t nJ, const uint8_t *vis) {
    const int64_t D = p->sh.head_dim;
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)nI, (int)nJ, (int)D, p->scale,
                w->qt, (int)D, w->kt, (int)D, 0.0, w->s, (int)nJ);
    const int64_t n = nI * nJ;
    if (p->softcap > 0.0)
        for (int64_t x = 0; x < n; x++) {
            w->tc[x] = tanh(w->s[x] / p->softcap);
            w->s[x] = p->softcap * w->tc[x];
        }
    for (int64_t x = 0; vis && x < n; x++)
        if (!vis[x])
            w->s[x] = -INFINITY;
}

void ref_abs_scores(ref_ws *w, int64_t nI, int64_t nJ, int64_t D) {
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)nI, (int)nJ, (int)D, 1.0, w->qa,
                (int)D, w->ka, (int)D, 0.0, w->a, (int)nJ);
}

// The larger of m and x, NaN once either was NaN (a NaN score must reach out and lse).
static double nan_max(double m, double x) { return m != m || x != x ? NAN : x > m ? x : m; }

CPT_REF_VECTOR void ref_online_softmax(ref_ws *w, int64_t nI, int64_t nJ, int64_t Dv) {
    for (int64_t a = 0; a < nI; a++) {
        double *s = w->s + a * nJ, *pr = w->pm + a * nJ;
        double mx = -INFINITY;
        for (int64_t c = 0; c < nJ; c++)
            mx = nan_max(mx, s[c]);
        if (mx == -INFINITY) { // nothing visible in this tile
            memset(pr, 0, sizeof(double) * (size_t)nJ);
            continue;
        }
        const double m_new = nan_max(w->m[a], mx);
        const double alpha = w->m[a] == -INFINITY ? 0.0 : exp(w->m[a] - m_new);
        double sum = 0.0;
        for (int64_t c = 0; c < nJ; c++)
            sum += pr[c] = exp(s[c] - m_new);
        w->l[a] = w->l[a] * alpha + sum;
        w->m[a] = m_new;
        if (alpha != 1.0)
            for (int64_t d = 0; d < Dv; d++)
                w->acc[a * Dv + d] *= alpha;
    }
}

CPT_REF_VECTOR void ref_probabilities(const ref_problem *p, ref_ws *w, int64_t nI, int64_t nJ,
                       const uint8_t *vis) {
    const double as = fabs(p->scale);
    for (int64_t a = 0; a < nI; a++) {
        const double lse = w->lse[a];
        const int none = lse == -INFINITY;
        for (int64_t c = 0; c < nJ; c++) {
            const int64_t x = a * nJ + c;
            if (none || (vis && !vis[x])) {
                w->pm[x] = w->pw[x] = w->wt[x] = 0.0;
                continue;
            }
            double wt = 1.0 + as * w->a[x] + fabs(lse);
            if (p->softcap > 0.0)
                wt += fabs(w->s[x]);
            w->pm[x] = exp(w->s[x] - lse);
            w->wt[x] = wt;
            w->pw[x] = w->pm[x] * wt;
        }
    }
}

CPT_REF_VECTOR void ref_grad_scores(const ref_problem *p, ref_ws *w, int64_t nI, int64_t nJ,
                     const uint8_t *vis, int with_mdelta) {
    const int64_t Dv = p->dv;
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)nI, (int)nJ, (int)Dv, 1.0, w->dot,
                (int)Dv, w->vt, (int)Dv, 0.0, w->dp, (int)nJ);
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)nI, (int)nJ, (int)Dv, 1.0, w->doa,
                (int)Dv, w->va, (int)Dv, 0.0, w->bm, (int)nJ);
    const double C = p->softcap;
    for (int64_t a = 0; a < nI; a++) {
        const double md = with_mdelta ? w->mdelta[a] : 0.0;
        const double md16 = with_mdelta ? w->mdelta16[a] : 0.0;
        const int none = w->lse[a] == -INFINITY;
        for (int64_t c = 0; c < nJ; c++) {
            const int64_t x = a * nJ + c;
            if (none || (vis && !vis[x])) { // never touches dP: a masked NaN stays out
                w->ds[x] = w->mu[x] = w->mu16[x] = w->pd[x] = 0.0;
                continue;
            }
            const double pr = w->pm[x], dpd = w->dp[x] - w->delta[a];
            const double dcap = C > 0.0 ? 1.0 - w->tc[x] * w->tc[x] : 1.0;
            double mu = pr * (fabs(dpd) * w->wt[x] + w->bm[x] + md);
            double mu16 = p->want16 ? pr * (fabs(dpd) + w->bm[x] + md16) : 0.0;
            if (C > 0.0) { // dS times 1 - t^2, which is off by 2 |t| w u / C + u
                const double cap_err = pr * fabs(dpd) * (2.0 * fabs(w->tc[x]) * w->wt[x] / C + 1.0);
                mu = mu * dcap + cap_err;
                mu16 = mu16 * dcap + cap_err;
            }
            w->ds[x] = pr * dpd * dcap;
            w->mu[x] = mu;
            w->mu16[x] = mu16;
            w->pd[x] = pr * dcap;
        }
    }
}

// Columns of out summed at once in ref_spread: 32 doubles are 8 accumulator vectors (AVX-512),
// enough independent adds to keep both FP ports busy.
#define SPREAD_COLS 32

// The pairs of row a that carry weight: their key index, p and p w (compact, in key order).
static int64_t weighted_pairs(const ref_ws *w, int64_t a, int64_t nJ, const uint8_t *vis,
                              int64_t *idx, double *pr, double *pw) {
    int64_t n = 0;
    for (int64_t c = 0; c < nJ; c++) {
        const int64_t x = a * nJ + c;
        if (w->pm[x] == 0.0 || (vis && !vis[x]))
            continue;
        idx[n] = c;
        pr[n] = w->pm[x];
        pw[n++] = w->pw[x];
    }
    return n;
}

// Adds sum_c p_c w_c |v_c - o| to mo and sum_c p_c |v_c - o| to mo16 over `cols` columns, the
// sums kept in registers across the pairs.
static inline void spread_cols(const double *vt, int64_t Dv, const double *o, int64_t cols,
                               int64_t n, const int64_t *idx, const double *pr, const double *pw,
                               double *mo, double *mo16) {
    double sw[SPREAD_COLS] = {0}, s1[SPREAD_COLS] = {0};
    for (int64_t e = 0; e < n; e++) {
        const double *v = vt + idx[e] * Dv;
        if (mo16) {
#pragma omp simd
            for (int64_t d = 0; d < cols; d++) {
                const double dist = fabs(v[d] - o[d]);
                sw[d] += pw[e] * dist;
                s1[d] += pr[e] * dist;
            }
        } else {
#pragma omp simd
            for (int64_t d = 0; d < cols; d++)
                sw[d] += pw[e] * fabs(v[d] - o[d]);
        }
    }
    for (int64_t d = 0; d < cols; d++) {
        mo[d] += sw[d];
        if (mo16)
            mo16[d] += s1[d];
    }
}

CPT_REF_VECTOR void ref_spread(const ref_problem *p, ref_ws *w, int64_t nI, int64_t nJ,
                               const uint8_t *vis) {
    const int64_t Dv = p->dv;
    int64_t idx[CPT_REF_TILE];
    double pr[CPT_REF_TILE], pw[CPT_REF_TILE];
    for (int64_t a = 0; a < nI; a++) {
        const int64_t n = weighted_pairs(w, a, nJ, vis, idx, pr, pw);
        const double *o = w->ot + a * Dv;
        double *mo = w->mo + a * Dv, *mo16 = p->want16 ? w->mo16 + a * Dv : NULL;
        int64_t d0 = 0;
        for (; d0 + SPREAD_COLS <= Dv; d0 += SPREAD_COLS) // a constant width, fully unrolled
            spread_cols(w->vt + d0, Dv, o + d0, SPREAD_COLS, n, idx, pr, pw, mo + d0,
                        mo16 ? mo16 + d0 : NULL);
        if (d0 < Dv)
            spread_cols(w->vt + d0, Dv, o + d0, Dv - d0, n, idx, pr, pw, mo + d0,
                        mo16 ? mo16 + d0 : NULL);
    }
}

void ref_pair_gemm(int trans, int64_t m, int64_t n, int64_t kk, double alpha, const double *A,
                   const double *B, double *C, const uint8_t *vis, int data_finite) {
    // A is stored [nI, nJ]: nJ = kk without trans, m with it.
    const int64_t lda = trans ? m : kk;
    if (data_finite || !vis) {
        cblas_dgemm(CblasRowMajor, trans ? CblasTrans : CblasNoTrans, CblasNoTrans, (int)m, (int)n,
                    (int)kk, alpha, A, (int)lda, B, (int)n, 1.0, C, (int)n);
        return;
    }
    for (int64_t r = 0; r < m; r++)
        for (int64_t e = 0; e < kk; e++) {
            const int64_t x = trans ? e * lda + r : r * lda + e;
            if (!vis[x])
                continue;
            const double f = alpha * A[x];
            for (int64_t d = 0; d < n; d++)
                C[r * n + d] += f * B[e * n + d];
        }
}

static void zero(double *x, int64_t n) { memset(x, 0, sizeof(double) * (size_t)n); }

void ref_zero_row_accumulators(ref_ws *w, int64_t nI, int64_t D, int64_t Dv) {
    zero(w->u, nI * Dv);
    zero(w->mo, nI * Dv);
    zero(w->mo16, nI * Dv);
    zero(w->dqa, nI * D);
    zero(w->mdqa, nI * D);
    zero(w->mdqa16, nI * D);
    zero(w->x, nI * D);
}

void ref_zero_key_accumulators(ref_ws *w, int64_t nJ, int64_t D, int64_t Dv) {
    zero(w->dka, nJ * D);
    zero(w->mdka, nJ * D);
    zero(w->mdka16, nJ * D);
    zero(w->dva, nJ * Dv);
    zero(w->mdva, nJ * Dv);
    zero(w->mdva16, nJ * Dv);
}

void ref_finish_rows(const ref_problem *p, const ref_ws *w, int64_t b, int64_t h, int64_t a0,
                     int64_t nI, int64_t n, const ref_rows_dst *dst) {
    const int64_t H = p->sh.heads_q, D = p->sh.head_dim, Dv = p->dv;
    const double as = fabs(p->scale);
    for (int64_t a = 0; a < nI; a++) {
        const int64_t slot = a0 + a, r = (b * H + h) * n + slot;
        const int64_t oo = ((b * n + slot) * H + h) * Dv, qo = ((b * n + slot) * H + h) * D;
        double mdelta = 0.0, mdelta16 = 0.0;
        for (int64_t d = 0; d < Dv; d++) {
            const int64_t x = a * Dv + d;
            const double m = w->u[x] + w->mo[x], m16 = p->want16 ? w->u[x] + w->mo16[x] : 0.0;
            dst->mout[oo + d] = m;
            if (dst->mout16)
                dst->mout16[oo + d] = m16;
            if (p->dout) {
                mdelta += w->doa[x] * (fabs(w->ot[x]) + m);
                mdelta16 += w->doa[x] * (fabs(w->ot[x]) + m16);
            }
        }
        dst->ml[r] = w->ml[a];
        if (!p->dout)
            continue;
        const double delta = w->delta[a], lse = w->lse[a];
        dst->delta[r] = delta;
        dst->mdelta[r] = mdelta;
        dst->mdelta16[r] = mdelta16;
        for (int64_t d = 0; dst->dq && d < D; d++) {
            const int64_t x = a * D + d;
            dst->dq[qo + d] = w->dqa[x];
            dst->mdq[qo + d] = w->mdqa[x] + as * mdelta * w->x[x];
            if (dst->mdq16)
                dst->mdq16[qo + d] = w->mdqa16[x] + as * mdelta16 * w->x[x];
        }
        if (dst->sink_part[0]) { // dsinks_h = -sum_i p_sink,i delta_i, and its magnitudes
            const double ps = exp(p->sinks[h] - lse);
            dst->sink_part[0][r] = -ps * delta;
            dst->sink_part[1][r] = ps * (fabs(delta) * (1.0 + fabs(lse)) + mdelta);
            dst->sink_part[2][r] = ps * (fabs(delta) + mdelta16);
        }
    }
}
