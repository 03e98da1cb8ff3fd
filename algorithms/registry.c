// The table of algorithms and the AUTO choice: the front door has no per-algorithm branches.
// Each entry lives in its algorithm's file.
#include <stddef.h>

#include "registry.h"

extern const ctxpar_algorithm ctxpar_ring_algorithm, ctxpar_allgather_algorithm,
    ctxpar_alltoall_algorithm, ctxpar_hybrid_algorithm, ctxpar_decode_algorithm;

// In ctxpar_algo order: entry i has id i + 1.
static const ctxpar_algorithm *const table[] = {&ctxpar_ring_algorithm, &ctxpar_allgather_algorithm,
                                                &ctxpar_alltoall_algorithm,
                                                &ctxpar_hybrid_algorithm, &ctxpar_decode_algorithm};
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

ctxpar_status ctxpar_algorithm_check(const ctxpar_algorithm *algo, const ctxpar_problem *pb,
                                     const ctxpar_device *dev, int backward) {
    if (pb->q_len > 0 && !algo->short_queries)
        return CTXPAR_ERROR(CTXPAR_ERR_NOT_SUPPORTED,
                            "the %s algorithm does not take queries shorter than the keys "
                            "(params.q_len %lld): use decode or allgather",
                            algo->name, (long long)pb->q_len);
    if (pb->reproducible && !algo->reproducible)
        return CTXPAR_ERROR(CTXPAR_ERR_NOT_SUPPORTED,
                            "the %s algorithm has no reproducible mode (params.reproducible): use "
                            "ring, allgather or alltoall",
                            algo->name);
    CTXPAR_CHECK(algo->check(pb));
    if (!dev)
        return CTXPAR_OK;
    if (pb->reproducible && !ctxpar_dev_has_bins(dev))
        return CTXPAR_ERROR(CTXPAR_ERR_NOT_SUPPORTED,
                            "reproducible mode (params.reproducible) needs a device with binned "
                            "accumulators; device '%s' has none",
                            dev->ops->name ? dev->ops->name : "(unnamed)");
    if (pb->q_len > 0) // forward only: ctxpar_attn_bwd refuses such a problem
        backward = 0;
    ctxpar_attn_query q = {pb->dtype,      pb->batch,   ctxpar_problem_q_rows(pb),
                           pb->seq_local,  pb->heads_q, pb->heads_kv,
                           pb->head_dim,   pb->mask,    backward,
                           pb->head_dim_v, pb->softcap, pb->sinks != NULL};
    algo->blocks(pb, &q);
    return ctxpar_dev_attn_supported(dev, &q);
}

const ctxpar_algorithm *ctxpar_algorithm_choose(ctxpar_algo requested, const ctxpar_problem *pb,
                                                const ctxpar_device *dev, int backward) {
    if (requested != CTXPAR_ALGO_AUTO)
        return ctxpar_algorithm_find(requested);
    const ctxpar_algorithm *best = NULL;
    double best_cost = 0.0;
    for (int i = 0; i < COUNT; i++) {
        if (ctxpar_algorithm_check(table[i], pb, dev, backward) != CTXPAR_OK)
            continue;
        const double c = table[i]->cost(pb);
        if (!best || c < best_cost) {
            best = table[i];
            best_cost = c;
        }
    }
    ctxpar_clear_error(); // a rejecting check's message is not this call's error
    return best ? best : &ctxpar_ring_algorithm;
}

const char *ctxpar_algo_name(ctxpar_algo algo) {
    if (algo == CTXPAR_ALGO_AUTO)
        return "auto";
    const ctxpar_algorithm *a = ctxpar_algorithm_find(algo);
    return a ? a->name : "?";
}
