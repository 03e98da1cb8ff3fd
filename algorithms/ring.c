// Ring attention. Rank r starts with its own K/V block; at step s it computes its queries against
// block (r - s) mod P while that block's successor arrives from r - 1 and the current one leaves
// for r + 1. Forward merges per-block (out, lse) partials; backward sends dK/dV partial sums
// around the ring behind K/V so that each block's gradient arrives back at its owner.
#include <math.h>

#include "transfer.h"

static int next_rank(const ctxpar_problem *pb) { return (pb->rank + 1) % pb->nranks; }
static int prev_rank(const ctxpar_problem *pb) { return (pb->rank + pb->nranks - 1) % pb->nranks; }
static int block_at(const ctxpar_problem *pb, int step) {
    return (pb->rank - step + pb->nranks) % pb->nranks;
}

ctxpar_status ctxpar_ring_fwd(const ctxpar_run *run, const ctxpar_problem *pb,
                              const ctxpar_tensor *q, const ctxpar_tensor *k,
                              const ctxpar_tensor *v, ctxpar_tensor *out, float *lse) {
    const int P = pb->nranks;
    const size_t kv_bytes = ctxpar_packed_kv_bytes(pb->dtype, pb, pb->seq_local);
    const size_t out_n = (size_t)(pb->batch * pb->seq_local * pb->heads_q * pb->head_dim);
    const size_t lse_n = (size_t)(pb->batch * pb->heads_q * pb->seq_local);
    ctxpar_buffers buf = {.dev = run->dev, .stream = run->stream};
    ctxpar_xfer x = {0};
    void *kv[2] = {NULL, NULL};
    float *out_acc = NULL, *lse_acc = NULL;
    ctxpar_status st;

    CTXPAR_CHECK_GOTO(ctxpar_buffers_alloc(&buf, kv_bytes + CTXPAR_XFER_TRAILER, &kv[0]), st, done);
    if (P > 1)
        CTXPAR_CHECK_GOTO(ctxpar_buffers_alloc(&buf, kv_bytes + CTXPAR_XFER_TRAILER, &kv[1]), st,
                          done);
    CTXPAR_CHECK_GOTO(ctxpar_buffers_alloc(&buf, out_n * sizeof(float), (void **)&out_acc), st,
                      done);
    CTXPAR_CHECK_GOTO(ctxpar_buffers_alloc(&buf, lse_n * sizeof(float), (void **)&lse_acc), st,
                      done);
    CTXPAR_CHECK_GOTO(ctxpar_pack_kv(run, pb, k, v, kv[0]), st, done);

    ctxpar_shard_spans qs;
    ctxpar_layout_spans(pb->layout, pb->seq_global, pb->rank, P, &qs);
    int have = 0; // whether out_acc/lse_acc hold a partial yet
    for (int s = 0; s < P; s++) {
        void *cur = kv[s % 2];
        if (s + 1 < P) // the next block travels while this one is computed
            CTXPAR_CHECK_GOTO(ctxpar_xfer_post(run, &x, "kv", s, cur, next_rank(pb),
                                               kv[(s + 1) % 2], prev_rank(pb), kv_bytes),
                              st, done);
        int j = block_at(pb, s);
        ctxpar_shard_spans ks;
        ctxpar_layout_spans(pb->layout, pb->seq_global, j, P, &ks);
        ctxpar_spans qp = {qs.span, qs.count}, kp = {ks.span, ks.count};
        if (ctxpar_block_account(run, pb, qp, kp)) {
            ctxpar_attn_block blk = {*q,
                                     ctxpar_packed_kv(cur, pb->dtype, pb, pb->seq_local, 0),
                                     ctxpar_packed_kv(cur, pb->dtype, pb, pb->seq_local, 1),
                                     qp,
                                     kp,
                                     pb->mask,
                                     pb->scale};
            double t0 = ctxpar_now();
            CTXPAR_CHECK_GOTO(
                ctxpar_dev_attn_block_fwd(run->dev, &blk, out_acc, lse_acc, have, run->stream),
                st, done);
            ctxpar_run_trace(run, CTXPAR_EVENT_COMPUTE, "fwd", s, j, t0, ctxpar_now(), 0);
            have = 1;
        }
        CTXPAR_CHECK_GOTO(ctxpar_xfer_wait(run, &x), st, done);
    }
    if (!have) { // no query of this rank sees any key: out 0, lse -inf
        CTXPAR_CHECK_GOTO(ctxpar_dev_fill(run->dev, out_acc, 0.0f, out_n, run->stream), st, done);
        CTXPAR_CHECK_GOTO(ctxpar_dev_fill(run->dev, lse_acc, -INFINITY, lse_n, run->stream), st,
                          done);
    }
    st = ctxpar_store_fwd(run, pb, out_acc, lse_acc, out, lse);
done:
    ctxpar_xfer_cancel(run, &x);
    ctxpar_buffers_free(&buf);
    return st;
}

