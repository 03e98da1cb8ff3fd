// One rank of a run: make the local shard, stage it in the device's memory, call the library
// (warm-up, then the timed calls), bring the local results back and keep them with the stats.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dispatch.h"
#include "runner_internal.h"

typedef struct rank_trace {
    const cpt_run_config *cfg;
    int rank;
    int active; // only the timed calls count
    double compute_s, transfer_s, wait_s;
} rank_trace;

static void on_event(void *user, const ctxpar_trace_event *ev) {
    rank_trace *rt = user;
    if (!rt->active)
        return;
    double d = ev->t_end - ev->t_begin;
    if (ev->kind == CTXPAR_EVENT_COMPUTE)
        rt->compute_s += d;
    else if (ev->kind == CTXPAR_EVENT_TRANSFER)
        rt->transfer_s += d;
    else
        rt->wait_s += d;
    if (rt->cfg->trace)
        rt->cfg->trace(rt->cfg->trace_user, rt->rank, ev);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return v[n / 2];
}

// The local tensors of one rank, each twice: on the host (filled, read back) and in the device's
// memory (what the library is given; for the CPU backend that is host memory too). L_LSE_LO: the
// LSE's low part (params.lse_lo), which the backward reads when the forward wrote it.
enum { L_Q, L_K, L_V, L_DOUT, L_OUT, L_LSE, L_DQ, L_DK, L_DV, L_LSE_LO, L_COUNT };

typedef struct local_set {
    const cpt_run_config *cfg;
    ctxpar_device *dev;
    int64_t seq;   // local: this rank's shard
    int64_t seq_q; // rows of q, dout, out, lse, dq: the shard, or params.q_len
    void *host[L_COUNT];
    void *devp[L_COUNT];
    size_t bytes[L_COUNT];
    ctxpar_attn_params params; // cfg's, with the sinks and dsinks in the device's memory
    float *sinks, *dsinks;     // device memory, [heads], or NULL
    // This rank's own stream on a device with streams (else NULL): ranks sharing one GPU then
    // overlap as separate GPUs would, instead of queueing on the device's default stream.
    ctxpar_stream *stream;
} local_set;

static int slot_used(const cpt_run_config *cfg, int i) {
    return i == L_Q || i == L_K || i == L_V || i == L_OUT || i == L_LSE || cfg->backward;
}

static int64_t slot_heads(const cpt_run_config *cfg, int i) {
    return i == L_K || i == L_V || i == L_DK || i == L_DV ? cfg->kv_heads : cfg->heads;
}

// v, dout, out and dv have v's head_dim (MLA).
static int64_t slot_dim(const cpt_run_config *cfg, int i) {
    return i == L_V || i == L_DOUT || i == L_OUT || i == L_DV ? cpt_run_dim_v(cfg)
                                                             : cfg->head_dim;
}

// The queries' slots have the queries' rows; k, v, dk, dv the shard's.
static int64_t slot_rows(const local_set *t, int i) {
    return i == L_K || i == L_V || i == L_DK || i == L_DV ? t->seq : t->seq_q;
}

static ctxpar_tensor slot_tensor(const local_set *t, int i, int on_device) {
    const cpt_run_config *c = t->cfg;
    return ctxpar_tensor_bshd(on_device ? t->devp[i] : t->host[i], c->dtype, c->batch,
                              slot_rows(t, i), slot_heads(c, i), slot_dim(c, i));
}

// Stages the sinks (cfg: host memory) in the device's memory, with room for dsinks.
static ctxpar_status stage_sinks(local_set *t) {
    const cpt_run_config *c = t->cfg;
    t->params = c->params;
    t->params.dsinks = NULL;
    if (!c->params.sinks)
        return CTXPAR_OK;
    const size_t bytes = (size_t)c->heads * sizeof(float);
    CTXPAR_CHECK(ctxpar_dev_alloc(t->dev, bytes, CTXPAR_MEM_DEVICE, (void **)&t->sinks));
    CTXPAR_CHECK(ctxpar_dev_copy(t->dev, t->sinks, c->params.sinks, bytes, CTXPAR_COPY_H2D, NULL));
    CTXPAR_CHECK(ctxpar_dev_stream_sync(t->dev, NULL));
    t->params.sinks = t->sinks;
    if (c->backward) {
        CTXPAR_CHECK(ctxpar_dev_alloc(t->dev, bytes, CTXPAR_MEM_DEVICE, (void **)&t->dsinks));
        t->params.dsinks = t->dsinks;
    }
    return CTXPAR_OK;
}

