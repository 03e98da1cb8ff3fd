// Decode over a sharded KV cache (params.q_len > 0): every rank holds the same q_len queries and
// its own slice of the keys. Each rank attends its queries to its slice, the partial (out, lse)
// of every rank are all-gathered, and every rank merges them by LSE in rank order, so that all
// ranks hold the same bits of the whole result. K/V never move: a step sends P - 1 partials of
// B x q_len x Hq x (Dv + 1) floats per rank. Forward only.
#include <math.h>

#include "algorithms.h"
#include "ctxpar_count.h"
#include "registry.h"

// One rank's partial: out [B, N, Hq, Dv] then lse [B, Hq, N], F32, back to back.
static size_t part_out_n(const ctxpar_problem *pb) {
    return ctxpar_count(pb->batch, ctxpar_problem_q_rows(pb), pb->heads_q, pb->head_dim_v);
}
static size_t part_rows(const ctxpar_problem *pb) {
    return ctxpar_count(pb->batch, pb->heads_q, ctxpar_problem_q_rows(pb), 1);
}
static size_t part_bytes(const ctxpar_problem *pb) {
    return (part_out_n(pb) + part_rows(pb)) * sizeof(float);
}

typedef struct decode_ws {
    float *mine;     // this rank's partial
    float *gathered; // every rank's, in rank order (P > 1)
    float *out_acc, *lse_acc, *lse_lo;
    void *fold; // the sinks' fold (NULL without sinks)
} decode_ws;

static size_t decode_layout(const ctxpar_problem *pb, char *base, decode_ws *w) {
    ctxpar_carve c = {base, 0};
    w->mine = ctxpar_carve_take(&c, part_bytes(pb));
    w->gathered =
        pb->nranks > 1 ? ctxpar_carve_take(&c, part_bytes(pb) * (size_t)pb->nranks) : NULL;
    w->out_acc = ctxpar_carve_take(&c, part_out_n(pb) * sizeof(float));
    w->lse_acc = ctxpar_carve_take(&c, part_rows(pb) * sizeof(float));
    w->lse_lo = ctxpar_carve_take(&c, part_rows(pb) * sizeof(float));
    w->fold = pb->sinks ? ctxpar_carve_take(&c, ctxpar_sinks_fold_bytes(
                                                    pb, ctxpar_problem_q_rows(pb), pb->heads_q))
                        : NULL;
    return c.used;
}

static size_t decode_workspace_bytes(const ctxpar_problem *pb) {
    decode_ws w;
    return decode_layout(pb, NULL, &w);
}

// This rank's queries against its slice of the keys, into `part`. A slice none of the queries
// sees (no keys, or all masked) gives the empty partial: out 0, lse -inf.
static ctxpar_status local_part(const ctxpar_run *run, const ctxpar_problem *pb,
                                const ctxpar_tensor *q, const ctxpar_tensor *k,
                                const ctxpar_tensor *v, float *part) {
    float *out = part, *lse = part + part_out_n(pb);
    ctxpar_attn_block blk = {.struct_size = sizeof blk,
                             .q = *q,
                             .k = *k,
                             .v = *v,
                             .q_pos = ctxpar_problem_q_spans(pb),
                             .k_pos = ctxpar_problem_spans(pb, pb->rank),
                             .mask = pb->mask,
                             .scale = pb->scale,
                             .softcap = pb->softcap};
    if (pb->seq_local == 0 || !ctxpar_block_account(run, pb, blk.q_pos, blk.k_pos)) {
        CTXPAR_CHECK(ctxpar_dev_fill(run->dev, out, 0.0f, part_out_n(pb), run->stream));
        return ctxpar_dev_fill(run->dev, lse, -INFINITY, part_rows(pb), run->stream);
    }
    double t0 = ctxpar_now();
    CTXPAR_CHECK(ctxpar_dev_attn_block_fwd(run->dev, &blk, out, lse, 0, run->stream));
    ctxpar_run_trace(run, CTXPAR_EVENT_COMPUTE, "fwd", -1, -1, t0, ctxpar_now(), 0);
    return CTXPAR_OK;
}

static ctxpar_status gather_parts(const ctxpar_run *run, const ctxpar_problem *pb,
                                  const decode_ws *w) {
    const size_t bytes = part_bytes(pb);
    const double t0 = ctxpar_now();
    ctxpar_request *req = NULL;
    CTXPAR_CHECK(ctxpar_comm_allgather(run->comm, w->mine, w->gathered, bytes, run->stream, &req));
    CTXPAR_CHECK(ctxpar_comm_wait(run->comm, req, run->stream));
    const double t1 = ctxpar_now();
    ctxpar_run_trace(run, CTXPAR_EVENT_TRANSFER, "allgather_partials", -1, -1, t0, t1,
                     bytes * (uint64_t)(pb->nranks - 1));
    ctxpar_run_trace(run, CTXPAR_EVENT_WAIT, "allgather_partials", -1, -1, t0, t1, 0);
    return CTXPAR_OK;
}

