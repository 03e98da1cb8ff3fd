// All-to-all (Ulysses) attention. One all-to-all turns sequence shards into head shards: rank j
// receives every rank's tokens for its Hq/P query heads (and the K/V heads they use), puts them
// in global order and runs full-sequence attention on those heads; a second all-to-all brings
// each rank its own tokens for all heads. With fewer K/V heads than ranks, the K/V head a rank
// needs is sent to it (replicated); in backward the dK/dV partials of the ranks sharing a K/V head
// are summed in rank order at the token owner.
#include <string.h>

#include "a2a_parts.h"
#include "algorithms.h"
#include "ctxpar_count.h"
#include "registry.h"
#include "repro.h"

ctxpar_heads_plan ctxpar_a2a_plan_heads(const ctxpar_problem *pb) {
    ctxpar_heads_plan h;
    h.hq = pb->heads_q / pb->nranks;
    h.group = pb->heads_q / pb->heads_kv;
    h.replicate = pb->heads_kv % pb->nranks != 0;
    h.hk = h.replicate ? 1 : pb->heads_kv / pb->nranks;
    return h;
}

// The i-th K/V head rank j works on.
static int64_t ctxpar_a2a_kv_head(const ctxpar_heads_plan *h, int j, int64_t i) {
    return h->replicate ? (j * h->hq) / h->group : j * h->hk + i;
}

static ctxpar_status ctxpar_alltoall_check(const ctxpar_problem *pb) {
    const int P = pb->nranks;
    if (pb->reproducible && pb->heads_kv % P != 0)
        return CTXPAR_ERROR(CTXPAR_ERR_NOT_SUPPORTED,
                            "reproducible mode with alltoall needs the k/v heads (%lld) to divide "
                            "by the ranks (%d): a k/v head's gradient would be split between "
                            "ranks; use ring or allgather",
                            (long long)pb->heads_kv, P);
    if (pb->heads_q % P != 0)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG,
                            "alltoall needs the query heads (%lld) to divide by the ranks (%d)",
                            (long long)pb->heads_q, P);
    if (pb->heads_kv % P != 0 && P % pb->heads_kv != 0)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG,
                            "alltoall needs the k/v heads (%lld) to divide by the ranks (%d), or "
                            "the ranks by the k/v heads",
                            (long long)pb->heads_kv, P);
    return CTXPAR_OK;
}

size_t ctxpar_a2a_seg_bytes(const ctxpar_problem *pb, const ctxpar_seg *s, int64_t seq) {
    return ctxpar_count(pb->batch, seq, s->heads, s->dim) * ctxpar_dtype_size(s->dtype);
}

size_t ctxpar_a2a_block_bytes(const ctxpar_problem *pb, const ctxpar_seg *segs, int n,
                              int64_t seq) {
    size_t b = 0;
    for (int i = 0; i < n; i++)
        b += ctxpar_a2a_seg_bytes(pb, &segs[i], seq);
    return b;
}

ctxpar_tensor ctxpar_a2a_seg_view(void *block, const ctxpar_problem *pb, const ctxpar_seg *segs,
                                  int idx, int64_t seq) {
    size_t off = 0;
    for (int i = 0; i < idx; i++)
        off += ctxpar_a2a_seg_bytes(pb, &segs[i], seq);
    return ctxpar_tensor_bshd((char *)block + off, segs[idx].dtype, pb->batch, seq, segs[idx].heads,
                              segs[idx].dim);
}

// Heads [h0, h0 + n) of a tensor.
ctxpar_tensor ctxpar_a2a_heads(const ctxpar_tensor *t, int64_t h0, int64_t n) {
    ctxpar_tensor r = *t;
    r.data = (char *)t->data + (size_t)(h0 * t->stride[2]) * ctxpar_dtype_size(t->dtype);
    r.shape[2] = n;
    return r;
}

// An F32 [B, H, seq] LSE buffer seen as a [B, seq, H, 1] tensor, so that rows move like tokens.
ctxpar_tensor ctxpar_a2a_lse_view(const float *lse, const ctxpar_problem *pb, int64_t seq,
                                  int64_t h) {
    ctxpar_tensor t = ctxpar_tensor_bshd((void *)lse, CTXPAR_DTYPE_F32, pb->batch, seq, h, 1);
    t.stride[0] = h * seq;
    t.stride[1] = 1;
    t.stride[2] = seq;
    return t;
}

