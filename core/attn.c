// The attention entry points: validate, agree across ranks, run the chosen algorithm.
#include <stdio.h>

#include "context_internal.h"
#include "registry.h"
#include "validate.h"
#include "dispatch.h"

static ctxpar_run make_run(ctxpar_context *ctx, ctxpar_stream *stream) {
    ctxpar_run run = {.dev = ctx->dev,
                      .comm = ctx->comm,
                      .stream = stream,
                      .verify_transfers = ctx->options.verify_transfers,
                      .trace = ctx->trace,
                      .trace_user = ctx->trace_user,
                      .work = &ctx->work,
                      .ws = &ctx->ws};
    return run;
}

// Ends the call's use of the workspace; a failure there (the device reporting a fault of the
// call's last work) is the call's result unless it already failed.
static ctxpar_status finish(ctxpar_context *ctx, ctxpar_stream *stream, ctxpar_status st) {
    ctxpar_status end = ctxpar_workspace_finish(&ctx->ws, stream);
    return st != CTXPAR_OK ? st : end;
}

static ctxpar_status check_lse(const char *name, const void *lse) {
    if (!lse)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "%s is NULL", name);
    return CTXPAR_OK;
}

// After local validation, every rank takes part in the agreement check; a rank whose own
// arguments failed keeps its own message and status.
static ctxpar_status agree(ctxpar_context *ctx, ctxpar_call_kind kind,
                           const ctxpar_attn_params *params, const ctxpar_problem *pb,
                           ctxpar_algo algo, ctxpar_status local) {
    if (local == CTXPAR_OK)
        return ctxpar_check_agreement(ctx, kind, params, pb, algo);
    char saved[512];
    snprintf(saved, sizeof saved, "%s", ctxpar_last_error());
    (void)ctxpar_check_agreement(ctx, kind, NULL, NULL, algo);
    ctxpar_restore_error(saved);
    return local;
}

// After the ranks agreed, a failure on one rank leaves its peers waiting for transfers that will
// not come. Aborting the comm tells them at once (CTXPAR_ERR_REMOTE) instead of after the
// timeout; the comm cannot be used afterwards, as with NCCL's ncclCommAbort.
static ctxpar_status abort_on_failure(ctxpar_context *ctx, ctxpar_status st) {
    if (st != CTXPAR_OK)
        ctxpar_comm_abort(ctx->comm);
    return st;
}

// Everything a rank can check alone, before the ranks agree: arguments (params normalized into
// *norm), the algorithm and whether the device can run it. A failure here leaves the comm usable.
static ctxpar_status validate_fwd(const ctxpar_context *ctx, const ctxpar_attn_params *params,
                                  const ctxpar_tensor *q, const ctxpar_tensor *k,
                                  const ctxpar_tensor *v, const ctxpar_tensor *out, int has_out,
                                  int backward, ctxpar_attn_params *norm, ctxpar_problem *pb,
                                  const ctxpar_algorithm **algo) {
    CTXPAR_CHECK(ctxpar_params_normalize(params, norm));
    CTXPAR_CHECK(ctxpar_validate_problem(norm, ctx->comm, q, k, v, pb));
    if (has_out) // not for a query without the call's out (attn_supported, reserve)
        CTXPAR_CHECK(ctxpar_validate_like("out", out, "q", q, "v.shape[3]", v->shape[3]));
    CTXPAR_CHECK(ctxpar_validate_sinks(ctx->dev, norm, pb->heads_q, &pb->sinks_hash));
    *algo = ctxpar_algorithm_choose(norm->algo, pb, ctx->dev, backward);
    return ctxpar_algorithm_check(*algo, pb, ctx->dev, backward);
}