ctxpar_status ctxpar_ring_bwd(const ctxpar_run *run, const ctxpar_problem *pb,
                              const ctxpar_tensor *q, const ctxpar_tensor *k,
                              const ctxpar_tensor *v, const ctxpar_tensor *out, const float *lse,
                              const ctxpar_tensor *dout, ctxpar_tensor *dq, ctxpar_tensor *dk,
                              ctxpar_tensor *dv) {
    const int P = pb->nranks;
    const size_t kv_bytes = ctxpar_packed_kv_bytes(pb->dtype, pb, pb->seq_local);
    const size_t dkv_bytes = ctxpar_packed_kv_bytes(CTXPAR_DTYPE_F32, pb, pb->seq_local);
    const size_t dkv_n = dkv_bytes / sizeof(float);
    const size_t q_n = (size_t)(pb->batch * pb->seq_local * pb->heads_q * pb->head_dim);
    const size_t delta_n = (size_t)(pb->batch * pb->heads_q * pb->seq_local);
    ctxpar_buffers buf = {.dev = run->dev, .stream = run->stream};
    ctxpar_xfer xkv = {0}, xd = {0};
    void *kv[2] = {NULL, NULL}, *dkv_loc[2] = {NULL, NULL}, *dkv_in = NULL;
    float *dq_acc = NULL, *delta = NULL;
    ctxpar_status st;

    CTXPAR_CHECK_GOTO(ctxpar_buffers_alloc(&buf, kv_bytes + CTXPAR_XFER_TRAILER, &kv[0]), st, done);
    CTXPAR_CHECK_GOTO(ctxpar_buffers_alloc(&buf, dkv_bytes + CTXPAR_XFER_TRAILER, &dkv_loc[0]), st,
                      done);
    if (P > 1) {
        CTXPAR_CHECK_GOTO(ctxpar_buffers_alloc(&buf, kv_bytes + CTXPAR_XFER_TRAILER, &kv[1]), st,
                          done);
        CTXPAR_CHECK_GOTO(ctxpar_buffers_alloc(&buf, dkv_bytes + CTXPAR_XFER_TRAILER, &dkv_loc[1]),
                          st, done);
        CTXPAR_CHECK_GOTO(ctxpar_buffers_alloc(&buf, dkv_bytes + CTXPAR_XFER_TRAILER, &dkv_in), st,
                          done);
    }
    CTXPAR_CHECK_GOTO(ctxpar_buffers_alloc(&buf, q_n * sizeof(float), (void **)&dq_acc), st, done);
    CTXPAR_CHECK_GOTO(ctxpar_buffers_alloc(&buf, delta_n * sizeof(float), (void **)&delta), st,
                      done);
    CTXPAR_CHECK_GOTO(ctxpar_pack_kv(run, pb, k, v, kv[0]), st, done);
    CTXPAR_CHECK_GOTO(ctxpar_dev_attn_bwd_prep(run->dev, out, dout, delta, run->stream), st, done);
    CTXPAR_CHECK_GOTO(ctxpar_dev_fill(run->dev, dq_acc, 0.0f, q_n, run->stream), st, done);

    ctxpar_shard_spans qs;
    ctxpar_layout_spans(pb->layout, pb->seq_global, pb->rank, P, &qs);
    for (int s = 0; s < P; s++) {
        void *cur = kv[s % 2];
        float *dloc = dkv_loc[s % 2];
        if (s + 1 < P)
            CTXPAR_CHECK_GOTO(ctxpar_xfer_post(run, &xkv, "kv", s, cur, next_rank(pb),
                                               kv[(s + 1) % 2], prev_rank(pb), kv_bytes),
                              st, done);
        int j = block_at(pb, s);
        ctxpar_shard_spans ks;
        ctxpar_layout_spans(pb->layout, pb->seq_global, j, P, &ks);
        ctxpar_spans qp = {qs.span, qs.count}, kp = {ks.span, ks.count};
        // This step's contribution to block j's dK/dV goes to a fresh buffer, so the partial sum
        // from earlier ranks can keep arriving meanwhile; it is added afterwards.
        CTXPAR_CHECK_GOTO(ctxpar_dev_fill(run->dev, dloc, 0.0f, dkv_n, run->stream), st, done);
        if (ctxpar_block_account(run, pb, qp, kp)) {
            ctxpar_attn_block blk = {*q,
                                     ctxpar_packed_kv(cur, pb->dtype, pb, pb->seq_local, 0),
                                     ctxpar_packed_kv(cur, pb->dtype, pb, pb->seq_local, 1),
                                     qp,
                                     kp,
                                     pb->mask,
                                     pb->scale};
            double t0 = ctxpar_now();
            CTXPAR_CHECK_GOTO(ctxpar_dev_attn_block_bwd(run->dev, &blk, dout, lse, delta, dq_acc,
                                                        dloc, dloc + dkv_n / 2, run->stream),
                              st, done);
            ctxpar_run_trace(run, CTXPAR_EVENT_COMPUTE, "bwd", s, j, t0, ctxpar_now(), 0);
        }
        if (P > 1) {
            if (s > 0) { // block j's partial sum from the ranks that saw it before this one
                CTXPAR_CHECK_GOTO(ctxpar_xfer_wait(run, &xd), st, done);
                CTXPAR_CHECK_GOTO(ctxpar_dev_add(run->dev, dloc, dkv_in, dkv_n, run->stream), st,
                                  done);
            }
            CTXPAR_CHECK_GOTO(ctxpar_xfer_post(run, &xd, "dkv", s, dloc, next_rank(pb), dkv_in,
                                               prev_rank(pb), dkv_bytes),
                              st, done);
        }
        CTXPAR_CHECK_GOTO(ctxpar_xfer_wait(run, &xkv), st, done);
    }
    // After P steps the last hop has brought this rank's own block home with every contribution.
    CTXPAR_CHECK_GOTO(ctxpar_xfer_wait(run, &xd), st, done);
    const float *dkv = P > 1 ? dkv_in : dkv_loc[0];
    ctxpar_tensor dq_t = ctxpar_tensor_bshd(dq_acc, CTXPAR_DTYPE_F32, pb->batch, pb->seq_local,
                                            pb->heads_q, pb->head_dim);
    ctxpar_tensor dk_t = ctxpar_packed_kv((void *)dkv, CTXPAR_DTYPE_F32, pb, pb->seq_local, 0);
    ctxpar_tensor dv_t = ctxpar_packed_kv((void *)dkv, CTXPAR_DTYPE_F32, pb, pb->seq_local, 1);
    CTXPAR_CHECK_GOTO(ctxpar_dev_cast(run->dev, &dq_t, dq, run->stream), st, done);
    CTXPAR_CHECK_GOTO(ctxpar_dev_cast(run->dev, &dk_t, dk, run->stream), st, done);
    st = ctxpar_dev_cast(run->dev, &dv_t, dv, run->stream);
done:
    ctxpar_xfer_cancel(run, &xkv);
    ctxpar_xfer_cancel(run, &xd);
    ctxpar_buffers_free(&buf);
    return st;
}
