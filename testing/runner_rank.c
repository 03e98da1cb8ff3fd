// One rank of a run: make the local shard, call the library, keep the local results and stats.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctxpar_backend.h"
#include "data.h"
#include "runner_internal.h"


typedef struct rank_trace {
    const ctxpar_run_config *cfg;
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

typedef struct local_tensors {
    ctxpar_tensor q, k, v, out, dout, dq, dk, dv;
    float *lse;
} local_tensors;

static void *zalloc(size_t bytes) { return calloc(1, bytes ? bytes : 1); }

static ctxpar_tensor make(const ctxpar_run_config *cfg, int64_t seq, int64_t heads) {
    size_t n = (size_t)(cfg->batch * seq * heads * cfg->head_dim);
    return ctxpar_tensor_bshd(zalloc(n * ctxpar_dtype_size(cfg->dtype)), cfg->dtype, cfg->batch,
                              seq, heads, cfg->head_dim);
}

static int alloc_local(const ctxpar_run_config *cfg, int64_t seq, local_tensors *t) {
    memset(t, 0, sizeof *t);
    t->q = make(cfg, seq, cfg->heads);
    t->k = make(cfg, seq, cfg->kv_heads);
    t->v = make(cfg, seq, cfg->kv_heads);
    t->out = make(cfg, seq, cfg->heads);
    t->lse = zalloc((size_t)(cfg->batch * cfg->heads * seq) * sizeof(float));
    int ok = t->q.data && t->k.data && t->v.data && t->out.data && t->lse;
    if (cfg->backward) {
        t->dout = make(cfg, seq, cfg->heads);
        t->dq = make(cfg, seq, cfg->heads);
        t->dk = make(cfg, seq, cfg->kv_heads);
        t->dv = make(cfg, seq, cfg->kv_heads);
        ok = ok && t->dout.data && t->dq.data && t->dk.data && t->dv.data;
    }
    return ok;
}

static void free_local(local_tensors *t) {
    void *p[] = {t->q.data,    t->k.data,  t->v.data,  t->out.data, t->lse,
                 t->dout.data, t->dq.data, t->dk.data, t->dv.data};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++)
        free(p[i]);
    memset(t, 0, sizeof *t);
}

// Moves the local results into the report (the report owns them afterwards).
static void keep_outputs(const ctxpar_run_config *cfg, local_tensors *t, ctxpar_rank_report *r) {
    size_t es = ctxpar_dtype_size(cfg->dtype);
    int64_t seq = t->q.shape[1];
    r->out.t[CTXPAR_T_OUT] = t->out.data;
    r->out.bytes[CTXPAR_T_OUT] = (size_t)(cfg->batch * seq * cfg->heads * cfg->head_dim) * es;
    r->out.t[CTXPAR_T_LSE] = t->lse;
    r->out.bytes[CTXPAR_T_LSE] = (size_t)(cfg->batch * cfg->heads * seq) * sizeof(float);
    t->out.data = NULL;
    t->lse = NULL;
    if (cfg->backward) {
        ctxpar_tensor *g[3] = {&t->dq, &t->dk, &t->dv};
        int64_t heads[3] = {cfg->heads, cfg->kv_heads, cfg->kv_heads};
        for (int i = 0; i < 3; i++) {
            r->out.t[CTXPAR_T_DQ + i] = g[i]->data;
            r->out.bytes[CTXPAR_T_DQ + i] =
                (size_t)(cfg->batch * seq * heads[i] * cfg->head_dim) * es;
            g[i]->data = NULL;
        }
    }
}

static ctxpar_status fail(ctxpar_rank_report *r, ctxpar_status st, int rank) {
    r->status = st;
    snprintf(r->message, sizeof r->message, "rank %d: %s: %s", rank, ctxpar_status_string(st),
             ctxpar_last_error());
    return st;
}

// The timed part: forward (and backward) `reps` times.
static ctxpar_status call(ctxpar_context *ctx, const ctxpar_run_config *cfg, local_tensors *t) {
    CTXPAR_CHECK(ctxpar_attn_fwd(ctx, &cfg->params, &t->q, &t->k, &t->v, &t->out, t->lse, NULL));
    if (cfg->backward)
        CTXPAR_CHECK(ctxpar_attn_bwd(ctx, &cfg->params, &t->q, &t->k, &t->v, &t->out, t->lse,
                                     &t->dout, &t->dq, &t->dk, &t->dv, NULL));
    return CTXPAR_OK;
}