// The all-to-all itself (a copy on one rank), traced.
ctxpar_status ctxpar_a2a_exchange(const ctxpar_run *run, const ctxpar_problem *pb, const void *send,
                                  void *recv, size_t block, const char *name) {
    if (pb->nranks == 1)
        return ctxpar_dev_copy(run->dev, recv, send, block, CTXPAR_COPY_D2D, run->stream);
    ctxpar_request *req = NULL;
    double t0 = ctxpar_now();
    CTXPAR_CHECK(ctxpar_comm_alltoall(run->comm, send, recv, block, run->stream, &req));
    CTXPAR_CHECK(ctxpar_comm_wait(run->comm, req, run->stream));
    double t1 = ctxpar_now();
    ctxpar_run_trace(run, CTXPAR_EVENT_TRANSFER, name, -1, -1, t0, t1,
                     block * (uint64_t)(pb->nranks - 1));
    ctxpar_run_trace(run, CTXPAR_EVENT_WAIT, name, -1, -1, t0, t1, 0);
    return CTXPAR_OK;
}

// Casts rank j's heads of the local tensors into j's block of `send`: q-like tensors give their
// query heads, k-like ones the K/V heads j needs (kinds[i]: 0 query heads, 1 K/V heads).
ctxpar_status ctxpar_a2a_pack_heads(const ctxpar_run *run, const ctxpar_problem *pb,
                                    const ctxpar_heads_plan *h, const ctxpar_tensor *const *src,
                                    const int *kinds, const ctxpar_seg *segs, int n, void *block,
                                    int j) {
    for (int s = 0; s < n; s++) {
        ctxpar_tensor dst = ctxpar_a2a_seg_view(block, pb, segs, s, pb->seq_local);
        if (kinds[s] == 0) {
            ctxpar_tensor from = ctxpar_a2a_heads(src[s], j * h->hq, h->hq);
            CTXPAR_CHECK(ctxpar_dev_cast(run->dev, &from, &dst, run->stream));
            continue;
        }
        for (int64_t i = 0; i < h->hk; i++) {
            ctxpar_tensor from = ctxpar_a2a_heads(src[s], ctxpar_a2a_kv_head(h, j, i), 1),
                          to = ctxpar_a2a_heads(&dst, i, 1);
            CTXPAR_CHECK(ctxpar_dev_cast(run->dev, &from, &to, run->stream));
        }
    }
    return CTXPAR_OK;
}

// Received blocks (every rank's tokens, this rank's heads) to global order.
static ctxpar_status unpack_global(const ctxpar_run *run, const ctxpar_problem *pb,
                                   const ctxpar_seg *segs, int n, void *recv, size_t block,
                                   ctxpar_tensor *global) {
    for (int i = 0; i < pb->nranks; i++)
        for (int s = 0; s < n; s++) {
            ctxpar_tensor local = ctxpar_a2a_seg_view((char *)recv + (size_t)i * block, pb, segs, s,
                                                      ctxpar_problem_count(pb, i));
            CTXPAR_CHECK(ctxpar_move_shard_rows(run, pb, i, &local, &global[s], 1));
        }
    return CTXPAR_OK;
}

// Global per-head results to every rank's block (its tokens, this rank's heads).
static ctxpar_status pack_tokens(const ctxpar_run *run, const ctxpar_problem *pb,
                                 const ctxpar_seg *segs, int n, const ctxpar_tensor *global,
                                 void *send, size_t block) {
    for (int j = 0; j < pb->nranks; j++)
        for (int s = 0; s < n; s++) {
            ctxpar_tensor local = ctxpar_a2a_seg_view((char *)send + (size_t)j * block, pb, segs, s,
                                                      ctxpar_problem_count(pb, j));
            CTXPAR_CHECK(ctxpar_move_shard_rows(run, pb, j, &local, &global[s], 0));
        }
    return CTXPAR_OK;
}

