/*
 * cpu_kernels_impl.h - the kernels of cpu_kernels.h written once over a small vector vocabulary.
 *
 * Included by cpu_kernels_generic.c, cpu_kernels_avx2.c and cpu_kernels_avx512.c, which first
 * define (for their instruction set):
 *   vf, vi           float and uint32 GCC vector types of VL lanes (+ - * and casts work on them)
 *   VL, MR, NR       lanes per vector; register tile = MR vectors of lanes x NR broadcast values
 *                    (MR x VL must divide 64, the drivers' tile rows)
 *   v_load v_store v_set1 v_fma v_max v_min
 *                    v_max(a, b) / v_min(a, b) return b when either is NaN, so NaN propagates
 *   v_f16_to_f32     (optional) VL half floats -> VL floats, exact
 *   KERNELS_TABLE    the name of the table to define, KERNELS_LABEL its printable name
 * Nothing here may depend on where a lane sits: see the contract in cpu_kernels.h.
 */
#include <math.h>
#include <string.h>

#include "backends/cpu/cpu_kernels.h"
#include "ctxpar_half.h"

#define CPU_INLINE static inline __attribute__((always_inline))

// F64 lanes as many as the F32 vector's, and their integer view (the F64 sums of accum_f64,
// soft-capping's tanh).
typedef double vd __attribute__((vector_size(VL * sizeof(double))));
typedef int64_t vl __attribute__((vector_size(VL * sizeof(int64_t))));

// 2^x for a vector, about 1 ulp. Arguments below -127 give exactly 0 (no subnormals: the
// softmax never needs weights that small), so -inf gives 0; 2^0 is exactly 1, which makes a
// skipped tile and a fully masked one give the same bits. The polynomial approximates 2^f on
// [-1/2, 1/2] (interpolation at Chebyshev nodes with the constant term pinned to 1); t holds
// n = round(x) in its low bits (x + 1.5 * 2^23), and f = x - n.
CPU_INLINE vf v_exp2_nf(vf t, vf f) {
    vf p = v_set1(0x1.44138ap-13f);
    p = v_fma(p, f, v_set1(0x1.5f0890p-10f));
    p = v_fma(p, f, v_set1(0x1.3b2a54p-7f));
    p = v_fma(p, f, v_set1(0x1.c6af6cp-5f));
    p = v_fma(p, f, v_set1(0x1.ebfbe0p-3f));
    p = v_fma(p, f, v_set1(0x1.62e430p-1f));
    p = v_fma(p, f, v_set1(1.0f));
    // The low bits of t hold n (two's complement); (n + 127) << 23 is 2^n, and 0 for n = -127.
    vi e = ((vi)t + 127u) << 23;
    return p * (vf)e;
}

#define EXP2_ROUND_MAGIC 0x1.8p23f // adding it rounds to an integer in the low bits

CPU_INLINE vf v_exp2(vf x) {
    x = v_max(v_set1(-127.0f), x);
    x = v_min(v_set1(127.0f), x);
    vf t = x + v_set1(EXP2_ROUND_MAGIC);
    return v_exp2_nf(t, x - (t - v_set1(EXP2_ROUND_MAGIC)));
}

// 2^(c s - k0 - r) for an integer-valued k0 and a remainder r (|r| <= 1/2 + an ulp), with
// c = chi + clo (two floats, about 48 bits of c). The exponent is split as x = n + f with n an
// integer picked from an F32 estimate of x, then f = chi s - (k0 + n) (k0 + n exact, the product
// exact inside the FMA: one rounding at |f| <= 1), - r, + clo s. So the roundings fall on f,
// at most about 1.5 * 2^-25 absolute, not on x (up to 2^-25 |x|: with |x| ~ 4 that alone was
// 1.4 ulp of every weight, the largest error of `out` for clamped inputs, docs/numerics.md),
// in F32 operations only. f is kept in [-1, 1] so that a score of -inf (masked) or a large k0
// (an empty row) gives 2^-127 p(-1) = 0, and a NaN stays NaN.
CPU_INLINE vf exp2_split(vf s, vf chi, vf clo, vf k0, vf r) {
    vf x = v_fma(chi, s, -(k0 + r)); // only to pick n
    x = v_max(v_set1(-127.0f), x);
    x = v_min(v_set1(127.0f), x);
    vf t = x + v_set1(EXP2_ROUND_MAGIC);
    vf n = t - v_set1(EXP2_ROUND_MAGIC);
    vf f = v_fma(chi, s, -(k0 + n)) - r;
    // clo times an infinite score would be inf - inf (or 0 * inf) next to f's own -inf: the
    // score is bounded here (a NaN has already made f NaN).
    f = v_fma(clo, v_min(v_set1(0x1p64f), v_max(v_set1(-0x1p64f), s)), f);
    f = v_min(v_set1(1.0f), v_max(v_set1(-1.0f), f));
    return v_exp2_nf(t, f);
}

