/*
 * a2a_parts.h - the pieces of the all-to-all algorithm (alltoall.c) that the hybrid (hybrid.c)
 * runs inside each all-to-all group: how heads are divided among the ranks of pb->nranks, the
 * per-rank blocks of the exchange, and the exchange itself on run->comm.
 */
#ifndef CTXPAR_A2A_PARTS_H
#define CTXPAR_A2A_PARTS_H

#include "algorithms.h"

#ifdef __cplusplus
extern "C" {
#endif

/* How heads are divided: hq query heads per rank, hk K/V heads per rank. */
typedef struct ctxpar_heads_plan {
    int64_t hq, hk, group; /* group: query heads per K/V head */
    int replicate;         /* Hkv < P: each rank gets one K/V head that others share */
} ctxpar_heads_plan;

ctxpar_heads_plan ctxpar_a2a_plan_heads(const ctxpar_problem *pb);

/* One part of a per-rank block: a dense [B, seq, heads, dim] tensor. */
typedef struct ctxpar_seg {
    ctxpar_dtype dtype;
    int64_t heads, dim;
} ctxpar_seg;

size_t ctxpar_a2a_seg_bytes(const ctxpar_problem *pb, const ctxpar_seg *s, int64_t seq);
size_t ctxpar_a2a_block_bytes(const ctxpar_problem *pb, const ctxpar_seg *segs, int n, int64_t seq);
/* Part idx of a block of `seq` rows. */
ctxpar_tensor ctxpar_a2a_seg_view(void *block, const ctxpar_problem *pb, const ctxpar_seg *segs,
                                  int idx, int64_t seq);
/* Heads [h0, h0 + n) of a tensor. */
ctxpar_tensor ctxpar_a2a_heads(const ctxpar_tensor *t, int64_t h0, int64_t n);
/* An F32 [B, H, seq] LSE buffer seen as a [B, seq, H, 1] tensor, so that rows move like tokens. */
ctxpar_tensor ctxpar_a2a_lse_view(const float *lse, const ctxpar_problem *pb, int64_t seq,
                                  int64_t h);
/* The all-to-all of `block` bytes per rank on run->comm (a copy on one rank), traced. */
ctxpar_status ctxpar_a2a_exchange(const ctxpar_run *run, const ctxpar_problem *pb, const void *send,
                                  void *recv, size_t block, const char *name);
/* Casts rank j's heads of the local tensors into j's block: kinds[i] 0 gives src[i]'s query
 * heads, 1 the K/V heads j needs. */
ctxpar_status ctxpar_a2a_pack_heads(const ctxpar_run *run, const ctxpar_problem *pb,
                                    const ctxpar_heads_plan *h, const ctxpar_tensor *const *src,
                                    const int *kinds, const ctxpar_seg *segs, int n, void *block,
                                    int j);
/* The forward's results from every rank's block of `recv` (parts of back: out, lse, lse_lo;
 * block i holds this rank's rows of rank i's heads) into out, lse (may be NULL) and
 * pb->lse_lo (when set). */
ctxpar_status ctxpar_a2a_store_out(const ctxpar_run *run, const ctxpar_problem *pb,
                                   const ctxpar_heads_plan *h, const ctxpar_seg *back,
                                   const void *recv, size_t back_b, ctxpar_tensor *out,
                                   float *lse);
/* The backward's: dQ, then dK/dV (parts 0, 1 and 2 of back) into dq, dk, dv; with replicated
 * K/V heads the dK/dV partials are summed in rank order in acc (2 x Hkv one-head partials of
 * head_dim and head_dim_v, F32). */
ctxpar_status ctxpar_a2a_store_grads(const ctxpar_run *run, const ctxpar_problem *pb,
                                     const ctxpar_heads_plan *h, const ctxpar_seg *back,
                                     const void *recv, size_t back_b, float *acc,
                                     ctxpar_tensor *dq, ctxpar_tensor *dk, ctxpar_tensor *dv);

#ifdef __cplusplus
}
#endif

#endif /* CTXPAR_A2A_PARTS_H */
