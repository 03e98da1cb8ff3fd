/*
 * plan_run.h - a dry run of one attention call on every rank: the library's own algorithm code
 * runs rank by rank on the planner's device and comm (plan_device.h, plan_comm.h), so the work
 * it counts (ctxpar_block_account), the bytes it sends (the comm dispatch) and the workspace it
 * takes (the registry's workspace_bytes) are what a real run counts, without data. The ring's
 * transfer plan is made once for all ranks.
 */
#ifndef CPT_PLAN_RUN_H
#define CPT_PLAN_RUN_H

#include <stddef.h>
#include <stdint.h>

#include "ctxpar.h"
#include "plan_comm.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cpt_plan_config {
    int ranks;
    int64_t batch, seq, heads, kv_heads, head_dim; /* seq: global */
    int64_t head_dim_v;                            /* of v, out, dout, dv (MLA); 0 = head_dim */
    ctxpar_dtype dtype;
    ctxpar_attn_params params; /* algo (or AUTO), layout, mask, window, documents, ulysses;
                                  sinks (any non-NULL pointer: never read) and, with backward,
                                  their gradient's exchange as the front door makes it */
    int backward;              /* also the backward call */
    int group_size;            /* ranks sharing the fast links (a node), for the link classes of the
                                  algorithms other than the hybrid (whose groups are its own) */
    int coverage;              /* run the coverage proof (24 bytes per token) */
    int share_members;         /* the hybrid: the first member of a group stands for the others
                                  (the same plan, u times fewer ring steps; plan_run.c) instead
                                  of every member's own dry run */
    /* Optional: the ranks done so far, for a progress line (stage "dry run of N ranks", done of
     * N; the signature of cpt_run_config.progress). */
    void (*progress)(void *user, const char *stage, int done, int total);
    void *progress_user;
} cpt_plan_config;

typedef struct cpt_plan_rank {
    double flops_fwd, flops_bwd; /* as ctxpar_work_stats counts them (4·D per visible pair) */
    /* Visible (query, key) pairs x heads x batch the forward computes: its FLOPs over 2 (D + Dv),
     * the work statistics' count (over ranks: the coverage proof's pairs_computed). */
    double pairs;
    uint64_t bytes_sent;      /* as ctxpar_context_bytes_sent counts them */
    uint64_t bytes_received;  /* counted where the data lands (plan_comm.h) */
    size_t workspace_bytes;   /* the largest workspace this rank's calls acquire */
    cpt_plan_traffic traffic; /* by link class, point-to-point and collective */
} cpt_plan_rank;

typedef struct cpt_plan_result {
    ctxpar_algo algo;       /* what AUTO resolved to */
    int ulysses;            /* its all-to-all group's size (the hybrid's; 0 for the others) */
    size_t workspace_bytes; /* the largest rank's */
    int nranks;
    cpt_plan_rank *rank; /* [ranks] */
    /* Coverage (cpt_plan_cover_check): every query position's computed (key, head, batch)
     * triples - count, sum and sum of squares of key positions - against the mask's. */
    int coverage_checked, coverage_ok;
    int64_t coverage_bad_position;        /* the first position that differs, or -1 */
    double pairs_computed, pairs_visible; /* x heads x batch, over all positions */
    double imbalance; /* max / mean - 1 of per-rank FLOPs (forward + backward) */
    double seconds;   /* how long the dry run took */
} cpt_plan_result;

/* Rank 0's problem as the front door resolves it (validated), for any length: shards are the
 * layout's (params.seq_len_global = seq). */
struct ctxpar_problem;
ctxpar_status cpt_plan_problem(const cpt_plan_config *cfg, struct ctxpar_problem *pb);

/* The size of the all-to-all group `algo` splits its comm into for a problem its check accepts
 * (ctxpar_algorithm.splits: the hybrid's u), or 0. */
struct ctxpar_algorithm;
int cpt_plan_group_size(const struct ctxpar_algorithm *algo, const struct ctxpar_problem *pb);

/* Runs the dry run; INVALID_ARG / NOT_SUPPORTED (with the library's message) for a problem the
 * library would refuse. result->rank is allocated: cpt_plan_result_free. */
ctxpar_status cpt_plan_run(const cpt_plan_config *cfg, cpt_plan_result *result);
void cpt_plan_result_free(cpt_plan_result *result);

#ifdef __cplusplus
}
#endif

#endif /* CPT_PLAN_RUN_H */
