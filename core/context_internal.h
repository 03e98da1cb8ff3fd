// The context object, shared by the files of the front door.
#ifndef CTXPAR_CONTEXT_INTERNAL_H
#define CTXPAR_CONTEXT_INTERNAL_H

#include "registry.h"

struct ctxpar_context {
    ctxpar_device *dev; /* borrowed */
    ctxpar_comm *comm;  /* borrowed */
    ctxpar_context_options options;
    ctxpar_trace_fn trace;
    void *trace_user;
    ctxpar_work_stats work;
    ctxpar_workspace ws;       /* the algorithms' buffers (algorithms.h) */
    ctxpar_algo_states states; /* what the algorithms keep between calls (registry.h) */
    /* The last built-in layout's map (every rank's positions), kept between calls: it depends
     * only on (map_layout, seq_global, nranks). Empty (count NULL) until the first call. */
    ctxpar_layout_map map;
    ctxpar_layout map_layout;
};

// Puts back a message saved from ctxpar_last_error() (after a call that may overwrite it).
void ctxpar_restore_error(const char *message);

typedef enum ctxpar_call_kind { CTXPAR_CALL_FWD = 1, CTXPAR_CALL_BWD = 2 } ctxpar_call_kind;

// Collective: every rank says whether its arguments were valid and what it was asked to do, and
// all ranks return CTXPAR_ERR_INVALID_USAGE, naming what differs, unless they all agree. pb and
// params may be NULL on a rank whose arguments were rejected (it still takes part, so that its
// peers fail at once instead of waiting for a transfer that will never come).
ctxpar_status ctxpar_check_agreement(ctxpar_context *ctx, ctxpar_call_kind kind,
                                     const ctxpar_attn_params *params, const ctxpar_problem *pb,
                                     ctxpar_algo algo);

#endif // CTXPAR_CONTEXT_INTERNAL_H
