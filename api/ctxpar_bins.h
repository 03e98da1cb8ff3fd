/*
 * ctxpar_bins.h - binned accumulators: sums whose bits do not depend on the order of their terms
 * (reproducible mode, docs/numerics.md). Part of the backend SDK: a device's bins_* ops
 * (ctxpar_backend.h) must give exactly the bits of these functions, and may simply call them.
 *
 * A term is x 2^k: x an F32 value, k an integer (|k| <= 2^50). Bin i of the absolute scale
 * covers the bits of weight [2^(iW), 2^((i+1)W)), W = 32. A value keeps its top index T (the
 * largest bin index of any term it has seen: the bin of the term's exponent, e + k for
 * x = m 2^(e - 23)) and three int64 sums: of its terms' slices in bins T (hi), T - 1 (mid) and
 * T - 2 (lo), a slice being the term's magnitude truncated to a multiple of 2^(32(T-2)) and cut
 * at the bin edges, with the term's sign. When T rises the low bins fall off: each term's slices
 * on the new grid are its old ones shifted (truncation composes), so the sums are those of
 * adding every term to the final grid, whatever the order. What a term holds below 2^(32(T-2))
 * is dropped: less than 2^-64 of the value's largest term, per term, so that even a sum that
 * cancels to a small fraction of its terms (a dQ row) keeps F32's precision. Each bin takes
 * terms below 2^32: 2^31 terms per value. Non-finite terms are summed apart (NaN made
 * canonical), so a NaN or an infinity comes out where IEEE addition puts it. Integer arithmetic
 * only, branch-free per value: what a vectorising compiler turns into SIMD.
 *
 * Layout of a block of n = rows * width values (device memory, ctxpar_bins_bytes long):
 *   int64_t top[n]       the value's T; CTXPAR_BINS_EMPTY: no term yet
 *   int64_t hi[n], mid[n], lo[n]   bins T, T - 1, T - 2
 *   float   special[n]   the sum of the non-finite terms; 0: none
 */
#ifndef CTXPAR_BINS_H
#define CTXPAR_BINS_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define CTXPAR_BINS_FN static inline __host__ __device__
#else
#define CTXPAR_BINS_FN static inline
#endif

#define CTXPAR_BINS_W 32
#define CTXPAR_BINS_EMPTY INT64_MIN
#define CTXPAR_BINS_KMAX ((int64_t)1 << 50) /* |k| beyond this is clamped (no float gets there) */

/* Where a bins op adds its rows: a block of batch*seq*heads rows of `width` values (row
 * (b*seq + s)*heads + h), and a source [batch, len, heads, ...] whose row s lands at s + off. */
typedef struct ctxpar_bins_shape {
    int64_t batch, seq, heads, width;
    int64_t off, len;
} ctxpar_bins_shape;

CTXPAR_BINS_FN size_t ctxpar_bins_bytes(int64_t rows, int64_t width) {
    size_t n = (size_t)rows * (size_t)width;
    return (n * (4 * sizeof(int64_t) + sizeof(float)) + 7) & ~(size_t)7;
}

typedef struct ctxpar_bins_view {
    int64_t *top, *hi, *mid, *lo;
    float *special;
} ctxpar_bins_view;

CTXPAR_BINS_FN ctxpar_bins_view ctxpar_bins_at(void *block, int64_t rows, int64_t width) {
    const int64_t n = rows * width;
    ctxpar_bins_view v;
    v.top = (int64_t *)block;
    v.hi = v.top + n;
    v.mid = v.hi + n;
    v.lo = v.mid + n;
    v.special = (float *)(v.lo + n);
    return v;
}

/* Value i empty. */
CTXPAR_BINS_FN void ctxpar_bins_clear_value(ctxpar_bins_view b, int64_t i) {
    b.top[i] = CTXPAR_BINS_EMPTY;
    b.hi[i] = b.mid[i] = b.lo[i] = 0;
    b.special[i] = 0.0f;
}

/* floor(a / 32) without a branch. */
CTXPAR_BINS_FN int64_t ctxpar_bins_floor32(int64_t a) {
    return a >= 0 ? a / 32 : ~(~a / 32);
}

/* A non-finite term into a value's special sum (a canonical NaN, whatever the order). */
CTXPAR_BINS_FN void ctxpar_bins_put_special(float *special, float x) {
    float s = *special + x;
    *special = s != s ? NAN : s;
}

