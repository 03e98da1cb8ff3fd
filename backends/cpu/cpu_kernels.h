/*
 * cpu_kernels.h - the inner loops of the CPU attention kernels, one table per instruction set.
 *
 * Every kernel works on F32 tiles in which the *lanes* (the contiguous, vectorised index l) are
 * independent: lane l's result is a function of lane l's inputs only, computed with the same
 * operations in the same order whatever the lane's position, the tile's width or the other
 * lanes. This is what lets the attention drivers promise that a query row's bits depend only on
 * that row (see cpu_attn_fwd.c). Sums over the reduced index (d or m below) run in increasing
 * order, one fused multiply-add at a time (a multiply and an add in the generic table).
 *
 * L (the number of lanes) is always a multiple of `lane_block`; rows are given as pointer arrays
 * so that tensors with any row stride are read in place.
 *
 * `vis` (NULL in tiles the mask does not touch) holds 0xffffffff for a visible (row, lane) pair
 * and 0 for a masked one, laid out like the tile it goes with. A masked pair is *selected away*,
 * never multiplied by 0: 0 * NaN and 0 * inf are NaN, and a non-finite value in a row that a lane
 * does not see must not reach that lane. A visible pair gives the same bits as with vis NULL.
 */
#ifndef CTXPAR_CPU_KERNELS_H
#define CTXPAR_CPU_KERNELS_H

#include <stdint.h>