static ctxpar_status alloc_local(local_set *t) {
    const cpt_run_config *c = t->cfg;
    for (int i = 0; i < L_COUNT; i++) {
        if (!slot_used(c, i))
            continue;
        t->bytes[i] =
            i == L_LSE || i == L_LSE_LO
                ? (size_t)(c->batch * c->heads * t->seq_q) * sizeof(float)
                : (size_t)(c->batch * slot_rows(t, i) * slot_heads(c, i) * slot_dim(c, i)) *
                      ctxpar_dtype_size(c->dtype);
        if (t->bytes[i] == 0) // a rank with no tokens still passes real (unread) pointers
            t->bytes[i] = 1;
        t->host[i] = calloc(1, t->bytes[i]);
        if (!t->host[i])
            return CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "cannot allocate %zu host bytes",
                                t->bytes[i]);
        CTXPAR_CHECK(ctxpar_dev_alloc(t->dev, t->bytes[i], CTXPAR_MEM_DEVICE, &t->devp[i]));
    }
    return CTXPAR_OK;
}

static void free_local(local_set *t) {
    for (int i = 0; i < L_COUNT; i++) {
        free(t->host[i]);
        if (t->devp[i])
            ctxpar_dev_free(t->dev, t->devp[i], t->bytes[i], CTXPAR_MEM_DEVICE);
        t->host[i] = t->devp[i] = NULL;
    }
    const size_t sink_bytes = (size_t)t->cfg->heads * sizeof(float);
    if (t->sinks)
        ctxpar_dev_free(t->dev, t->sinks, sink_bytes, CTXPAR_MEM_DEVICE);
    if (t->dsinks)
        ctxpar_dev_free(t->dev, t->dsinks, sink_bytes, CTXPAR_MEM_DEVICE);
    t->sinks = t->dsinks = NULL;
}

// Copies slots [first, last] that are used between host and device, and waits for the copies.
static ctxpar_status copy_slots(local_set *t, int first, int last, ctxpar_copy_kind kind) {
    for (int i = first; i <= last; i++) {
        if (!t->host[i])
            continue;
        void *dst = kind == CTXPAR_COPY_H2D ? t->devp[i] : t->host[i];
        const void *src = kind == CTXPAR_COPY_H2D ? t->host[i] : t->devp[i];
        CTXPAR_CHECK(ctxpar_dev_copy(t->dev, dst, src, t->bytes[i], kind, NULL));
    }
    return ctxpar_dev_stream_sync(t->dev, NULL);
}

// Moves the host copies of the results into the report (the report owns them afterwards).
static ctxpar_status keep_outputs(local_set *t, cpt_rank_report *r) {
    static const int slot_of[CPT_RUN_TENSORS] = {L_OUT, L_LSE, L_DQ, L_DK, L_DV};
    for (int i = 0; i < CPT_RUN_TENSORS; i++) {
        r->out.t[i] = t->host[slot_of[i]];
        r->out.bytes[i] = t->bytes[slot_of[i]];
        t->host[slot_of[i]] = NULL;
    }
    if (!t->dsinks)
        return CTXPAR_OK;
    const size_t bytes = (size_t)t->cfg->heads * sizeof(float);
    r->out.dsinks = malloc(bytes);
    if (!r->out.dsinks)
        return CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "cannot allocate dsinks");
    CTXPAR_CHECK(ctxpar_dev_copy(t->dev, r->out.dsinks, t->dsinks, bytes, CTXPAR_COPY_D2H, NULL));
    return ctxpar_dev_stream_sync(t->dev, NULL);
}

static ctxpar_status fail(cpt_rank_report *r, ctxpar_status st, int rank) {
    r->status = st;
    snprintf(r->message, sizeof r->message, "rank %d: %s: %s", rank, ctxpar_status_string(st),
             ctxpar_last_error());
    return st;
}

