/*
 * algorithms.h - the context-parallel algorithms, written once against the device and comm
 * vtables (through the ctxpar_dev_* / ctxpar_comm_* wrappers of ctxpar_backend.h).
 *
 * The front door (core/attn.c) validates arguments and checks that ranks agree before calling
 * any of these; here, inputs are known to be well formed.
 */
#ifndef CTXPAR_ALGORITHMS_H
#define CTXPAR_ALGORITHMS_H

#include "dispatch.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Layouts (layout.c): which global positions each rank holds, for any length S >= 1 and any P.
 * Built-in layouts split S as evenly as their granule allows (shards differ by at most one token,
 * a rank may hold none when S < P); CUSTOM follows the caller's assignment. A rank's positions
 * are a list of spans in increasing order (runs of consecutive positions for CUSTOM).
 */

/* The hybrid's largest all-to-all group. */
#define CTXPAR_MAX_ULYSSES 16

/* Tokens `rank` holds; assignment is read only for CUSTOM (valid: checked by the caller). */
int64_t ctxpar_layout_count(ctxpar_layout layout, const int32_t *assignment, int64_t seq_global,
                            int rank, int nranks);

/* The largest rank's count; -1 when out of memory (CUSTOM counts every rank). */
int64_t ctxpar_layout_max_count(ctxpar_layout layout, const int32_t *assignment,
                                int64_t seq_global, int nranks);

/* Every rank's spans, built once per call (host memory). */
typedef struct ctxpar_layout_map {
    int nranks;
    int64_t seq_global;
    int64_t *count;    /* [P] tokens of each rank */
    int64_t *first;    /* [P + 1]: rank r's spans are span[first[r] .. first[r + 1]) */
    ctxpar_span *span; /* all ranks' spans, rank by rank; none is empty */
} ctxpar_layout_map;

ctxpar_status ctxpar_layout_map_make(ctxpar_layout layout, const int32_t *assignment,
                                     int64_t seq_global, int nranks, ctxpar_layout_map *map_out);
void ctxpar_layout_map_free(ctxpar_layout_map *map);
/* The map of nranks / g ranks in which rank i holds the positions of ranks i*g .. i*g+g-1 of `m`
 * (the hybrid's ring over its all-to-all groups): their spans in position order, adjacent ones
 * merged, so that a zigzag group's front chunks form one span and its back chunks another.
 * span_row (NULL, or one entry per span of m) gets the row of the group's rows where each span
 * of m starts. */
ctxpar_status ctxpar_layout_map_group(const ctxpar_layout_map *m, int g, ctxpar_layout_map *out,
                                      int64_t *span_row);

static inline ctxpar_spans ctxpar_layout_map_spans(const ctxpar_layout_map *m, int rank) {
    ctxpar_spans s = {m->span + m->first[rank], (int)(m->first[rank + 1] - m->first[rank])};
    return s;
}

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
    int64_t ulysses; /* params.ulysses (hybrid: 0 = chosen) */
    int comm_splits; /* the comm has the split op (the hybrid needs it) */
    /* The largest rank's token count: what every buffer that travels is sized by (a block of
     * rank j holds its own count of rows, densely packed, at the front). */
    int64_t seq_max;
    const int32_t *assignment;     /* CTXPAR_LAYOUT_CUSTOM's (params.assignment) */
    const ctxpar_layout_map *map;  /* set by the front door for the attention calls */
    int64_t head_dim_v;   /* of v, out, dout, dv (MLA: may differ from head_dim) */
    float softcap;        /* > 0: soft-capped scores (ctxpar_attn_block) */
    const float *sinks;   /* [Hq] device memory, or NULL (sinks.c) */
    float *dsinks;        /* [Hq] device memory, or NULL */
    int64_t sinks_hash;   /* of the sink values' bits, for the agreement check */
    float *lse_lo; /* params.lse_lo: the caller's LSE low part [B, Hq, S/P], or NULL */
    /* params.q_len: 0, or the queries every rank holds at the last q_len global positions (then
     * seq_local and the map are the keys' shards); q_span: their positions with q_len. */
    int64_t q_len;
    ctxpar_span q_span;
    int reproducible; /* params.reproducible: chunked blocks, binned sums (repro.h) */
} ctxpar_problem;

