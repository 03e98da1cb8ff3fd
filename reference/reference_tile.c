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
#include <math.h>
#include <string.h>

#include "reference/reference_tile.h"

void ref_scores(const ref_problem *p, ref_ws *w, int64_t nI, int64_t nJ, const double *vis) {
    const int64_t D = p->sh.head_dim;
    ref_dgemm(0, 1, nI, nJ, D, p->scale, w->qt, D, w->kt, D, 0.0, w->s, nJ);
    const int64_t n = nI * nJ;
    if (p->softcap > 0.0)
        for (int64_t x = 0; x < n; x++) {
            w->tc[x] = tanh(w->s[x] / p->softcap);
            w->s[x] = p->softcap * w->tc[x];
        }
    for (int64_t x = 0; vis && x < n; x++)
        w->s[x] = vis[x] != 0.0 ? w->s[x] : -INFINITY;
}

void ref_abs_scores(ref_ws *w, int64_t nI, int64_t nJ, int64_t D) {
    ref_dgemm(0, 1, nI, nJ, D, 1.0, w->qa, D, w->ka, D, 0.0, w->a, nJ);
}

// The larger of m and x, NaN once either was NaN (a NaN score must reach out and lse).
static double nan_max(double m, double x) { return m != m || x != x ? NAN : x > m ? x : m; }

/*
 * e^x within a few ulp, written so that the vectoriser takes it (no call, no branch): x = k ln2 + r
 * with |r| <= ln2 / 2 (ln2 in two parts, the first exact times k), e^r by its Taylor series to
 * r^13 (the rest is below 5e-18 of it), 2^(k-1) put together in the exponent bits and times 2 (so
 * that k = 1024 still fits). e^x below 2^-1021 becomes 0: nothing the reference sums notices a
 * weight that small. NaN stays NaN, +inf and x > 709.78 give +inf.
 */
static inline double ref_exp(double x) {
    const double hi = 709.782712893384, lo = -707.7;
    const double xc = x > hi ? hi : x < lo ? lo : x; // NaN passes through
    const double magic = 6755399441055744.0;         // 1.5 * 2^52: rounds to an integer
    const double t = xc * 1.4426950408889634 + magic;
    const double k = t - magic;
    const double r = (xc - k * 6.93147180369123816490e-01) - k * 1.90821492927058770002e-10;
    double q = 1.0 / 6227020800.0; // 1/13!
    q = q * r + 1.0 / 479001600.0;
    q = q * r + 1.0 / 39916800.0;
    q = q * r + 1.0 / 3628800.0;
    q = q * r + 1.0 / 362880.0;
    q = q * r + 1.0 / 40320.0;
    q = q * r + 1.0 / 5040.0;
    q = q * r + 1.0 / 720.0;
    q = q * r + 1.0 / 120.0;
    q = q * r + 1.0 / 24.0;
    q = q * r + 1.0 / 6.0;
    q = q * r + 0.5;
    q = q * r + 1.0;
    q = q * r + 1.0;
    int64_t bits;
    memcpy(&bits, &t, sizeof bits); // the low bits of t hold k
    const int64_t e = (bits - INT64_C(0x4338000000000000) + 1022) << 52;
    double two_k1;
    memcpy(&two_k1, &e, sizeof two_k1);
    const double y = q * two_k1 * 2.0;
    return x > hi ? INFINITY : x < lo ? 0.0 : y;
}

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
        const double alpha = w->m[a] == -INFINITY ? 0.0 : ref_exp(w->m[a] - m_new);
        double sum = 0.0;
#pragma omp simd
        for (int64_t c = 0; c < nJ; c++)
            pr[c] = ref_exp(s[c] - m_new);
        for (int64_t c = 0; c < nJ; c++)
            sum += pr[c];
        w->l[a] = w->l[a] * alpha + sum;
        w->m[a] = m_new;
        if (alpha != 1.0)
            for (int64_t d = 0; d < Dv; d++)
                w->acc[a * Dv + d] *= alpha;
    }
}

