// All-gather attention. Every rank gathers all K/V, puts them in global order and runs one block
// over the whole sequence: the kernel then sees exactly what a single rank would, so the forward
// output is bitwise identical to P = 1 for any P and layout. Backward computes dK/dV for the whole
// sequence and reduce-scatters the F32 partials (summed in rank order) back to their owners.
#include <string.h>

#include "algorithms.h"
#include "ctxpar_count.h"
#include "registry.h"
#include "repro.h"

// Gathers every rank's packed K/V and writes it in global order into kv_global
// ([2][B, S, Hkv, D]). `gathered` holds P packed blocks.
static ctxpar_status gather_kv(const ctxpar_run *run, const ctxpar_problem *pb, void *local,
                               void *gathered, void *kv_global) {
    const int P = pb->nranks;
    const size_t block = ctxpar_packed_kv_bytes(pb->dtype, pb, pb->seq_max);
    double t0 = ctxpar_now();
    if (P > 1) {
        ctxpar_request *req = NULL;
        CTXPAR_CHECK(ctxpar_comm_allgather(run->comm, local, gathered, block, run->stream, &req));
        CTXPAR_CHECK(ctxpar_comm_wait(run->comm, req, run->stream));
        double t1 = ctxpar_now();
        ctxpar_run_trace(run, CTXPAR_EVENT_TRANSFER, "allgather_kv", -1, -1, t0, t1,
                         block * (uint64_t)(P - 1));
        ctxpar_run_trace(run, CTXPAR_EVENT_WAIT, "allgather_kv", -1, -1, t0, t1, 0);
    } else {
        gathered = local;
    }
    for (int j = 0; j < P; j++) {
        for (int which = 0; which < 2; which++) {
            // Rank j's block: its own count of rows, packed at the front.
            ctxpar_tensor src = ctxpar_packed_kv((char *)gathered + (size_t)j * block, pb->dtype,
                                                 pb, ctxpar_problem_count(pb, j), which);
            ctxpar_tensor dst = ctxpar_packed_kv(kv_global, pb->dtype, pb, pb->seq_global, which);
            CTXPAR_CHECK(ctxpar_move_shard_rows(run, pb, j, &src, &dst, 1));
        }
    }
    return CTXPAR_OK;
}

// The whole sequence as one key block, plus the local queries.
static ctxpar_attn_block whole_block(const ctxpar_problem *pb, ctxpar_spans qs,
                                     const ctxpar_span *all, const ctxpar_tensor *q,
                                     void *kv_global) {
    ctxpar_attn_block blk = {.struct_size = sizeof blk,
                             .q = *q,
                             .k = ctxpar_packed_kv(kv_global, pb->dtype, pb, pb->seq_global, 0),
                             .v = ctxpar_packed_kv(kv_global, pb->dtype, pb, pb->seq_global, 1),
                             .q_pos = qs,
                             .k_pos = {all, 1},
                             .mask = pb->mask,
                             .scale = pb->scale,
                             .softcap = pb->softcap};
    return blk;
}

// The buffers of both directions: the local packed K/V, the gathered blocks and the global K/V;
// the forward's accumulators; the backward's dQ, delta, global dK/dV, its per-rank blocks and
// this rank's reduced block. NULL where a direction does not use one.
typedef struct allgather_ws {
    void *local, *gathered, *kv_global;
    float *out_acc, *lse_acc, *lse_lo;
    void *fold; // the sinks' fold (NULL without sinks)
    float *dq_acc, *delta;
    void *dkv_global, *dkv_blocks, *dkv_mine;
    // Reproducible mode: the bins of out or dQ, the global dK/dV's and P blocks' of them each
    // way, and the chunk pairs' temporaries.
    void *bins, *send, *recv;
    ctxpar_repro_scratch rs;
} allgather_ws;