// One call: forward (and backward), each waited for, so that the times are the work's. The
// forward's time goes to *fwd_s.
static ctxpar_status call(ctxpar_context *ctx, ctxpar_comm *comm, local_set *t, double *fwd_s,
                          double *total_s) {
    const cpt_run_config *cfg = t->cfg;
    ctxpar_tensor q = slot_tensor(t, L_Q, 1), k = slot_tensor(t, L_K, 1),
                  v = slot_tensor(t, L_V, 1), out = slot_tensor(t, L_OUT, 1);
    float *lse = t->devp[L_LSE];
    ctxpar_attn_params params = t->params;
    params.lse_lo = t->devp[L_LSE_LO]; // NULL without a backward
    // Start together, so that the time is the call's and not a late peer's.
    CTXPAR_CHECK(ctxpar_comm_barrier(comm));
    double t0 = ctxpar_now();
    CTXPAR_CHECK(ctxpar_attn_fwd(ctx, &params, &q, &k, &v, &out, lse, t->stream));
    CTXPAR_CHECK(ctxpar_dev_stream_sync(t->dev, t->stream));
    double t1 = ctxpar_now();
    if (cfg->backward) {
        ctxpar_tensor dout = slot_tensor(t, L_DOUT, 1), dq = slot_tensor(t, L_DQ, 1),
                      dk = slot_tensor(t, L_DK, 1), dv = slot_tensor(t, L_DV, 1);
        CTXPAR_CHECK(
            ctxpar_attn_bwd(ctx, &params, &q, &k, &v, &out, lse, &dout, &dq, &dk, &dv, t->stream));
        CTXPAR_CHECK(ctxpar_dev_stream_sync(t->dev, t->stream));
    }
    *fwd_s = t1 - t0;
    *total_s = ctxpar_now() - t0;
    return CTXPAR_OK;
}

// pos: the shard's positions; q_pos: the queries' (pos itself without params.q_len).
static ctxpar_status fill_inputs(local_set *t, int rank, int P, const int64_t *pos,
                                 const int64_t *q_pos) {
    static const int ids[4] = {CPT_RUN_ID_Q, CPT_RUN_ID_K, CPT_RUN_ID_V,
                               CPT_RUN_ID_DOUT};
    for (int i = L_Q; i <= L_DOUT; i++) {
        if (!t->host[i])
            continue;
        ctxpar_tensor h = slot_tensor(t, i, 0);
        CTXPAR_CHECK(
            cpt_run_fill_local(t->cfg, ids[i], rank, P, i == L_K || i == L_V ? pos : q_pos, &h));
    }
    return copy_slots(t, L_Q, L_DOUT, CTXPAR_COPY_H2D);
}