/* Rank j's token count and positions in a problem. */
static inline int64_t ctxpar_problem_count(const ctxpar_problem *pb, int j) {
    return pb->map->count[j];
}
static inline ctxpar_spans ctxpar_problem_spans(const ctxpar_problem *pb, int j) {
    return ctxpar_layout_map_spans(pb->map, j);
}
/* The rows of this rank's q, out and lse: its shard's, or q_len. */
static inline int64_t ctxpar_problem_q_rows(const ctxpar_problem *pb) {
    return pb->q_len ? pb->q_len : pb->seq_local;
}
/* The positions of this rank's queries: its shard, or the last q_len positions. */
static inline ctxpar_spans ctxpar_problem_q_spans(const ctxpar_problem *pb) {
    if (pb->q_len == 0)
        return ctxpar_problem_spans(pb, pb->rank);
    ctxpar_spans s = {&pb->q_span, 1};
    return s;
}

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

/* A dry run's cache for counting the visible pairs of blocks whose key span holds a whole
 * residue class of the sequence (every position b + t·d, as a striped shard does) against the same
 * query span, block after block (common.c): made once per query span, it counts each such block
 * in O(log rows) instead of row by row. Real runs have none (NULL): they count row by row. */
typedef struct ctxpar_count_cache ctxpar_count_cache;
ctxpar_status ctxpar_count_cache_create(ctxpar_count_cache **cache_out);
void ctxpar_count_cache_destroy(ctxpar_count_cache *cache);

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
    /* The running algorithm's state kept between calls (ctxpar_algorithm.state_bytes), or NULL
     * when it has none. */
    void *state;
    /* A dry run's data shared by every rank (ctxpar_algorithm.dry_make); NULL: none. */
    void *dry;
    /* The dry run's count cache (ctxpar_count_cache); NULL: none. */
    ctxpar_count_cache *counts;
} ctxpar_run;

/* Reports one trace event if tracing is on. */
void ctxpar_run_trace(const ctxpar_run *run, ctxpar_event_kind kind, const char *name, int step,
                      int peer, double t_begin, double t_end, uint64_t bytes);

/* How many keys of span k query position q sees under the mask (closed form). */
int64_t ctxpar_visible_keys(const ctxpar_mask_desc *m, int64_t q, const ctxpar_span *k,
                            int64_t seq_global);

/* Whether span k holds a whole residue class of the sequence: every position b + t·d of
 * [0, seq_global) for one b in [0, d), d > 1 (a striped shard; a striped member of a hybrid
 * group). Such blocks have closed-form counts against any query span (ctxpar_count_cache). */
static inline int ctxpar_span_whole_class(const ctxpar_span *k, int64_t seq_global) {
    return k->stride > 1 && k->start >= 0 && k->start < k->stride && k->len >= 1 &&
           k->start + k->len * k->stride >= seq_global;
}

/* Counts the (q span, k span) pairs of one block for the work statistics; returns whether any
 * pair has visible entries (0: the whole block is masked out and can be skipped). */
int ctxpar_block_account(const ctxpar_run *run, const ctxpar_problem *pb, ctxpar_spans q_pos,
                         ctxpar_spans k_pos);

/* Above this many (q span, k span) pairs in a block (a custom layout's runs),
 * ctxpar_block_account classifies the lists as a whole and counts the pairs per query. */
#define CTXPAR_SPAN_PAIRS_MAX 256

/* Whether the spans are runs (stride 1, or one position) in increasing order, not overlapping. */
int ctxpar_spans_sorted_runs(ctxpar_spans k);

/* The FLOPs (as ctxpar_block_account counts them) of the queries of q_pos against every key of
 * the sequence: O(queries). */
double ctxpar_row_flops(const ctxpar_problem *pb, ctxpar_spans q_pos);

/* Whether the spans' first positions and their last positions both never decrease from one
 * span to the next (a layout's spans, a hybrid group's). */
int ctxpar_spans_ordered(ctxpar_spans s);

/* The spans k.span[*j0 .. *j1) that may hold a key some query of span q sees, when k is ordered
 * (ctxpar_spans_ordered): every other one is masked from all of q by the causal and window
 * bounds or the documents of q's first and last query, a block ctxpar_mask_classify calls SKIP.
 * Not ordered: all of them. O(log k.count). */