// Reproducible mode's backward: dQ's bins, the global dK/dV bins, P blocks of them to send and
// P received (summed into the first), this rank's F32 dK/dV.
static size_t allgather_repro_bwd_layout(const ctxpar_problem *pb, ctxpar_carve *c,
                                         allgather_ws *w) {
    const int P = pb->nranks;
    const size_t block = ctxpar_repro_dkv_bytes(pb, pb->seq_max, pb->heads_kv);
    w->dq_acc = ctxpar_carve_take(
        c, ctxpar_count(pb->batch, pb->seq_local, pb->heads_q, pb->head_dim) * sizeof(float));
    w->delta = ctxpar_carve_take(c, ctxpar_count(pb->batch, pb->heads_q, pb->seq_local, 1) *
                                        sizeof(float));
    w->bins = ctxpar_carve_take(c, ctxpar_repro_dq_bytes(pb, pb->seq_local, pb->heads_q));
    w->dkv_global = ctxpar_carve_take(c, ctxpar_repro_dkv_bytes(pb, pb->seq_global, pb->heads_kv));
    w->send = ctxpar_carve_take(c, block * (size_t)P);
    w->recv = P > 1 ? ctxpar_carve_take(c, block * (size_t)P) : w->send;
    w->dkv_mine = ctxpar_carve_take(c, ctxpar_packed_kv_bytes(CTXPAR_DTYPE_F32, pb, pb->seq_max));
    ctxpar_repro_scratch_carve(pb, pb->seq_local, 1, c, &w->rs);
    return c->used;
}

static size_t allgather_layout(const ctxpar_problem *pb, int backward, char *base,
                               allgather_ws *w) {
    const int P = pb->nranks;
    const size_t block = ctxpar_packed_kv_bytes(pb->dtype, pb, pb->seq_max);
    const size_t q_n = ctxpar_count(pb->batch, pb->seq_local, pb->heads_q, pb->head_dim);
    const size_t row_n = ctxpar_count(pb->batch, pb->heads_q, ctxpar_problem_q_rows(pb), 1);
    const size_t dkv_global = ctxpar_packed_kv_bytes(CTXPAR_DTYPE_F32, pb, pb->seq_global);
    ctxpar_carve c = {base, 0};
    memset(w, 0, sizeof *w);
    w->local = ctxpar_carve_take(&c, block);
    w->gathered = P > 1 ? ctxpar_carve_take(&c, block * (size_t)P) : NULL;
    w->kv_global = ctxpar_carve_take(&c, ctxpar_packed_kv_bytes(pb->dtype, pb, pb->seq_global));
    if (!backward) {
        w->out_acc = ctxpar_carve_take(
            &c, ctxpar_count(pb->batch, ctxpar_problem_q_rows(pb), pb->heads_q, pb->head_dim_v) *
                    sizeof(float));
        w->lse_acc = ctxpar_carve_take(&c, row_n * sizeof(float));
        if (pb->sinks)
            w->fold = ctxpar_carve_take(
                &c, ctxpar_sinks_fold_bytes(pb, ctxpar_problem_q_rows(pb), pb->heads_q));
        w->lse_lo = ctxpar_carve_take(&c, row_n * sizeof(float));
        if (pb->reproducible) {
            w->bins = ctxpar_carve_take(&c, ctxpar_repro_out_bytes(pb, pb->seq_local, pb->heads_q));
            ctxpar_repro_scratch_carve(pb, pb->seq_local, 0, &c, &w->rs);
        }
        return c.used;
    }
    if (pb->reproducible)
        return allgather_repro_bwd_layout(pb, &c, w);
    w->dq_acc = ctxpar_carve_take(&c, q_n * sizeof(float));
    w->delta = ctxpar_carve_take(&c, row_n * sizeof(float));
    w->dkv_global = ctxpar_carve_take(&c, dkv_global);
    // P blocks sized for the largest shard: more than the sequence when shards are uneven.
    const size_t blocks = ctxpar_packed_kv_bytes(CTXPAR_DTYPE_F32, pb, pb->seq_max) * (size_t)P;
    w->dkv_blocks = ctxpar_carve_take(&c, blocks > dkv_global ? blocks : dkv_global);
    // This rank's reduced dK/dV lands where the gathered K/V were (dead once in global order)
    // when it fits: the backward then holds no more than the forward plus the gradients.
    const size_t mine = ctxpar_packed_kv_bytes(CTXPAR_DTYPE_F32, pb, pb->seq_max);
    if (P == 1)
        w->dkv_mine = w->dkv_blocks;
    else if (block * (size_t)P >= mine)
        w->dkv_mine = w->gathered;
    else
        w->dkv_mine = ctxpar_carve_take(&c, mine);
    return c.used;
}

