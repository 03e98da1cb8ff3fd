/*
 * registry.h - the table of algorithms the front door dispatches through (core/attn.c), and the
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
    /* The largest blocks it passes to the device, as the device's attn_supported is asked about
     * them: sets seq_q, seq_k, heads_q and heads_kv of *q (the rest is the problem's). */
    void (*blocks)(const ctxpar_problem *pb, ctxpar_attn_query *q);
    /* Workspace bytes of its forward and backward (the larger), for ctxpar_context_reserve. */
    size_t (*workspace_bytes)(const ctxpar_problem *pb);
    ctxpar_status (*forward)(const ctxpar_run *run, const ctxpar_problem *pb,
                             const ctxpar_tensor *q, const ctxpar_tensor *k, const ctxpar_tensor *v,
                             ctxpar_tensor *out, float *lse);
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

/* OK when `algo` can run this problem: its own check, then the device's attn_supported asked
 * about the algorithm's blocks (forward, and backward too when `backward`); else the failing
 * status (INVALID_ARG or NOT_SUPPORTED) with its reason. dev NULL: the algorithm's check only.
 * No communication, so a failure here leaves the comm usable. */
ctxpar_status ctxpar_algorithm_check(const ctxpar_algorithm *algo, const ctxpar_problem *pb,
                                     const ctxpar_device *dev, int backward);

/* `requested` unless it is AUTO (NULL if it names no algorithm); else the entry that
 * ctxpar_algorithm_check accepts at the lowest cost (ties go to the earlier entry), or the ring
 * when none does (its check then names why). Leaves the error message clear. */
const ctxpar_algorithm *ctxpar_algorithm_choose(ctxpar_algo requested, const ctxpar_problem *pb,
                                                const ctxpar_device *dev, int backward);

#ifdef __cplusplus
}
#endif

#endif /* CTXPAR_REGISTRY_H */