// round(x) for |x| < 2^22; any float of larger magnitude (and +-inf, NaN) is returned as an
// integer-valued float (or as it is).
CPU_INLINE vf v_round(vf x) {
    return (x + v_set1(EXP2_ROUND_MAGIC)) - v_set1(EXP2_ROUND_MAGIC);
}

// VL visibility words (0 or 0xffffffff, see cpu_kernels.h) as a mask vector.
CPU_INLINE vi v_load_mask(const uint32_t *p) {
    vi m;
    memcpy(&m, p, sizeof m);
    return m;
}

// a where m is all ones, b where it is 0: a select, so a NaN or inf in the unselected side
// never reaches the result.
CPU_INLINE vf v_keep(vi m, vf a, vf b) {
    return (vf)(((vi)a & m) | ((vi)b & ~m));
}

// One MR*VL x NR tile of scores: nb (<= NR) valid rows of b. The sum over d runs in chunks of
// SCORE_CHUNK terms, each an FMA chain from zero, added in order into c: the partial sums a
// rounding sees stay small, which halves the scores' rounding error at D 64-128 (docs/numerics.md:
// with a sharp softmax the scores' error is most of every tensor's). The adds use the FP add
// ports, not the FMA ones the loop is bound by.
#define SCORE_CHUNK 16
CPU_INLINE void scores_tile(float *c, int64_t ldc, const float *at, int64_t lda,
                            const float *const *b, int nb, int64_t dim) {
    vf acc[MR][NR], tot[MR][NR];
    const float *bp[NR];
    for (int j = 0; j < NR; j++)
        bp[j] = b[j < nb ? j : nb - 1]; // past the end: recompute the last row, never stored
    for (int64_t d0 = 0; d0 == 0 || d0 < dim; d0 += SCORE_CHUNK) { // dim 0: zeros
        const int64_t d1 = dim - d0 < SCORE_CHUNK ? dim : d0 + SCORE_CHUNK;
        for (int j = 0; j < NR; j++)
            for (int r = 0; r < MR; r++)
                acc[r][j] = v_set1(0.0f);
        for (int64_t d = d0; d < d1; d++) {
            vf a[MR];
            for (int r = 0; r < MR; r++)
                a[r] = v_load(at + d * lda + r * VL);
            for (int j = 0; j < NR; j++) {
                vf bb = v_set1(bp[j][d]);
                for (int r = 0; r < MR; r++)
                    acc[r][j] = v_fma(a[r], bb, acc[r][j]);
            }
        }
        for (int j = 0; j < NR; j++)
            for (int r = 0; r < MR; r++)
                tot[r][j] = d0 > 0 ? (vf)(tot[r][j] + acc[r][j]) : acc[r][j];
    }
    for (int j = 0; j < nb; j++)
        for (int r = 0; r < MR; r++)
            v_store(c + j * ldc + r * VL, tot[r][j]);
}

static void scores(float *c, int64_t ldc, const float *at, int64_t lda, const float *const *b,
                   int64_t n, int64_t lanes, int64_t dim) {
    for (int64_t l0 = 0; l0 < lanes; l0 += MR * VL) {
        int64_t n0 = 0;
        for (; n0 + NR <= n; n0 += NR)
            scores_tile(c + n0 * ldc + l0, ldc, at + l0, lda, b + n0, NR, dim);
        if (n0 < n)
            scores_tile(c + n0 * ldc + l0, ldc, at + l0, lda, b + n0, (int)(n - n0), dim);
    }
}