static size_t ctxpar_allgather_workspace_bytes(const ctxpar_problem *pb) {
    allgather_ws w;
    size_t fwd = allgather_layout(pb, 0, NULL, &w), bwd = allgather_layout(pb, 1, NULL, &w);
    return fwd > bwd ? fwd : bwd;
}

// Lays out the workspace and fills the global K/V.
static ctxpar_status setup(const ctxpar_run *run, const ctxpar_problem *pb, int backward,
                           const ctxpar_tensor *k, const ctxpar_tensor *v, allgather_ws *w) {
    void *base = NULL;
    CTXPAR_CHECK(ctxpar_run_workspace(run, allgather_layout(pb, backward, NULL, w), &base));
    (void)allgather_layout(pb, backward, base, w);
    CTXPAR_CHECK(ctxpar_pack_kv(run, pb, k, v, w->local));
    return gather_kv(run, pb, w->local, w->gathered, w->kv_global);
}

static ctxpar_status ctxpar_allgather_fwd(const ctxpar_run *run, const ctxpar_problem *pb,
                                          const ctxpar_tensor *q, const ctxpar_tensor *k,
                                          const ctxpar_tensor *v, ctxpar_tensor *out, float *lse) {
    allgather_ws w;
    CTXPAR_CHECK(setup(run, pb, 0, k, v, &w));
    ctxpar_span all = {0, pb->seq_global, 1};
    ctxpar_attn_block blk = whole_block(pb, ctxpar_problem_q_spans(pb), &all, q, w.kv_global);
    (void)ctxpar_block_account(run, pb, blk.q_pos, blk.k_pos);
    blk.lse_lo = w.lse_lo; // 0 stands for a device that does not keep it
    CTXPAR_CHECK(ctxpar_dev_fill(run->dev, w.lse_lo, 0.0f,
                                 ctxpar_count(pb->batch, pb->heads_q, ctxpar_problem_q_rows(pb), 1),
                                 run->stream));
    if (pb->reproducible) {
        CTXPAR_CHECK(ctxpar_repro_clear(run, pb, w.bins, 0, pb->seq_local, pb->heads_q));
        double t0 = ctxpar_now();
        CTXPAR_CHECK(ctxpar_repro_fwd_block(run, &blk, w.bins, &w.rs));
        ctxpar_run_trace(run, CTXPAR_EVENT_COMPUTE, "fwd", -1, -1, t0, ctxpar_now(), 0);
        CTXPAR_CHECK(ctxpar_repro_fwd_finish(run, pb, w.bins, pb->seq_local, pb->heads_q, w.out_acc,
                                             w.lse_acc, w.lse_lo));
    } else if (ctxpar_problem_q_rows(pb) > 0) {
        // The kernel handles rows that see nothing (out 0, lse -inf), so it runs unless this
        // rank holds no rows at all.
        double t0 = ctxpar_now();
        CTXPAR_CHECK(
            ctxpar_dev_attn_block_fwd(run->dev, &blk, w.out_acc, w.lse_acc, 0, run->stream));
        ctxpar_run_trace(run, CTXPAR_EVENT_COMPUTE, "fwd", -1, -1, t0, ctxpar_now(), 0);
    }
    return ctxpar_store_fwd(run, pb, w.out_acc, w.lse_acc, w.lse_lo, w.fold, out, lse);
}

// Rearranges the global dK/dV ([2][B, S, Hkv, D] F32) into P packed per-rank blocks in the
// layout's order, ready for reduce-scatter.
static ctxpar_status scatter_order(const ctxpar_run *run, const ctxpar_problem *pb,
                                   void *dkv_global, void *dkv_blocks) {
    const size_t block = ctxpar_packed_kv_bytes(CTXPAR_DTYPE_F32, pb, pb->seq_max);
    for (int j = 0; j < pb->nranks; j++) {
        for (int which = 0; which < 2; which++) {
            ctxpar_tensor global =
                ctxpar_packed_kv(dkv_global, CTXPAR_DTYPE_F32, pb, pb->seq_global, which);
            ctxpar_tensor local =
                ctxpar_packed_kv((char *)dkv_blocks + (size_t)j * block, CTXPAR_DTYPE_F32, pb,
                                 ctxpar_problem_count(pb, j), which);
            CTXPAR_CHECK(ctxpar_move_shard_rows(run, pb, j, &local, &global, 0));
        }
    }
    return CTXPAR_OK;
}