// Every rank's positions for the algorithms (after local validation succeeded). A built-in
// layout's map depends on (layout, S, P) only and stays on the context for the next call; a
// custom assignment's is built into `own` each call (the caller may change its contents).
static ctxpar_status make_map(ctxpar_context *ctx, const ctxpar_attn_params *p, ctxpar_problem *pb,
                              ctxpar_layout_map *own, ctxpar_status st) {
    if (st != CTXPAR_OK)
        return st;
    if (p->layout == CTXPAR_LAYOUT_CUSTOM) {
        CTXPAR_CHECK(
            ctxpar_layout_map_make(p->layout, p->assignment, pb->seq_global, pb->nranks, own));
        pb->map = own;
        return CTXPAR_OK;
    }
    ctxpar_layout_map *c = &ctx->map;
    if (!c->count || ctx->map_layout != p->layout || c->seq_global != pb->seq_global ||
        c->nranks != pb->nranks) {
        ctxpar_layout_map m;
        CTXPAR_CHECK(ctxpar_layout_map_make(p->layout, NULL, pb->seq_global, pb->nranks, &m));
        ctxpar_layout_map_free(c);
        *c = m;
        ctx->map_layout = p->layout;
    }
    pb->map = c;
    return CTXPAR_OK;
}

// The id the ranks agree on: AUTO until validation resolved it.
static ctxpar_algo algo_id(const ctxpar_algorithm *algo) {
    return algo ? algo->id : CTXPAR_ALGO_AUTO;
}

ctxpar_status ctxpar_attn_fwd(ctxpar_context *ctx, const ctxpar_attn_params *params,
                              const ctxpar_tensor *q, const ctxpar_tensor *k,
                              const ctxpar_tensor *v, ctxpar_tensor *out, float *lse,
                              ctxpar_stream *stream) {
    ctxpar_clear_error();
    if (!ctx)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "ctx is NULL");
    ctxpar_attn_params p;
    ctxpar_problem pb;
    const ctxpar_algorithm *algo = NULL;
    ctxpar_layout_map map = {0};
    ctxpar_status st = validate_fwd(ctx, params, q, k, v, out, 1, 0, &p, &pb, &algo);
    st = make_map(ctx, &p, &pb, &map, st);
    st = agree(ctx, CTXPAR_CALL_FWD, &p, &pb, algo_id(algo), st);
    if (st == CTXPAR_OK) {
        ctxpar_run run = make_run(ctx, stream);
        st = ctxpar_call_forward(algo, &ctx->states, &run, &pb, q, k, v, out, lse);
        st = abort_on_failure(ctx, finish(ctx, stream, st));
    }
    ctxpar_layout_map_free(&map);
    return st;
}

static ctxpar_status validate_bwd(const ctxpar_context *ctx, const ctxpar_attn_params *params,
                                  const ctxpar_tensor *q, const ctxpar_tensor *k,
                                  const ctxpar_tensor *v, const ctxpar_tensor *out,
                                  const float *lse, const ctxpar_tensor *dout,
                                  const ctxpar_tensor *dq, const ctxpar_tensor *dk,
                                  const ctxpar_tensor *dv, ctxpar_attn_params *norm,
                                  ctxpar_problem *pb, const ctxpar_algorithm **algo) {
    CTXPAR_CHECK(validate_fwd(ctx, params, q, k, v, out, 1, 1, norm, pb, algo));
    if (norm->q_len > 0)
        return CTXPAR_ERROR(CTXPAR_ERR_NOT_SUPPORTED,
                            "params.q_len (%lld): queries shorter than the keys are forward only",
                            (long long)norm->q_len);
    CTXPAR_CHECK(check_lse("lse", lse));
    CTXPAR_CHECK(ctxpar_validate_like("dout", dout, "q", q, "v.shape[3]", v->shape[3]));
    CTXPAR_CHECK(ctxpar_validate_same("dq", dq, "q", q));
    CTXPAR_CHECK(ctxpar_validate_same("dk", dk, "k", k));
    return ctxpar_validate_same("dv", dv, "v", v);
}

