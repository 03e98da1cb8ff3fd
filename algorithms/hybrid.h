/*
 * hybrid.h - the hybrid (2-D) algorithm's shape: P = u x r ranks, u consecutive ranks form an
 * all-to-all group, the r groups a ring. Shared by hybrid.c and the planner.
 */
#ifndef CTXPAR_HYBRID_H
#define CTXPAR_HYBRID_H

#include "algorithms.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Whether u ranks per group can run this problem: u divides P and Hq, Hkv divides by u or u by
 * Hkv, u <= CTXPAR_MAX_ULYSSES. */
int ctxpar_hybrid_valid_u(const ctxpar_problem *pb, int64_t u);

/* The group size the hybrid uses: pb->ulysses if set (0 if not valid), else the valid u of the
 * lowest cost (ties: the smaller u). */
int ctxpar_hybrid_ulysses(const ctxpar_problem *pb);

/* The problem one rank of the ring across groups solves: rank pb->rank / u of P / u, the
 * group's rows (its members' tokens, in member order; seq_max u x pb->seq_max on every rank),
 * this rank's share of the heads and of the sink logits. Its map (positions) and lse_lo are
 * NULL: a call sets them (ctxpar_layout_map_group(pb->map, u), the group rows' low part). */
ctxpar_problem ctxpar_hybrid_ring_problem(const ctxpar_problem *pb, int u);

/* The problem of the all-to-all inside a group: rank pb->rank % u of u. */
ctxpar_problem ctxpar_hybrid_group_problem(const ctxpar_problem *pb, int u);

/* The ring's positions for groups of u (ctxpar_layout_map_group of a call's map) and the row of
 * its group's rows where each span of the call's map starts: made by each call, or once by a dry
 * run for every rank (ctxpar_run.hybrid_rows). */
typedef struct ctxpar_hybrid_rows {
    int u;
    ctxpar_layout_map ring_map;
    int64_t *span_row; /* [spans of the call's map] */
} ctxpar_hybrid_rows;

ctxpar_status ctxpar_hybrid_rows_make(const ctxpar_layout_map *m, int u, ctxpar_hybrid_rows *out);
void ctxpar_hybrid_rows_free(ctxpar_hybrid_rows *rows);

#ifdef __cplusplus
}
#endif

#endif /* CTXPAR_HYBRID_H */