// Reproducible mode: the chunk pairs into bins; each rank's dK/dV bins go to it whole (exact
// sums cannot travel as F32) and are summed there.
static ctxpar_status allgather_repro_bwd(const ctxpar_run *run, const ctxpar_problem *pb,
                                         allgather_ws *w, const ctxpar_tensor *q,
                                         const ctxpar_tensor *out, const float *lse,
                                         const ctxpar_tensor *dout, ctxpar_tensor *dq,
                                         ctxpar_tensor *dk, ctxpar_tensor *dv) {
    const int P = pb->nranks;
    const int64_t S = pb->seq_global, M = pb->seq_max, Hkv = pb->heads_kv;
    const size_t block = ctxpar_repro_dkv_bytes(pb, M, Hkv);
    CTXPAR_CHECK(ctxpar_dev_attn_bwd_prep(run->dev, out, dout, w->delta, run->stream));
    CTXPAR_CHECK(ctxpar_repro_clear(run, pb, w->bins, 1, pb->seq_local, pb->heads_q));
    CTXPAR_CHECK(ctxpar_repro_clear(run, pb, w->dkv_global, 2, S, Hkv));
    ctxpar_span all = {0, S, 1};
    ctxpar_attn_block blk =
        whole_block(pb, ctxpar_problem_spans(pb, pb->rank), &all, q, w->kv_global);
    if (ctxpar_block_account(run, pb, blk.q_pos, blk.k_pos)) {
        double t0 = ctxpar_now();
        CTXPAR_CHECK(ctxpar_repro_bwd_block(run, pb, &blk, dout, lse, pb->lse_lo, w->delta, w->bins,
                                            w->dkv_global, S, &w->rs));
        ctxpar_run_trace(run, CTXPAR_EVENT_COMPUTE, "bwd", -1, -1, t0, ctxpar_now(), 0);
    }
    for (int j = 0; j < P; j++) { // rank j's rows, at the front of its block
        char *to = (char *)w->send + (size_t)j * block;
        CTXPAR_CHECK(ctxpar_repro_clear(run, pb, to, 2, M, Hkv));
        ctxpar_spans sp = ctxpar_problem_spans(pb, j);
        int64_t row = 0;
        for (int i = 0; i < sp.count; row += sp.span[i].len, i++)
            CTXPAR_CHECK(ctxpar_repro_dkv_move(run, pb, w->dkv_global, S, sp.span[i].start, to, M,
                                               row, sp.span[i].len, Hkv));
    }
    if (P > 1) {
        ctxpar_request *req = NULL;
        double t0 = ctxpar_now();
        CTXPAR_CHECK(ctxpar_comm_alltoall(run->comm, w->send, w->recv, block, run->stream, &req));
        CTXPAR_CHECK(ctxpar_comm_wait(run->comm, req, run->stream));
        double t1 = ctxpar_now();
        ctxpar_run_trace(run, CTXPAR_EVENT_TRANSFER, "alltoall_dkv_bins", -1, -1, t0, t1,
                         block * (uint64_t)(P - 1));
        ctxpar_run_trace(run, CTXPAR_EVENT_WAIT, "alltoall_dkv_bins", -1, -1, t0, t1, 0);
    }
    for (int i = 1; i < P; i++)
        CTXPAR_CHECK(
            ctxpar_repro_dkv_merge(run, pb, w->recv, (char *)w->recv + (size_t)i * block, M, Hkv));
    CTXPAR_CHECK(ctxpar_repro_dq_finish(run, pb, w->bins, pb->seq_local, pb->heads_q, w->dq_acc));
    CTXPAR_CHECK(ctxpar_repro_dkv_finish(run, pb, w->recv, M, Hkv, w->dkv_mine));
    ctxpar_tensor dq_t = ctxpar_tensor_bshd(w->dq_acc, CTXPAR_DTYPE_F32, pb->batch, pb->seq_local,
                                            pb->heads_q, pb->head_dim);
    ctxpar_tensor dk_t = ctxpar_packed_kv(w->dkv_mine, CTXPAR_DTYPE_F32, pb, M, 0);
    ctxpar_tensor dv_t = ctxpar_packed_kv(w->dkv_mine, CTXPAR_DTYPE_F32, pb, M, 1);
    dk_t.shape[1] = dv_t.shape[1] = pb->seq_local; // rows beyond the shard stay behind
    CTXPAR_CHECK(ctxpar_dev_cast(run->dev, &dq_t, dq, run->stream));
    CTXPAR_CHECK(ctxpar_dev_cast(run->dev, &dk_t, dk, run->stream));
    return ctxpar_dev_cast(run->dev, &dv_t, dv, run->stream);
}