static ctxpar_attn_block whole(const ctxpar_problem *pb, const ctxpar_span *all,
                               const ctxpar_tensor *g) {
    ctxpar_attn_block blk = {.struct_size = sizeof blk,
                             .q = g[0],
                             .k = g[1],
                             .v = g[2],
                             .q_pos = {all, 1},
                             .k_pos = {all, 1},
                             .mask = pb->mask,
                             .scale = pb->scale,
                             .softcap = pb->softcap};
    return blk;
}

// The buffers of both directions: the all-to-all send and receive blocks, the global (all tokens,
// this rank's heads) inputs, the F32 results (forward: out; backward: dQ, dK, dV), the global
// LSE and its low part (ctxpar_attn_block.lse_lo: it travels whether or not a rank's caller
// keeps it, so that every rank's blocks have one size), and for the backward delta and the sums
// of replicated K/V heads' dK/dV.
typedef struct a2a_ws {
    void *send, *recv, *glob;
    void *acc;
    float *lse, *lse_lo, *delta, *dkv_sum;
    void *fold; // the sinks' fold (forward with sinks)
    // Reproducible mode: the out or dQ bins, dK/dV's, the chunk pairs' temporaries.
    void *bins, *dkv_bins;
    ctxpar_repro_scratch rs;
} a2a_ws;

// The problem as this rank's share of the heads sees it (reproducible mode's accumulators).
static ctxpar_problem heads_problem(const ctxpar_problem *pb) {
    const ctxpar_heads_plan h = ctxpar_a2a_plan_heads(pb);
    ctxpar_problem hp = *pb;
    hp.heads_q = h.hq;
    hp.heads_kv = h.hk;
    return hp;
}

// Floats of the backward's delta buffer: the global rows of this rank's heads, or the local
// rows of every head when an uneven shard makes those more.
static size_t a2a_delta_count(const ctxpar_problem *pb) {
    const size_t glob = ctxpar_count(pb->batch, pb->seq_global, ctxpar_a2a_plan_heads(pb).hq, 1);
    const size_t local = ctxpar_count(pb->batch, pb->seq_max, pb->heads_q, 1);
    return glob > local ? glob : local;
}

static size_t a2a_layout(const ctxpar_problem *pb, int backward, char *base, a2a_ws *w) {
    const int64_t S = pb->seq_global, D = pb->head_dim, Dv = pb->head_dim_v;
    const ctxpar_heads_plan h = ctxpar_a2a_plan_heads(pb);
    const ctxpar_dtype dt = pb->dtype, f32 = CTXPAR_DTYPE_F32;
    // What travels each way: forward q, k, v in and out, lse, lse_lo back; backward q, k, v, out,
    // dout, lse, lse_lo in and dq, dk, dv back (as in the functions below).
    const ctxpar_seg in[7] = {{dt, h.hq, D},  {dt, h.hk, D},   {dt, h.hk, Dv}, {dt, h.hq, Dv},
                              {dt, h.hq, Dv}, {f32, h.hq, 1}, {f32, h.hq, 1}};
    const ctxpar_seg fwd_back[3] = {{dt, h.hq, Dv}, {f32, h.hq, 1}, {f32, h.hq, 1}};
    const ctxpar_seg bwd_back[3] = {{f32, h.hq, D}, {f32, h.hk, D}, {f32, h.hk, Dv}};
    const int n_in = backward ? 7 : 3;
    // Every block is sized for the largest shard; each holds its owner's count of rows.
    const size_t in_b = ctxpar_a2a_block_bytes(pb, in, n_in, pb->seq_max);
    const size_t back_b = backward ? ctxpar_a2a_block_bytes(pb, bwd_back, 3, pb->seq_max)
                                   : ctxpar_a2a_block_bytes(pb, fwd_back, 3, pb->seq_max);
    const size_t big = (in_b > back_b ? in_b : back_b) * (size_t)pb->nranks;
    const size_t rows = ctxpar_count(pb->batch, S, h.hq, 1) * sizeof(float);
    ctxpar_carve c = {base, 0};
    memset(w, 0, sizeof *w);
    w->send = ctxpar_carve_take(&c, big);
    w->recv = ctxpar_carve_take(&c, big);
    w->glob = ctxpar_carve_take(&c, ctxpar_a2a_block_bytes(pb, in, backward ? 5 : 3, S));
    w->acc = ctxpar_carve_take(&c, backward ? ctxpar_a2a_block_bytes(pb, bwd_back, 3, S)
                                            : ctxpar_count(pb->batch, S, h.hq, Dv) * sizeof(float));
    w->lse = ctxpar_carve_take(&c, rows);
    w->lse_lo = ctxpar_carve_take(&c, rows);
    if (!backward && pb->sinks)
        w->fold = ctxpar_carve_take(&c, ctxpar_sinks_fold_bytes(pb, S, h.hq));
    if (backward) {
        // delta also lends its zeros to the caller's missing lse_lo ([B, Hq, seq_local]), which
        // with uneven shards can be more rows than [B, S, Hq / P].
        w->delta = ctxpar_carve_take(&c, a2a_delta_count(pb) * sizeof(float));
        if (h.replicate)
            w->dkv_sum = ctxpar_carve_take(&c, ctxpar_count(pb->batch, pb->seq_local, D + Dv, 1) *
                                                   (size_t)pb->heads_kv * sizeof(float));
    }
    if (pb->reproducible) {
        const ctxpar_problem hp = heads_problem(pb);
        w->bins = ctxpar_carve_take(&c, backward ? ctxpar_repro_dq_bytes(&hp, S, h.hq)
                                                 : ctxpar_repro_out_bytes(&hp, S, h.hq));
        if (backward)
            w->dkv_bins = ctxpar_carve_take(&c, ctxpar_repro_dkv_bytes(&hp, S, h.hk));
        ctxpar_repro_scratch_carve(&hp, S, backward, &c, &w->rs);
    }
    return c.used;
}