// One MR*VL x NR tile of accum: columns d0 .. d0+nd-1 (nd <= NR). `full` and `masked` (constants
// at each call) let the compiler address b[m][d0 + j] with fixed offsets and leave the select
// out of the tiles the mask does not touch. A masked (m, lane) keeps acc as it was, so the
// masked pairs neither add a NaN (0 * inf, 0 * NaN) nor turn a -0 into +0. The sum over m runs
// in chunks, each an FMA chain from zero added into ct in order (as in scores_tile), so that the
// partial sums a rounding sees stay small: 16 terms for the backward's sums over query rows (dV
// with dO = 1 is a sum of positive terms that grows along the tile: its 64-term chain was most
// of dv's error), 32 for the forward's P V (one chain over the tile was 1.12x naive float32's
// `out` error on short documents at P = 8; 16 cost 5-7 % of the forward, 32 costs 2-4 %).
// With c64 the tile is then folded (`fold`) into the F64 sums at c64 (times c64_alpha[l] when
// given), in the same pass, instead of being stored: ct (if any) is left zero. Without ct the
// sum starts from +0 (and alpha is NULL).
#define ACCUM_CHUNK 16
#define ACCUM_CHUNK_FWD 32
CPU_INLINE void accum_tile(float *ct, double *c64, const double *c64_alpha, int64_t ldc,
                           const float *alpha, const float *a, const uint32_t *vis, int64_t lda,
                           const float *const *b, int64_t m, int64_t d0, int nd, int full,
                           int masked) {
    vf acc[MR][NR], tot[MR][NR];
    int64_t off[NR];
    for (int j = 0; j < NR; j++)
        off[j] = d0 + (j < nd ? j : nd - 1);
    // The first chunk starts from alpha * ct (the forward's rescale), the others from zero.
    const int64_t chunk = alpha ? ACCUM_CHUNK_FWD : ACCUM_CHUNK;
    for (int j = 0; j < NR; j++)
        for (int r = 0; r < MR; r++)
            tot[r][j] = j < nd && ct ? v_load(ct + (d0 + j) * ldc + r * VL) : v_set1(0.0f);
    int64_t i0 = 0;
    do {
        const int64_t i1 = m - i0 < chunk ? m : i0 + chunk;
        for (int j = 0; j < NR; j++)
            for (int r = 0; r < MR; r++)
                acc[r][j] =
                    alpha && i0 == 0 ? (vf)(tot[r][j] * v_load(alpha + r * VL)) : v_set1(0.0f);
        for (int64_t i = i0; i < i1; i++) {
            const float *bm = b[i];
            vf av[MR];
            vi mk[MR];
            for (int r = 0; r < MR; r++) {
                av[r] = v_load(a + i * lda + r * VL);
                if (masked)
                    mk[r] = v_load_mask(vis + i * lda + r * VL);
            }
            for (int j = 0; j < NR; j++) {
                vf bb = v_set1(full ? bm[d0 + j] : bm[off[j]]);
                for (int r = 0; r < MR; r++) {
                    vf f = v_fma(av[r], bb, acc[r][j]);
                    acc[r][j] = masked ? v_keep(mk[r], f, acc[r][j]) : f;
                }
            }
        }
        for (int j = 0; j < NR; j++)
            for (int r = 0; r < MR; r++)
                tot[r][j] = alpha && i0 == 0 ? acc[r][j] : (vf)(tot[r][j] + acc[r][j]);
        i0 = i1;
    } while (i0 < m);
    for (int j = 0; j < nd; j++)
        for (int r = 0; r < MR; r++) {
            if (!c64) {
                v_store(ct + (d0 + j) * ldc + r * VL, tot[r][j]);
                continue;
            }
            double *cp = c64 + (d0 + j) * ldc + r * VL;
            vd sum;
            memcpy(&sum, cp, sizeof sum);
            if (c64_alpha) {
                vd al;
                memcpy(&al, c64_alpha + r * VL, sizeof al);
                sum *= al;
            }
            sum += __builtin_convertvector(tot[r][j], vd);
            memcpy(cp, &sum, sizeof sum);
            if (ct)
                v_store(ct + (d0 + j) * ldc + r * VL, v_set1(0.0f));
        }
}

// All the column tiles of one lane block; `masked` a constant, as in accum_tile.
CPU_INLINE void accum_lanes(float *ct, double *c64, const double *c64_alpha, int64_t ldc,
                            const float *alpha, const float *a, const uint32_t *vis, int64_t lda,
                            const float *const *b, int64_t m, int64_t dim, int masked) {
    int64_t d0 = 0;
    for (; d0 + NR <= dim; d0 += NR)
        accum_tile(ct, c64, c64_alpha, ldc, alpha, a, vis, lda, b, m, d0, NR, 1, masked);
    if (d0 < dim)
        accum_tile(ct, c64, c64_alpha, ldc, alpha, a, vis, lda, b, m, d0, (int)(dim - d0), 0,
                   masked);
}