/* Adds the finite term x 2^k to value i (the whole rule, branch-free). */
CTXPAR_BINS_FN void ctxpar_bins_put(ctxpar_bins_view b, int64_t i, float x, int64_t k) {
    uint32_t bits;
    memcpy(&bits, &x, sizeof bits);
    const int64_t ef = (bits >> 23) & 0xff, m = ef ? (bits & 0x7fffff) | 0x800000 : bits & 0x7fffff;
    const int64_t e = (ef ? ef : 1) - 127 + k; // |x 2^k| = m 2^(e - 23) < 2^(e + 1)
    const int64_t idx = m ? ctxpar_bins_floor32(e) : CTXPAR_BINS_EMPTY;
    const int64_t t0 = b.top[i], t = idx > t0 ? idx : t0;
    // How many bins the value rises by: 3 (all fall off) from empty; unsigned: no overflow.
    const uint64_t d = t0 == CTXPAR_BINS_EMPTY ? 3 : (uint64_t)t - (uint64_t)t0;
    const int64_t h0 = b.hi[i], m0 = b.mid[i], l0 = b.lo[i];
    const int64_t hi = d == 0 ? h0 : 0,
                  mid = d == 0   ? m0
                        : d == 1 ? h0
                                 : 0,
                  lo = d == 0   ? l0
                       : d == 1 ? m0
                       : d == 2 ? h0
                                : 0;
    // The term in units of the middle bin: m 2^sm, sm <= 40 (e < 32 t + 32); below it, the low
    // bin's part (sm < 0: the bits shifted out, in units of the low bin).
    const int64_t sm = e - 23 - 32 * ((t == CTXPAR_BINS_EMPTY ? 1 : t) - 1);
    const int64_t shl = sm > 0 ? (sm > 40 ? 40 : sm) : 0, shr = sm < 0 ? (sm < -63 ? 63 : -sm) : 0;
    const uint64_t upper = ((uint64_t)m << shl) >> shr; // the term's bits from the middle bin up
    const int64_t sl = sm + 32; // in units of the low bin, for the bits below the middle one
    const int64_t shl2 = sl > 0 ? (sl > 31 ? 31 : sl) : 0,
                  shr2 = sl < 0 ? (sl < -63 ? 63 : -sl) : 0;
    const uint64_t low = sm < 0 ? (((uint64_t)m << shl2) >> shr2) & 0xffffffffu : 0;
    const int64_t neg = (int64_t)(bits >> 31), s_hi = (int64_t)(upper >> 32),
                  s_mid = (int64_t)(upper & 0xffffffffu), s_lo = (int64_t)low;
    b.top[i] = t;
    b.hi[i] = hi + (neg ? -s_hi : s_hi);
    b.mid[i] = mid + (neg ? -s_mid : s_mid);
    b.lo[i] = lo + (neg ? -s_lo : s_lo);
}

/* Adds one term x 2^k to value i of a view (x may be non-finite). */
CTXPAR_BINS_FN void ctxpar_bins_add_term(ctxpar_bins_view b, int64_t i, float x, int64_t k) {
    if (!isfinite(x))
        ctxpar_bins_put_special(b.special + i, x);
    else
        ctxpar_bins_put(b, i, x, k);
}

/* Adds x[0 .. n) 2^k to values i0 .. i0 + n - 1: the rule for a row of terms, in a loop a
 * compiler vectorises when every term is finite. */
CTXPAR_BINS_FN void ctxpar_bins_add_row(ctxpar_bins_view b, int64_t i0, const float *x, int64_t n,
                                        int64_t k) {
    int finite = 1;
    for (int64_t j = 0; j < n; j++) {
        uint32_t bits;
        memcpy(&bits, &x[j], sizeof bits);
        finite &= ((bits >> 23) & 0xff) != 0xff;
    }
    if (!finite) {
        for (int64_t j = 0; j < n; j++)
            ctxpar_bins_add_term(b, i0 + j, x[j], k);
        return;
    }
    for (int64_t j = 0; j < n; j++)
        ctxpar_bins_put(b, i0 + j, x[j], k);
}

/* Value a of view `to` += value c of view `from`. */
CTXPAR_BINS_FN void ctxpar_bins_merge_value(ctxpar_bins_view to, int64_t a, ctxpar_bins_view from,
                                            int64_t c) {
    if (from.special[c] != 0.0f)
        ctxpar_bins_put_special(to.special + a, from.special[c]);
    const int64_t tb = from.top[c], ta = to.top[a];
    if (tb == CTXPAR_BINS_EMPTY)
        return;
    if (ta == CTXPAR_BINS_EMPTY || tb > ta) { // a rises to b's top first
        const uint64_t d = ta == CTXPAR_BINS_EMPTY ? 3 : (uint64_t)tb - (uint64_t)ta;
        to.lo[a] = d == 1 ? to.mid[a] : d == 2 ? to.hi[a] : 0;
        to.mid[a] = d == 1 ? to.hi[a] : 0;
        to.hi[a] = 0;
        to.top[a] = tb;
    }
    const uint64_t d = (uint64_t)to.top[a] - (uint64_t)tb;
    if (d == 0) {
        to.hi[a] += from.hi[c];
        to.mid[a] += from.mid[c];
        to.lo[a] += from.lo[c];
    } else if (d == 1) {
        to.mid[a] += from.hi[c];
        to.lo[a] += from.mid[c];
    } else if (d == 2) {
        to.lo[a] += from.hi[c];
    }
}