void ctxpar_run_rank(const ctxpar_run_config *cfg, ctxpar_device *dev, ctxpar_comm *comm,
                     ctxpar_rank_report *r) {
    memset(r, 0, sizeof *r);
    const int rank = ctxpar_comm_rank(comm), P = ctxpar_comm_size(comm);
    const int64_t seq = cfg->seq / P;
    const int reps = cfg->repeat > 0 ? cfg->repeat : 1;
    ctxpar_context *ctx = NULL;
    local_tensors t;
    int64_t *pos = malloc((size_t)seq * sizeof *pos);
    double *times = malloc((size_t)reps * sizeof *times);
    rank_trace rt = {cfg, rank, 0, 0, 0, 0};
    ctxpar_status st;
    if (!alloc_local(cfg, seq, &t) || !pos || !times) {
        fail(r, CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "cannot allocate the local tensors"), rank);
        goto done;
    }
    ctxpar_context_options opts = CTXPAR_CONTEXT_OPTIONS_INIT;
    opts.verify_transfers = cfg->verify_transfers;
    CTXPAR_CHECK_GOTO(ctxpar_context_create(dev, comm, &opts, &ctx), st, failed);
    CTXPAR_CHECK_GOTO(ctxpar_context_set_trace(ctx, on_event, &rt), st, failed);
    CTXPAR_CHECK_GOTO(ctxpar_positions(cfg->params.layout, cfg->seq, rank, P, pos), st, failed);
    ctxpar_test_fill(&t.q, cfg->seed, CTXPAR_RUN_ID_Q, cfg->seq, pos);
    ctxpar_test_fill(&t.k, cfg->seed, CTXPAR_RUN_ID_K, cfg->seq, pos);
    ctxpar_test_fill(&t.v, cfg->seed, CTXPAR_RUN_ID_V, cfg->seq, pos);
    if (cfg->backward)
        ctxpar_test_fill(&t.dout, cfg->seed, CTXPAR_RUN_ID_DOUT, cfg->seq, pos);
    CTXPAR_CHECK_GOTO(ctxpar_attn_choose_algo(ctx, &cfg->params, &t.q, &t.k, &r->algo), st,
                      failed);
    CTXPAR_CHECK_GOTO(ctxpar_context_reset_peak(ctx), st, failed);
    CTXPAR_CHECK_GOTO(ctxpar_context_reset_work_stats(ctx), st, failed);
    uint64_t sent0 = 0;
    CTXPAR_CHECK_GOTO(ctxpar_context_bytes_sent(ctx, &sent0), st, failed);
    rt.active = 1;
    for (int i = 0; i < reps; i++) {
        // Start together, so that the time is the call's and not a late peer's.
        CTXPAR_CHECK_GOTO(ctxpar_comm_barrier(comm), st, failed);
        double t0 = ctxpar_now();
        CTXPAR_CHECK_GOTO(call(ctx, cfg, &t), st, failed);
        times[i] = ctxpar_now() - t0;
    }
    rt.active = 0;
    qsort(times, (size_t)reps, sizeof *times, cmp_double);
    r->time_s = times[reps / 2];
    r->stats.compute_s = rt.compute_s / reps;
    r->stats.transfer_s = rt.transfer_s / reps;
    r->stats.wait_s = rt.wait_s / reps;
    ctxpar_memory_stats ms;
    CTXPAR_CHECK_GOTO(ctxpar_context_memory_stats(ctx, &ms), st, failed);
    r->stats.peak_bytes = ms.peak_bytes;
    CTXPAR_CHECK_GOTO(ctxpar_context_bytes_sent(ctx, &r->stats.bytes_sent), st, failed);
    r->stats.bytes_sent = (r->stats.bytes_sent - sent0) / (uint64_t)reps;
    CTXPAR_CHECK_GOTO(ctxpar_context_work_stats(ctx, &r->stats.work), st, failed);
    r->stats.work.blocks_computed /= (uint64_t)reps;
    r->stats.work.blocks_skipped /= (uint64_t)reps;
    r->stats.work.flops /= reps;
    keep_outputs(cfg, &t, r);
    r->status = CTXPAR_OK;
    goto done;
failed:
    fail(r, st, rank);
done:
    ctxpar_context_destroy(ctx);
    free_local(&t);
    free(pos);
    free(times);
}

void ctxpar_rank_outputs_free(ctxpar_rank_outputs *out) {
    for (int i = 0; i < CTXPAR_RUN_TENSORS; i++) {
        free(out->t[i]);
        out->t[i] = NULL;
    }
}