static void accum(float *ct, int64_t ldc, const float *alpha, const float *a, const uint32_t *vis,
                  int64_t lda, const float *const *b, int64_t m, int64_t lanes, int64_t dim) {
    for (int64_t l0 = 0; l0 < lanes; l0 += MR * VL) {
        const float *al = alpha ? alpha + l0 : NULL;
        if (vis)
            accum_lanes(ct + l0, NULL, NULL, ldc, al, a + l0, vis + l0, lda, b, m, dim, 1);
        else
            accum_lanes(ct + l0, NULL, NULL, ldc, al, a + l0, NULL, lda, b, m, dim, 0);
    }
}

static void accum_f64(double *acc, int64_t ldacc, const float *a, const uint32_t *vis, int64_t lda,
                      const float *const *b, int64_t m, int64_t lanes, int64_t dim) {
    for (int64_t l0 = 0; l0 < lanes; l0 += MR * VL) {
        if (vis)
            accum_lanes(NULL, acc + l0, NULL, ldacc, NULL, a + l0, vis + l0, lda, b, m, dim, 1);
        else
            accum_lanes(NULL, acc + l0, NULL, ldacc, NULL, a + l0, NULL, lda, b, m, dim, 0);
    }
}

static void accum_fold(float *ct, double *acc, int64_t ldc, const float *alpha,
                       const float *fold_alpha, const float *a, const uint32_t *vis, int64_t lda,
                       const float *const *b, int64_t m, int64_t lanes, int64_t dim) {
    double fa[64]; // fold_alpha in F64 once (lanes <= 64), as fold does
    for (int64_t l = 0; l < lanes; l++)
        fa[l] = (double)fold_alpha[l];
    for (int64_t l0 = 0; l0 < lanes; l0 += MR * VL) {
        if (vis)
            accum_lanes(ct + l0, acc + l0, fa + l0, ldc, alpha + l0, a + l0, vis + l0, lda, b, m,
                        dim, 1);
        else
            accum_lanes(ct + l0, acc + l0, fa + l0, ldc, alpha + l0, a + l0, NULL, lda, b, m, dim,
                        0);
    }
}

static void softmax_step(float *s, int64_t lds, int64_t n, int64_t lanes, double c, float *m,
                         float *l, float *alpha) {
    const float chi = (float)c;
    const vf cv = v_set1(chi), clo = v_set1((float)(c - chi));
    for (int64_t l0 = 0; l0 < lanes; l0 += VL) {
        // The tile's max in 4 independent chains: one chain is 64 dependent maxima, a wait of
        // 4 x 64 cycles per lane block that nothing else fills (the exponentials need it).
        vf mc[4] = {v_set1(-INFINITY), v_set1(-INFINITY), v_set1(-INFINITY), v_set1(-INFINITY)};
        int64_t i = 0;
        for (; i + 4 <= n; i += 4)
            for (int c = 0; c < 4; c++)
                mc[c] = v_max(mc[c], v_load(s + (i + c) * lds + l0));
        for (; i < n; i++)
            mc[0] = v_max(mc[0], v_load(s + i * lds + l0));
        vf mt = v_max(v_max(mc[0], mc[1]), v_max(mc[2], mc[3]));
        vf mo = v_load(m + l0);
        // c > 0: (float)c * max s is within an ulp or two of the largest c * s (an exponent
        // of 2^-23 above 0 is harmless); m only has to be the same in p and in the lse. It is
        // not rounded to an integer: then the dominant weight of a row would carry the
        // polynomial's rounding instead of being 2^(about 0), nearly exact (that cost 1.4x
        // naive float32's dq error on rows of a few keys).
        vf mn = v_max(mo, mt * cv); // mo >= -FLT_MAX: finite
        vf k0 = v_round(mn), r = mn - k0; // m = k0 + r, exactly, for exp2_split
        vf al = v_exp2(mo - mn);
        vf sum = v_load(l + l0) * al;
        for (i = 0; i < n; i++) {
            vf p = exp2_split(v_load(s + i * lds + l0), cv, clo, k0, r);
            v_store(s + i * lds + l0, p);
            sum = sum + p;
        }
        v_store(m + l0, mn);
        v_store(l + l0, sum);
        v_store(alpha + l0, al);
    }
}