/* Leading zero bits of x != 0. */
CTXPAR_BINS_FN int ctxpar_bins_clz64(uint64_t x) {
#if defined(__CUDA_ARCH__)
    return __clzll((long long)x);
#elif defined(__GNUC__)
    return __builtin_clzll(x);
#else
    int n = 0;
    for (; !(x >> 63); x <<= 1)
        n++;
    return n;
#endif
}

/* hi 2^64 + lo as a double, rounded to odd: truncated to 53 bits, the last of them set when a
 * bit below was. Rounding that double to float (or to any format of at most 51 bits) is then
 * exactly rounding the integer itself once; a correctly rounded double would round twice (an
 * integer just above a float's halfway point, by less than a double's half ulp, becomes that
 * halfway point, then ties to even: the wrong side). Portable: no 128-bit conversion needed. */
CTXPAR_BINS_FN double ctxpar_bins_u128_to_double(uint64_t hi, uint64_t lo) {
    int e = 0;
    if (hi == 0) {
        if (lo < ((uint64_t)1 << 53))
            return (double)lo; // exact
        hi = lo;
        lo = 0;
        e = -64;
    }
    const int z = ctxpar_bins_clz64(hi); // normalise: the leading 1 to bit 127
    if (z) {
        hi = (hi << z) | (lo >> (64 - z));
        lo <<= z;
        e -= z;
    }
    // The top 53 bits, and the sticky bit into the last of them.
    const uint64_t m = (hi >> 11) | (uint64_t)((hi & 0x7ff) != 0 || lo != 0);
    return ldexp((double)m, 75 + e); // exact
}

/* Value i's exact sum as m 2^e: m the integer hi 2^64 + mid 2^32 + lo as a double rounded to
 * odd (ctxpar_bins_u128_to_double), e = 32 (T - 2) the low bin's weight. An empty value: 0. */
CTXPAR_BINS_FN double ctxpar_bins_sum(ctxpar_bins_view b, int64_t i, int64_t *e_out) {
    *e_out = 0;
    if (b.top[i] == CTXPAR_BINS_EMPTY)
        return 0.0;
    // Carries up, so that lo and mid are in [0, 2^32): the sum is hi 2^64 + u, u >= 0.
    const int64_t base = (int64_t)1 << 32;
    int64_t lo = b.lo[i], mid = b.mid[i], hi = b.hi[i];
    int64_t c = (lo - (lo & (base - 1))) / base;
    lo -= c * base;
    mid += c;
    c = (mid - (mid & (base - 1))) / base;
    mid -= c * base;
    hi += c;
    const uint64_t u = (uint64_t)mid * (uint64_t)base + (uint64_t)lo;
    *e_out = 32 * (b.top[i] - 2);
    // hi 2^64 + u as sign and magnitude.
    uint64_t mh, ml;
    const int neg = hi < 0;
    if (!neg) {
        mh = (uint64_t)hi;
        ml = u;
    } else { // -(hi 2^64 + u) = (-hi - 1) 2^64 + (2^64 - u), borrowing when u > 0
        mh = (uint64_t)(-(hi + 1));
        ml = (uint64_t)0 - u;
        if (u == 0)
            mh += 1;
    }
    const double m = ctxpar_bins_u128_to_double(mh, ml);
    return neg ? -m : m;
}

/* m 2^e, with e clamped to where the result is 0 or infinite anyway. */
CTXPAR_BINS_FN double ctxpar_bins_scale(double m, int64_t e) {
    return ldexp(m, e > 4096 ? 4096 : e < -4096 ? -4096 : (int)e);
}

/* Value i of a view as a double: its exact sum (rounded to odd), or its special sum. */
CTXPAR_BINS_FN double ctxpar_bins_value(ctxpar_bins_view b, int64_t i) {
    if (b.special[i] != 0.0f)
        return b.special[i];
    int64_t e;
    const double m = ctxpar_bins_sum(b, i, &e);
    return m == 0.0 ? 0.0 : ctxpar_bins_scale(m, e);
}

