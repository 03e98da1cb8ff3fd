/*
 * repro.h - reproducible mode (params.reproducible, docs/numerics.md): the blocks of the
 * algorithms computed chunk pair by chunk pair and summed in binned accumulators
 * (ctxpar_bins.h), so that every result has the same bits for any number of ranks, layout,
 * algorithm and schedule.
 *
 * The sequence is cut into canonical chunks of CTXPAR_REPRO_CHUNK positions (the last one
 * shorter), the same for every P. The device computes each (query rows, key chunk) pair as one
 * block (forward: its out and LSE; backward: each (query chunk, key chunk) pair's dQ, dK, dV) and
 * a binned accumulator adds the pieces: no partial sum ever depends on which rank held what.
 * Accumulators here are bins blocks of B x seq x H rows: out (width Dv + 1, the last value the
 * denominator), dQ (D), and dK/dV (one block: dK of width D, then dV of width Dv).
 */
#ifndef CTXPAR_REPRO_H
#define CTXPAR_REPRO_H

#include "algorithms.h"

#ifdef __cplusplus
extern "C" {
#endif

#define CTXPAR_REPRO_CHUNK 256

/* Whether the positions are whole canonical chunks: every chunk they touch lies in runs of
 * consecutive positions (adjacent spans continue each other), from its start to its end or the
 * sequence's. */
int ctxpar_repro_aligned(ctxpar_spans s, int64_t seq_global);

/* OK when every rank's shard is whole chunks (the ring's and the all-gather's condition), else
 * NOT_SUPPORTED naming the first rank that is not and what would do. */
ctxpar_status ctxpar_repro_check_shards(const ctxpar_problem *pb, const char *algo);

/* The device temporaries of one block's pieces, for blocks of up to q_rows query rows. */
typedef struct ctxpar_repro_scratch {
    float *out, *lse, *lse_lo;                    /* forward: one key chunk's partial */
    float *dq, *dk, *dv, *lse_c, *lo_c, *delta_c; /* backward: one chunk pair's */
} ctxpar_repro_scratch;
void ctxpar_repro_scratch_carve(const ctxpar_problem *pb, int64_t q_rows, int backward,
                                ctxpar_carve *c, ctxpar_repro_scratch *s);

/* Bins bytes of the out accumulator of q_rows rows, of dQ, and of dK/dV for k_rows rows. */
size_t ctxpar_repro_out_bytes(const ctxpar_problem *pb, int64_t q_rows, int64_t heads);
size_t ctxpar_repro_dq_bytes(const ctxpar_problem *pb, int64_t q_rows, int64_t heads);
size_t ctxpar_repro_dkv_bytes(const ctxpar_problem *pb, int64_t k_rows, int64_t heads_kv);

/* Empties an accumulator (which: 0 out, 1 dQ, 2 dK/dV) of `rows` sequence rows and `heads`. */
ctxpar_status ctxpar_repro_clear(const ctxpar_run *run, const ctxpar_problem *pb, void *bins,
                                 int which, int64_t rows, int64_t heads);

/* Adds blk's forward (every key chunk of blk.k_pos against all its query rows) into `out`, a
 * bins block of blk.q's rows and heads. blk.k_pos must be chunk-aligned runs. */
ctxpar_status ctxpar_repro_fwd_block(const ctxpar_run *run, const ctxpar_attn_block *blk,
                                     void *out, const ctxpar_repro_scratch *s);

/* out_acc [B, rows, H, Dv], lse_acc and lse_lo [B, H, rows] from the out accumulator. */
ctxpar_status ctxpar_repro_fwd_finish(const ctxpar_run *run, const ctxpar_problem *pb,
                                      const void *out, int64_t rows, int64_t heads, float *out_acc,
                                      float *lse_acc, float *lse_lo);

/* Adds blk's backward into dq (bins of blk.q's rows) and dkv (bins of k_rows rows from blk.k's
 * first row; NULL: not wanted), one (query chunk, key chunk) pair at a time. lse, lse_lo (may be
 * NULL) and delta are [B, Hq, rows of blk.q] dense. Both position lists must be chunk-aligned. */
ctxpar_status ctxpar_repro_bwd_block(const ctxpar_run *run, const ctxpar_problem *pb,
                                     const ctxpar_attn_block *blk, const ctxpar_tensor *dout,
                                     const float *lse, const float *lse_lo, const float *delta,
                                     void *dq, void *dkv, int64_t k_rows,
                                     const ctxpar_repro_scratch *s);

/* The F32 sums: dq_f32 [B, rows, Hq, D] from dq; dkv_f32 packed like ctxpar_packed_kv (dK
 * [B, rows, Hkv, D] then dV [B, rows, Hkv, Dv]) from dkv. */
ctxpar_status ctxpar_repro_dq_finish(const ctxpar_run *run, const ctxpar_problem *pb,
                                     const void *dq, int64_t rows, int64_t heads, float *dq_f32);
ctxpar_status ctxpar_repro_dkv_finish(const ctxpar_run *run, const ctxpar_problem *pb,
                                      const void *dkv, int64_t rows, int64_t heads_kv,
                                      float *dkv_f32);

/* Copies sequence rows [from, from + len) of a dK/dV accumulator of src_seq rows to rows
 * [to, to + len) of one of dst_seq rows, every batch row. */
ctxpar_status ctxpar_repro_dkv_move(const ctxpar_run *run, const ctxpar_problem *pb,
                                    const void *src, int64_t src_seq, int64_t from, void *dst,
                                    int64_t dst_seq, int64_t to, int64_t len, int64_t heads_kv);
/* dst += src, two dK/dV accumulators of `rows` sequence rows. */
ctxpar_status ctxpar_repro_dkv_merge(const ctxpar_run *run, const ctxpar_problem *pb, void *dst,
                                     const void *src, int64_t rows, int64_t heads_kv);

#ifdef __cplusplus
}
#endif

#endif /* CTXPAR_REPRO_H */
