/*
 * registry.h - the table of algorithms, the AUTO choice made from the table's costs, and the one
 * call path through it that the front door (core/attn.c) and the planner's dry run
 * (tools/ctxpar/plan_run.c) both take. docs/algorithms.md ("Adding an algorithm / a backend")
 * lists the files a new entry touches.
 */
#ifndef CTXPAR_REGISTRY_H
#define CTXPAR_REGISTRY_H

#include "algorithms.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One sub-comm an algorithm splits the run's comm into (ctxpar_algorithm.splits): this rank's
 * place in it, and whether its members are one all-to-all group (1) or one rank of each (0). */
typedef struct ctxpar_split_shape {
    int rank, size;
    int group;
} ctxpar_split_shape;
#define CTXPAR_MAX_SPLITS 2

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

    /* The optional hooks below: NULL / 0 for none. */

    /* 1: it runs queries shorter than the keys (params.q_len > 0, forward only); 0: such a
     * problem is NOT_SUPPORTED for it, before its own check runs. */
    int short_queries;

    /* 1: it runs reproducible mode (params.reproducible; repro.h), its check saying where not;
     * 0: reproducible problems are NOT_SUPPORTED for it. */
    int reproducible;

    /* State kept between calls (the hybrid's sub-comms): the caller of ctxpar_call_forward /
     * _backward (a context; a rank of a dry run) keeps one zeroed block of state_bytes for the
     * algorithm, made at its first call and passed to every call as run->state; state_release
     * frees what the block holds (not the block) when the caller is done with it. */
    size_t state_bytes;
    void (*state_release)(void *state);
    /* For a dry run, which runs every rank's calls of one problem one after another (the
     * planner): what those calls share, made once (from any rank's problem, with its map, that
     * check accepts) and passed to each as run->dry; real runs have none (NULL) and each call
     * makes its own. */
    ctxpar_status (*dry_make)(const ctxpar_problem *pb, void **dry_out);
    void (*dry_free)(void *dry);
    /* The sub-comms rank pb->rank's calls split the run's comm into, in the order they split it,
     * for a problem check accepts; returns how many (at most CTXPAR_MAX_SPLITS). A dry run's comm,
     * which has no peers to meet in a split, answers the splits with these. */
    int (*splits)(const ctxpar_problem *pb, ctxpar_split_shape out[CTXPAR_MAX_SPLITS]);
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

/* The algorithms' states of one caller (a context; a rank of a dry run): a slot per table entry,
 * made on first use (call.c). Zero-initialised: no state yet. */
typedef struct ctxpar_algo_states {
    void **slot; /* [table entries], or NULL */
} ctxpar_algo_states;

/* Releases every state made (state_release, then the block); the slots are empty again. */
void ctxpar_algo_states_release(ctxpar_algo_states *states);

/* The one call path: `algo`'s forward on `run` with run->state its state in `states` (made at
 * its first call). */
ctxpar_status ctxpar_call_forward(const ctxpar_algorithm *algo, ctxpar_algo_states *states,
                                  const ctxpar_run *run, const ctxpar_problem *pb,
                                  const ctxpar_tensor *q, const ctxpar_tensor *k,
                                  const ctxpar_tensor *v, ctxpar_tensor *out, float *lse);

/* Likewise its backward, then the sinks' gradient (pb->dsinks: ctxpar_sinks_backward), which is
 * written only when every other gradient was. */
ctxpar_status ctxpar_call_backward(const ctxpar_algorithm *algo, ctxpar_algo_states *states,
                                   const ctxpar_run *run, const ctxpar_problem *pb,
                                   const ctxpar_tensor *q, const ctxpar_tensor *k,
                                   const ctxpar_tensor *v, const ctxpar_tensor *out,
                                   const float *lse, const ctxpar_tensor *dout, ctxpar_tensor *dq,
                                   ctxpar_tensor *dk, ctxpar_tensor *dv);

#ifdef __cplusplus
}
#endif

#endif /* CTXPAR_REGISTRY_H */
