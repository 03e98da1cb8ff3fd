// All-gather attention. Every rank gathers all K/V, puts them in global order and runs one block
// over the whole sequence: the kernel then sees exactly what a single rank would, so the forward
// output is bitwise identical to P = 1 for any P and layout. Backward computes dK/dV for the whole
// sequence and reduce-scatters the F32 partials (summed in rank order) back to their owners.
#include "algorithms.h"
#include "ctxpar_count.h"

// Gathers every rank's packed K/V and writes it in global order into kv_global
// ([2][B, S, Hkv, D]). `gathered` holds P packed blocks.
static ctxpar_status gather_kv(const ctxpar_run *run, const ctxpar_problem *pb, void *local,
                               void *gathered, void *kv_global) {
    const int P = pb->nranks;
    const size_t block = ctxpar_packed_kv_bytes(pb->dtype, pb, pb->seq_local);
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
            ctxpar_tensor src = ctxpar_packed_kv((char *)gathered + (size_t)j * block, pb->dtype,
                                                 pb, pb->seq_local, which);
            ctxpar_tensor dst = ctxpar_packed_kv(kv_global, pb->dtype, pb, pb->seq_global, which);
            CTXPAR_CHECK(ctxpar_move_shard_rows(run, pb, j, &src, &dst, 1));
        }
    }
    return CTXPAR_OK;
}

// The whole sequence as one key block, plus the local queries.
static ctxpar_attn_block whole_block(const ctxpar_problem *pb, const ctxpar_shard_spans *qs,
                                     const ctxpar_span *all, const ctxpar_tensor *q,
                                     void *kv_global) {
    ctxpar_attn_block blk = {*q,
                             ctxpar_packed_kv(kv_global, pb->dtype, pb, pb->seq_global, 0),
                             ctxpar_packed_kv(kv_global, pb->dtype, pb, pb->seq_global, 1),
                             {qs->span, qs->count},
                             {all, 1},
                             pb->mask,
                             pb->scale};
    return blk;
}

// Allocates and fills the local packed K/V, the gather buffer and the global K/V.
static ctxpar_status setup_kv(const ctxpar_run *run, const ctxpar_problem *pb, ctxpar_buffers *buf,
                              const ctxpar_tensor *k, const ctxpar_tensor *v, void **kv_global) {
    const size_t block = ctxpar_packed_kv_bytes(pb->dtype, pb, pb->seq_local);
    void *local = NULL, *gathered = NULL;
    CTXPAR_CHECK(ctxpar_buffers_alloc(buf, block, &local));
    if (pb->nranks > 1)
        CTXPAR_CHECK(ctxpar_buffers_alloc(buf, block * (size_t)pb->nranks, &gathered));
    CTXPAR_CHECK(ctxpar_buffers_alloc(buf, ctxpar_packed_kv_bytes(pb->dtype, pb, pb->seq_global),
                                      kv_global));
    CTXPAR_CHECK(ctxpar_pack_kv(run, pb, k, v, local));
    return gather_kv(run, pb, local, gathered, *kv_global);
}

ctxpar_status ctxpar_allgather_fwd(const ctxpar_run *run, const ctxpar_problem *pb,
                                   const ctxpar_tensor *q, const ctxpar_tensor *k,
                                   const ctxpar_tensor *v, ctxpar_tensor *out, float *lse) {
    const size_t out_n = ctxpar_count(pb->batch, pb->seq_local, pb->heads_q, pb->head_dim);
    const size_t lse_n = ctxpar_count(pb->batch, pb->heads_q, pb->seq_local, 1);
    ctxpar_buffers buf = {.dev = run->dev, .stream = run->stream};
    void *kv_global = NULL;
    float *out_acc = NULL, *lse_acc = NULL;
    ctxpar_status st;
    CTXPAR_CHECK_GOTO(setup_kv(run, pb, &buf, k, v, &kv_global), st, done);
    CTXPAR_CHECK_GOTO(ctxpar_buffers_alloc(&buf, out_n * sizeof(float), (void **)&out_acc), st,
                      done);
    CTXPAR_CHECK_GOTO(ctxpar_buffers_alloc(&buf, lse_n * sizeof(float), (void **)&lse_acc), st,
                      done);
    ctxpar_shard_spans qs;
    ctxpar_layout_spans(pb->layout, pb->seq_global, pb->rank, pb->nranks, &qs);
    ctxpar_span all = {0, pb->seq_global, 1};
    ctxpar_attn_block blk = whole_block(pb, &qs, &all, q, kv_global);
    (void)ctxpar_block_account(run, pb, blk.q_pos, blk.k_pos);
    double t0 = ctxpar_now();
    // The kernel handles rows that see nothing (out 0, lse -inf), so it always runs.
    CTXPAR_CHECK_GOTO(ctxpar_dev_attn_block_fwd(run->dev, &blk, out_acc, lse_acc, 0, run->stream),
                      st, done);
    ctxpar_run_trace(run, CTXPAR_EVENT_COMPUTE, "fwd", -1, -1, t0, ctxpar_now(), 0);
    st = ctxpar_store_fwd(run, pb, out_acc, lse_acc, out, lse);
done:
    ctxpar_buffers_free(&buf);
    return st;
}