static size_t ctxpar_alltoall_workspace_bytes(const ctxpar_problem *pb) {
    a2a_ws w;
    size_t fwd = a2a_layout(pb, 0, NULL, &w), bwd = a2a_layout(pb, 1, NULL, &w);
    return fwd > bwd ? fwd : bwd;
}

static ctxpar_status take_workspace(const ctxpar_run *run, const ctxpar_problem *pb, int backward,
                                    a2a_ws *w) {
    void *base = NULL;
    CTXPAR_CHECK(ctxpar_run_workspace(run, a2a_layout(pb, backward, NULL, w), &base));
    (void)a2a_layout(pb, backward, base, w);
    return CTXPAR_OK;
}

static ctxpar_status ctxpar_alltoall_fwd(const ctxpar_run *run, const ctxpar_problem *pb,
                                         const ctxpar_tensor *q, const ctxpar_tensor *k,
                                         const ctxpar_tensor *v, ctxpar_tensor *out, float *lse) {
    const int P = pb->nranks;
    const int64_t S = pb->seq_global, D = pb->head_dim, Dv = pb->head_dim_v;
    const ctxpar_heads_plan h = ctxpar_a2a_plan_heads(pb);
    const ctxpar_seg in[3] = {{pb->dtype, h.hq, D}, {pb->dtype, h.hk, D}, {pb->dtype, h.hk, Dv}};
    const ctxpar_seg back[3] = {{pb->dtype, h.hq, Dv}, {CTXPAR_DTYPE_F32, h.hq, 1},
                                {CTXPAR_DTYPE_F32, h.hq, 1}};
    const size_t in_b = ctxpar_a2a_block_bytes(pb, in, 3, pb->seq_max);
    const size_t back_b = ctxpar_a2a_block_bytes(pb, back, 3, pb->seq_max);
    ctxpar_status st;
    a2a_ws w;
    CTXPAR_CHECK(take_workspace(run, pb, 0, &w));
    void *send = w.send, *recv = w.recv, *qkv = w.glob;
    float *out_acc = w.acc, *lse_acc = w.lse;

    const ctxpar_tensor *src[3] = {q, k, v};
    const int kinds[3] = {0, 1, 1};
    for (int j = 0; j < P; j++)
        CTXPAR_CHECK_GOTO(ctxpar_a2a_pack_heads(run, pb, &h, src, kinds, in, 3,
                                                (char *)send + (size_t)j * in_b, j),
                          st, done);
    CTXPAR_CHECK_GOTO(ctxpar_a2a_exchange(run, pb, send, recv, in_b, "alltoall_qkv"), st, done);
    ctxpar_tensor g[3] = {ctxpar_a2a_seg_view(qkv, pb, in, 0, S),
                          ctxpar_a2a_seg_view(qkv, pb, in, 1, S),
                          ctxpar_a2a_seg_view(qkv, pb, in, 2, S)};
    CTXPAR_CHECK_GOTO(unpack_global(run, pb, in, 3, recv, in_b, g), st, done);

    ctxpar_span all = {0, S, 1};
    ctxpar_attn_block blk = whole(pb, &all, g);
    blk.lse_lo = w.lse_lo; // 0 stands for a device that does not keep it
    CTXPAR_CHECK_GOTO(ctxpar_dev_fill(run->dev, w.lse_lo, 0.0f,
                                      ctxpar_count(pb->batch, S, h.hq, 1), run->stream),
                      st, done);
    // This rank's share of the work: for the statistics (which count K/V heads as the problem's)
    // and reproducible mode's accumulators.
    ctxpar_problem heads_pb = heads_problem(pb);
    heads_pb.heads_kv = pb->heads_kv;
    (void)ctxpar_block_account(run, &heads_pb, blk.q_pos, blk.k_pos);
    heads_pb.heads_kv = h.hk;
    double t0 = ctxpar_now();
    if (pb->reproducible) {
        CTXPAR_CHECK_GOTO(ctxpar_repro_clear(run, &heads_pb, w.bins, 0, S, h.hq), st, done);
        CTXPAR_CHECK_GOTO(ctxpar_repro_fwd_block(run, &blk, w.bins, &w.rs), st, done);
        CTXPAR_CHECK_GOTO(
            ctxpar_repro_fwd_finish(run, &heads_pb, w.bins, S, h.hq, out_acc, lse_acc, w.lse_lo),
            st, done);
    } else {
        CTXPAR_CHECK_GOTO(
            ctxpar_dev_attn_block_fwd(run->dev, &blk, out_acc, lse_acc, 0, run->stream), st, done);
    }
    ctxpar_run_trace(run, CTXPAR_EVENT_COMPUTE, "fwd", -1, -1, t0, ctxpar_now(), 0);
    if (pb->sinks) { // this rank's heads, every row: once, on the finished rows
        CTXPAR_CHECK_GOTO(ctxpar_sinks_fold(run, pb, out_acc, lse_acc, S, h.hq,
                                            (int64_t)pb->rank * h.hq, w.fold),
                          st, done);
        // The fold rounds the new LSE to F32: the old low part no longer belongs to it.
        CTXPAR_CHECK_GOTO(ctxpar_dev_fill(run->dev, w.lse_lo, 0.0f,
                                          ctxpar_count(pb->batch, S, h.hq, 1), run->stream),
                          st, done);
    }

    ctxpar_tensor res[3] = {
        ctxpar_tensor_bshd(out_acc, CTXPAR_DTYPE_F32, pb->batch, S, h.hq, Dv),
        ctxpar_a2a_lse_view(lse_acc, pb, S, h.hq), ctxpar_a2a_lse_view(w.lse_lo, pb, S, h.hq)};
    CTXPAR_CHECK_GOTO(pack_tokens(run, pb, back, 3, res, send, back_b), st, done);
    CTXPAR_CHECK_GOTO(ctxpar_a2a_exchange(run, pb, send, recv, back_b, "alltoall_out"), st, done);
    CTXPAR_CHECK_GOTO(ctxpar_a2a_store_out(run, pb, &h, back, recv, back_b, out, lse), st, done);
    st = CTXPAR_OK;
done:
    return st;
}

