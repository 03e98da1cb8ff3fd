/*
 * ring_plan.h - which ring transfers a masked problem needs.
 *
 * Block j (the K/V shard of rank j) travels j -> j+1 -> ... around the ring, but only as far as
 * the last rank on that path whose queries see any of it (`last[j]`): with a causal contiguous
 * layout no block wraps around, and with a sliding window narrower than a shard each block goes
 * one hop. In backward, block j's dK/dV partial sum follows it to last[j] and then either goes
 * straight home to j, when j has a partial-sum buffer free from that step to the end, or
 * travels on around the ring (added to by nobody) to arrive home at the last step, as without a
 * mask (`sum_last[j]`). So the owner never needs a third dK/dV buffer. Every rank derives the
 * same plan from the shared params, so both sides of each transfer agree on whether it happens.
 */
#ifndef CTXPAR_RING_PLAN_H
#define CTXPAR_RING_PLAN_H

#include "algorithms.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A dry run's cache of ctxpar_shards_interact for one query rank against every block: the
 * planner runs the ranks' calls one after another (a hybrid group's members on the same ring
 * rank), so a ring step skips a block its queries cannot see without classifying it again, and
 * each (rank, block) pair is classified once, not once per step, call and group member (P ranks
 * x P steps made ctxpar plan quadratic in classifications). Real runs have none. */
typedef struct ctxpar_ring_seen {
    int rank; /* the query rank whose row this is, or -1 */
    int nranks;
    unsigned char *row; /* [nranks]: 0 or 1, or 2 until a block is classified (ring_plan.c) */
    /* [nranks]: each block's accounting against this row's queries once it was made
     * (ctxpar_ring_account): the members of a hybrid group run the same ring on the same rows,
     * and the backward accounts the forward's blocks again. */
    struct ctxpar_ring_block_work *work;
    /* Every rank's spans are sorted runs (ctxpar_spans_sorted_runs): then a row of many query
     * runs is counted as a whole (ctxpar_ring_account), its FLOPs in row_flops (NAN: not yet). */
    int sorted_runs;
    double row_flops;
} ctxpar_ring_seen;

/* What ctxpar_block_account added to the work statistics for one block, and its result. */
typedef struct ctxpar_ring_block_work {
    ctxpar_work_stats work;
    signed char live; /* -1: not accounted yet */
} ctxpar_ring_block_work;

typedef struct ctxpar_ring_plan {
    int nranks;
    int *last; /* [P]: the last rank along block j's path that needs it (j itself if none) */
    /* [P]: the last rank along the path of block j's dK/dV partial sum: last[j], or j - 1 when
     * the sum goes around the ring; j itself when no other rank needs the block (the owner
     * then computes its own block after the ring, with no transfer). */
    int *sum_last;
    int borrowed; /* the arrays belong to the dry run's plan (run->dry): free leaves them */
    ctxpar_ring_seen *seen; /* the dry run's (ctxpar_ring_dry), or NULL */
} ctxpar_ring_plan;

/* What a dry run's ring calls share (run->dry of a ring call: the table's dry_make): the plan,
 * made once for every rank, and its cache. */
typedef struct ctxpar_ring_dry {
    ctxpar_ring_plan plan;
    ctxpar_ring_seen seen;
} ctxpar_ring_dry;

/* The plan and, when memory allows, its cache (else the ring classifies every block it holds). */
ctxpar_status ctxpar_ring_dry_make(const ctxpar_problem *pb, ctxpar_ring_dry *dry);
void ctxpar_ring_dry_free(ctxpar_ring_dry *dry);

/* The dry run's plan (run->dry, a ctxpar_ring_dry) when it is for this many ranks, else a new
 * one (ctxpar_ring_plan_make). */
ctxpar_status ctxpar_ring_plan_for(const ctxpar_run *run, const ctxpar_problem *pb,
                                   ctxpar_ring_plan *plan_out);

/* Builds the plan (host memory; O(P^2) mask classifications). */
ctxpar_status ctxpar_ring_plan_make(const ctxpar_problem *pb, ctxpar_ring_plan *plan_out);
void ctxpar_ring_plan_free(ctxpar_ring_plan *plan);

/* Whether any query of rank q_rank may see any key of rank k_rank's shard. */
int ctxpar_shards_interact(const ctxpar_problem *pb, int q_rank, int k_rank);

/* Steps from rank a forward to rank b around the ring (no division for ranks in [0, P): a dry
 * run takes this P^2 times). */
static inline int ctxpar_ring_dist(int a, int b, int P) {
    const int d = b - a;
    return d >= 0 && d < P ? d : d < 0 && d >= -P ? d + P : (d % P + P) % P;
}

/* Whether rank pb->rank's queries may see any key of block j: ctxpar_shards_interact, from the
 * plan's cache when it has one (else 1: the block's own accounting decides). */
int ctxpar_ring_may_see(const ctxpar_ring_plan *plan, const ctxpar_problem *pb, int j);

/* Whether rank pb->rank computes block j against its queries qp: ctxpar_ring_may_see, then
 * ctxpar_block_account (which counts the block in run->work). With the plan's cache, each block is
 * accounted once per row and its counts added again on later calls: rows of one dry run are of
 * one ring problem. */
int ctxpar_ring_account(const ctxpar_ring_plan *plan, const ctxpar_run *run,
                        const ctxpar_problem *pb, ctxpar_spans qp, int j);

/* Whether rank `from`, at step s, passes the block it holds (block from - s) on to from + 1. */
int ctxpar_ring_kv_hop(const ctxpar_ring_plan *plan, int from, int step);

/* Whether rank r holds a block at step s (always at step 0; later only if it arrived). */
int ctxpar_ring_holds(const ctxpar_ring_plan *plan, int r, int step);

/* Whether rank `from`, at step s, passes the dK/dV partial sum it holds (of block from - s) on
 * to from + 1 (backward). */
int ctxpar_ring_sum_hop(const ctxpar_ring_plan *plan, int from, int step);

/* Whether rank r holds a partial sum at step s (backward): its own block's at step 0 unless
 * sum_last says it computes it after the ring, later only if one arrived. */
int ctxpar_ring_has_sum(const ctxpar_ring_plan *plan, int r, int step);

#ifdef __cplusplus
}
#endif

#endif /* CTXPAR_RING_PLAN_H */
