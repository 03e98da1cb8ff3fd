// The one call path through the table (registry.h): the front door and the planner's dry run
// both run an algorithm here, with the state it keeps between calls.
#include <stdlib.h>

#include "registry.h"

// The state of `algo` in `states` (made zeroed at its first call), or NULL when it keeps none.
static ctxpar_status state_of(const ctxpar_algorithm *algo, ctxpar_algo_states *states,
                              void **state_out) {
    *state_out = NULL;
    if (!algo->state_bytes)
        return CTXPAR_OK;
    int count = 0;
    (void)ctxpar_algorithms(&count);
    if (!states->slot) {
        states->slot = calloc((size_t)count, sizeof *states->slot);
        if (!states->slot)
            return CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "cannot allocate %d algorithm states",
                                count);
    }
    void **slot = &states->slot[algo->id - 1]; // entry i has id i + 1 (registry.c)
    if (!*slot) {
        *slot = calloc(1, algo->state_bytes);
        if (!*slot)
            return CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY,
                                "%s: cannot allocate its state (%zu bytes)", algo->name,
                                algo->state_bytes);
    }
    *state_out = *slot;
    return CTXPAR_OK;
}

void ctxpar_algo_states_release(ctxpar_algo_states *states) {
    if (!states->slot)
        return;
    int count = 0;
    const ctxpar_algorithm *const *table = ctxpar_algorithms(&count);
    for (int i = 0; i < count; i++) {
        if (states->slot[i] && table[i]->state_release)
            table[i]->state_release(states->slot[i]);
        free(states->slot[i]);
    }
    free(states->slot);
    states->slot = NULL;
}

ctxpar_status ctxpar_call_forward(const ctxpar_algorithm *algo, ctxpar_algo_states *states,
                                  const ctxpar_run *run, const ctxpar_problem *pb,
                                  const ctxpar_tensor *q, const ctxpar_tensor *k,
                                  const ctxpar_tensor *v, ctxpar_tensor *out, float *lse) {
    ctxpar_run r = *run;
    CTXPAR_CHECK(state_of(algo, states, &r.state));
    return algo->forward(&r, pb, q, k, v, out, lse);
}

ctxpar_status ctxpar_call_backward(const ctxpar_algorithm *algo, ctxpar_algo_states *states,
                                   const ctxpar_run *run, const ctxpar_problem *pb,
                                   const ctxpar_tensor *q, const ctxpar_tensor *k,
                                   const ctxpar_tensor *v, const ctxpar_tensor *out,
                                   const float *lse, const ctxpar_tensor *dout, ctxpar_tensor *dq,
                                   ctxpar_tensor *dk, ctxpar_tensor *dv) {
    ctxpar_run r = *run;
    CTXPAR_CHECK(state_of(algo, states, &r.state));
    CTXPAR_CHECK(algo->backward(&r, pb, q, k, v, out, lse, dout, dq, dk, dv));
    if (!pb->dsinks) // after every gradient: written only on success
        return CTXPAR_OK;
    r.state = NULL; // the sinks' step is no algorithm's
    return ctxpar_sinks_backward(&r, pb, out, dout, lse);
}