ctxpar_status ctxpar_a2a_store_out(const ctxpar_run *run, const ctxpar_problem *pb,
                                   const ctxpar_heads_plan *h, const ctxpar_seg *back,
                                   const void *recv, size_t back_b, ctxpar_tensor *out,
                                   float *lse) {
    for (int i = 0; i < pb->nranks; i++) {
        char *blk_i = (char *)recv + (size_t)i * back_b;
        ctxpar_tensor o = ctxpar_a2a_seg_view(blk_i, pb, back, 0, pb->seq_local);
        ctxpar_tensor dst = ctxpar_a2a_heads(out, i * h->hq, h->hq);
        CTXPAR_CHECK(ctxpar_dev_cast(run->dev, &o, &dst, run->stream));
        float *user_lse[2] = {lse, pb->lse_lo};
        for (int u = 0; u < 2; u++) {
            if (!user_lse[u])
                continue;
            ctxpar_tensor l = ctxpar_a2a_seg_view(blk_i, pb, back, 1 + u, pb->seq_local);
            ctxpar_tensor user = ctxpar_a2a_lse_view(user_lse[u], pb, pb->seq_local, pb->heads_q);
            ctxpar_tensor ldst = ctxpar_a2a_heads(&user, i * h->hq, h->hq);
            CTXPAR_CHECK(ctxpar_dev_cast(run->dev, &l, &ldst, run->stream));
        }
    }
    return CTXPAR_OK;
}

