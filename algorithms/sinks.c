// Attention sinks (docs/numerics.md): one logit per query head in every row's softmax
// denominator. They touch no kernel: the forward folds them into the finished rows with one
// attn_merge against an empty partial whose lse is the sink, and the backward's dS needs nothing
// new (P is rebuilt from the folded lse); only the sinks' own gradient is computed here.
#include <math.h>
#include <stdlib.h>

#include "algorithms.h"
#include "ctxpar_count.h"

ctxpar_status ctxpar_sinks_read(ctxpar_device *dev, const float *sinks, int64_t h0, int64_t n,
                                float *host) {
    CTXPAR_CHECK(ctxpar_dev_copy(dev, host, sinks + h0, (size_t)n * sizeof(float),
                                 CTXPAR_COPY_D2H, NULL));
    return ctxpar_dev_stream_sync(dev, NULL);
}

static size_t rows_of(const ctxpar_problem *pb, int64_t seq, int64_t heads) {
    return ctxpar_count(pb->batch, heads, seq, 1);
}

size_t ctxpar_sinks_fold_bytes(const ctxpar_problem *pb, int64_t seq, int64_t heads) {
    if (!pb->sinks)
        return 0;
    return (rows_of(pb, seq, heads) * (size_t)(pb->head_dim_v + 1)) * sizeof(float);
}

ctxpar_status ctxpar_sinks_fold(const ctxpar_run *run, const ctxpar_problem *pb, float *out_acc,
                                float *lse_acc, int64_t seq, int64_t heads, int64_t head0,
                                void *scratch) {
    const size_t rows = rows_of(pb, seq, heads);
    if (rows == 0)
        return CTXPAR_OK;
    float *zeros = scratch, *lse_b = zeros + rows * (size_t)pb->head_dim_v;
    float *sink = malloc((size_t)heads * sizeof *sink);
    if (!sink)
        return CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "sinks: cannot allocate %lld floats",
                            (long long)heads);
    ctxpar_status st = ctxpar_dev_stream_sync(run->dev, run->stream);
    if (st == CTXPAR_OK)
        st = ctxpar_sinks_read(run->dev, pb->sinks, head0, heads, sink);
    if (st == CTXPAR_OK)
        st = ctxpar_dev_fill(run->dev, zeros, 0.0f, rows * (size_t)pb->head_dim_v, run->stream);
    for (int64_t b = 0; b < pb->batch && st == CTXPAR_OK; b++)
        for (int64_t h = 0; h < heads && st == CTXPAR_OK; h++)
            st = ctxpar_dev_fill(run->dev, lse_b + (size_t)((b * heads + h) * seq), sink[h],
                                 (size_t)seq, run->stream);
    free(sink);
    CTXPAR_CHECK(st);
    // lse' = logaddexp(lse, sink), out' = e^(lse - lse') out + e^(sink - lse') 0. A row that
    // sees no key (lse -inf) gets lse' = sink and keeps out = 0.
    return ctxpar_dev_attn_merge(run->dev, out_acc, lse_acc, zeros, lse_b, pb->batch, seq, heads,
                                 pb->head_dim_v, run->stream);
}

// A rank's part of the gradient: F32 per head, or (reproducible mode) a bins block of one value
// per head, so that the parts add up to the same bits for any split of the rows.
static size_t part_bytes(const ctxpar_problem *pb) {
    return pb->reproducible ? ctxpar_bins_bytes(pb->heads_q, 1)
                            : (size_t)pb->heads_q * sizeof(float);
}

size_t ctxpar_sinks_backward_bytes(const ctxpar_problem *pb) {
    if (!pb->sinks || !pb->dsinks)
        return 0;
    ctxpar_carve c = {NULL, 0};
    (void)ctxpar_carve_take(&c, rows_of(pb, pb->seq_local, pb->heads_q) * sizeof(float));
    (void)ctxpar_carve_take(&c, part_bytes(pb));
    (void)ctxpar_carve_take(&c, part_bytes(pb) * (size_t)pb->nranks);
    return c.used;
}

// This rank's part of every head's gradient: -sum over its rows of e^(sink - lse) delta, as F32
// per head, or (reproducible mode) binned terms (ctxpar_bins.h) in the block `part` points to.
static void local_part(const ctxpar_problem *pb, const float *sink, const float *lse,
                       const float *delta, float *part) {
    const int64_t S = pb->seq_local, H = pb->heads_q;
    ctxpar_bins_view bins = ctxpar_bins_at(part, H, 1);
    for (int64_t h = 0; h < H; h++) {
        double sum = 0.0;
        if (pb->reproducible)
            ctxpar_bins_clear_value(bins, h);
        for (int64_t b = 0; b < pb->batch; b++)
            for (int64_t s = 0; s < S; s++) {
                size_t i = (size_t)((b * H + h) * S + s);
                // delta is 0 on a row that sees nothing (out 0), whose P_sink is 1: no term.
                double t = exp((double)sink[h] - (double)lse[i]) * (double)delta[i];
                if (pb->reproducible) { // as two F32 terms: about 48 bits of it
                    const float hi = (float)-t;
                    ctxpar_bins_add_term(bins, h, hi, 0);
                    ctxpar_bins_add_term(bins, h, (float)(-t - (double)hi), 0);
                } else
                    sum += t;
            }
        if (!pb->reproducible)
            part[h] = (float)-sum;
    }
}