/* The terms of one attention row's forward partial (out_b[d stride], d < n, and its LSE L, the
 * low part added): with t = L log2(e), k = floor(t) and s = 2^(t - k) split into F32
 * s_hi + s_lo (48 bits of it), numerator d gets out_b[d] s_hi (exact, as two F32: tmp[d] and
 * tmp[n + d]) and (F32)(out_b[d] s_lo) (tmp[2n + d]; a non-finite out_b[d] all in tmp[d], the
 * others 0), each times 2^k (k into *k_out), and the
 * denominator s_hi 2^k and s_lo 2^k (den[0..1]): the weights of both sides to 48 bits. Returns
 * 1 with terms; 0 for a row that saw no key (L = -inf: no term); -1 for an infinite or NaN L
 * (every value of the row gets the special NaN, the denominator L). */
CTXPAR_BINS_FN int ctxpar_bins_attn_terms(double L, const float *out_b, int64_t stride, int64_t n,
                                          float *tmp, int64_t *k_out, float den[2]) {
    if (L == -INFINITY)
        return 0;
    if (L != L || L == INFINITY)
        return -1;
    const double t = L * 1.4426950408889634074, ft = floor(t); // log2(e)
    const double s = exp2(t - ft);
    *k_out = ft > (double)CTXPAR_BINS_KMAX    ? CTXPAR_BINS_KMAX
             : ft < -(double)CTXPAR_BINS_KMAX ? -CTXPAR_BINS_KMAX
                                              : (int64_t)ft;
    den[0] = (float)s;
    den[1] = (float)(s - (double)den[0]);
    for (int64_t d = 0; d < n; d++) {
        const double o = (double)out_b[d * stride], p = o * (double)den[0]; // 48 bits: exact
        tmp[d] = (float)p;
        // A non-finite partial goes whole into the first term (inf - inf, inf x 0 are NaN).
        const int fin = isfinite(o);
        tmp[n + d] = fin ? (float)(p - (double)tmp[d]) : 0.0f;
        tmp[2 * n + d] = fin ? (float)(o * (double)den[1]) : 0.0f;
    }
    return 1;
}

/* Every value of an attention row (i0 .. i0 + width - 1) gets the special its LSE L calls for
 * (ctxpar_bins_attn_terms returned -1). */
CTXPAR_BINS_FN void ctxpar_bins_attn_special(ctxpar_bins_view b, int64_t i0, int64_t width,
                                             double L) {
    for (int64_t v = 0; v < width; v++)
        ctxpar_bins_put_special(b.special + i0 + v, v == width - 1 ? (float)L : NAN);
}

/* Adds one attention row's forward partial to values i0 .. i0 + width - 1 (the last one the
 * denominator), as ctxpar_bins_attn_terms says. `tmp` holds 3 (width - 1) floats. */
CTXPAR_BINS_FN void ctxpar_bins_add_attn_row(ctxpar_bins_view b, int64_t i0, int64_t width,
                                             const float *out_b, int64_t stride, double L,
                                             float *tmp) {
    const int64_t n = width - 1;
    int64_t k = 0;
    float den[2];
    const int r = ctxpar_bins_attn_terms(L, out_b, stride, n, tmp, &k, den);
    if (r < 0)
        ctxpar_bins_attn_special(b, i0, width, L);
    if (r <= 0)
        return;
    for (int part = 0; part < 3; part++)
        ctxpar_bins_add_row(b, i0, tmp + part * n, n, k);
    ctxpar_bins_add_row(b, i0 + n, den, 1, k); // both into the denominator
    ctxpar_bins_add_row(b, i0 + n, den + 1, 1, k);
}

/* The attention row's results (values i0 .. i0 + width - 1): out[d stride] and the LSE as a
 * double. No visible key: out 0, LSE -inf. */
CTXPAR_BINS_FN double ctxpar_bins_finish_attn_row(ctxpar_bins_view b, int64_t i0, int64_t width,
                                                  float *out, int64_t stride) {
    const int64_t dv = width - 1, iden = i0 + dv;
    if (b.special[iden] != 0.0f) { // an infinite or NaN denominator: no finite output
        for (int64_t d = 0; d < dv; d++)
            out[d * stride] = NAN;
        return b.special[iden];
    }
    if (b.top[iden] == CTXPAR_BINS_EMPTY) {
        for (int64_t d = 0; d < dv; d++)
            out[d * stride] = 0.0f;
        return -INFINITY;
    }
    int64_t e_den;
    const double den = ctxpar_bins_sum(b, iden, &e_den);
    for (int64_t d = 0; d < dv; d++) {
        const int64_t i = i0 + d;
        if (b.special[i] != 0.0f) {
            out[d * stride] = b.special[i];
            continue;
        }
        int64_t e;
        const double num = ctxpar_bins_sum(b, i, &e);
        out[d * stride] = num == 0.0 ? 0.0f : (float)ctxpar_bins_scale(num / den, e - e_den);
    }
    return log(den) + (double)e_den * 0.69314718055994530942; // ln(2)
}

#endif /* CTXPAR_BINS_H */