// dK/dV arrive from every rank for the K/V heads it worked on; with replicated K/V heads the
// ranks that shared a head each sent a partial, summed here in rank order.
static ctxpar_status store_dkv(const ctxpar_run *run, const ctxpar_problem *pb,
                               const ctxpar_heads_plan *h, const ctxpar_seg *back,
                               const void *recv, size_t back_b, float *acc, ctxpar_tensor *dk,
                               ctxpar_tensor *dv) {
    ctxpar_tensor *dst[2] = {dk, dv};
    if (!h->replicate) {
        for (int i = 0; i < pb->nranks; i++)
            for (int w = 0; w < 2; w++) {
                ctxpar_tensor part = ctxpar_a2a_seg_view((char *)recv + (size_t)i * back_b, pb,
                                                         back, 1 + w, pb->seq_local);
                ctxpar_tensor to = ctxpar_a2a_heads(dst[w], ctxpar_a2a_kv_head(h, i, 0), h->hk);
                CTXPAR_CHECK(ctxpar_dev_cast(run->dev, &part, &to, run->stream));
            }
        return CTXPAR_OK;
    }
    // One head's partial of dK, then of dV (its own head_dim); all dK heads, then all dV heads.
    const int64_t dims[2] = {pb->head_dim, pb->head_dim_v};
    const size_t n[2] = {ctxpar_count(pb->batch, pb->seq_local, dims[0], 1),
                         ctxpar_count(pb->batch, pb->seq_local, dims[1], 1)};
    float *part_of[2] = {acc, acc + n[0] * (size_t)pb->heads_kv};
    CTXPAR_CHECK(ctxpar_dev_fill(run->dev, acc, 0.0f, (n[0] + n[1]) * (size_t)pb->heads_kv,
                                 run->stream));
    for (int i = 0; i < pb->nranks; i++)
        for (int w = 0; w < 2; w++) {
            ctxpar_tensor part =
                ctxpar_a2a_seg_view((char *)recv + (size_t)i * back_b, pb, back, 1 + w, pb->seq_local);
            float *into = part_of[w] + (size_t)ctxpar_a2a_kv_head(h, i, 0) * n[w];
            CTXPAR_CHECK(ctxpar_dev_add(run->dev, into, part.data, n[w], run->stream));
        }
    for (int w = 0; w < 2; w++)
        for (int64_t kh = 0; kh < pb->heads_kv; kh++) {
            ctxpar_tensor from =
                ctxpar_tensor_bshd(part_of[w] + (size_t)kh * n[w], CTXPAR_DTYPE_F32, pb->batch,
                                   pb->seq_local, 1, dims[w]);
            ctxpar_tensor to = ctxpar_a2a_heads(dst[w], kh, 1);
            CTXPAR_CHECK(ctxpar_dev_cast(run->dev, &from, &to, run->stream));
        }
    return CTXPAR_OK;
}