static ctxpar_status ctxpar_allgather_bwd(const ctxpar_run *run, const ctxpar_problem *pb,
                                          const ctxpar_tensor *q, const ctxpar_tensor *k,
                                          const ctxpar_tensor *v, const ctxpar_tensor *out,
                                          const float *lse, const ctxpar_tensor *dout,
                                          ctxpar_tensor *dq, ctxpar_tensor *dk, ctxpar_tensor *dv) {
    const int P = pb->nranks;
    const size_t q_n = ctxpar_count(pb->batch, pb->seq_local, pb->heads_q, pb->head_dim);
    const size_t dkv_global_bytes = ctxpar_packed_kv_bytes(CTXPAR_DTYPE_F32, pb, pb->seq_global);
    const size_t dkv_block_bytes = ctxpar_packed_kv_bytes(CTXPAR_DTYPE_F32, pb, pb->seq_max);
    allgather_ws w;
    ctxpar_status st;
    CTXPAR_CHECK(setup(run, pb, 1, k, v, &w));
    if (pb->reproducible)
        return allgather_repro_bwd(run, pb, &w, q, out, lse, dout, dq, dk, dv);
    float *dq_acc = w.dq_acc, *delta = w.delta;
    void *kv_global = w.kv_global, *dkv_global = w.dkv_global, *dkv_blocks = w.dkv_blocks,
         *dkv_mine = w.dkv_mine;
    CTXPAR_CHECK_GOTO(ctxpar_dev_attn_bwd_prep(run->dev, out, dout, delta, run->stream), st, done);
    CTXPAR_CHECK_GOTO(ctxpar_dev_fill(run->dev, dq_acc, 0.0f, q_n, run->stream), st, done);
    CTXPAR_CHECK_GOTO(ctxpar_dev_fill(run->dev, dkv_global, 0.0f,
                                      dkv_global_bytes / sizeof(float), run->stream),
                      st, done);
    ctxpar_span all = {0, pb->seq_global, 1};
    ctxpar_attn_block blk =
        whole_block(pb, ctxpar_problem_spans(pb, pb->rank), &all, q, kv_global);
    blk.lse_lo = pb->lse_lo;
    if (ctxpar_block_account(run, pb, blk.q_pos, blk.k_pos)) {
        float *dk_g = dkv_global;
        float *dv_g = dk_g + ctxpar_count(pb->batch, pb->seq_global, pb->heads_kv, pb->head_dim);
        double t0 = ctxpar_now();
        CTXPAR_CHECK_GOTO(ctxpar_dev_attn_block_bwd(run->dev, &blk, dout, lse, delta, dq_acc, dk_g,
                                                    dv_g, run->stream),
                          st, done);
        ctxpar_run_trace(run, CTXPAR_EVENT_COMPUTE, "bwd", -1, -1, t0, ctxpar_now(), 0);
    }
    if (pb->seq_max * (int64_t)P != pb->seq_global) // uneven: the blocks' tails are summed too
        CTXPAR_CHECK_GOTO(ctxpar_dev_fill(run->dev, dkv_blocks, 0.0f,
                                          dkv_block_bytes / sizeof(float) * (size_t)P,
                                          run->stream),
                          st, done);
    CTXPAR_CHECK_GOTO(scatter_order(run, pb, dkv_global, dkv_blocks), st, done);
    if (P > 1) {
        ctxpar_request *req = NULL;
        double t0 = ctxpar_now();
        CTXPAR_CHECK_GOTO(ctxpar_comm_reduce_scatter(run->comm, dkv_blocks, dkv_mine,
                                                     dkv_block_bytes / sizeof(float), run->stream,
                                                     &req),
                          st, done);
        CTXPAR_CHECK_GOTO(ctxpar_comm_wait(run->comm, req, run->stream), st, done);
        double t1 = ctxpar_now();
        ctxpar_run_trace(run, CTXPAR_EVENT_TRANSFER, "reduce_scatter_dkv", -1, -1, t0, t1,
                         dkv_block_bytes * (uint64_t)(P - 1));
        ctxpar_run_trace(run, CTXPAR_EVENT_WAIT, "reduce_scatter_dkv", -1, -1, t0, t1, 0);
    }
    ctxpar_tensor dq_t = ctxpar_tensor_bshd(dq_acc, CTXPAR_DTYPE_F32, pb->batch, pb->seq_local,
                                            pb->heads_q, pb->head_dim);
    ctxpar_tensor dk_t = ctxpar_packed_kv(dkv_mine, CTXPAR_DTYPE_F32, pb, pb->seq_local, 0);
    ctxpar_tensor dv_t = ctxpar_packed_kv(dkv_mine, CTXPAR_DTYPE_F32, pb, pb->seq_local, 1);
    CTXPAR_CHECK_GOTO(ctxpar_dev_cast(run->dev, &dq_t, dq, run->stream), st, done);
    CTXPAR_CHECK_GOTO(ctxpar_dev_cast(run->dev, &dk_t, dk, run->stream), st, done);
    st = ctxpar_dev_cast(run->dev, &dv_t, dv, run->stream);
done:
    return st;
}

