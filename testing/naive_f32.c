/*
 * naive_f32.c - attention in plain float32 math (naive_f32.h): the baseline, not a reference.
 */
#include "testing/naive_f32.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct naive {
    cpt_oracle_shape sh;
    const float *q, *k, *v;
    const uint8_t *vis;
    float scale;
} naive;

static const float *row_q(const naive *n, const float *t, int64_t b, int64_t i, int64_t h) {
    return t + ((b * n->sh.seq_q + i) * n->sh.heads_q + h) * n->sh.head_dim;
}

static const float *row_kv(const naive *n, const float *t, int64_t b, int64_t j, int64_t hk) {
    return t + ((b * n->sh.seq_k + j) * n->sh.heads_kv + hk) * n->sh.head_dim;
}

static int sees(const naive *n, int64_t i, int64_t j) {
    return !n->vis || n->vis[i * n->sh.seq_k + j];
}

static float dot_f32(const float *a, const float *b, int64_t d) {
    float s = 0.0f;
    for (int64_t i = 0; i < d; i++)
        s += a[i] * b[i];
    return s;
}

// acc[d] += w * x[d]
static void axpy_f32(float w, const float *restrict x, float *restrict acc, int64_t d) {
    for (int64_t i = 0; i < d; i++)
        acc[i] += w * x[i];
}

// s[t] = dot_f32(a, rows[t], d) for four rows at once: each sum adds its terms in dot_f32's order
// (the same bits), and the four chains of additions overlap instead of waiting on each other.
static void dot4_f32(const float *a, const float *const rows[4], int64_t d, float s[4]) {
    float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
    for (int64_t i = 0; i < d; i++) {
        s0 += a[i] * rows[0][i];
        s1 += a[i] * rows[1][i];
        s2 += a[i] * rows[2][i];
        s3 += a[i] * rows[3][i];
    }
    s[0] = s0, s[1] = s1, s[2] = s2, s[3] = s3;
}

// out[j] = dot_f32(a, row j of t) for the keys j that row i of (b, kv head hk) sees.
static void visible_dots(const naive *n, int64_t b, int64_t hk, int64_t i, const float *a,
                         const float *t, float *out) {
    const int64_t D = n->sh.head_dim;
    const float *rows[4];
    int64_t js[4];
    int c = 0;
    for (int64_t j = 0; j < n->sh.seq_k; j++) {
        if (!sees(n, i, j))
            continue;
        rows[c] = row_kv(n, t, b, j, hk);
        js[c++] = j;
        if (c == 4) {
            float s[4];
            dot4_f32(a, rows, D, s);
            for (int u = 0; u < 4; u++)
                out[js[u]] = s[u];
            c = 0;
        }
    }
    for (int u = 0; u < c; u++)
        out[js[u]] = dot_f32(a, rows[u], D);
}

// Softmax row i of (b, h): p[j] = P_ij (0 where masked); returns lse (-inf: sees nothing).
static float softmax_row(const naive *n, int64_t b, int64_t h, int64_t i, float *p) {
    const int64_t Sk = n->sh.seq_k, hk = h / (n->sh.heads_q / n->sh.heads_kv);
    memset(p, 0, (size_t)Sk * sizeof *p);
    visible_dots(n, b, hk, i, row_q(n, n->q, b, i, h), n->k, p);
    float m = -INFINITY;
    int any = 0;
    for (int64_t j = 0; j < Sk; j++) {
        if (!sees(n, i, j))
            continue;
        p[j] *= n->scale;
        if (!any || p[j] > m)
            m = p[j];
        any = 1;
    }
    if (!any)
        return -INFINITY;
    float sum = 0.0f, part = 0.0f;
    for (int64_t j = 0; j < Sk; j++) {
        if (sees(n, i, j))
            p[j] = expf(p[j] - m);
        part += p[j];
        if ((j + 1) % CPT_NAIVE_KC == 0 || j + 1 == Sk) {
            sum += part;
            part = 0.0f;
        }
    }
    for (int64_t j = 0; j < Sk; j++)
        p[j] /= sum;
    return m + logf(sum);
}

// dst[d] = sum_j w[j] * rows(j)[d] over the visible j, in blocks of CPT_NAIVE_KC keys.
static void blocked_gemv(const naive *n, int64_t i, const float *w, const float *t, int64_t b,
                         int64_t hk, float *acc, float *dst) {
    const int64_t Sk = n->sh.seq_k, D = n->sh.head_dim;
    memset(dst, 0, (size_t)D * sizeof *dst);
    for (int64_t j0 = 0; j0 < Sk; j0 += CPT_NAIVE_KC) {
        memset(acc, 0, (size_t)D * sizeof *acc);
        for (int64_t j = j0; j < j0 + CPT_NAIVE_KC && j < Sk; j++)
            if (sees(n, i, j))
                axpy_f32(w[j], row_kv(n, t, b, j, hk), acc, D);
        for (int64_t d = 0; d < D; d++)
            dst[d] += acc[d];
    }
}