#include "ctxpar.h"
#include "ctxpar_bins.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ctxpar_cpu_kernels {
    const char *name; /* "generic", "avx2", "avx512" */
    int lane_block;   /* L is a multiple of this */

    /* C[n*ldc + l] = sum_{d<D} at[d*lda + l] * b[n][d]        for n < N, l < L */
    void (*scores)(float *c, int64_t ldc, const float *at, int64_t lda, const float *const *b,
                   int64_t n, int64_t lanes, int64_t d);

    /* ct[d*ldc + l] = (alpha ? alpha[l] : 1) * ct[d*ldc + l] + sum_{m<M} a[m*lda + l] * b[m][d]
     * for d < D, l < L (alpha == NULL: no rescaling, the sum is added to ct as it is). The sum
     * leaves out (does not add, not even a zero) every m with vis[m*lda + l] == 0. It runs in
     * chunks of m (32 with alpha, 16 without), each a chain from zero added to ct in order,
     * the first from alpha * ct (docs/numerics.md). */
    void (*accum)(float *ct, int64_t ldc, const float *alpha, const float *a, const uint32_t *vis,
                  int64_t lda, const float *const *b, int64_t m, int64_t lanes, int64_t d);

    /* accum from zero, alpha NULL, then folded (below) into F64 sums, in one pass and with the
     * same bits as accum into a zeroed ct followed by fold:
     *   acc[d*ldacc + l] += (double)(+0 + the chunked sum over m of accum)   d < D, l < L. */
    void (*accum_f64)(double *acc, int64_t ldacc, const float *a, const uint32_t *vis, int64_t lda,
                      const float *const *b, int64_t m, int64_t lanes, int64_t d);

    /* accum (alpha not NULL: the forward's) and then fold (below) of ct into acc with
     * fold_alpha, in one pass and with the same bits as the two calls: ct is left zero. */
    void (*accum_fold)(float *ct, double *acc, int64_t ldc, const float *alpha,
                       const float *fold_alpha, const float *a, const uint32_t *vis, int64_t lda,
                       const float *const *b, int64_t m, int64_t lanes, int64_t d);

    /* One online-softmax step in base 2 over a tile s [N, L] (lds) of raw scores q.k, with
     * c = scale * log2(e) (F64): per lane, m' = max(m, (float)(c * max_n s)), alpha = 2^(m - m'),
     * s = 2^(c s - m') in place (the exponent split exactly into n + f, only f rounded: exp2_split
     * in cpu_kernels_impl.h), l = alpha * l
     * + sum_n s (in increasing n). m starts at -FLT_MAX (not -inf), so a lane whose scores are
     * all -inf keeps m, gets alpha = 1 and adds exact zeros. */
    void (*softmax_step)(float *s, int64_t lds, int64_t n, int64_t lanes, double c, float *m,
                         float *l, float *alpha);

    /* The accurate half of every long sum (docs/numerics.md): a part summed in F32 from zero
     * over one or two key tiles (at most 128 terms) is added into an F64 running sum, and
     * cleared:
     *   acc[r*lda + l] = (alpha ? alpha[l] : 1) * acc[r*lda + l] + part[r*ldp + l]
     *   part[r*ldp + l] = 0                                        for r < R, l < L <= 64.
     * One F64 add per 64 or 128 F32 multiply-adds: the rounding error of a row stops growing
     * with the number of tiles. */
    void (*fold)(double *acc, int64_t lda, float *part, int64_t ldp, const float *alpha,
                 int64_t r, int64_t lanes);

    /* s[n*lds + l] = 2^(c s[n*lds + l] - hi - lo) (the exponent split as in softmax_step),
     * hi, lo = hi_lane[l], lo_lane[l] if hi_lane else hi_row[n], lo_row[n]: the subtrahend
     * hi + lo carries more bits than one float. */
    void (*exp2_sub)(float *s, int64_t lds, int64_t n, int64_t lanes, double c,
                     const float *hi_lane, const float *lo_lane, const float *hi_row,
                     const float *lo_row);

    /* dp[n*lds + l] = p[n*lds + l] * (dp[n*lds + l] - delta), delta = delta_lane[l] if
     * delta_lane else delta_row[n]; exactly 0 where vis[n*lds + l] == 0. */
    void (*dsoftmax)(float *dp, const float *p, const uint32_t *vis, int64_t lds, int64_t n,
                     int64_t lanes, const float *delta_lane, const float *delta_row);

    /* dst[i] = src[i] as F32 (exact for every storage dtype), i < n. */
    void (*to_f32)(float *dst, const void *src, ctxpar_dtype dtype, int64_t n);

    /* The peak probe (cpu_peak.c): `iters` rounds of FMA_CHAINS independent multiply-add chains
     * on this table's vectors, the instructions the kernels above are made of; each round does
     * 2 * vector_lanes * FMA_CHAINS FLOPs. Returns a value that depends on every chain, so that
     * the loop cannot be left out. */
    int vector_lanes;
    float (*fma_chains)(int64_t iters);

    /* The register tile, "MRxNR": MR vectors of lanes x NR rows of the other operand (lane_block
     * = MR x vector_lanes). Tables of one instruction set differ only in it, never in bits. */
    const char *tiles;

    /* Reproducible mode: ctxpar_bins_add_row (ctxpar_bins.h), bit for bit, compiled for this
     * instruction set so that its branch-free loop is vectorised. */
    void (*bins_add_row)(ctxpar_bins_view b, int64_t i0, const float *x, int64_t n, int64_t k);

    /* Soft-capping: s[i] = C tanh(mul s[i]) with tanh in F64 (relative error < 1e-15, see
     * cpu_kernels_impl.h) rounded once to F32, and with dcap dcap[i] = 1 - tanh^2, for i < n;
     * where vis[i] == 0 (vis may be NULL) s[i] is left alone and dcap[i] = 0. */
    void (*softcap)(float *s, float *dcap, const uint32_t *vis, int64_t n, double cap,
                    double mul);

    /* 32-bit words (F32 or visibility words, copied bit for bit):
     *   dst[m*ldd + l] = l < rows ? src[l*lds + m] : pad      for m < cols, l < lanes,
     * lanes a multiple of vector_lanes. Reads nothing of src outside rows x cols. */
    void (*transpose)(void *dst, int64_t ldd, const void *src, int64_t lds, int64_t rows,
                      int64_t cols, int64_t lanes, uint32_t pad);
} ctxpar_cpu_kernels;

/* Independent chains in the peak probe: enough to cover the FMA latency times the FMA units of
 * any current core (4 cycles x 2 units on Zen 4 and recent Intel), and few enough to stay in
 * registers (16 vector registers with AVX2). */
#define CTXPAR_CPU_FMA_CHAINS 12

extern const ctxpar_cpu_kernels ctxpar_cpu_kernels_generic;
#if defined(__x86_64__) && defined(__GNUC__)
#define CTXPAR_CPU_HAVE_X86_KERNELS 1
extern const ctxpar_cpu_kernels ctxpar_cpu_kernels_avx2;
extern const ctxpar_cpu_kernels ctxpar_cpu_kernels_avx512;
extern const ctxpar_cpu_kernels ctxpar_cpu_kernels_avx512_4x4; /* cpu_uarch.c says where */
#endif

#ifdef __cplusplus
}
#endif

#endif /* CTXPAR_CPU_KERNELS_H */
