/*
 * cpu_attn_bwd.h - what the CPU backward's work items share (cpu_attn_bwd.c drives them).
 *
 *   q [B, Sq, Hq, D], dout [B, Sq, Hq, Dv], k [B, Sk, Hkv, D], v [B, Sk, Hkv, Dv]   one dtype
 *                                                   (F32, F16, BF16), any row strides
 *   lse, delta [B, Hq, Sq]                          F32, dense: final forward LSE, rowsum(dO*O)
 *   dq_acc [B, Sq, Hq, D], dk_acc [B, Sk, Hkv, D], dv_acc [B, Sk, Hkv, Dv]   F32, dense,
 *                                                   accumulated (each may be NULL)
 * With soft-capping (blk->softcap > 0) the scores are capped before the softmax, and dS takes
 * the cap's derivative 1 - tanh^2 before it meets K or Q (ctxpar_cpu_softcap).
 * With P = exp(scale*QK^T + mask - lse), dP = dO V^T, dS = P * (dP - delta):
 *   dq += scale dS K,   dk += scale dS^T Q,   dv += P^T dO
 *
 * P = 2^(s * c - lse * log2(e)), c = |scale| * log2(e), from the raw scores s = q.k (q or k
 * negated for a negative scale: ctxpar_cpu_score_sign): every score
 * has the bits the forward's had (same products, same order), so P is consistent with the lse
 * the forward made from them (a dominant key's P is then near 1, not off by a dot product's
 * rounding: what keeps dV accurate for a sharp softmax). In a PARTIAL tile every product
 * selects the masked pairs away (dS is 0 there by selection, not P * (dP - delta), and the sums
 * skip them): a NaN or inf in a row a pair does not see never leaks in.
 */
#ifndef CTXPAR_CPU_ATTN_BWD_H
#define CTXPAR_CPU_ATTN_BWD_H

#include "backends/cpu/cpu_internal.h"

typedef struct ctxpar_bwd_args {
    const ctxpar_cpu_plan *p;
    const ctxpar_cpu_kernels *kern;
    const ctxpar_tensor *dout;
    const float *lse, *delta;
    const float *lse_lo; /* the LSE's low part (ctxpar_attn_block.lse_lo), or NULL */
    float *dq, *dk, *dv;
    /* The fused items' dQ partial sums (F64, like every running sum: see fold in cpu_kernels.h),
     * one set per key chunk: chunk c, (b, h), query tile qt is the transposed tile
     * dq_part + ((((c * B + b) * Hq + h) * q_tiles + qt) * D) * 64, [D, 64]. */
    double *dq_part;
    int64_t chunks, chunk_tiles; /* key chunks, and key tiles per chunk (the last may be short) */
    int group; /* key tiles per dk/dv item of the fused schedule (ctxpar_bwd_fused_group) */
} ctxpar_bwd_args;

/* Most key tiles a fused dk/dv item covers: its workspace is laid out for this many. */
#define CTXPAR_BWD_GROUP_MAX 8

/* Key tiles per fused dk/dv item: as many as keep the item's per-tile state (K^T, V^T, K, the
 * two F64 sums: 64 x (12 D + 16 D) bytes a tile at head_dim D) within 1 MiB, between
 * CTXPAR_CPU_GROUP and CTXPAR_BWD_GROUP_MAX: 8 at head_dim 64, 4 at 128. Each Q and dO tile is
 * then loaded once per group. Which key tiles share an item changes no bit. */
int ctxpar_bwd_fused_group(int64_t dim);

/* Per-thread workspace. An item covers up to `groups` (at most CTXPAR_BWD_GROUP_MAX) tiles of
 * its own side, each with two transposed [D, 64] tiles, their F64 gradient sums, three [64]
 * vectors and (fused items) its K rows; every tile of the other side is loaded once for the whole
 * group. */
