// Ring attention. Rank r starts with its own K/V block; at step s it computes its queries against
// block (r - s) mod P while that block's successor arrives from r - 1 and the current one leaves
// for r + 1. Forward merges per-block (out, lse) partials; backward sends dK/dV partial sums
// around the ring behind K/V so that each block's gradient arrives back at its owner. A block
// travels only as far as some rank needs it (ring_plan.h): masked-out steps move no data.
// Buffers come from the context's workspace; the budget per rank is in docs/algorithms.md.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ctxpar_count.h"
#include "registry.h"
#include "repro.h"
#include "ring_plan.h"
#include "transfer.h"

static int next_rank(const ctxpar_problem *pb) {
    return ctxpar_ring_dist(-1, pb->rank, pb->nranks);
}
static int prev_rank(const ctxpar_problem *pb) {
    return ctxpar_ring_dist(1, pb->rank, pb->nranks);
}
static int block_at(const ctxpar_problem *pb, int step) {
    return ctxpar_ring_dist(step, pb->rank, pb->nranks);
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

// Where block j's dV starts in its dK/dV sum: blocks are densely packed with their own count
// of rows at the front of buffers sized for the largest shard.
static float *dv_part(const ctxpar_problem *pb, float *dkv, int j) {
    return dkv + ctxpar_count(pb->batch, ctxpar_problem_count(pb, j), pb->heads_kv, pb->head_dim);
}

// The block of query rows x the K/V held at step s, if any of it is visible.
static int block_for_step(const ctxpar_run *run, const ctxpar_problem *pb,
                          const ctxpar_ring_plan *plan, ctxpar_spans qp, int s,
                          const ctxpar_tensor *q, void *kv, ctxpar_attn_block *blk) {
    const int j = block_at(pb, s);
    if (!ctxpar_ring_account(plan, run, pb, qp, j))
        return 0;
    const int64_t n = ctxpar_problem_count(pb, j);
    // Field by field into *blk: a dry run takes this P^2 times, and a whole-struct temporary
    // doubled its cost.
    memset(blk, 0, sizeof *blk);
    blk->struct_size = sizeof *blk;
    blk->q = *q;
    blk->k = ctxpar_packed_kv(kv, pb->dtype, pb, n, 0);
    blk->v = ctxpar_packed_kv(kv, pb->dtype, pb, n, 1);
    blk->q_pos = qp;
    blk->k_pos = ctxpar_problem_spans(pb, j);
    blk->mask = pb->mask;
    blk->scale = pb->scale;
    blk->softcap = pb->softcap;
    return 1;
}

// The forward's buffers: the K/V double buffer (each with room for a transfer's checksum) and
// the F32 accumulators. The running LSE is lse_acc + lse_lo: each step's merge then does not
// round it to F32 (which would add up to |lse| 2^-25 per step, docs/numerics.md).
typedef struct ring_fwd_ws {
    void *kv[2];
    float *out_acc, *lse_acc, *lse_lo;
    void *fold; // the sinks' fold (NULL without sinks)
    void *bins; // reproducible mode: the out accumulator, and its chunks' temporaries
    ctxpar_repro_scratch rs;
} ring_fwd_ws;

static size_t ring_fwd_layout(const ctxpar_problem *pb, char *base, ring_fwd_ws *w) {
    const size_t kv_bytes = ctxpar_packed_kv_bytes(pb->dtype, pb, pb->seq_max);
    ctxpar_carve c = {base, 0};
    w->kv[0] = ctxpar_carve_take(&c, kv_bytes + CTXPAR_XFER_TRAILER);
    w->kv[1] = pb->nranks > 1 ? ctxpar_carve_take(&c, kv_bytes + CTXPAR_XFER_TRAILER) : NULL;
    w->out_acc = ctxpar_carve_take(
        &c, ctxpar_count(pb->batch, pb->seq_local, pb->heads_q, pb->head_dim_v) * sizeof(float));
    w->lse_acc = ctxpar_carve_take(&c, ctxpar_count(pb->batch, pb->heads_q, pb->seq_local, 1) *
                                           sizeof(float));
    w->fold = pb->sinks ? ctxpar_carve_take(
                              &c, ctxpar_sinks_fold_bytes(pb, pb->seq_local, pb->heads_q))
                        : NULL;
    w->lse_lo = ctxpar_carve_take(&c, ctxpar_count(pb->batch, pb->heads_q, pb->seq_local, 1) *
                                          sizeof(float));
    if (pb->reproducible) {
        w->bins = ctxpar_carve_take(&c, ctxpar_repro_out_bytes(pb, pb->seq_local, pb->heads_q));
        ctxpar_repro_scratch_carve(pb, pb->seq_local, 0, &c, &w->rs);
    }
    return c.used;
}

static ctxpar_status ctxpar_ring_fwd(const ctxpar_run *run, const ctxpar_problem *pb,
                                     const ctxpar_tensor *q, const ctxpar_tensor *k,
                                     const ctxpar_tensor *v, ctxpar_tensor *out, float *lse) {
    const int P = pb->nranks;
    const size_t kv_bytes = ctxpar_packed_kv_bytes(pb->dtype, pb, pb->seq_max);
    const size_t out_n = ctxpar_count(pb->batch, pb->seq_local, pb->heads_q, pb->head_dim_v);
    const size_t lse_n = ctxpar_count(pb->batch, pb->heads_q, pb->seq_local, 1);
    ctxpar_ring_plan plan = {0, NULL, NULL, 0, NULL};
    ctxpar_xfer x = {0};
    ring_fwd_ws w;
    void *base = NULL;
    ctxpar_status st;

    CTXPAR_CHECK_GOTO(ctxpar_ring_plan_for(run, pb, &plan), st, done);
    CTXPAR_CHECK_GOTO(ctxpar_run_workspace(run, ring_fwd_layout(pb, NULL, &w), &base), st, done);
    (void)ring_fwd_layout(pb, base, &w);
    CTXPAR_CHECK_GOTO(ctxpar_pack_kv(run, pb, k, v, w.kv[0]), st, done);
    // 0 stands for a device that does not keep the low part (ctxpar_attn_block.lse_lo).
    CTXPAR_CHECK_GOTO(ctxpar_dev_fill(run->dev, w.lse_lo, 0.0f, lse_n, run->stream), st, done);
    if (pb->reproducible)
        CTXPAR_CHECK_GOTO(ctxpar_repro_clear(run, pb, w.bins, 0, pb->seq_local, pb->heads_q), st,
                          done);

    const ctxpar_spans qs = ctxpar_problem_spans(pb, pb->rank);
    int have = 0; // whether out_acc/lse_acc hold a partial yet
    for (int s = 0; s < P; s++) {
        void *cur = w.kv[s % 2];
        // The next block travels while this one is computed.
        CTXPAR_CHECK_GOTO(post_kv(run, pb, &plan, &x, s, cur, w.kv[(s + 1) % 2], kv_bytes), st,
                          done);
        ctxpar_attn_block blk;
        if (ctxpar_ring_holds(&plan, pb->rank, s) &&
            block_for_step(run, pb, &plan, qs, s, q, cur, &blk)) {
            blk.lse_lo = w.lse_lo;
            double t0 = run->trace ? ctxpar_now() : 0.0; // the clock only for the trace
            CTXPAR_CHECK_GOTO(pb->reproducible
                                  ? ctxpar_repro_fwd_block(run, &blk, w.bins, &w.rs)
                                  : ctxpar_dev_attn_block_fwd(run->dev, &blk, w.out_acc, w.lse_acc,
                                                              have, run->stream),
                              st, done);
            if (run->trace)
                ctxpar_run_trace(run, CTXPAR_EVENT_COMPUTE, "fwd", s, block_at(pb, s), t0,
                                 ctxpar_now(), 0);
            have = 1;
        }
        CTXPAR_CHECK_GOTO(ctxpar_xfer_wait(run, &x), st, done);
    }
    if (pb->reproducible)
        CTXPAR_CHECK_GOTO(ctxpar_repro_fwd_finish(run, pb, w.bins, pb->seq_local, pb->heads_q,
                                                  w.out_acc, w.lse_acc, w.lse_lo),
                          st, done);
    else if (!have) { // no query of this rank sees any key: out 0, lse -inf
        CTXPAR_CHECK_GOTO(ctxpar_dev_fill(run->dev, w.out_acc, 0.0f, out_n, run->stream), st,
                          done);
        CTXPAR_CHECK_GOTO(ctxpar_dev_fill(run->dev, w.lse_acc, -INFINITY, lse_n, run->stream), st,
                          done);
    }
    st = ctxpar_store_fwd(run, pb, w.out_acc, w.lse_acc, w.lse_lo, w.fold, out, lse);
done:
    ctxpar_xfer_cancel(run, &x);
    ctxpar_ring_plan_free(&plan);
    return st;
}

// Backward state. Block b's dK/dV partial sum follows it around the ring one step behind its
// K/V: at step s a rank waits for the partial sum of the block it holds, adds its own
// contribution into it (the kernel accumulates), and passes it on while the next block's sum
// arrives in the other buffer. Two dK/dV buffers, not three: the partial-sum transfer is not
// hidden behind compute (the K/V transfer is), which halves what the ring keeps per rank.
typedef struct ring_bwd {
    ctxpar_ring_plan plan;
    ctxpar_xfer xkv, xd, xsend, xhome; // K/V; partial sums; a finished sum out; ours in
    void *kv[2];
    // d[s % 2]: the sum of the block held at step s. This rank's own block's finished sum comes
    // home into the other one, which the plan keeps free from then on (ring_plan.h, sum_last).
    float *d[2];
    float *dq_acc, *delta;
    size_t dkv_n, dkv_bytes;
    // Reproducible mode: the partial sums are bins blocks of seq_max rows (repro.h); dQ's bins,
    // the chunk pairs' temporaries, and the finished F32 dK/dV.
    void *dq_bins;
    ctxpar_repro_scratch rs;
    float *dkv_f32;
} ring_bwd;

// Bytes of one block's dK/dV partial sum: F32, or bins in reproducible mode.
static size_t dkv_sum_bytes(const ctxpar_problem *pb) {
    return pb->reproducible ? ctxpar_repro_dkv_bytes(pb, pb->seq_max, pb->heads_kv)
                            : ctxpar_packed_kv_bytes(CTXPAR_DTYPE_F32, pb, pb->seq_max);
}

// Where the partial sum of the block held at step s goes next: along its path (sum_last), then
// home to its owner (or nowhere: it is the owner's).
static int dkv_destination(const ctxpar_problem *pb, const ctxpar_ring_plan *plan, int s) {
    int j = block_at(pb, s), P = pb->nranks;
    if (ctxpar_ring_dist(j, pb->rank, P) < ctxpar_ring_dist(j, plan->sum_last[j], P))
        return next_rank(pb);
    return j != pb->rank ? j : -1;
}

// Per rank: the K/V double buffer (4 shard tensors in F32), two dK/dV partial sums (4) and dQ
// (1), for every mask and layout (docs/algorithms.md).
static size_t ring_bwd_layout(const ctxpar_problem *pb, char *base, ring_bwd *w) {
    const size_t kv_bytes = ctxpar_packed_kv_bytes(pb->dtype, pb, pb->seq_max);
    const size_t dkv_bytes = dkv_sum_bytes(pb);
    const int P = pb->nranks;
    ctxpar_carve c = {base, 0};
    w->kv[0] = ctxpar_carve_take(&c, kv_bytes + CTXPAR_XFER_TRAILER);
    w->kv[1] = P > 1 ? ctxpar_carve_take(&c, kv_bytes + CTXPAR_XFER_TRAILER) : NULL;
    w->d[0] = ctxpar_carve_take(&c, dkv_bytes + CTXPAR_XFER_TRAILER);
    w->d[1] = P > 1 ? ctxpar_carve_take(&c, dkv_bytes + CTXPAR_XFER_TRAILER) : NULL;
    w->dq_acc = ctxpar_carve_take(
        &c, ctxpar_count(pb->batch, pb->seq_local, pb->heads_q, pb->head_dim) * sizeof(float));
    w->delta = ctxpar_carve_take(&c, ctxpar_count(pb->batch, pb->heads_q, pb->seq_local, 1) *
                                         sizeof(float));
    if (pb->reproducible) {
        w->dq_bins = ctxpar_carve_take(&c, ctxpar_repro_dq_bytes(pb, pb->seq_local, pb->heads_q));
        ctxpar_repro_scratch_carve(pb, pb->seq_local, 1, &c, &w->rs);
        w->dkv_f32 =
            ctxpar_carve_take(&c, ctxpar_packed_kv_bytes(CTXPAR_DTYPE_F32, pb, pb->seq_max));
    }
    return c.used;
}

// Empties a block's dK/dV partial sum.
static ctxpar_status dkv_clear(const ctxpar_run *run, const ctxpar_problem *pb, const ring_bwd *w,
                               void *acc) {
    if (pb->reproducible)
        return ctxpar_repro_clear(run, pb, acc, 2, pb->seq_max, pb->heads_kv);
    return ctxpar_dev_fill(run->dev, acc, 0.0f, w->dkv_n, run->stream);
}

// Adds a block's backward to dQ and to its dK/dV partial sum `acc` (block j's).
static ctxpar_status block_bwd(const ctxpar_run *run, const ctxpar_problem *pb, const ring_bwd *w,
                               const ctxpar_attn_block *blk, const ctxpar_tensor *dout,
                               const float *lse, float *acc, int j) {
    if (pb->reproducible)
        return ctxpar_repro_bwd_block(run, pb, blk, dout, lse, pb->lse_lo, w->delta, w->dq_bins,
                                      acc, pb->seq_max, &w->rs);
    return ctxpar_dev_attn_block_bwd(run->dev, blk, dout, lse, w->delta, w->dq_acc, acc,
                                     dv_part(pb, acc, j), run->stream);
}

static size_t ctxpar_ring_workspace_bytes(const ctxpar_problem *pb) {
    ring_fwd_ws f;
    ring_bwd b;
    size_t fwd = ring_fwd_layout(pb, NULL, &f), bwd = ring_bwd_layout(pb, NULL, &b);
    return fwd > bwd ? fwd : bwd;
}

// One backward step: take the partial sum of the block held (it arrived during the previous
// step), add this rank's contribution, pass it on, and post the receive of the next block's
// sum and, when due, of this rank's finished block.
static ctxpar_status bwd_step(const ctxpar_run *run, const ctxpar_problem *pb, ring_bwd *w, int s,
                              ctxpar_spans qs, const ctxpar_tensor *q,
                              const ctxpar_tensor *dout, const float *lse, size_t kv_bytes) {
    const int P = pb->nranks;
    void *cur = w->kv[s % 2];
    CTXPAR_CHECK(post_kv(run, pb, &w->plan, &w->xkv, s, cur, w->kv[(s + 1) % 2], kv_bytes));
    // The previous step's transfers: this block's sum has arrived and the sent buffer is free.
    CTXPAR_CHECK(ctxpar_xfer_wait(run, &w->xd));
    CTXPAR_CHECK(ctxpar_xfer_wait(run, &w->xsend));
    // A sum may pass through without K/V (it goes on around the ring): nothing to add then.
    const int holds = ctxpar_ring_holds(&w->plan, pb->rank, s);
    const int has_sum = ctxpar_ring_has_sum(&w->plan, pb->rank, s);
    float *acc = w->d[s % 2];
    if (has_sum) {
        if (s == 0) // this rank's own block: the first contribution to its sum
            CTXPAR_CHECK(dkv_clear(run, pb, w, acc));
        ctxpar_attn_block blk;
        if (holds && block_for_step(run, pb, &w->plan, qs, s, q, cur, &blk)) {
            blk.lse_lo = pb->lse_lo;
            double t0 = run->trace ? ctxpar_now() : 0.0; // the clock only for the trace
            CTXPAR_CHECK(block_bwd(run, pb, w, &blk, dout, lse, acc, block_at(pb, s)));
            if (run->trace)
                ctxpar_run_trace(run, CTXPAR_EVENT_COMPUTE, "bwd", s, block_at(pb, s), t0,
                                 ctxpar_now(), 0);
        }
    }
    int dst = has_sum ? dkv_destination(pb, &w->plan, s) : -1;
    int src = ctxpar_ring_sum_hop(&w->plan, prev_rank(pb), s) ? prev_rank(pb) : -1;
    float *next = P > 1 ? w->d[(s + 1) % 2] : NULL;
    // A finished sum goes home as a transfer of its own kind, which its owner expects.
    int home = dst >= 0 && dst == block_at(pb, s);
    if (home)
        CTXPAR_CHECK(ctxpar_xfer_post(run, &w->xsend, CTXPAR_XFER_DKV_HOME, s, acc, dst, NULL, -1,
                                      w->dkv_bytes));
    if ((dst >= 0 && !home) || src >= 0)
        CTXPAR_CHECK(ctxpar_xfer_post(run, &w->xd, CTXPAR_XFER_DKV, s, acc, home ? -1 : dst, next,
                                      src, w->dkv_bytes));
    int last = w->plan.sum_last[pb->rank];
    if (last != pb->rank && s == ctxpar_ring_dist(pb->rank, last, P))
        // The plan keeps `next` free from here to the end (at the last step nothing comes in).
        CTXPAR_CHECK(ctxpar_xfer_post(run, &w->xhome, CTXPAR_XFER_DKV_HOME, s, NULL, -1, next, last,
                                      w->dkv_bytes));
    return ctxpar_xfer_wait(run, &w->xkv);
}

// dK/dV of this rank's own block when no other rank needs it (into d[0], free after the ring).
static ctxpar_status own_block_bwd(const ctxpar_run *run, const ctxpar_problem *pb, ring_bwd *w,
                                   ctxpar_spans qs, const ctxpar_tensor *q,
                                   const ctxpar_tensor *k, const ctxpar_tensor *v,
                                   const ctxpar_tensor *dout, const float *lse) {
    CTXPAR_CHECK(dkv_clear(run, pb, w, w->d[0]));
    if (!ctxpar_block_account(run, pb, qs, qs))
        return CTXPAR_OK;
    ctxpar_attn_block blk = {.struct_size = sizeof blk,
                             .q = *q,
                             .k = *k,
                             .v = *v,
                             .q_pos = qs,
                             .k_pos = qs,
                             .mask = pb->mask,
                             .scale = pb->scale,
                             .softcap = pb->softcap,
                             .lse_lo = pb->lse_lo};
    float *acc = w->d[0];
    double t0 = ctxpar_now();
    CTXPAR_CHECK(block_bwd(run, pb, w, &blk, dout, lse, acc, pb->rank));
    ctxpar_run_trace(run, CTXPAR_EVENT_COMPUTE, "bwd", 0, pb->rank, t0, ctxpar_now(), 0);
    return CTXPAR_OK;
}

static ctxpar_status ctxpar_ring_bwd(const ctxpar_run *run, const ctxpar_problem *pb,
                                     const ctxpar_tensor *q, const ctxpar_tensor *k,
                                     const ctxpar_tensor *v, const ctxpar_tensor *out,
                                     const float *lse, const ctxpar_tensor *dout, ctxpar_tensor *dq,
                                     ctxpar_tensor *dk, ctxpar_tensor *dv) {
    const int P = pb->nranks;
    const size_t kv_bytes = ctxpar_packed_kv_bytes(pb->dtype, pb, pb->seq_max);
    const size_t q_n = ctxpar_count(pb->batch, pb->seq_local, pb->heads_q, pb->head_dim);
    ring_bwd w = {0};
    w.dkv_bytes = dkv_sum_bytes(pb);
    w.dkv_n = w.dkv_bytes / sizeof(float);
    void *base = NULL;
    ctxpar_status st;

    CTXPAR_CHECK_GOTO(ctxpar_ring_plan_for(run, pb, &w.plan), st, done);
    CTXPAR_CHECK_GOTO(ctxpar_run_workspace(run, ring_bwd_layout(pb, NULL, &w), &base), st, done);
    (void)ring_bwd_layout(pb, base, &w);
    CTXPAR_CHECK_GOTO(ctxpar_pack_kv(run, pb, k, v, w.kv[0]), st, done);
    CTXPAR_CHECK_GOTO(ctxpar_dev_attn_bwd_prep(run->dev, out, dout, w.delta, run->stream), st,
                      done);
    CTXPAR_CHECK_GOTO(pb->reproducible
                          ? ctxpar_repro_clear(run, pb, w.dq_bins, 1, pb->seq_local, pb->heads_q)
                          : ctxpar_dev_fill(run->dev, w.dq_acc, 0.0f, q_n, run->stream),
                      st, done);

    const ctxpar_spans qs = ctxpar_problem_spans(pb, pb->rank);
    for (int s = 0; s < P; s++)
        CTXPAR_CHECK_GOTO(bwd_step(run, pb, &w, s, qs, q, dout, lse, kv_bytes), st, done);
    CTXPAR_CHECK_GOTO(ctxpar_xfer_wait(run, &w.xd), st, done);
    CTXPAR_CHECK_GOTO(ctxpar_xfer_wait(run, &w.xsend), st, done);
    CTXPAR_CHECK_GOTO(ctxpar_xfer_wait(run, &w.xhome), st, done);
    // Own block: it has come home into the buffer the plan kept free, or, when no other rank
    // needs the block, this rank computes it now (from k and v: its packed copy is gone).
    const int own_last = w.plan.sum_last[pb->rank];
    const float *dkv = w.d[0];
    if (P > 1 && own_last != pb->rank)
        dkv = w.d[(ctxpar_ring_dist(pb->rank, own_last, P) + 1) % 2];
    else if (P > 1)
        CTXPAR_CHECK_GOTO(own_block_bwd(run, pb, &w, qs, q, k, v, dout, lse), st, done);
    int64_t rows = pb->seq_local; // of the finished dK/dV
    if (pb->reproducible) {
        CTXPAR_CHECK_GOTO(
            ctxpar_repro_dq_finish(run, pb, w.dq_bins, pb->seq_local, pb->heads_q, w.dq_acc), st,
            done);
        CTXPAR_CHECK_GOTO(
            ctxpar_repro_dkv_finish(run, pb, dkv, pb->seq_max, pb->heads_kv, w.dkv_f32), st, done);
        dkv = w.dkv_f32;
        rows = pb->seq_max;
    }
    ctxpar_tensor dq_t = ctxpar_tensor_bshd(w.dq_acc, CTXPAR_DTYPE_F32, pb->batch, pb->seq_local,
                                            pb->heads_q, pb->head_dim);
    ctxpar_tensor dk_t = ctxpar_packed_kv((void *)dkv, CTXPAR_DTYPE_F32, pb, rows, 0);
    ctxpar_tensor dv_t = ctxpar_packed_kv((void *)dkv, CTXPAR_DTYPE_F32, pb, rows, 1);
    dk_t.shape[1] = dv_t.shape[1] = pb->seq_local;
    CTXPAR_CHECK_GOTO(ctxpar_dev_cast(run->dev, &dq_t, dq, run->stream), st, done);
    CTXPAR_CHECK_GOTO(ctxpar_dev_cast(run->dev, &dk_t, dk, run->stream), st, done);
    st = ctxpar_dev_cast(run->dev, &dv_t, dv, run->stream);
done:
    ctxpar_xfer_cancel(run, &w.xkv);
    ctxpar_xfer_cancel(run, &w.xd);
    ctxpar_xfer_cancel(run, &w.xsend);
    ctxpar_xfer_cancel(run, &w.xhome);
    ctxpar_ring_plan_free(&w.plan);
    return st;
}

// Costs are in values moved per rank (units of D·(S/P)·(P-1)/P, as docs/algorithms.md derives
// them). The ring moves all K/V, 2·Hkv·P, and hides it behind compute.
static double ring_cost(const ctxpar_problem *pb) {
    return 2.0 * (double)pb->heads_kv * pb->nranks;
}

// Blocks of one shard's queries against one shard's keys, all heads.
static void ring_blocks(const ctxpar_problem *pb, ctxpar_attn_query *q) {
    q->seq_q = q->seq_k = pb->seq_max; // the same bound on every rank
}

// A dry run's plan for every rank (ring_plan.h).
static ctxpar_status ring_dry_make(const ctxpar_problem *pb, void **dry_out) {
    ctxpar_ring_dry *dry = malloc(sizeof *dry);
    if (!dry)
        return CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "ring: no memory for a dry run's plan");
    ctxpar_status st = ctxpar_ring_dry_make(pb, dry);
    if (st != CTXPAR_OK) {
        free(dry);
        return st;
    }
    *dry_out = dry;
    return CTXPAR_OK;
}

static void ring_dry_free(void *dry) {
    if (dry)
        ctxpar_ring_dry_free(dry);
    free(dry);
}

static ctxpar_status ring_check(const ctxpar_problem *pb) {
    return pb->reproducible ? ctxpar_repro_check_shards(pb, "ring") : CTXPAR_OK;
}

const ctxpar_algorithm ctxpar_ring_algorithm = {
    .id = CTXPAR_ALGO_RING,
    .name = "ring",
    .check = ring_check,
    .forward = ctxpar_ring_fwd,
    .backward = ctxpar_ring_bwd,
    .blocks = ring_blocks,
    .workspace_bytes = ctxpar_ring_workspace_bytes,
    .cost = ring_cost,
    .dry_make = ring_dry_make,
    .dry_free = ring_dry_free,
    .reproducible = 1,
};