// Every rank's parts (P blocks of part_bytes) into dsinks per head, on every rank alike: F32
// parts added in rank order, or bins merged (in any order: the same bits).
static void total(const ctxpar_problem *pb, const float *all, float *dsinks) {
    const int64_t H = pb->heads_q;
    const int P = pb->nranks;
    if (!pb->reproducible) {
        for (int64_t h = 0; h < H; h++) {
            double sum = 0.0;
            for (int r = 0; r < P; r++)
                sum += (double)all[(size_t)r * (size_t)H + (size_t)h];
            dsinks[h] = (float)sum;
        }
        return;
    }
    const size_t bytes = part_bytes(pb);
    ctxpar_bins_view first = ctxpar_bins_at((void *)all, H, 1);
    for (int r = 1; r < P; r++) {
        ctxpar_bins_view b = ctxpar_bins_at((char *)all + (size_t)r * bytes, H, 1);
        for (int64_t h = 0; h < H; h++)
            ctxpar_bins_merge_value(first, h, b, h);
    }
    for (int64_t h = 0; h < H; h++)
        dsinks[h] = (float)ctxpar_bins_value(first, h);
}

ctxpar_status ctxpar_sinks_backward(const ctxpar_run *run, const ctxpar_problem *pb,
                                    const ctxpar_tensor *out, const ctxpar_tensor *dout,
                                    const float *lse) {
    const int64_t H = pb->heads_q;
    const int P = pb->nranks;
    const size_t rows = rows_of(pb, pb->seq_local, H);
    void *base = NULL;
    CTXPAR_CHECK(ctxpar_run_workspace(run, ctxpar_sinks_backward_bytes(pb), &base));
    ctxpar_carve c = {base, 0};
    float *delta = ctxpar_carve_take(&c, rows * sizeof(float));
    const size_t part = part_bytes(pb);
    float *send = ctxpar_carve_take(&c, part);
    float *recv = ctxpar_carve_take(&c, part * (size_t)P);
    // Host copies: delta and lse of the local rows, the sinks, every rank's parts (8-aligned:
    // bins blocks hold doubles).
    const size_t lead = (2 * rows + (size_t)H + 1) & ~(size_t)1;
    float *host = malloc(lead * sizeof(float) + part * (size_t)P);
    if (!host)
        return CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "dsinks: cannot allocate host buffers");
    float *h_delta = host, *h_lse = host + rows, *h_sink = h_lse + rows, *h_all = host + lead;
    ctxpar_status st = ctxpar_dev_attn_bwd_prep(run->dev, out, dout, delta, run->stream);
    if (st == CTXPAR_OK && rows > 0)
        st = ctxpar_dev_copy(run->dev, h_delta, delta, rows * sizeof(float), CTXPAR_COPY_D2H,
                             run->stream);
    if (st == CTXPAR_OK && rows > 0)
        st = ctxpar_dev_copy(run->dev, h_lse, lse, rows * sizeof(float), CTXPAR_COPY_D2H,
                             run->stream);
    if (st == CTXPAR_OK)
        st = ctxpar_dev_stream_sync(run->dev, run->stream);
    if (st == CTXPAR_OK)
        st = ctxpar_sinks_read(run->dev, pb->sinks, 0, H, h_sink);
    if (st == CTXPAR_OK) {
        local_part(pb, h_sink, h_lse, h_delta, h_all);
        st = ctxpar_dev_copy(run->dev, send, h_all, part, CTXPAR_COPY_H2D, run->stream);
    }
    if (st == CTXPAR_OK && P > 1) {
        ctxpar_request *req = NULL;
        double t0 = ctxpar_now();
        st = ctxpar_comm_allgather(run->comm, send, recv, part, run->stream, &req);
        if (st == CTXPAR_OK)
            st = ctxpar_comm_wait(run->comm, req, run->stream);
        if (st == CTXPAR_OK)
            ctxpar_run_trace(run, CTXPAR_EVENT_TRANSFER, "allgather_dsinks", -1, -1, t0,
                             ctxpar_now(), (uint64_t)part * (uint64_t)(P - 1));
        if (st == CTXPAR_OK)
            st = ctxpar_dev_copy(run->dev, h_all, recv, part * (size_t)P, CTXPAR_COPY_D2H,
                                 run->stream);
        if (st == CTXPAR_OK)
            st = ctxpar_dev_stream_sync(run->dev, run->stream);
    }
    if (st == CTXPAR_OK) {
        total(pb, h_all, h_sink); // the same bits on every rank
        st = ctxpar_dev_copy(run->dev, pb->dsinks, h_sink, (size_t)H * sizeof(float),
                             CTXPAR_COPY_H2D, run->stream);
    }
    if (st == CTXPAR_OK) // the host buffer is the source of an ordered copy
        st = ctxpar_dev_stream_sync(run->dev, run->stream);
    free(host);
    return st;
}