// All-gather moves what the ring moves (2·Hkv·P values per rank, docs/algorithms.md) and holds
// the whole K/V at once: the part of it beyond the local Q and out it sits beside is counted
// against it. Where the gathered K/V is no larger (Hkv·P <= Hq, GQA with few K/V heads) it wins
// the tie with the ring (the 0.5) for its bitwise reproducibility and its single large transfer.
// With params.q_len the Q and out beside it are q_len rows, not S/P.
static double allgather_cost(const ctxpar_problem *pb) {
    const double held = (double)pb->heads_kv * pb->nranks;
    const double beside =
        pb->q_len ? (double)pb->heads_q * (double)pb->q_len * pb->nranks / (double)pb->seq_global
                  : (double)pb->heads_q;
    return 2.0 * held + (held - beside) - 0.5;
}

// The local queries (or the q_len replicated ones) against the whole sequence, all heads.
static void allgather_blocks(const ctxpar_problem *pb, ctxpar_attn_query *q) {
    q->seq_q = pb->q_len ? pb->q_len : pb->seq_max; // the same bound on every rank
    q->seq_k = pb->seq_global;
}

static ctxpar_status allgather_check(const ctxpar_problem *pb) {
    if (!pb->reproducible)
        return CTXPAR_OK;
    if (pb->q_len)
        return CTXPAR_ERROR(CTXPAR_ERR_NOT_SUPPORTED,
                            "reproducible mode does not take queries shorter than the keys "
                            "(params.q_len %lld)",
                            (long long)pb->q_len);
    return ctxpar_repro_check_shards(pb, "allgather");
}

const ctxpar_algorithm ctxpar_allgather_algorithm = {
    .id = CTXPAR_ALGO_ALLGATHER,
    .name = "allgather",
    .check = allgather_check,
    .forward = ctxpar_allgather_fwd,
    .backward = ctxpar_allgather_bwd,
    .blocks = allgather_blocks,
    .workspace_bytes = ctxpar_allgather_workspace_bytes,
    .cost = allgather_cost,
    .short_queries = 1,
    .reproducible = 1,
};