// Plain loops: the compiler vectorises them for the table's instruction set.
static void fold(double *acc, int64_t lda, float *part, int64_t ldp, const float *alpha,
                 int64_t rows, int64_t lanes) {
    double al[64]; // alpha in F64 once, not once per row (lanes <= 64: the drivers' tiles)
    for (int64_t l = 0; alpha && l < lanes; l++)
        al[l] = (double)alpha[l];
    for (int64_t r = 0; r < rows; r++) {
        double *restrict a = acc + r * lda;
        float *restrict p = part + r * ldp;
        if (alpha)
            for (int64_t l = 0; l < lanes; l++)
                a[l] = a[l] * al[l] + (double)p[l];
        else
            for (int64_t l = 0; l < lanes; l++)
                a[l] += (double)p[l];
        memset(p, 0, (size_t)lanes * sizeof *p);
    }
}

static void exp2_sub(float *s, int64_t lds, int64_t n, int64_t lanes, double c,
                     const float *hi_lane, const float *lo_lane, const float *hi_row,
                     const float *lo_row) {
    const float chi = (float)c;
    const vf cv = v_set1(chi), clo = v_set1((float)(c - chi));
    for (int64_t i = 0; i < n; i++)
        for (int64_t l0 = 0; l0 < lanes; l0 += VL) {
            vf hi = hi_lane ? v_load(hi_lane + l0) : v_set1(hi_row[i]);
            vf lo = hi_lane ? v_load(lo_lane + l0) : v_set1(lo_row[i]);
            // hi + lo = k0 + r: k0 an integer (hi = +inf, an empty row, becomes 2^24: every
            // weight 0), r = (hi - k0) + lo, |r| <= 1/2 + an ulp.
            hi = v_min(v_set1(0x1p24f), hi);
            vf k0 = v_round(hi);
            vf r = (hi - k0) + lo;
            v_store(s + i * lds + l0, exp2_split(v_load(s + i * lds + l0), cv, clo, k0, r));
        }
}

static void dsoftmax(float *dp, const float *p, const uint32_t *vis, int64_t lds, int64_t n,
                     int64_t lanes, const float *delta_lane, const float *delta_row) {
    for (int64_t i = 0; i < n; i++)
        for (int64_t l0 = 0; l0 < lanes; l0 += VL) {
            vf dl = delta_lane ? v_load(delta_lane + l0) : v_set1(delta_row[i]);
            vf x = v_load(dp + i * lds + l0) - dl;
            vf ds = v_load(p + i * lds + l0) * x;
            if (vis) // a masked dP may be NaN (from dO or V): select 0, never multiply by it
                ds = v_keep(v_load_mask(vis + i * lds + l0), ds, v_set1(0.0f));
            v_store(dp + i * lds + l0, ds);
        }
}

// Lanes of the pair (a, b) picked by idx: idx[l] < VL is a[idx[l]], else b[idx[l] - VL] (GCC's
// two-vector __builtin_shuffle). clang has no shuffle with indices known only at run time, so
// it gets a loop over lanes; a table may define it as an instruction (AVX-512's VPERMT2D).
#ifndef v_shuffle2
#ifdef __clang__
CPU_INLINE vi v_shuffle2_(vi a, vi b, vi idx) {
    vi r;
    for (int l = 0; l < VL; l++)
        r[l] = idx[l] < VL ? a[idx[l]] : b[idx[l] - VL];
    return r;
}
#define v_shuffle2 v_shuffle2_
#else
#define v_shuffle2(a, b, idx) __builtin_shuffle((a), (b), (idx))
#endif
#endif

// The lane indices 0 .. VL-1 as a vector.
CPU_INLINE vi v_iota(void) {
    uint32_t a[VL];
    for (int l = 0; l < VL; l++)
        a[l] = (uint32_t)l;
    vi v;
    memcpy(&v, a, sizeof v);
    return v;
}