typedef struct ctxpar_bwd_ws {
    float *t[CTXPAR_BWD_GROUP_MAX][2];    /* [D, 64] Q^T and dO^T (dq items), K^T and V^T (dk/dv) */
    double *acc[CTXPAR_BWD_GROUP_MAX][2]; /* [D, 64] the running gradient sums in F64: each tile
                                         pair's part is summed in F32 and added in (accum_f64) */
    float *vec[CTXPAR_BWD_GROUP_MAX][3];  /* [64] lse in base 2 (high part), delta, its low part */
    float *krow[CTXPAR_BWD_GROUP_MAX];    /* [64, D] the key tile's rows, unscaled (fused) */
    float *s, *dp, *dst;             /* [64, 64]; dst: dS transposed (fused) */
    float *dcap;                     /* [64, 64] the soft-cap's derivative (softcap > 0) */
    uint32_t *vis, *vist;            /* [64, 64] visibility of a PARTIAL tile, and transposed */
    float *buf0, *buf1;              /* [64, D] */
    float *row;                      /* [D] */
} ctxpar_bwd_ws;

/* Lays the workspace out from base for `groups` tiles; with base NULL it only measures
 * (*floats_out). dim: the larger of the q/k and v head_dims. */
ctxpar_bwd_ws ctxpar_bwd_ws_at(float *base, int64_t dim, int groups, size_t *floats_out);

/* Rows in tile t of a side of `seq` rows; the lanes a kernel runs for `rows` rows. */
int64_t ctxpar_bwd_tile_rows(int64_t seq, int64_t t, int64_t tile);
int64_t ctxpar_bwd_lanes(const ctxpar_cpu_kernels *kern, int64_t rows);

/* dst[d*lanes + r] = rows r of t (b, s0 + r, h) times mul, r < n; 0 for n <= r < lanes. */
void ctxpar_bwd_pack_t(const ctxpar_cpu_kernels *kern, const ctxpar_tensor *t, int64_t b,
                       int64_t s0, int64_t n, int64_t h, int64_t lanes, float mul, float *row,
                       float *dst);

/* Whether query row i of (b, h) is fully masked (lse = -inf, also when its visible scores were
 * all -inf): its dq gets nothing added, since its dS is 0 but 0 x an infinite key is NaN
 * (docs/numerics.md: such a row has zero gradients). */
int ctxpar_bwd_row_masked(const ctxpar_bwd_args *a, int64_t b, int64_t h, int64_t i);

/* Whether every key of this block that query row i of (b, h) sees scores -inf. With sinks such a
 * row's lse is the sink, not -inf, so ctxpar_bwd_row_masked cannot tell; the writers of dq ask
 * this for a row whose sum came out NaN (0 x an infinite key) and then add nothing, as for a
 * masked row. A rescan of the row's scores in F64, so only for such rows. */
int ctxpar_bwd_row_sees_only_neg_inf(const ctxpar_bwd_args *a, int64_t b, int64_t h, int64_t i);

/* Row li's LSE (lse + lse_lo, when the caller has the low part) in base 2 for
 * exp2(c s - lse2), as hi + lo, so that lse * log2(e) is not rounded a second time (at |lse| = 40
 * that rounding alone would change P by 1.5e-6); an empty row (lse = -inf) gets hi = +inf,
 * lo = 0, so that P = 0. */
float ctxpar_bwd_lse2(const ctxpar_bwd_args *a, int64_t li, float *lo);

/* The work items (cpu_attn_bwd_items.c), each sum with one owner and a fixed order:
 *  - dq for query tiles qt0 .. qt0+ng-1 of (b, h): query rows are the lanes; key tiles in
 *    increasing order. Recomputes P and dP (the two-pass backward's second pass).
 *  - dk, dv for key tiles kt0 .. kt0+ng-1 of (b, hk): key rows are the lanes; the query heads of
 *    the GQA group, then the query tiles, in increasing order. With dq_chunk (a chunk's part of
 *    dq_part, see ctxpar_bwd_args) it also adds dS K to the dQ partial sums, from the same dS.
 *  - fused: the dk, dv items of every key tile group of chunk c of (b, hk) with dQ partial sums
 *    (zeroed first): P and dP are computed once for all three gradients. */
void ctxpar_bwd_dq_item(const ctxpar_bwd_args *a, const ctxpar_bwd_ws *w, int64_t b, int64_t h,
                        int64_t qt0, int ng);
void ctxpar_bwd_dkv_item(const ctxpar_bwd_args *a, const ctxpar_bwd_ws *w, int64_t b,
                         int64_t hk, int64_t kt0, int ng, double *dq_chunk);
void ctxpar_bwd_fused_item(const ctxpar_bwd_args *a, const ctxpar_bwd_ws *w, int64_t b,
                           int64_t hk, int64_t c);

#endif /* CTXPAR_CPU_ATTN_BWD_H */