ctxpar_status ctxpar_attn_bwd(ctxpar_context *ctx, const ctxpar_attn_params *params,
                              const ctxpar_tensor *q, const ctxpar_tensor *k,
                              const ctxpar_tensor *v, const ctxpar_tensor *out, const float *lse,
                              const ctxpar_tensor *dout, ctxpar_tensor *dq, ctxpar_tensor *dk,
                              ctxpar_tensor *dv, ctxpar_stream *stream) {
    ctxpar_clear_error();
    if (!ctx)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "ctx is NULL");
    ctxpar_attn_params p;
    ctxpar_problem pb;
    const ctxpar_algorithm *algo = NULL;
    ctxpar_layout_map map = {0};
    ctxpar_status st =
        validate_bwd(ctx, params, q, k, v, out, lse, dout, dq, dk, dv, &p, &pb, &algo);
    st = make_map(ctx, &p, &pb, &map, st);
    st = agree(ctx, CTXPAR_CALL_BWD, &p, &pb, algo_id(algo), st);
    if (st == CTXPAR_OK) {
        ctxpar_run run = make_run(ctx, stream);
        st = ctxpar_call_backward(algo, &ctx->states, &run, &pb, q, k, v, out, lse, dout, dq, dk,
                                  dv);
        st = abort_on_failure(ctx, finish(ctx, stream, st));
    }
    ctxpar_layout_map_free(&map);
    return st;
}

ctxpar_status ctxpar_attn_choose_algo(const ctxpar_context *ctx, const ctxpar_attn_params *params,
                                      const ctxpar_tensor *q, const ctxpar_tensor *k,
                                      ctxpar_algo *algo_out) {
    ctxpar_clear_error();
    if (!ctx || !algo_out)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "ctx (%p) and algo_out (%p) must be set",
                            (const void *)ctx, (void *)algo_out);
    ctxpar_attn_params p;
    ctxpar_problem pb;
    CTXPAR_CHECK(ctxpar_params_normalize(params, &p));
    // v has k's shape; validating k against itself is enough here.
    CTXPAR_CHECK(ctxpar_validate_problem(&p, ctx->comm, q, k, k, &pb));
    *algo_out = ctxpar_algorithm_choose(p.algo, &pb, ctx->dev, 0)->id;
    return CTXPAR_OK;
}

// A forward and backward call's local checks without running it (the backward's blocks include
// the forward's; out is the caller's to make, so it is not looked at).
static ctxpar_status check_call(const ctxpar_context *ctx, const ctxpar_attn_params *params,
                                const ctxpar_tensor *q, const ctxpar_tensor *k,
                                const ctxpar_tensor *v, ctxpar_problem *pb,
                                const ctxpar_algorithm **algo) {
    ctxpar_clear_error();
    if (!ctx)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "ctx is NULL");
    ctxpar_attn_params p;
    return validate_fwd(ctx, params, q, k, v, NULL, 0, 1, &p, pb, algo);
}

ctxpar_status ctxpar_attn_supported(const ctxpar_context *ctx, const ctxpar_attn_params *params,
                                    const ctxpar_tensor *q, const ctxpar_tensor *k,
                                    const ctxpar_tensor *v) {
    ctxpar_problem pb;
    const ctxpar_algorithm *algo;
    return check_call(ctx, params, q, k, v, &pb, &algo);
}

ctxpar_status ctxpar_context_reserve(ctxpar_context *ctx, const ctxpar_attn_params *params,
                                     const ctxpar_tensor *q, const ctxpar_tensor *k,
                                     const ctxpar_tensor *v) {
    ctxpar_problem pb;
    const ctxpar_algorithm *algo;
    // Sized for the backward, whose workspace holds the forward's.
    CTXPAR_CHECK(check_call(ctx, params, q, k, v, &pb, &algo));
    void *base = NULL;
    size_t bytes = algo->workspace_bytes(&pb), sinks = ctxpar_sinks_backward_bytes(&pb);
    CTXPAR_CHECK(ctxpar_workspace_acquire(&ctx->ws, bytes > sinks ? bytes : sinks, NULL, &base));
    return ctxpar_workspace_finish(&ctx->ws, NULL);
}