// Rearranges the global dK/dV ([2][B, S, Hkv, D] F32) into P packed per-rank blocks in the
// layout's order, ready for reduce-scatter.
static ctxpar_status scatter_order(const ctxpar_run *run, const ctxpar_problem *pb,
                                   void *dkv_global, void *dkv_blocks) {
    const size_t block = ctxpar_packed_kv_bytes(CTXPAR_DTYPE_F32, pb, pb->seq_local);
    for (int j = 0; j < pb->nranks; j++) {
        for (int which = 0; which < 2; which++) {
            ctxpar_tensor global =
                ctxpar_packed_kv(dkv_global, CTXPAR_DTYPE_F32, pb, pb->seq_global, which);
            ctxpar_tensor local = ctxpar_packed_kv((char *)dkv_blocks + (size_t)j * block,
                                                   CTXPAR_DTYPE_F32, pb, pb->seq_local, which);
            CTXPAR_CHECK(ctxpar_move_shard_rows(run, pb, j, &local, &global, 0));
        }
    }
    return CTXPAR_OK;
}

ctxpar_status ctxpar_allgather_bwd(const ctxpar_run *run, const ctxpar_problem *pb,
                                   const ctxpar_tensor *q, const ctxpar_tensor *k,
                                   const ctxpar_tensor *v, const ctxpar_tensor *out,
                                   const float *lse, const ctxpar_tensor *dout, ctxpar_tensor *dq,
                                   ctxpar_tensor *dk, ctxpar_tensor *dv) {
    const int P = pb->nranks;
    const size_t q_n = ctxpar_count(pb->batch, pb->seq_local, pb->heads_q, pb->head_dim);
    const size_t delta_n = ctxpar_count(pb->batch, pb->heads_q, pb->seq_local, 1);
    const size_t dkv_global_bytes = ctxpar_packed_kv_bytes(CTXPAR_DTYPE_F32, pb, pb->seq_global);
    const size_t dkv_block_bytes = ctxpar_packed_kv_bytes(CTXPAR_DTYPE_F32, pb, pb->seq_local);
    ctxpar_buffers buf = {.dev = run->dev, .stream = run->stream};
    void *kv_global = NULL, *dkv_global = NULL, *dkv_blocks = NULL, *dkv_mine = NULL;
    float *dq_acc = NULL, *delta = NULL;
    ctxpar_status st;
    CTXPAR_CHECK_GOTO(setup_kv(run, pb, &buf, k, v, &kv_global), st, done);
    CTXPAR_CHECK_GOTO(ctxpar_buffers_alloc(&buf, q_n * sizeof(float), (void **)&dq_acc), st, done);
    CTXPAR_CHECK_GOTO(ctxpar_buffers_alloc(&buf, delta_n * sizeof(float), (void **)&delta), st,
                      done);
    CTXPAR_CHECK_GOTO(ctxpar_buffers_alloc(&buf, dkv_global_bytes, &dkv_global), st, done);
    CTXPAR_CHECK_GOTO(ctxpar_buffers_alloc(&buf, dkv_global_bytes, &dkv_blocks), st, done);
    CTXPAR_CHECK_GOTO(ctxpar_dev_attn_bwd_prep(run->dev, out, dout, delta, run->stream), st, done);
    CTXPAR_CHECK_GOTO(ctxpar_dev_fill(run->dev, dq_acc, 0.0f, q_n, run->stream), st, done);
    CTXPAR_CHECK_GOTO(ctxpar_dev_fill(run->dev, dkv_global, 0.0f,
                                      dkv_global_bytes / sizeof(float), run->stream),
                      st, done);
    ctxpar_shard_spans qs;
    ctxpar_layout_spans(pb->layout, pb->seq_global, pb->rank, P, &qs);
    ctxpar_span all = {0, pb->seq_global, 1};
    ctxpar_attn_block blk = whole_block(pb, &qs, &all, q, kv_global);
    if (ctxpar_block_account(run, pb, blk.q_pos, blk.k_pos)) {
        float *dk_g = dkv_global;
        float *dv_g = dk_g + dkv_global_bytes / sizeof(float) / 2;
        double t0 = ctxpar_now();
        CTXPAR_CHECK_GOTO(ctxpar_dev_attn_block_bwd(run->dev, &blk, dout, lse, delta, dq_acc, dk_g,
                                                    dv_g, run->stream),
                          st, done);
        ctxpar_run_trace(run, CTXPAR_EVENT_COMPUTE, "bwd", -1, -1, t0, ctxpar_now(), 0);
    }
    CTXPAR_CHECK_GOTO(scatter_order(run, pb, dkv_global, dkv_blocks), st, done);
    dkv_mine = dkv_blocks;
    if (P > 1) {
        CTXPAR_CHECK_GOTO(ctxpar_buffers_alloc(&buf, dkv_block_bytes, &dkv_mine), st, done);
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
    ctxpar_buffers_free(&buf);
    return st;
}