void ctxpar_spans_reach(const ctxpar_mask_desc *mask, const ctxpar_span *q, ctxpar_spans k,
                        int ordered, int *j0, int *j1);

/* Whether any query of the q spans may see any key of the k spans (an exact SKIP claim when 0;
 * with many spans, the lists are classified as a whole). */
int ctxpar_spans_interact(const ctxpar_mask_desc *mask, ctxpar_spans q, ctxpar_spans k);

/* Copies rank j's local rows (`local`: [B, S/P, H, D] in its shard order) to their global
 * positions in `global` ([B, S, H, D]), or back (to_global = 0). Any dtypes (cast). */
ctxpar_status ctxpar_move_shard_rows(const ctxpar_run *run, const ctxpar_problem *pb, int j,
                                     const ctxpar_tensor *local, const ctxpar_tensor *global,
                                     int to_global);

/* K and V of `seq` rows packed back to back in one buffer: K [B, seq, Hkv, D] then V
 * [B, seq, Hkv, Dv] of `dtype`; which = 0 for K, 1 for V. */
ctxpar_tensor ctxpar_packed_kv(void *buf, ctxpar_dtype dtype, const ctxpar_problem *pb, int64_t seq,
                               int which);
size_t ctxpar_packed_kv_bytes(ctxpar_dtype dtype, const ctxpar_problem *pb, int64_t seq);

/* Copies the local k and v into a packed buffer of the problem's dtype. */
ctxpar_status ctxpar_pack_kv(const ctxpar_run *run, const ctxpar_problem *pb,
                             const ctxpar_tensor *k, const ctxpar_tensor *v, void *buf);

/* Folds the sinks in (pb->sinks: fold_scratch holds ctxpar_sinks_fold_bytes for the local rows),
 * then casts the F32 accumulators to the caller's out and copies lse (may be NULL) and the LSE's
 * low part lse_lo_acc into pb->lse_lo (when both are set). */
ctxpar_status ctxpar_store_fwd(const ctxpar_run *run, const ctxpar_problem *pb, float *out_acc,
                               float *lse_acc, float *lse_lo_acc, void *fold_scratch,
                               ctxpar_tensor *out, float *lse);

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

/* Attention sinks (sinks.c, docs/numerics.md). The forward folds each head's sink logit into its
 * finished rows once, after every merge: lse' = logaddexp(lse, sink), out' = out e^(lse - lse')
 * (an attn_merge with a zero partial), over `seq` rows of `heads` heads starting at head0, with
 * out_acc [B, seq, heads, Dv] and lse_acc [B, heads, seq]; `scratch` holds
 * ctxpar_sinks_fold_bytes. */
size_t ctxpar_sinks_fold_bytes(const ctxpar_problem *pb, int64_t seq, int64_t heads);
ctxpar_status ctxpar_sinks_fold(const ctxpar_run *run, const ctxpar_problem *pb, float *out_acc,
                                float *lse_acc, int64_t seq, int64_t heads, int64_t head0,
                                void *scratch);
/* dsinks[h] = -sum over batch and every rank's rows of e^(sink_h - lse) * rowsum(dout * out),
 * summed across ranks in rank order (every rank gets the same bits) and written to pb->dsinks.
 * Collective; run after the backward, from the caller's out, dout and lse (local rows). */
ctxpar_status ctxpar_sinks_backward(const ctxpar_run *run, const ctxpar_problem *pb,
                                    const ctxpar_tensor *out, const ctxpar_tensor *dout,
                                    const float *lse);
/* The workspace ctxpar_sinks_backward takes. */
size_t ctxpar_sinks_backward_bytes(const ctxpar_problem *pb);
/* Copies n sink values starting at head h0 to the host (synchronised). */
ctxpar_status ctxpar_sinks_read(ctxpar_device *dev, const float *sinks, int64_t h0, int64_t n,
                                float *host);

/* Each algorithm (ring.c, allgather.c, alltoall.c, hybrid.c) is an entry of the table in
 * registry.h. */

#ifdef __cplusplus
}
#endif

#endif /* CTXPAR_ALGORITHMS_H */