// Masked pairs, and every pair of a row that sees no key, get 0 by a select (never 0 * x: x may
// be a NaN the mask hides); the bound's w and p w also skip pairs whose p is 0, as the plain bound
// does. vis NULL: every pair visible.
CPT_REF_VECTOR void ref_probabilities(const ref_problem *p, ref_ws *w, int64_t nI, int64_t nJ,
                                      const double *vis) {
    const double as = fabs(p->scale), capped = p->softcap > 0.0 ? 1.0 : 0.0;
    const double *vv = vis ? vis : w->ones;
    for (int64_t a = 0; a < nI; a++) {
        const double lse = w->lse[a], seen = lse == -INFINITY ? 0.0 : 1.0;
        const double *s = w->s + a * nJ, *ab = w->a + a * nJ;
        const double *va = vv + a * nJ;
        double *pm = w->pm + a * nJ, *wt = w->wt + a * nJ, *pw = w->pw + a * nJ;
#pragma omp simd
        for (int64_t c = 0; c < nJ; c++) {
            const double keep = seen * va[c];
            const double wc = 1.0 + as * ab[c] + fabs(lse) + capped * fabs(s[c]);
            const double pc = ref_exp(s[c] - lse);
            pm[c] = keep != 0.0 ? pc : 0.0;
            wt[c] = (keep != 0.0) & (pc != 0.0) ? wc : 0.0;
            pw[c] = (keep != 0.0) & (pc != 0.0) ? pc * wc : 0.0;
        }
    }
}

void ref_grad_scores(const ref_problem *p, ref_ws *w, int64_t nI, int64_t nJ, const double *vis,
                     int with_mdelta) {
    const int64_t Dv = p->dv;
    ref_dgemm(0, 1, nI, nJ, Dv, 1.0, w->dot, Dv, w->vt, Dv, 0.0, w->dp, nJ);
    ref_dgemm(0, 1, nI, nJ, Dv, 1.0, w->doa, Dv, w->va, Dv, 0.0, w->bm, nJ);
    ref_grad_pairs(p, w, nI, nJ, vis, with_mdelta);
}

// dS, mu, mu16 and P dcap of every pair (after ref_grad_scores' products dP and |dO| |V|^T).
// dS is 0 where the mask hides the pair (a masked NaN in dP stays out); the bound's mu and P dcap
// also where p is 0. Without soft-capping tc is 0 (ref_ws_alloc), so dcap is 1 and cap_err 0.
CPT_REF_VECTOR void ref_grad_pairs(const ref_problem *p, ref_ws *w, int64_t nI, int64_t nJ,
                                   const double *vis, int with_mdelta) {
    const double capped = p->softcap > 0.0 ? 1.0 : 0.0;
    const double inv_c = p->softcap > 0.0 ? 1.0 / p->softcap : 0.0, w16 = p->want16 ? 1.0 : 0.0;
    const double *vv = vis ? vis : w->ones;
    for (int64_t a = 0; a < nI; a++) {
        const double md = with_mdelta ? w->mdelta[a] : 0.0;
        const double md16 = with_mdelta ? w->mdelta16[a] : 0.0;
        const double delta = w->delta[a], seen = w->lse[a] == -INFINITY ? 0.0 : 1.0;
        const int64_t o = a * nJ;
        const double *va = vv + o;
        const double *pm = w->pm + o, *dp = w->dp + o, *wt = w->wt + o, *bm = w->bm + o;
        const double *tc = w->tc + o;
        double *ds = w->ds + o, *mu = w->mu + o, *mu16 = w->mu16 + o, *pd = w->pd + o;
#pragma omp simd
        for (int64_t c = 0; c < nJ; c++) {
            const double keep = seen * va[c];
            const double pr = pm[c], dpd = dp[c] - delta, t = tc[c];
            // dS times 1 - t^2, which is off by 2 |t| w u / C + u
            const double dcap = 1.0 - capped * t * t;
            const double cap_err = capped * pr * fabs(dpd) * (2.0 * fabs(t) * wt[c] * inv_c + 1.0);
            const double m = pr * (fabs(dpd) * wt[c] + bm[c] + md) * dcap + cap_err;
            const double m16 = w16 * (pr * (fabs(dpd) + bm[c] + md16) * dcap + cap_err);
            const int bound = (keep != 0.0) & (pr != 0.0);
            ds[c] = keep != 0.0 ? pr * dpd * dcap : 0.0;
            mu[c] = bound ? m : 0.0;
            mu16[c] = bound ? m16 : 0.0;
            pd[c] = bound ? pr * dcap : 0.0;
        }
    }
}

// Columns of out summed at once in ref_spread: 32 doubles are 8 accumulator vectors (AVX-512),
// enough independent adds to keep both FP ports busy.
#define SPREAD_COLS 32

// The pairs of row a that carry weight: their key index, p and p w (compact, in key order).
static int64_t weighted_pairs(const ref_ws *w, int64_t a, int64_t nJ, const double *vis,
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
                               const double *vis) {
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
                   const double *B, double *C, const double *vis, int data_finite) {
    // A is stored [nI, nJ]: nJ = kk without trans, m with it.
    const int64_t lda = trans ? m : kk;
    if (data_finite || !vis) {
        ref_dgemm(trans, 0, m, n, kk, alpha, A, lda, B, n, 1.0, C, n);
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