// 32-bit words (floats or visibility words: moved, never computed on)
//   dst[m * ldd + l] = l < rows ? src[l * lds + m] : pad    for m < cols, l < lanes,
// lanes a multiple of VL. A VL x VL block whose source is all inside rows x cols goes through
// registers: log2(VL) rounds, each swapping the off-diagonal w x w blocks of every 2w x 2w block
// with two-vector shuffles. The edges go one word at a time (and never read past rows x cols).
static void transpose(void *dst, int64_t ldd, const void *src, int64_t lds, int64_t rows,
                      int64_t cols, int64_t lanes, uint32_t pad) {
    char *d = dst;
    const char *s = src;
    const vi idx = v_iota();
    for (int64_t l0 = 0; l0 < lanes; l0 += VL)
        for (int64_t m0 = 0; m0 < cols; m0 += VL) {
            if (l0 + VL <= rows && m0 + VL <= cols) {
                vi r[VL];
                for (int i = 0; i < VL; i++)
                    memcpy(&r[i], s + ((l0 + i) * lds + m0) * 4, sizeof r[i]);
                for (uint32_t w = 1; w < VL; w <<= 1) {
                    const vi upper = (vi)((idx & w) != 0) & (VL - w); // VL - w where l & w
                    const vi lo = idx + upper, hi = idx + w + upper;
                    for (int i = 0; i < VL; i++)
                        if (!(i & w)) {
                            const vi a = r[i], b = r[i + w];
                            r[i] = v_shuffle2(a, b, lo);
                            r[i + w] = v_shuffle2(a, b, hi);
                        }
                }
                for (int j = 0; j < VL; j++)
                    memcpy(d + ((m0 + j) * ldd + l0) * 4, &r[j], sizeof r[j]);
                continue;
            }
            for (int64_t m = m0; m < m0 + VL && m < cols; m++)
                for (int64_t l = l0; l < l0 + VL; l++) {
                    uint32_t x = pad;
                    if (l < rows)
                        memcpy(&x, s + (l * lds + m) * 4, 4);
                    memcpy(d + (m * ldd + l) * 4, &x, 4);
                }
        }
}

// *x = tanh(*x) in F64, VL lanes, without a library call (libm's scalar tanh made a soft-capped
// forward ~4x slower than a plain one). tanh |x| = e / (e + 2) with e = expm1(2|x|)
// = 2^k (1 + p) - 1, k = round(2|x| / ln 2), p = expm1(r) for the remainder |r| <= ln(2) / 2
// (Cody-Waite: ln 2 in two parts, k ln2_hi exact), p by its Taylor series to r^13 (truncation
// < 2e-17 relative). Relative error below 1e-15 (a few F64 ulps), so C tanh rounded to F32 is
// the correctly rounded value unless it lies within 1e-15 (relative) of the midpoint between two
// floats, and is then one F32 ulp off (testing/cpu_ops_test checks this against libm). |x| >= 20
// gives exactly +-1 (as libm: tanh 20 = 1 - 8.5e-18 rounds to 1); NaN gives NaN; -0 gives -0.
// Through a pointer: a 32-byte vector argument would change the ABI on the generic table.
CPU_INLINE void v_tanh_f64(vd *xp) {
    const vd x = *xp;
    const vl sign = (vl)x & INT64_MIN;
    vd a = (vd)((vl)x ^ sign);
    const vl big = a > 20.0; // all ones where |x| > 20 (not for NaN, which stays NaN)
    const vd twenty = (vd){0} + 20.0;
    a = (vd)((big & (vl)twenty) | (~big & (vl)a));
    const vd y = 2.0 * a;
    const vd kt = y * 0x1.71547652b82fep0 + 0x1.8p52; // y / ln 2 rounded, in the low bits
    const vd k = kt - 0x1.8p52;
    const vd r = (y - k * 0x1.62e42fee00000p-1) - k * 0x1.a39ef35793c76p-33;
    static const double inv_fact[] = {1.0 / 479001600.0, 1.0 / 39916800.0, 1.0 / 3628800.0,
                                      1.0 / 362880.0,    1.0 / 40320.0,    1.0 / 5040.0,
                                      1.0 / 720.0,       1.0 / 120.0,      1.0 / 24.0,
                                      1.0 / 6.0,         0.5,              1.0};
    vd p = r * (1.0 / 6227020800.0) + inv_fact[0]; // r / 13! + 1 / 12!
    for (int i = 1; i < 12; i++)
        p = p * r + inv_fact[i];
    p = p * r;
    // 2^k (0 <= k <= 58) from kt's low bits, then expm1(y): exact scaling, one rounding.
    const vd scale = (vd)(((vl)kt + 1023) << 52);
    const vd e = scale * p + (scale - 1.0);
    *xp = (vd)((vl)(e / (e + 2.0)) | sign);
}

