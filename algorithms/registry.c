// The table of algorithms and the AUTO choice: the front door has no per-algorithm branches.
#include <stddef.h>

#include "registry.h"

static ctxpar_status any_problem(const ctxpar_problem *pb) {
    (void)pb;
    return CTXPAR_OK;
}

// Costs in values moved per rank (units of D·(S/P)·(P-1)/P, as docs/algorithms.md derives them).
// Ring and all-gather move all K/V: 2·Hkv·P; the ring hides it behind compute.
static double ring_cost(const ctxpar_problem *pb) {
    return 2.0 * (double)pb->heads_kv * pb->nranks;
}

// All-gather moves what the ring moves and holds the whole K/V at once: the part of it beyond
// the local Q and out it sits beside is counted against it. Where the gathered K/V is no larger
// (Hkv·P <= Hq, GQA with few K/V heads) it wins the tie with the ring (the 0.5) for its bitwise
// reproducibility and its single large transfer.
static double allgather_cost(const ctxpar_problem *pb) {
    const double held = (double)pb->heads_kv * pb->nranks, beside = (double)pb->heads_q;
    return ring_cost(pb) + (held - beside) - 0.5;
}

// All-to-all moves the local Q, K, V and out, 2·(Hq+Hkv), but cannot hide it behind compute:
// counted twice, so it is taken only when it moves less than half the ring's bytes.
static double alltoall_cost(const ctxpar_problem *pb) {
    return 2.0 * 2.0 * (double)(pb->heads_q + pb->heads_kv);
}

static const ctxpar_algorithm ring = {CTXPAR_ALGO_RING, "ring", any_problem, ctxpar_ring_fwd,
                                      ctxpar_ring_bwd, ring_cost};
static const ctxpar_algorithm allgather = {CTXPAR_ALGO_ALLGATHER, "allgather", any_problem,
                                           ctxpar_allgather_fwd, ctxpar_allgather_bwd,
                                           allgather_cost};
static const ctxpar_algorithm alltoall = {CTXPAR_ALGO_ALLTOALL, "alltoall", ctxpar_alltoall_check,
                                          ctxpar_alltoall_fwd, ctxpar_alltoall_bwd,
                                          alltoall_cost};

// In ctxpar_algo order: entry i has id i + 1.
static const ctxpar_algorithm *const table[] = {&ring, &allgather, &alltoall};
#define COUNT ((int)(sizeof table / sizeof table[0]))

const ctxpar_algorithm *const *ctxpar_algorithms(int *count_out) {
    *count_out = COUNT;
    return table;
}

const ctxpar_algorithm *ctxpar_algorithm_find(ctxpar_algo algo) {
    for (int i = 0; i < COUNT; i++)
        if (table[i]->id == algo)
            return table[i];
    return NULL;
}

const ctxpar_algorithm *ctxpar_algorithm_choose(ctxpar_algo requested, const ctxpar_problem *pb) {
    if (requested != CTXPAR_ALGO_AUTO)
        return ctxpar_algorithm_find(requested);
    const ctxpar_algorithm *best = NULL;
    double best_cost = 0.0;
    for (int i = 0; i < COUNT; i++) {
        if (table[i]->check(pb) != CTXPAR_OK)
            continue;
        const double c = table[i]->cost(pb);
        if (!best || c < best_cost) {
            best = table[i];
            best_cost = c;
        }
    }
    ctxpar_clear_error(); // a rejecting check's message is not this call's error
    return best ? best : &ring;
}

const char *ctxpar_algo_name(ctxpar_algo algo) {
    if (algo == CTXPAR_ALGO_AUTO)
        return "auto";
    const ctxpar_algorithm *a = ctxpar_algorithm_find(algo);
    return a ? a->name : "?";
}
