// Ring attention. Rank r starts with its own K/V block; at step s it computes its queries against
// block (r - s) mod P while that block's successor arrives from r - 1 and the current one leaves
// for r + 1. Forward merges per-block (out, lse) partials; backward sends dK/dV partial sums
// around the ring behind K/V so that each block's gradient arrives back at its owner. A block
// travels only as far as some rank needs it (ring_plan.h): masked-out steps move no data.
#include <math.h>

#include "ctxpar_count.h"
#include "ring_plan.h"
#include "transfer.h"

static int next_rank(const ctxpar_problem *pb) {
    return (pb->rank + 1) % pb->nranks;
}
static int prev_rank(const ctxpar_problem *pb) {
    return (pb->rank + pb->nranks - 1) % pb->nranks;
}
static int block_at(const ctxpar_problem *pb, int step) {
    return (pb->rank - step + pb->nranks) % pb->nranks;
}

// Posts step s's K/V transfer: the held block onward, the next block in; either half may be
// absent under a mask, and then nothing is posted at all.
static ctxpar_status post_kv(const ctxpar_run *run, const ctxpar_problem *pb,
                             const ctxpar_ring_plan *plan, ctxpar_xfer *x, int s, void *cur,
                             void *next, size_t bytes) {
    int send = ctxpar_ring_kv_hop(plan, pb->rank, s);
    int recv = ctxpar_ring_kv_hop(plan, prev_rank(pb), s);
    if (!send && !recv)
        return CTXPAR_OK;
    return ctxpar_xfer_post(run, x, CTXPAR_XFER_KV, s, cur, send ? next_rank(pb) : -1, next,
                            recv ? prev_rank(pb) : -1, bytes);
}

// The block of query rows x the K/V held at step s, if any of it is visible.
static int block_for_step(const ctxpar_run *run, const ctxpar_problem *pb,
                          const ctxpar_shard_spans *qs, ctxpar_shard_spans *ks, int s,
                          const ctxpar_tensor *q, void *kv, ctxpar_attn_block *blk) {
    ctxpar_layout_spans(pb->layout, pb->seq_global, block_at(pb, s), pb->nranks, ks);
    ctxpar_spans qp = {qs->span, qs->count}, kp = {ks->span, ks->count};
    if (!ctxpar_block_account(run, pb, qp, kp))
        return 0;
    ctxpar_attn_block b = {*q,
                           ctxpar_packed_kv(kv, pb->dtype, pb, pb->seq_local, 0),
                           ctxpar_packed_kv(kv, pb->dtype, pb, pb->seq_local, 1),
                           qp,
                           kp,
                           pb->mask,
                           pb->scale};
    *blk = b;
    return 1;
}

