/*
 * cpu_internal.h - what the files of the CPU device share: the device state, the ops each file
 * implements, and the per-call plan of a (Q block, K/V block) pair.
 */
#ifndef CTXPAR_CPU_INTERNAL_H
#define CTXPAR_CPU_INTERNAL_H

#include <math.h>
#include <stdint.h>

#include "backends/cpu/cpu_kernels.h"
#include "ctxpar_backend.h"
#include "ctxpar_cpu.h" /* ctxpar_cpu_bwd_schedule: how the backward is scheduled */

#ifdef __cplusplus
extern "C" {
#endif

/* Tile sizes of the attention kernels. The forward visits key tiles [j*CPU_TILE_K, ...) of the
 * K/V block in increasing j; a query row's bits depend on this tiling, so it is fixed. */
#define CTXPAR_CPU_TILE_Q 64
#define CTXPAR_CPU_TILE_K 64
/* Tiles per work item on the side that is not looped over (query tiles in the forward): each
 * tile of the other side is loaded once for the whole group. */
#define CTXPAR_CPU_GROUP 4


/* The device's impl. */
typedef struct ctxpar_cpu_device {
    int num_threads; /* 0 = OpenMP default */
    const ctxpar_cpu_kernels *kern; /* instruction set and register tile */
    ctxpar_cpu_bwd_schedule bwd;
    ctxpar_cpu_uarch uarch; /* the core class the tile was chosen for (never AUTO) */
    void *kernel_ws;        /* the block kernels' per-thread workspaces (ctxpar_cpu_kernel_ws) */
    size_t kernel_ws_bytes;
} ctxpar_cpu_device;

/* Threads of a parallel region of this device (the size workspaces are made for). */
int ctxpar_cpu_threads(const ctxpar_cpu_device *cpu);

/* Everything an attention kernel needs to know about one block pair, checked and expanded:
 * global positions of every row, the keys every query row sees, and the position range of every
 * tile. */
typedef struct ctxpar_cpu_plan {
    const ctxpar_attn_block *blk;
    int64_t batch, seq_q, seq_k, heads_q, heads_kv, dim, group; /* group = heads_q / heads_kv */
    int64_t dim_v;                                              /* of v and out (MLA) */
    int64_t *q_pos, *k_pos;                                     /* [seq_q], [seq_k] */
    int64_t *q_lo, *q_hi;       /* query row i sees keys [q_lo[i], q_hi[i]] (ctxpar_mask_keys_of) */
    int64_t *q_range, *k_range; /* (min, max) position of each tile: [2 * tiles] */
    int64_t q_tiles, k_tiles;   /* tiles of CTXPAR_CPU_TILE_Q / CTXPAR_CPU_TILE_K rows */
    ctxpar_block_class whole;   /* class of the whole block pair */
} ctxpar_cpu_plan;

/* Fills plan for blk (checked by the dispatch: dtypes, shapes, strides, spans). `op` names the
 * calling op in error messages. Release with ctxpar_cpu_plan_release. */
ctxpar_status ctxpar_cpu_plan_init(const ctxpar_attn_block *blk, const char *op,
                                   ctxpar_cpu_plan *plan);
void ctxpar_cpu_plan_release(ctxpar_cpu_plan *plan);

/* Class of query tile qt against key tile kt. */
ctxpar_block_class ctxpar_cpu_plan_classify(const ctxpar_cpu_plan *plan, int64_t qt, int64_t kt);

/* Whether query row qi sees key row ki. */
static inline int ctxpar_cpu_plan_sees(const ctxpar_cpu_plan *plan, int64_t qi, int64_t ki) {
    const int64_t k = plan->k_pos[ki];
    return plan->q_lo[qi] <= k && k <= plan->q_hi[qi];
}

/* For a PARTIAL tile: sets s[n*lds + l] = -inf for every pair the mask hides, n < rows, l < lanes,
 * and writes vis[n*lds + l] (n < rows, l < lds) = 0 for those pairs, 0xffffffff for the others
 * and for the padding lanes l >= lanes: the kernels select the hidden pairs away (cpu_kernels.h).
 * With keys_in_rows the rows are keys k0 + n and the lanes queries q0 + l, otherwise the other
 * way round. */
void ctxpar_cpu_plan_mask(const ctxpar_cpu_plan *plan, float *s, uint32_t *vis, int64_t lds,
                          int64_t q0, int64_t k0, int64_t rows, int64_t lanes, int keys_in_rows);

#define CTXPAR_CPU_LOG2E 1.44269504088896340736

/* The softmax runs in base 2 on raw scores s = q.k: p = 2^(s * c - m). Its running maximum and
 * the -inf of masked scores need c > 0, so a negative scale goes into the sign of the packed
 * score operand (exact: negation does not round) and c is |scale| log2(e), in F64: the kernels
 * form s * c - m in F64 and round it once, so c's own F32 rounding (up to 2^-25 relative, the
 * same on every score: plain float32's exp(scale * s) does not have it) never enters. */
static inline float ctxpar_cpu_score_sign(float scale) {
    return scale < 0.0f ? -1.0f : 1.0f;
}
static inline double ctxpar_cpu_exp2_scale(float scale) {
    return (double)(scale < 0.0f ? -scale : scale) * CTXPAR_CPU_LOG2E;
}

/* The c of the base-2 softmax for a block: with soft-capping the scale is already inside the
 * capped score (ctxpar_cpu_softcap), so c is log2(e) alone. */
static inline double ctxpar_cpu_softmax_c(const ctxpar_attn_block *blk) {
    return ctxpar_cpu_exp2_scale(blk->softcap > 0.0f ? 1.0f : blk->scale);
}

/* Soft-capping (blk->softcap = C > 0) of a tile of raw scores s [rows, lds] whose packed operand
 * carries the scale's sign: s = C tanh(|scale| s / C), in F64 (the kernel table's tanh, relative
 * error below 1e-15) and rounded once. Pairs the mask
 * hid (vis 0; s is -inf there) are left alone. With dcap it also writes the derivative the
 * backward's dS takes, 1 - tanh^2 (0 for hidden pairs). Called only when C > 0, after the mask:
 * the plain path does not change. */
void ctxpar_cpu_softcap(const ctxpar_cpu_kernels *kern, const ctxpar_attn_block *blk, float *s,
                        float *dcap, const uint32_t *vis, int64_t lds, int64_t rows);

/* Loads n rows t[b, s0 + i, h, :] as F32 into the dense tile `dst` ([n, D]) and points rows[i]
 * at them: a dense tile in L1/L2 instead of rows scattered by the tensor's strides. */
void ctxpar_cpu_load_rows(const ctxpar_cpu_kernels *kern, const ctxpar_tensor *t, int64_t b,
                          int64_t s0, int64_t n, int64_t h, float *dst, const float **rows);

/* Address of element (b, s, h, 0) of a host tensor. */
const void *ctxpar_cpu_row(const ctxpar_tensor *t, int64_t b, int64_t s, int64_t h);

/* Merges one row (b, lse_b) into (out, *lse), D values; see attn_merge. b[d] is out_b[d] (F32),
 * or with out_b NULL num[d * stride] / den (F64: the forward's unrounded block result, so that a
 * ring step's partial is rounded once, after the merge, not also before it). With lo (NULL:
 * none) the running LSE is *lse + *lo, and both are written (ctxpar_attn_block.lse_lo). */
void ctxpar_cpu_merge_row(float *out, float *lse, float *lo, const float *out_b, const double *num,
                          int64_t stride, double den, double lse_b, int64_t dim);

/* lse = (float)x and, with lo, *lo = x - lse (0 for an infinite x): the LSE as hi + lo. */
static inline void ctxpar_cpu_store_lse(float *lse, float *lo, double x) {
    *lse = (float)x;
    if (lo)
        *lo = isinf(*lse) ? 0.0f : (float)(x - (double)*lse);
}

/* 64-byte aligned allocation of `bytes` (rounded up); free with free(). NULL on failure. */
void *ctxpar_cpu_aligned_alloc(size_t bytes);

/* The block kernels' per-thread workspaces: one 64-byte aligned block the device keeps and grows
 * to the largest call (a block mapped afresh for each call cost a page fault per page, every
 * call, where a ring or reproducible mode makes many small calls). NULL when it cannot grow.
 * One call at a time uses it (a device serves one rank). */
void *ctxpar_cpu_kernel_ws(ctxpar_cpu_device *cpu, size_t bytes);

/* dev's CPU state, or NULL when dev is NULL or not a CPU device. */
const ctxpar_cpu_device *ctxpar_cpu_device_of(const ctxpar_device *dev);

/* Name of the kernel table a CPU device uses ("avx512", ...): for tests and benchmarks. */
const char *ctxpar_cpu_kernels_name(const ctxpar_device *dev);

/* The ops, one file each. */
ctxpar_status ctxpar_cpu_attn_block_fwd(ctxpar_device *dev, const ctxpar_attn_block *blk,
                                        float *out_acc, float *lse_acc, int merge,
                                        ctxpar_stream *stream);
ctxpar_status ctxpar_cpu_attn_merge(ctxpar_device *dev, float *out_acc, float *lse_acc,
                                    const float *out_b, const float *lse_b, int64_t batch,
                                    int64_t seq, int64_t heads, int64_t head_dim,
                                    ctxpar_stream *stream);
ctxpar_status ctxpar_cpu_attn_bwd_prep(ctxpar_device *dev, const ctxpar_tensor *out,
                                       const ctxpar_tensor *dout, float *delta,
                                       ctxpar_stream *stream);
ctxpar_status ctxpar_cpu_attn_block_bwd(ctxpar_device *dev, const ctxpar_attn_block *blk,
                                        const ctxpar_tensor *dout, const float *lse,
                                        const float *delta, float *dq_acc, float *dk_acc,
                                        float *dv_acc, ctxpar_stream *stream);
ctxpar_status ctxpar_cpu_cast(ctxpar_device *dev, const ctxpar_tensor *src, ctxpar_tensor *dst,
                              ctxpar_stream *stream);
ctxpar_status ctxpar_cpu_add(ctxpar_device *dev, float *dst, const float *src, size_t n,
                             ctxpar_stream *stream);
ctxpar_status ctxpar_cpu_fill(ctxpar_device *dev, float *dst, float value, size_t n,
                              ctxpar_stream *stream);
/* The binned accumulators of reproducible mode (cpu_bins.c; ctxpar_backend.h's bins_* ops). */
ctxpar_status ctxpar_cpu_bins_clear(ctxpar_device *dev, void *bins, int64_t rows, int64_t width,
                                    ctxpar_stream *stream);
ctxpar_status ctxpar_cpu_bins_add(ctxpar_device *dev, void *bins, const float *src,
                                  const ctxpar_bins_shape *shape, ctxpar_stream *stream);
ctxpar_status ctxpar_cpu_bins_add_attn(ctxpar_device *dev, void *bins, const float *out_b,
                                       const float *lse_b, const float *lse_lo_b,
                                       const ctxpar_bins_shape *shape, ctxpar_stream *stream);
ctxpar_status ctxpar_cpu_bins_merge(ctxpar_device *dev, void *dst, const void *src, int64_t rows,
                                    int64_t width, ctxpar_stream *stream);
ctxpar_status ctxpar_cpu_bins_finish(ctxpar_device *dev, const void *bins, int64_t rows,
                                     int64_t width, float *dst, ctxpar_stream *stream);
ctxpar_status ctxpar_cpu_bins_finish_attn(ctxpar_device *dev, const void *bins,
                                          const ctxpar_bins_shape *shape, float *out, float *lse,
                                          float *lse_lo, ctxpar_stream *stream);

#ifdef __cplusplus
}
#endif

#endif /* CTXPAR_CPU_INTERNAL_H */
