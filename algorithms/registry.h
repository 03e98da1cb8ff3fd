/*
 * registry.h - the table of algorithms the front door dispatches through (api/attn.c), and the
 * AUTO choice made from the table's costs. docs/algorithms.md ("Adding an algorithm / a
 * backend") lists the files a new entry touches.
 */
#ifndef CTXPAR_REGISTRY_H
#define CTXPAR_REGISTRY_H

#include "algorithms.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ctxpar_algorithm {
    ctxpar_algo id;
    const char *name; /* what ctxpar_algo_name() returns */
    /* OK when the algorithm can run this problem, else INVALID_ARG naming what is off (called
     * after validation, before the ranks agree; no communication). */
    ctxpar_status (*check)(const ctxpar_problem *pb);
    ctxpar_status (*forward)(const ctxpar_run *run, const ctxpar_problem *pb,
                             const ctxpar_tensor *q, const ctxpar_tensor *k,
                             const ctxpar_tensor *v, ctxpar_tensor *out, float *lse);
    ctxpar_status (*backward)(const ctxpar_run *run, const ctxpar_problem *pb,
                              const ctxpar_tensor *q, const ctxpar_tensor *k,
                              const ctxpar_tensor *v, const ctxpar_tensor *out, const float *lse,
                              const ctxpar_tensor *dout, ctxpar_tensor *dq, ctxpar_tensor *dk,
                              ctxpar_tensor *dv);
    /* What AUTO minimises for a problem `check` accepts (docs/algorithms.md, "AUTO"): values
     * moved per rank per head_dim element and (S/P)·(P-1)/P rows, weighted for what cannot be
     * hidden behind compute or held in memory. Only compared between entries. */
    double (*cost)(const ctxpar_problem *pb);
} ctxpar_algorithm;

/* The registered algorithms, in ctxpar_algo order (AUTO excluded); *count_out entries. */
const ctxpar_algorithm *const *ctxpar_algorithms(int *count_out);

/* The entry of `algo`, or NULL for AUTO and values that name no algorithm. */
const ctxpar_algorithm *ctxpar_algorithm_find(ctxpar_algo algo);

/* `requested` unless it is AUTO; else the entry whose check accepts the problem at the lowest
 * cost (ties go to the earlier entry). Leaves the error message clear. */
const ctxpar_algorithm *ctxpar_algorithm_choose(ctxpar_algo requested, const ctxpar_problem *pb);

#ifdef __cplusplus
}
#endif

#endif /* CTXPAR_REGISTRY_H */