static ctxpar_status decode_fwd(const ctxpar_run *run, const ctxpar_problem *pb,
                                const ctxpar_tensor *q, const ctxpar_tensor *k,
                                const ctxpar_tensor *v, ctxpar_tensor *out, float *lse) {
    decode_ws w;
    void *base = NULL;
    CTXPAR_CHECK(ctxpar_run_workspace(run, decode_layout(pb, NULL, &w), &base));
    (void)decode_layout(pb, base, &w);
    CTXPAR_CHECK(local_part(run, pb, q, k, v, w.mine));
    const float *parts = w.mine;
    if (pb->nranks > 1) {
        CTXPAR_CHECK(gather_parts(run, pb, &w));
        parts = w.gathered;
    }
    // Rank 0's partial, then the others merged in rank order: the same bits on every rank.
    const size_t n_out = part_out_n(pb), n_rows = part_rows(pb);
    const size_t stride = n_out + n_rows;
    CTXPAR_CHECK(ctxpar_dev_copy(run->dev, w.out_acc, parts, n_out * sizeof(float), CTXPAR_COPY_D2D,
                                 run->stream));
    CTXPAR_CHECK(ctxpar_dev_copy(run->dev, w.lse_acc, parts + n_out, n_rows * sizeof(float),
                                 CTXPAR_COPY_D2D, run->stream));
    for (int j = 1; j < pb->nranks; j++) {
        const float *p = parts + (size_t)j * stride;
        CTXPAR_CHECK(ctxpar_dev_attn_merge(run->dev, w.out_acc, w.lse_acc, p, p + n_out, pb->batch,
                                           ctxpar_problem_q_rows(pb), pb->heads_q, pb->head_dim_v,
                                           run->stream));
    }
    // The merged LSE is F32 alone: its low part is 0.
    CTXPAR_CHECK(ctxpar_dev_fill(run->dev, w.lse_lo, 0.0f, n_rows, run->stream));
    return ctxpar_store_fwd(run, pb, w.out_acc, w.lse_acc, w.lse_lo, w.fold, out, lse);
}

static ctxpar_status decode_bwd(const ctxpar_run *run, const ctxpar_problem *pb,
                                const ctxpar_tensor *q, const ctxpar_tensor *k,
                                const ctxpar_tensor *v, const ctxpar_tensor *out, const float *lse,
                                const ctxpar_tensor *dout, ctxpar_tensor *dq, ctxpar_tensor *dk,
                                ctxpar_tensor *dv) {
    (void)run, (void)pb, (void)q, (void)k, (void)v, (void)out, (void)lse, (void)dout, (void)dq,
        (void)dk, (void)dv;
    return CTXPAR_ERROR(CTXPAR_ERR_NOT_SUPPORTED, "the decode algorithm is forward only");
}

static ctxpar_status decode_check(const ctxpar_problem *pb) {
    if (pb->q_len == 0)
        return CTXPAR_ERROR(CTXPAR_ERR_NOT_SUPPORTED,
                            "the decode algorithm needs params.q_len > 0 (queries every rank "
                            "holds, shorter than the keys)");
    return CTXPAR_OK;
}

// The replicated queries against this rank's slice.
static void decode_blocks(const ctxpar_problem *pb, ctxpar_attn_query *q) {
    q->seq_q = pb->q_len;
    q->seq_k = pb->seq_max; // the same bound on every rank
}

// In the table's unit (docs/algorithms.md, "AUTO": values per head_dim element and
// (S/P)·(P-1)/P rows): P - 1 partials of q_len x Hq x (Dv + 1) values against all-gather's
// 2·Hkv·P. No K/V is held beyond the caller's.
static double decode_cost(const ctxpar_problem *pb) {
    const double P = pb->nranks;
    return (double)pb->heads_q * P * P * (double)pb->q_len / (double)pb->seq_global *
           (double)(pb->head_dim_v + 1) / (double)pb->head_dim;
}

const ctxpar_algorithm ctxpar_decode_algorithm = {
    .id = CTXPAR_ALGO_DECODE,
    .name = "decode",
    .check = decode_check,
    .forward = decode_fwd,
    .backward = decode_bwd,
    .blocks = decode_blocks,
    .workspace_bytes = decode_workspace_bytes,
    .cost = decode_cost,
    .short_queries = 1,
};