// VL scores at a time; n is a multiple of VL (rows x lanes), a shorter end is padded.
static void softcap(float *s, float *dcap, const uint32_t *vis, int64_t n, double cap,
                    double mul) {
    for (int64_t i = 0; i < n; i += VL) {
        const int m = n - i < VL ? (int)(n - i) : VL;
        float xs[VL] = {0}, ds[VL];
        uint32_t ms[VL];
        memset(ms, 0xff, sizeof ms);
        memcpy(xs, s + i, (size_t)m * sizeof(float));
        if (vis)
            memcpy(ms, vis + i, (size_t)m * sizeof(uint32_t));
        const vf x = v_load(xs);
        vd t = __builtin_convertvector(x, vd) * mul;
        v_tanh_f64(&t);
        const vi shown = v_load_mask(ms); // hidden pairs (s is -inf there) are left alone
        v_store(xs, v_keep(shown, __builtin_convertvector(t * cap, vf), x));
        memcpy(s + i, xs, (size_t)m * sizeof(float));
        if (dcap) { // 1 - tanh^2 for the shown pairs, 0 for the hidden ones
            v_store(ds, v_keep(shown, __builtin_convertvector(1.0 - t * t, vf), v_set1(0.0f)));
            memcpy(dcap + i, ds, (size_t)m * sizeof(float));
        }
    }
}

static void to_f32(float *dst, const void *src, ctxpar_dtype dtype, int64_t n) {
    const uint16_t *h = (const uint16_t *)src;
    int64_t i = 0;
    switch (dtype) {
    case CTXPAR_DTYPE_F32:
        memcpy(dst, src, (size_t)n * sizeof(float));
        return;
    case CTXPAR_DTYPE_BF16:
        for (; i < n; i++)
            dst[i] = ctxpar_bf16_to_f32(h[i]);
        return;
    case CTXPAR_DTYPE_F16:
#ifdef v_f16_to_f32
        for (; i + VL <= n; i += VL)
            v_store(dst + i, v_f16_to_f32(h + i));
#endif
        for (; i < n; i++)
            dst[i] = ctxpar_f16_to_f32(h[i]);
        return;
    }
}

// x = x * a + b in CTXPAR_CPU_FMA_CHAINS registers. a < 1 keeps every chain bounded (it tends to
// b / (1 - a)), so no value overflows or turns subnormal however long the loop runs.
static float fma_chains(int64_t iters) {
    const vf a = v_set1(0.999f), b = v_set1(1e-3f);
    vf x[CTXPAR_CPU_FMA_CHAINS];
    for (int c = 0; c < CTXPAR_CPU_FMA_CHAINS; c++)
        x[c] = v_set1((float)c);
    for (int64_t it = 0; it < iters; it++)
        for (int c = 0; c < CTXPAR_CPU_FMA_CHAINS; c++) // unrolled by the compiler: a constant trip
            x[c] = v_fma(x[c], a, b);
    vf sum = x[0];
    for (int c = 1; c < CTXPAR_CPU_FMA_CHAINS; c++)
        sum = sum + x[c];
    float lanes[VL];
    v_store(lanes, sum);
    float total = 0.0f;
    for (int l = 0; l < VL; l++)
        total += lanes[l];
    return total;
}

// Reproducible mode's row of terms into binned accumulators: the SDK's function, inlined here so
// that its loop is vectorised for this table's instruction set.
static void bins_add_row(ctxpar_bins_view b, int64_t i0, const float *x, int64_t n, int64_t k) {
    ctxpar_bins_add_row(b, i0, x, n, k);
}

#define CPU_STR_(x) #x
#define CPU_STR(x) CPU_STR_(x)
const ctxpar_cpu_kernels KERNELS_TABLE = {
    .name = KERNELS_LABEL,
    .lane_block = MR * VL,
    .scores = scores,
    .accum = accum,
    .accum_f64 = accum_f64,
    .accum_fold = accum_fold,
    .softmax_step = softmax_step,
    .fold = fold,
    .exp2_sub = exp2_sub,
    .dsoftmax = dsoftmax,
    .to_f32 = to_f32,
    .vector_lanes = VL,
    .fma_chains = fma_chains,
    .tiles = CPU_STR(MR) "x" CPU_STR(NR),
    .softcap = softcap,
    .transpose = transpose,
    .bins_add_row = bins_add_row,
};