ctxpar_status ctxpar_a2a_store_grads(const ctxpar_run *run, const ctxpar_problem *pb,
                                     const ctxpar_heads_plan *h, const ctxpar_seg *back,
                                     const void *recv, size_t back_b, float *acc,
                                     ctxpar_tensor *dq, ctxpar_tensor *dk, ctxpar_tensor *dv) {
    for (int i = 0; i < pb->nranks; i++) {
        ctxpar_tensor part =
            ctxpar_a2a_seg_view((char *)recv + (size_t)i * back_b, pb, back, 0, pb->seq_local);
        ctxpar_tensor to = ctxpar_a2a_heads(dq, i * h->hq, h->hq);
        CTXPAR_CHECK(ctxpar_dev_cast(run->dev, &part, &to, run->stream));
    }
    return store_dkv(run, pb, h, back, recv, back_b, acc, dk, dv);
}

static ctxpar_status ctxpar_alltoall_bwd(const ctxpar_run *run, const ctxpar_problem *pb,
                                         const ctxpar_tensor *q, const ctxpar_tensor *k,
                                         const ctxpar_tensor *v, const ctxpar_tensor *out,
                                         const float *lse, const ctxpar_tensor *dout,
                                         ctxpar_tensor *dq, ctxpar_tensor *dk, ctxpar_tensor *dv) {
    const int P = pb->nranks;
    const int64_t S = pb->seq_global, D = pb->head_dim, Dv = pb->head_dim_v;
    const ctxpar_heads_plan h = ctxpar_a2a_plan_heads(pb);
    const ctxpar_dtype dt = pb->dtype, f32 = CTXPAR_DTYPE_F32;
    const ctxpar_seg in[7] = {{dt, h.hq, D},  {dt, h.hk, D},   {dt, h.hk, Dv}, {dt, h.hq, Dv},
                              {dt, h.hq, Dv}, {f32, h.hq, 1}, {f32, h.hq, 1}};
    const ctxpar_seg back[3] = {{f32, h.hq, D}, {f32, h.hk, D}, {f32, h.hk, Dv}};
    const size_t in_b = ctxpar_a2a_block_bytes(pb, in, 7, pb->seq_max);
    const size_t back_b = ctxpar_a2a_block_bytes(pb, back, 3, pb->seq_max);
    ctxpar_status st;
    a2a_ws w;
    CTXPAR_CHECK(take_workspace(run, pb, 1, &w));
    void *send = w.send, *recv = w.recv, *glob = w.glob, *grads = w.acc;
    float *lse_g = w.lse, *delta = w.delta;

    ctxpar_tensor lse_t = ctxpar_a2a_lse_view(lse, pb, pb->seq_local, pb->heads_q);
    // Without the caller's low part, zeros travel (delta's buffer, filled only later).
    float *lo = pb->lse_lo ? pb->lse_lo : delta;
    if (!pb->lse_lo)
        CTXPAR_CHECK_GOTO(ctxpar_dev_fill(run->dev, delta, 0.0f, a2a_delta_count(pb), run->stream),
                          st, done);
    ctxpar_tensor lo_t = ctxpar_a2a_lse_view(lo, pb, pb->seq_local, pb->heads_q);
    const ctxpar_tensor *src[7] = {q, k, v, out, dout, &lse_t, &lo_t};
    const int kinds[7] = {0, 1, 1, 0, 0, 0, 0};
    for (int j = 0; j < P; j++)
        CTXPAR_CHECK_GOTO(
            ctxpar_a2a_pack_heads(run, pb, &h, src, kinds, in, 7, (char *)send + (size_t)j * in_b, j), st,
            done);
    CTXPAR_CHECK_GOTO(ctxpar_a2a_exchange(run, pb, send, recv, in_b, "alltoall_bwd_in"), st, done);
    ctxpar_tensor g[7];
    for (int s = 0; s < 5; s++)
        g[s] = ctxpar_a2a_seg_view(glob, pb, in, s, S);
    g[5] = ctxpar_a2a_lse_view(lse_g, pb, S, h.hq);
    g[6] = ctxpar_a2a_lse_view(w.lse_lo, pb, S, h.hq);
    CTXPAR_CHECK_GOTO(unpack_global(run, pb, in, 7, recv, in_b, g), st, done);

    ctxpar_tensor gr[3] = {ctxpar_a2a_seg_view(grads, pb, back, 0, S),
                           ctxpar_a2a_seg_view(grads, pb, back, 1, S),
                           ctxpar_a2a_seg_view(grads, pb, back, 2, S)};
    CTXPAR_CHECK_GOTO(ctxpar_dev_fill(run->dev, grads, 0.0f,
                                      ctxpar_a2a_block_bytes(pb, back, 3, S) / 4, run->stream),
                      st, done);
    CTXPAR_CHECK_GOTO(ctxpar_dev_attn_bwd_prep(run->dev, &g[3], &g[4], delta, run->stream), st,
                      done);
    ctxpar_span all = {0, S, 1};
    ctxpar_attn_block blk = whole(pb, &all, g);
    blk.lse_lo = w.lse_lo;
    ctxpar_problem heads_pb = *pb;
    heads_pb.heads_q = h.hq;
    const ctxpar_problem hp = heads_problem(pb);
    if (pb->reproducible) {
        CTXPAR_CHECK_GOTO(ctxpar_repro_clear(run, &hp, w.bins, 1, S, h.hq), st, done);
        CTXPAR_CHECK_GOTO(ctxpar_repro_clear(run, &hp, w.dkv_bins, 2, S, h.hk), st, done);
    }
    if (ctxpar_block_account(run, &heads_pb, blk.q_pos, blk.k_pos)) {
        double t0 = ctxpar_now();
        CTXPAR_CHECK_GOTO(pb->reproducible
                              ? ctxpar_repro_bwd_block(run, &hp, &blk, &g[4], lse_g, w.lse_lo,
                                                       delta, w.bins, w.dkv_bins, S, &w.rs)
                              : ctxpar_dev_attn_block_bwd(run->dev, &blk, &g[4], lse_g, delta,
                                                          gr[0].data, gr[1].data, gr[2].data,
                                                          run->stream),
                          st, done);
        ctxpar_run_trace(run, CTXPAR_EVENT_COMPUTE, "bwd", -1, -1, t0, ctxpar_now(), 0);
    }
    if (pb->reproducible) {
        CTXPAR_CHECK_GOTO(ctxpar_repro_dq_finish(run, &hp, w.bins, S, h.hq, gr[0].data), st, done);
        CTXPAR_CHECK_GOTO(ctxpar_repro_dkv_finish(run, &hp, w.dkv_bins, S, h.hk, gr[1].data), st,
                          done);
    }
    CTXPAR_CHECK_GOTO(pack_tokens(run, pb, back, 3, gr, send, back_b), st, done);
    CTXPAR_CHECK_GOTO(ctxpar_a2a_exchange(run, pb, send, recv, back_b, "alltoall_grads"), st, done);
    st = ctxpar_a2a_store_grads(run, pb, &h, back, recv, back_b, w.dkv_sum, dq, dk, dv);
done:
    return st;
}

