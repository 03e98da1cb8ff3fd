/*
 * algorithms.h - the context-parallel algorithms, written once against the device and comm
 * vtables (through the ctxpar_dev_* / ctxpar_comm_* wrappers of ctxpar_backend.h).
 *
 * The front door (api/attn.c) validates arguments and checks that ranks agree before calling
 * any of these; here, inputs are known to be well formed.
 */
#ifndef CTXPAR_ALGORITHMS_H
#define CTXPAR_ALGORITHMS_H

#include "ctxpar_backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Spans of global positions held by one rank (layout.c). ZIGZAG needs two. */
#define CTXPAR_MAX_SPANS 2

typedef struct ctxpar_shard_spans {
    ctxpar_span span[CTXPAR_MAX_SPANS];
    int count;
} ctxpar_shard_spans;

/* The spans of `rank` for a layout; seq_global divides as the layout requires (checked by the
 * caller with ctxpar_layout_check). */
void ctxpar_layout_spans(ctxpar_layout layout, int64_t seq_global, int rank, int nranks,
                         ctxpar_shard_spans *spans_out);

/* INVALID_ARG unless seq_global > 0 divides by the layout's unit (P, or 2P for ZIGZAG). */
ctxpar_status ctxpar_layout_check(ctxpar_layout layout, int64_t seq_global, int nranks);

/* A view of the rows of `t` ([B, S, H, D]) at local indices [first, first + len). */
ctxpar_tensor ctxpar_tensor_rows(const ctxpar_tensor *t, int64_t first, int64_t len);

/* A view of the rows of a [B, S, H, D] tensor at the global positions of one span (the tensor
 * holds the whole sequence). */
ctxpar_tensor ctxpar_tensor_span(const ctxpar_tensor *global, const ctxpar_span *span);

/* The shape of one call, resolved from params and the local tensors. */
typedef struct ctxpar_problem {
    int rank, nranks;
    ctxpar_layout layout;
    ctxpar_mask_desc mask;
    float scale;
    ctxpar_dtype dtype;
    int64_t batch, seq_local, seq_global, heads_q, heads_kv, head_dim;
    float *lse_lo; /* params.lse_lo: the caller's LSE low part [B, Hq, S/P], or NULL */
} ctxpar_problem;

/*
 * The context's workspace (workspace.c): one device block that the algorithms carve their buffers
 * from. It grows to the largest call seen and is kept, so steady-state calls allocate nothing;
 * ctxpar_context_reserve sizes it up front and ctxpar_context_release gives it back.
 * Reuse is stream-ordered: each call records `done` on its stream when its work is enqueued, and
 * a call on another stream first makes its stream wait for that event, so a new call never
 * overwrites buffers that enqueued work of the previous one still reads. Growing frees the old
 * block through the dispatch, whose frees are stream-ordered too. On a host-memory device the
 * idle workspace is poisoned under AddressSanitizer, so a use after a call returned is caught.
 */
typedef struct ctxpar_workspace {
    ctxpar_device *dev;
    void *base;
    size_t bytes;        /* capacity of base */
    ctxpar_event *done;  /* recorded at the end of each call (devices with streams) */
    ctxpar_stream *last; /* the stream of the last call */
    int recorded;        /* done holds the last call's end */
} ctxpar_workspace;

/* The workspace of at least `bytes` for a call on `stream`, ordered after the previous call. */
ctxpar_status ctxpar_workspace_acquire(ctxpar_workspace *ws, size_t bytes, ctxpar_stream *stream,
                                       void **base_out);
/* Ends a call's use: records `done` on its stream (and poisons the idle block). */
ctxpar_status ctxpar_workspace_finish(ctxpar_workspace *ws, ctxpar_stream *stream);
/* Frees the block and the event; the workspace can be acquired again. */
ctxpar_status ctxpar_workspace_release(ctxpar_workspace *ws);

/* How to run: the device, the comm and the per-context services. */
typedef struct ctxpar_run {
    ctxpar_device *dev;
    ctxpar_comm *comm;
    ctxpar_stream *stream; /* the caller's compute stream */
    int verify_transfers;
    ctxpar_trace_fn trace;
    void *trace_user;
    ctxpar_work_stats *work;
    ctxpar_workspace *ws; /* the context's */
} ctxpar_run;

/* Reports one trace event if tracing is on. */
void ctxpar_run_trace(const ctxpar_run *run, ctxpar_event_kind kind, const char *name, int step,
                      int peer, double t_begin, double t_end, uint64_t bytes);

/* Counts the (q span, k span) pairs of one block for the work statistics; returns whether any
 * pair has visible entries (0: the whole block is masked out and can be skipped). */
int ctxpar_block_account(const ctxpar_run *run, const ctxpar_problem *pb, ctxpar_spans q_pos,
                         ctxpar_spans k_pos);

/* Copies rank j's local rows (`local`: [B, S/P, H, D] in its shard order) to their global
 * positions in `global` ([B, S, H, D]), or back (to_global = 0). Any dtypes (cast). */
ctxpar_status ctxpar_move_shard_rows(const ctxpar_run *run, const ctxpar_problem *pb, int j,
                                     const ctxpar_tensor *local, const ctxpar_tensor *global,
                                     int to_global);

/* K and V of `seq` rows packed back to back in one buffer: [2][B, seq, Hkv, D] of `dtype`;
 * which = 0 for K, 1 for V. */
ctxpar_tensor ctxpar_packed_kv(void *buf, ctxpar_dtype dtype, const ctxpar_problem *pb, int64_t seq,
                               int which);
size_t ctxpar_packed_kv_bytes(ctxpar_dtype dtype, const ctxpar_problem *pb, int64_t seq);

/* Copies the local k and v into a packed buffer of the problem's dtype. */
ctxpar_status ctxpar_pack_kv(const ctxpar_run *run, const ctxpar_problem *pb,
                             const ctxpar_tensor *k, const ctxpar_tensor *v, void *buf);

/* Casts the F32 accumulators to the caller's out and copies lse (may be NULL) and the LSE's
 * low part lse_lo_acc into pb->lse_lo (when both are set). */
ctxpar_status ctxpar_store_fwd(const ctxpar_run *run, const ctxpar_problem *pb,
                               const float *out_acc, const float *lse_acc,
                               const float *lse_lo_acc, ctxpar_tensor *out, float *lse);

/* Carves aligned buffers out of one block. With base NULL it only measures, so that one function
 * both sizes an algorithm's workspace and lays it out. */
#define CTXPAR_WS_ALIGN 256
typedef struct ctxpar_carve {
    char *base; /* NULL: measuring */
    size_t used;
} ctxpar_carve;
void *ctxpar_carve_take(ctxpar_carve *c, size_t bytes);

/* The run's workspace, at least `bytes` (ctxpar_workspace_acquire on the run's stream). */
ctxpar_status ctxpar_run_workspace(const ctxpar_run *run, size_t bytes, void **base_out);

/* Each algorithm (ring.c, allgather.c, alltoall.c) is an entry of the table in registry.h. */

#ifdef __cplusplus
}
#endif

#endif /* CTXPAR_ALGORITHMS_H */
