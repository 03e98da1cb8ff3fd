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
} ctxpar_problem;

/* How to run: the device, the comm and the per-context services. */
typedef struct ctxpar_run {
    ctxpar_device *dev;
    ctxpar_comm *comm;
    ctxpar_stream *stream; /* the caller's compute stream */
    int verify_transfers;
    ctxpar_trace_fn trace;
    void *trace_user;
    ctxpar_work_stats *work;
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

/* Casts the F32 accumulators to the caller's out and copies lse (may be NULL). */
ctxpar_status ctxpar_store_fwd(const ctxpar_run *run, const ctxpar_problem *pb,
                               const float *out_acc, const float *lse_acc, ctxpar_tensor *out,
                               float *lse);

/* Allocates device memory for an algorithm and remembers it, so one call frees all on any path. */
#define CTXPAR_MAX_BUFFERS 12
typedef struct ctxpar_buffers {
    ctxpar_device *dev;
    ctxpar_stream *stream; /* work on it may still read the buffers when they are freed */
    int count;
    void *ptr[CTXPAR_MAX_BUFFERS];
    size_t bytes[CTXPAR_MAX_BUFFERS];
} ctxpar_buffers;
ctxpar_status ctxpar_buffers_alloc(ctxpar_buffers *b, size_t bytes, void **ptr_out);
void ctxpar_buffers_free(ctxpar_buffers *b);

ctxpar_status ctxpar_ring_fwd(const ctxpar_run *run, const ctxpar_problem *pb,
                              const ctxpar_tensor *q, const ctxpar_tensor *k,
                              const ctxpar_tensor *v, ctxpar_tensor *out, float *lse);
ctxpar_status ctxpar_ring_bwd(const ctxpar_run *run, const ctxpar_problem *pb,
                              const ctxpar_tensor *q, const ctxpar_tensor *k,
                              const ctxpar_tensor *v, const ctxpar_tensor *out, const float *lse,
                              const ctxpar_tensor *dout, ctxpar_tensor *dq, ctxpar_tensor *dk,
                              ctxpar_tensor *dv);
ctxpar_status ctxpar_allgather_fwd(const ctxpar_run *run, const ctxpar_problem *pb,
                                   const ctxpar_tensor *q, const ctxpar_tensor *k,
                                   const ctxpar_tensor *v, ctxpar_tensor *out, float *lse);
ctxpar_status ctxpar_allgather_bwd(const ctxpar_run *run, const ctxpar_problem *pb,
                                   const ctxpar_tensor *q, const ctxpar_tensor *k,
                                   const ctxpar_tensor *v, const ctxpar_tensor *out,
                                   const float *lse, const ctxpar_tensor *dout, ctxpar_tensor *dq,
                                   ctxpar_tensor *dk, ctxpar_tensor *dv);

/* INVALID_ARG unless the heads divide as all-to-all needs: Hq by P, and Hkv by P or P by Hkv. */
ctxpar_status ctxpar_alltoall_check(const ctxpar_problem *pb);
ctxpar_status ctxpar_alltoall_fwd(const ctxpar_run *run, const ctxpar_problem *pb,
                                  const ctxpar_tensor *q, const ctxpar_tensor *k,
                                  const ctxpar_tensor *v, ctxpar_tensor *out, float *lse);
ctxpar_status ctxpar_alltoall_bwd(const ctxpar_run *run, const ctxpar_problem *pb,
                                  const ctxpar_tensor *q, const ctxpar_tensor *k,
                                  const ctxpar_tensor *v, const ctxpar_tensor *out,
                                  const float *lse, const ctxpar_tensor *dout, ctxpar_tensor *dq,
                                  ctxpar_tensor *dk, ctxpar_tensor *dv);

#ifdef __cplusplus
}
#endif

#endif /* CTXPAR_ALGORITHMS_H */