// All-to-all moves the local Q, K, V and out, 2·(Hq+Hkv) values per rank (docs/algorithms.md),
// but cannot hide it behind compute: counted twice, so it is taken only when it moves less than
// half the ring's bytes.
static double alltoall_cost(const ctxpar_problem *pb) {
    return 2.0 * 2.0 * (double)(pb->heads_q + pb->heads_kv);
}

// The whole sequence for a share of the heads (one K/V head when the ranks outnumber them).
static void alltoall_blocks(const ctxpar_problem *pb, ctxpar_attn_query *q) {
    q->seq_q = q->seq_k = pb->seq_global;
    q->heads_q = pb->heads_q / pb->nranks;
    q->heads_kv = pb->heads_kv >= pb->nranks ? pb->heads_kv / pb->nranks : 1;
}

const ctxpar_algorithm ctxpar_alltoall_algorithm = {
    .id = CTXPAR_ALGO_ALLTOALL,
    .name = "alltoall",
    .check = ctxpar_alltoall_check,
    .forward = ctxpar_alltoall_fwd,
    .backward = ctxpar_alltoall_bwd,
    .blocks = alltoall_blocks,
    .workspace_bytes = ctxpar_alltoall_workspace_bytes,
    .cost = alltoall_cost,
    .reproducible = 1,
};