ctxpar_status ctxpar_ring_fwd(const ctxpar_run *run, const ctxpar_problem *pb,
                              const ctxpar_tensor *q, const ctxpar_tensor *k,
                              const ctxpar_tensor *v, ctxpar_tensor *out, float *lse) {
    const int P = pb->nranks;
    const size_t kv_bytes = ctxpar_packed_kv_bytes(pb->dtype, pb, pb->seq_local);
    const size_t out_n = ctxpar_count(pb->batch, pb->seq_local, pb->heads_q, pb->head_dim);
    const size_t lse_n = ctxpar_count(pb->batch, pb->heads_q, pb->seq_local, 1);
    ctxpar_buffers buf = {.dev = run->dev, .stream = run->stream};
    ctxpar_ring_plan plan = {0, NULL};
    ctxpar_xfer x = {0};
    void *kv[2] = {NULL, NULL};
    float *out_acc = NULL, *lse_acc = NULL;
    ctxpar_status st;

    CTXPAR_CHECK_GOTO(ctxpar_ring_plan_make(pb, &plan), st, done);
    CTXPAR_CHECK_GOTO(ctxpar_buffers_alloc(&buf, kv_bytes + CTXPAR_XFER_TRAILER, &kv[0]), st, done);
    if (P > 1)
        CTXPAR_CHECK_GOTO(ctxpar_buffers_alloc(&buf, kv_bytes + CTXPAR_XFER_TRAILER, &kv[1]), st,
                          done);
    CTXPAR_CHECK_GOTO(ctxpar_buffers_alloc(&buf, out_n * sizeof(float), (void **)&out_acc), st,
                      done);
    CTXPAR_CHECK_GOTO(ctxpar_buffers_alloc(&buf, lse_n * sizeof(float), (void **)&lse_acc), st,
                      done);
    CTXPAR_CHECK_GOTO(ctxpar_pack_kv(run, pb, k, v, kv[0]), st, done);

    ctxpar_shard_spans qs, ks;
    ctxpar_layout_spans(pb->layout, pb->seq_global, pb->rank, P, &qs);
    int have = 0; // whether out_acc/lse_acc hold a partial yet
    for (int s = 0; s < P; s++) {
        void *cur = kv[s % 2];
        // The next block travels while this one is computed.
        CTXPAR_CHECK_GOTO(post_kv(run, pb, &plan, &x, s, cur, kv[(s + 1) % 2], kv_bytes), st, done);
        ctxpar_attn_block blk;
        if (ctxpar_ring_holds(&plan, pb->rank, s) &&
            block_for_step(run, pb, &qs, &ks, s, q, cur, &blk)) {
            double t0 = ctxpar_now();
            CTXPAR_CHECK_GOTO(
                ctxpar_dev_attn_block_fwd(run->dev, &blk, out_acc, lse_acc, have, run->stream), st,
                done);
            ctxpar_run_trace(run, CTXPAR_EVENT_COMPUTE, "fwd", s, block_at(pb, s), t0, ctxpar_now(),
                             0);
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
    ctxpar_ring_plan_free(&plan);
    return st;
}

// Backward state: K/V double buffer, dK/dV partial sums and their transfers.
typedef struct ring_bwd {
    ctxpar_ring_plan plan;
    ctxpar_xfer xkv, xd, xsend, xhome; // K/V; partial sums in; a finished sum out; ours in
    void *kv[2];
    float *own;     // this rank's contribution to its own block (step 0)
    float *dloc[2]; // contributions at steps >= 1, alternating while one is in flight
    float *din;     // a partial sum arriving for the next step's block
    // This rank's own block's complete dK/dV, sent home by the last rank that uses it. It lands
    // in `own`: own's one transfer (posted at step 0) is waited at step 1, before the receive of
    // the finished sum is posted (at step >= 1), so the two never overlap in time.
    float *dhome;
    size_t dkv_n, dkv_bytes;
} ring_bwd;

// Where the partial sum of the block held at step s goes next: along the path while someone
// further needs the block, else straight home to its owner (or nowhere: it is the owner's).
static int dkv_destination(const ctxpar_problem *pb, const ctxpar_ring_plan *plan, int s) {
    int j = block_at(pb, s), P = pb->nranks;
    if (ctxpar_ring_dist(j, pb->rank, P) < ctxpar_ring_dist(j, plan->last[j], P))
        return next_rank(pb);
    return j != pb->rank ? j : -1;
}

static ctxpar_status bwd_alloc(ctxpar_buffers *buf, const ctxpar_problem *pb, ring_bwd *w,
                               size_t kv_bytes) {
    const size_t tb = w->dkv_bytes + CTXPAR_XFER_TRAILER;
    const int P = pb->nranks;
    CTXPAR_CHECK(ctxpar_buffers_alloc(buf, kv_bytes + CTXPAR_XFER_TRAILER, &w->kv[0]));
    CTXPAR_CHECK(ctxpar_buffers_alloc(buf, tb, (void **)&w->own));
    if (P == 1)
        return CTXPAR_OK;
    CTXPAR_CHECK(ctxpar_buffers_alloc(buf, kv_bytes + CTXPAR_XFER_TRAILER, &w->kv[1]));
    // Steps 1 .. P-1 use dloc[s % 2]: with two ranks only dloc[1].
    if (P > 2)
        CTXPAR_CHECK(ctxpar_buffers_alloc(buf, tb, (void **)&w->dloc[0]));
    CTXPAR_CHECK(ctxpar_buffers_alloc(buf, tb, (void **)&w->dloc[1]));
    CTXPAR_CHECK(ctxpar_buffers_alloc(buf, tb, (void **)&w->din));
    if (w->plan.last[pb->rank] != pb->rank)
        w->dhome = w->own;
    return CTXPAR_OK;
}

// One backward step: compute this step's contribution, add the partial sum that came with the
// block, pass it on, and post the receive of this rank's finished block when it is due.
static ctxpar_status bwd_step(const ctxpar_run *run, const ctxpar_problem *pb, ring_bwd *w, int s,
                              const ctxpar_shard_spans *qs, const ctxpar_tensor *q,
                              const ctxpar_tensor *dout, const float *lse, const float *delta,
                              float *dq_acc, size_t kv_bytes) {
    const int P = pb->nranks;
    void *cur = w->kv[s % 2];
    CTXPAR_CHECK(post_kv(run, pb, &w->plan, &w->xkv, s, cur, w->kv[(s + 1) % 2], kv_bytes));
    int holds = ctxpar_ring_holds(&w->plan, pb->rank, s);
    float *dloc = s == 0 ? w->own : w->dloc[s % 2];
    if (holds) {
        // A fresh buffer for this contribution, so that the partial sum from earlier ranks can
        // keep arriving meanwhile; it is added afterwards.
        CTXPAR_CHECK(ctxpar_dev_fill(run->dev, dloc, 0.0f, w->dkv_n, run->stream));
        ctxpar_shard_spans ks;
        ctxpar_attn_block blk;
        if (block_for_step(run, pb, qs, &ks, s, q, cur, &blk)) {
            double t0 = ctxpar_now();
            CTXPAR_CHECK(ctxpar_dev_attn_block_bwd(run->dev, &blk, dout, lse, delta, dq_acc, dloc,
                                                   dloc + w->dkv_n / 2, run->stream));
            ctxpar_run_trace(run, CTXPAR_EVENT_COMPUTE, "bwd", s, block_at(pb, s), t0, ctxpar_now(),
                             0);
        }
    }
    // The previous step's partial-sum transfers: the receive is this step's block's sum so far,
    // and the send buffer is reused next step.
    CTXPAR_CHECK(ctxpar_xfer_wait(run, &w->xd));
    CTXPAR_CHECK(ctxpar_xfer_wait(run, &w->xsend));
    if (holds && s > 0)
        CTXPAR_CHECK(ctxpar_dev_add(run->dev, dloc, w->din, w->dkv_n, run->stream));
    int dst = holds ? dkv_destination(pb, &w->plan, s) : -1;
    int src = ctxpar_ring_kv_hop(&w->plan, prev_rank(pb), s) ? prev_rank(pb) : -1;
    // A finished sum goes home as a transfer of its own kind, which its owner expects.
    int home = dst >= 0 && dst == block_at(pb, s);
    if (home)
        CTXPAR_CHECK(ctxpar_xfer_post(run, &w->xsend, CTXPAR_XFER_DKV_HOME, s, dloc, dst, NULL, -1,
                                      w->dkv_bytes));
    if ((dst >= 0 && !home) || src >= 0)
        CTXPAR_CHECK(ctxpar_xfer_post(run, &w->xd, CTXPAR_XFER_DKV, s, dloc, home ? -1 : dst,
                                      w->din, src, w->dkv_bytes));
    int last = w->plan.last[pb->rank];
    if (last != pb->rank && s == ctxpar_ring_dist(pb->rank, last, P))
        CTXPAR_CHECK(ctxpar_xfer_post(run, &w->xhome, CTXPAR_XFER_DKV_HOME, s, NULL, -1, w->dhome,
                                      last, w->dkv_bytes));
    return ctxpar_xfer_wait(run, &w->xkv);
}

ctxpar_status ctxpar_ring_bwd(const ctxpar_run *run, const ctxpar_problem *pb,
                              const ctxpar_tensor *q, const ctxpar_tensor *k,
                              const ctxpar_tensor *v, const ctxpar_tensor *out, const float *lse,
                              const ctxpar_tensor *dout, ctxpar_tensor *dq, ctxpar_tensor *dk,
                              ctxpar_tensor *dv) {
    const int P = pb->nranks;
    const size_t kv_bytes = ctxpar_packed_kv_bytes(pb->dtype, pb, pb->seq_local);
    const size_t q_n = ctxpar_count(pb->batch, pb->seq_local, pb->heads_q, pb->head_dim);
    const size_t delta_n = ctxpar_count(pb->batch, pb->heads_q, pb->seq_local, 1);
    ctxpar_buffers buf = {.dev = run->dev, .stream = run->stream};
    ring_bwd w = {0};
    w.dkv_bytes = ctxpar_packed_kv_bytes(CTXPAR_DTYPE_F32, pb, pb->seq_local);
    w.dkv_n = w.dkv_bytes / sizeof(float);
    float *dq_acc = NULL, *delta = NULL;
    ctxpar_status st;

    CTXPAR_CHECK_GOTO(ctxpar_ring_plan_make(pb, &w.plan), st, done);
    CTXPAR_CHECK_GOTO(bwd_alloc(&buf, pb, &w, kv_bytes), st, done);
    CTXPAR_CHECK_GOTO(ctxpar_buffers_alloc(&buf, q_n * sizeof(float), (void **)&dq_acc), st, done);
    CTXPAR_CHECK_GOTO(ctxpar_buffers_alloc(&buf, delta_n * sizeof(float), (void **)&delta), st,
                      done);
    CTXPAR_CHECK_GOTO(ctxpar_pack_kv(run, pb, k, v, w.kv[0]), st, done);
    CTXPAR_CHECK_GOTO(ctxpar_dev_attn_bwd_prep(run->dev, out, dout, delta, run->stream), st, done);
    CTXPAR_CHECK_GOTO(ctxpar_dev_fill(run->dev, dq_acc, 0.0f, q_n, run->stream), st, done);

    ctxpar_shard_spans qs;
    ctxpar_layout_spans(pb->layout, pb->seq_global, pb->rank, P, &qs);
    for (int s = 0; s < P; s++)
        CTXPAR_CHECK_GOTO(bwd_step(run, pb, &w, s, &qs, q, dout, lse, delta, dq_acc, kv_bytes), st,
                          done);
    CTXPAR_CHECK_GOTO(ctxpar_xfer_wait(run, &w.xd), st, done);
    CTXPAR_CHECK_GOTO(ctxpar_xfer_wait(run, &w.xsend), st, done);
    CTXPAR_CHECK_GOTO(ctxpar_xfer_wait(run, &w.xhome), st, done);
    // Own block: complete at step 0 when nobody else needs it, else it has come home (into own).
    const float *dkv = w.own;
    ctxpar_tensor dq_t = ctxpar_tensor_bshd(dq_acc, CTXPAR_DTYPE_F32, pb->batch, pb->seq_local,
                                            pb->heads_q, pb->head_dim);
    ctxpar_tensor dk_t = ctxpar_packed_kv((void *)dkv, CTXPAR_DTYPE_F32, pb, pb->seq_local, 0);
    ctxpar_tensor dv_t = ctxpar_packed_kv((void *)dkv, CTXPAR_DTYPE_F32, pb, pb->seq_local, 1);
    CTXPAR_CHECK_GOTO(ctxpar_dev_cast(run->dev, &dq_t, dq, run->stream), st, done);
    CTXPAR_CHECK_GOTO(ctxpar_dev_cast(run->dev, &dk_t, dk, run->stream), st, done);
    st = ctxpar_dev_cast(run->dev, &dv_t, dv, run->stream);
done:
    ctxpar_xfer_cancel(run, &w.xkv);
    ctxpar_xfer_cancel(run, &w.xd);
    ctxpar_xfer_cancel(run, &w.xsend);
    ctxpar_xfer_cancel(run, &w.xhome);
    ctxpar_buffers_free(&buf);
    ctxpar_ring_plan_free(&w.plan);
    return st;
}