void cpt_run_rank(const cpt_run_config *cfg, ctxpar_device *dev, ctxpar_comm *comm,
                     cpt_rank_report *r) {
    memset(r, 0, sizeof *r);
    const int rank = ctxpar_comm_rank(comm), P = ctxpar_comm_size(comm);
    const int reps = cfg->repeat > 0 ? cfg->repeat : 1;
    char stage[32];
    snprintf(stage, sizeof stage, "%d rank%s", P, P > 1 ? "s" : "");
    ctxpar_context *ctx = NULL;
    local_set t = {.cfg = cfg, .dev = dev, .seq = cpt_run_local_seq(cfg, rank, P)};
    const int64_t q_len = cfg->params.q_len;
    t.seq_q = q_len > 0 ? q_len : t.seq;
    int64_t *pos = t.seq >= 0 ? malloc((size_t)(t.seq + t.seq_q) * sizeof *pos + 1) : NULL;
    double *times = malloc((size_t)reps * sizeof *times);
    double *fwd_times = malloc((size_t)reps * sizeof *fwd_times);
    rank_trace rt = {cfg, rank, 0, 0, 0, 0};
    ctxpar_status st;
    if (t.seq < 0) { // the layout helpers' own message (a bad assignment) says why
        char why[400];
        snprintf(why, sizeof why, "%s", ctxpar_last_error());
        fail(r, CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "seq %lld cannot be sharded: %s",
                             (long long)cfg->seq, why), rank);
        goto done;
    }
    if (!pos || !times || !fwd_times) {
        fail(r, CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "cannot allocate %d timings", reps), rank);
        goto done;
    }
    CTXPAR_CHECK_GOTO(alloc_local(&t), st, failed);
    CTXPAR_CHECK_GOTO(stage_sinks(&t), st, failed);
    ctxpar_context_options opts = CTXPAR_CONTEXT_OPTIONS_INIT;
    opts.verify_transfers = cfg->verify_transfers;
    if (ctxpar_dev_has_streams(dev))
        CTXPAR_CHECK_GOTO(ctxpar_dev_stream_create(dev, &t.stream), st, failed);
    CTXPAR_CHECK_GOTO(ctxpar_context_create(dev, comm, &opts, &ctx), st, failed);
    CTXPAR_CHECK_GOTO(ctxpar_context_set_trace(ctx, on_event, &rt), st, failed);
    CTXPAR_CHECK_GOTO(ctxpar_positions_assigned(cfg->params.layout, cfg->params.assignment,
                                                cfg->seq, rank, P, pos),
                      st, failed);
    int64_t *q_pos = pos + t.seq; // the last q_len positions, on every rank
    for (int64_t i = 0; q_len > 0 && i < q_len; i++)
        q_pos[i] = cfg->seq - q_len + i;
    CTXPAR_CHECK_GOTO(fill_inputs(&t, rank, P, pos, q_len > 0 ? q_pos : pos), st, failed);
    ctxpar_tensor q = slot_tensor(&t, L_Q, 1), k = slot_tensor(&t, L_K, 1);
    CTXPAR_CHECK_GOTO(ctxpar_attn_choose_algo(ctx, &cfg->params, &q, &k, &r->algo), st, failed);
    double fwd_s, total_s;
    // The staged tensors are the caller's, not the library's: count from here. (Measured before
    // the calls: the context's workspace, kept from the warm-up on, is the library's.)
    ctxpar_memory_stats ms;
    CTXPAR_CHECK_GOTO(ctxpar_context_memory_stats(ctx, &ms), st, failed);
    const size_t staged = ms.current_bytes;
    for (int i = 0; i < cfg->warmup; i++) {
        if (rank == 0)
            cpt_run_progress(cfg, "warm-up", i, cfg->warmup);
        CTXPAR_CHECK_GOTO(call(ctx, comm, &t, &fwd_s, &total_s), st, failed);
    }
    CTXPAR_CHECK_GOTO(ctxpar_context_reset_peak(ctx), st, failed);
    const uint64_t allocs0 = ctxpar_dev_books_of(dev)->alloc_count; // device allocations of the timed calls
    CTXPAR_CHECK_GOTO(ctxpar_context_reset_work_stats(ctx), st, failed);
    uint64_t sent0 = 0;
    CTXPAR_CHECK_GOTO(ctxpar_context_bytes_sent(ctx, &sent0), st, failed);
    rt.active = 1;
    for (int i = 0; i < reps; i++) {
        if (rank == 0)
            cpt_run_progress(cfg, stage, i, reps);
        CTXPAR_CHECK_GOTO(call(ctx, comm, &t, &fwd_times[i], &times[i]), st, failed);
    }
    rt.active = 0;
    r->stats.allocations = (ctxpar_dev_books_of(dev)->alloc_count - allocs0) / (uint64_t)reps;
    if (rank == 0)
        cpt_run_progress(cfg, stage, reps, reps);
    r->time_s = median(times, reps); // sorts: the ends are the fastest and the slowest
    r->time_fwd_s = median(fwd_times, reps);
    r->time_min_s = times[0];
    r->time_max_s = times[reps - 1];
    r->time_fwd_min_s = fwd_times[0];
    r->time_fwd_max_s = fwd_times[reps - 1];
    ctxpar_dev_describe(dev, r->device, sizeof r->device);
    r->stats.compute_s = rt.compute_s / reps;
    r->stats.transfer_s = rt.transfer_s / reps;
    r->stats.wait_s = rt.wait_s / reps;
    CTXPAR_CHECK_GOTO(ctxpar_context_memory_stats(ctx, &ms), st, failed);
    r->stats.peak_bytes = ms.peak_bytes > staged ? ms.peak_bytes - staged : 0;
    CTXPAR_CHECK_GOTO(ctxpar_context_bytes_sent(ctx, &r->stats.bytes_sent), st, failed);
    r->stats.bytes_sent = (r->stats.bytes_sent - sent0) / (uint64_t)reps;
    CTXPAR_CHECK_GOTO(ctxpar_context_work_stats(ctx, &r->stats.work), st, failed);
    r->stats.work.blocks_computed /= (uint64_t)reps;
    r->stats.work.blocks_skipped /= (uint64_t)reps;
    r->stats.work.flops /= reps;
    CTXPAR_CHECK_GOTO(copy_slots(&t, L_OUT, L_DV, CTXPAR_COPY_D2H), st, failed);
    CTXPAR_CHECK_GOTO(keep_outputs(&t, r), st, failed);
    r->status = CTXPAR_OK;
    goto done;
failed:
    fail(r, st, rank);
done:
    ctxpar_context_destroy(ctx);
    ctxpar_dev_stream_destroy(dev, t.stream); // NULL: nothing
    free_local(&t);
    free(pos);
    free(times);
    free(fwd_times);
}

void cpt_rank_outputs_free(cpt_rank_outputs *out) {
    for (int i = 0; i < CPT_RUN_TENSORS; i++) {
        free(out->t[i]);
        out->t[i] = NULL;
    }
    free(out->dsinks);
    out->dsinks = NULL;
}