void cpt_naive_f32_fwd(const cpt_oracle_shape *sh, const float *q, const float *k, const float *v,
                       const uint8_t *vis, float scale, float *out, float *lse) {
    const naive n = {*sh, q, k, v, vis, scale};
    const int64_t Sq = sh->seq_q, H = sh->heads_q, D = sh->head_dim;
    const int64_t rows = sh->batch * H * Sq, group = H / sh->heads_kv;
#pragma omp parallel
    {
        float *p = malloc(sizeof(float) * (size_t)(sh->seq_k + D + 1));
#pragma omp for schedule(dynamic, 16)
        for (int64_t r = 0; r < rows; r++) {
            int64_t b = r / (H * Sq), h = r / Sq % H, i = r % Sq;
            float *o = out + ((b * Sq + i) * H + h) * D;
            lse[r] = p ? softmax_row(&n, b, h, i, p) : NAN;
            if (p && lse[r] != -INFINITY)
                blocked_gemv(&n, i, p, v, b, h / group, p + sh->seq_k, o);
            else
                for (int64_t d = 0; d < D; d++)
                    o[d] = p ? 0.0f : NAN;
        }
        free(p);
    }
}

// Adds the block sums of dK and dV (key rows [Sk, D]) into the totals and clears them.
static void flush(float *dk, float *dv, float *bk, float *bv, int64_t Sk, int64_t Hk, int64_t hk,
                  int64_t b, int64_t D) {
    for (int64_t j = 0; j < Sk; j++) {
        float *tk = dk + ((b * Sk + j) * Hk + hk) * D, *tv = dv + ((b * Sk + j) * Hk + hk) * D;
        for (int64_t d = 0; d < D; d++) {
            tk[d] += bk[j * D + d];
            tv[d] += bv[j * D + d];
        }
    }
    memset(bk, 0, sizeof(float) * (size_t)(Sk * D));
    memset(bv, 0, sizeof(float) * (size_t)(Sk * D));
}

void cpt_naive_f32_bwd(const cpt_oracle_shape *sh, const float *q, const float *k, const float *v,
                       const uint8_t *vis, float scale, const float *out, const float *dout,
                       float *dq, float *dk, float *dv) {
    const naive n = {*sh, q, k, v, vis, scale};
    const int64_t Sq = sh->seq_q, Sk = sh->seq_k, H = sh->heads_q, Hk = sh->heads_kv;
    const int64_t D = sh->head_dim, group = H / Hk;
    memset(dk, 0, sizeof(float) * (size_t)(sh->batch * Sk * Hk * D));
    memset(dv, 0, sizeof(float) * (size_t)(sh->batch * Sk * Hk * D));
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t bh = 0; bh < sh->batch * Hk; bh++) {
        const int64_t b = bh / Hk, hk = bh % Hk;
        float *p = malloc(sizeof(float) * (size_t)(2 * Sk + 2 * Sk * D + D));
        float *ds = p + Sk, *bk = ds + Sk, *bv = bk + Sk * D, *acc = bv + Sk * D;
        if (!p)
            continue; // dk, dv stay 0 for this head: the comparison fails, never passes
        memset(bk, 0, sizeof(float) * (size_t)(2 * Sk * D));
        int64_t in_block = 0; // query rows summed into bk, bv since the last flush
        for (int64_t h = hk * group; h < (hk + 1) * group; h++)
            for (int64_t i = 0; i < Sq; i++) {
                const int64_t off = ((b * Sq + i) * H + h) * D;
                float *dqi = dq + off;
                if (softmax_row(&n, b, h, i, p) == -INFINITY) {
                    memset(dqi, 0, (size_t)D * sizeof *dqi);
                    continue;
                }
                const float *doi = dout + off, *qi = q + off;
                const float delta = dot_f32(doi, out + off, D);
                visible_dots(&n, b, hk, i, doi, v, ds);
                for (int64_t j = 0; j < Sk; j++)
                    ds[j] = sees(&n, i, j) ? p[j] * (ds[j] - delta) : 0.0f;
                blocked_gemv(&n, i, ds, k, b, hk, acc, dqi);
                for (int64_t d = 0; d < D; d++)
                    dqi[d] *= scale;
                for (int64_t j = 0; j < Sk; j++)
                    if (sees(&n, i, j)) {
                        axpy_f32(p[j], doi, bv + j * D, D);
                        axpy_f32(ds[j], qi, bk + j * D, D);
                    }
                if (++in_block == CPT_NAIVE_KC) {
                    flush(dk, dv, bk, bv, Sk, Hk, hk, b, D);
                    in_block = 0;
                }
            }
        flush(dk, dv, bk, bv, Sk, Hk, hk, b, D);
        for (int64_t j = 0; j < Sk; j++)
            for (int64_t d = 0; d < D; d++)
                dk[((b * Sk + j) * Hk + hk) * D + d] *= scale;
        free(p);
    }
}
