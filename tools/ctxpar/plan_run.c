// The planner's dry run (see plan_run.h).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plan_device.h"
#include "plan_run.h"
#include "registry.h"
#include "validate.h"

// Never dereferenced: the planner's device only passes addresses around.
#define FAKE_DATA ((void *)(uintptr_t)4096)

typedef struct plan_ctx {
    const cpt_plan_config *cfg;
    ctxpar_device *dev;
    ctxpar_workspace ws;
    void *dry;                  // what every rank's calls share (the table's dry_make), made once
    ctxpar_count_cache *counts; // the blocks' counts of striped keys (algorithms.h)
    ctxpar_tensor q, k, v, out; // out: also dout
} plan_ctx;

// Rank r's local tensors: its count of rows of the global sequence (never read).
static void tensors_of(const cpt_plan_config *cfg, int64_t rows, plan_ctx *c) {
    c->q = ctxpar_tensor_bshd(FAKE_DATA, cfg->dtype, cfg->batch, rows, cfg->heads, cfg->head_dim);
    c->k =
        ctxpar_tensor_bshd(FAKE_DATA, cfg->dtype, cfg->batch, rows, cfg->kv_heads, cfg->head_dim);
    const int64_t dv = cfg->head_dim_v > 0 ? cfg->head_dim_v : cfg->head_dim;
    c->v = ctxpar_tensor_bshd(FAKE_DATA, cfg->dtype, cfg->batch, rows, cfg->kv_heads, dv);
    c->out = ctxpar_tensor_bshd(FAKE_DATA, cfg->dtype, cfg->batch, rows, cfg->heads, dv);
}

ctxpar_status cpt_plan_problem(const cpt_plan_config *cfg, ctxpar_problem *pb) {
    if (cfg->ranks < 1 || cfg->seq < 1)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "plan: ranks (%d) and seq (%lld) must be >= 1",
                            cfg->ranks, (long long)cfg->seq);
    ctxpar_attn_params p;
    CTXPAR_CHECK(ctxpar_params_normalize(&cfg->params, &p));
    if (p.q_len != 0)
        return CTXPAR_ERROR(CTXPAR_ERR_NOT_SUPPORTED,
                            "plan: queries shorter than the keys (--q-len %lld) are not modelled "
                            "yet; run them with check",
                            (long long)p.q_len);
    p.seq_len_global = cfg->seq; // any length: shards differ as the layout makes them
    if (p.sinks && cfg->backward && !p.dsinks)
        p.dsinks = FAKE_DATA; // a training step wants the sinks' gradient
    const int custom = p.layout == CTXPAR_LAYOUT_CUSTOM;
    plan_ctx c;
    tensors_of(cfg,
               custom && !p.assignment
                   ? 0
                   : ctxpar_layout_count(p.layout, p.assignment, cfg->seq, 0, cfg->ranks),
               &c);
    cpt_plan_traffic none;
    ctxpar_comm *comm = NULL;
    // It splits, as every comm a real run uses (local, MPI, NCCL) does.
    CTXPAR_CHECK(cpt_plan_comm_create(0, cfg->ranks, 1, 0, NULL, 0, &none, &comm));
    ctxpar_status st = ctxpar_validate_problem(&p, comm, &c.q, &c.k, &c.v, pb);
    ctxpar_comm_destroy(comm);
    return st;
}

int cpt_plan_group_size(const ctxpar_algorithm *algo, const ctxpar_problem *pb) {
    ctxpar_split_shape shape[CTXPAR_MAX_SPLITS];
    const int n = algo->splits ? algo->splits(pb, shape) : 0;
    for (int i = 0; i < n; i++)
        if (shape[i].group)
            return shape[i].size;
    return 0;
}

// One rank's calls, through the front door's call path with the rank's own states (as its
// context keeps them): forward (with the coverage recorded when asked), then backward.
static ctxpar_status run_rank(plan_ctx *c, const ctxpar_algorithm *algo, ctxpar_problem *pb,
                              cpt_plan_cover *cover, uint64_t copies, cpt_plan_rank *out) {
    const cpt_plan_config *cfg = c->cfg;
    memset(out, 0, sizeof *out);
    ctxpar_split_shape splits[CTXPAR_MAX_SPLITS];
    const int nsplits = algo->splits ? algo->splits(pb, splits) : 0;
    ctxpar_comm *comm = NULL;
    // The link classes of the algorithms that do not split (the others' groups are their own).
    CTXPAR_CHECK(cpt_plan_comm_create(pb->rank, pb->nranks,
                                      cfg->group_size > 0 ? cfg->group_size : 1, -1, splits,
                                      nsplits, &out->traffic, &comm));
    ctxpar_algo_states states = {NULL};
    ctxpar_work_stats work = {0, 0, 0.0};
    const ctxpar_run run = {.dev = c->dev,
                            .comm = comm,
                            .work = &work,
                            .ws = &c->ws,
                            .dry = c->dry,
                            .counts = c->counts};
    // The tensors are never read: any non-NULL buffers of the right shapes.
    ctxpar_tensor out_t = c->out, dq = c->q, dk = c->k, dv = c->v;
    // Each rank's workspace from nothing, so that what it grows to is this rank's peak.
    ctxpar_status st = ctxpar_workspace_release(&c->ws);
    if (st == CTXPAR_OK)
        st = cpt_plan_device_record(c->dev, cover, copies);
    if (st == CTXPAR_OK) {
        st = ctxpar_call_forward(algo, &states, &run, pb, &c->q, &c->k, &c->v, &out_t, NULL);
        (void)cpt_plan_device_record(c->dev, NULL, 0); // stopping flushes nothing: never fails
        out->flops_fwd = work.flops;
    }
    if (st == CTXPAR_OK && cfg->backward) {
        st = ctxpar_call_backward(algo, &states, &run, pb, &c->q, &c->k, &c->v, &out_t, FAKE_DATA,
                                  &c->out, &dq, &dk, &dv);
        out->flops_bwd = work.flops - out->flops_fwd;
    }
    if (st == CTXPAR_OK)
        st = ctxpar_workspace_finish(&c->ws, NULL);
    out->pairs = out->flops_fwd / (2.0 * (double)(pb->head_dim + pb->head_dim_v));
    out->bytes_sent = ctxpar_comm_bytes_sent(comm);
    for (int l = 0; l < CPT_LINKS; l++)
        out->bytes_received += out->traffic.p2p_recv_bytes[l] + out->traffic.coll_recv_bytes[l];
    out->workspace_bytes = c->ws.bytes; // grown to this rank's largest call since its release
    ctxpar_algo_states_release(&states);
    ctxpar_comm_destroy(comm);
    return st;
}

static void check_coverage(const ctxpar_problem *pb, cpt_plan_cover *cover, cpt_plan_result *res) {
    res->coverage_checked = 1;
    res->coverage_ok =
        cpt_plan_cover_check(cover, &pb->mask, pb->batch, pb->heads_q, &res->coverage_bad_position,
                             &res->pairs_computed, &res->pairs_visible);
}

// The imbalance of per-rank FLOPs and the largest rank's workspace.
static void summarize(cpt_plan_result *res) {
    double max = 0, sum = 0;
    for (int r = 0; r < res->nranks; r++) {
        if (res->rank[r].workspace_bytes > res->workspace_bytes)
            res->workspace_bytes = res->rank[r].workspace_bytes;
        const double f = res->rank[r].flops_fwd + res->rank[r].flops_bwd;
        sum += f;
        if (f > max)
            max = f;
    }
    res->imbalance = sum > 0 ? max / (sum / res->nranks) - 1.0 : 0.0;
}

ctxpar_status cpt_plan_run(const cpt_plan_config *cfg, cpt_plan_result *res) {
    memset(res, 0, sizeof *res);
    res->coverage_bad_position = -1;
    const double t0 = ctxpar_now();
    plan_ctx c;
    memset(&c, 0, sizeof c);
    c.cfg = cfg;
    ctxpar_problem pb;
    CTXPAR_CHECK(cpt_plan_problem(cfg, &pb));
    // Every rank's positions, as the front door makes them for a call (and the hybrid's ring's).
    ctxpar_layout_map map = {0};
    CTXPAR_CHECK(ctxpar_layout_map_make(pb.layout, pb.assignment, pb.seq_global, pb.nranks, &map));
    pb.map = &map;
    const ctxpar_algorithm *algo =
        ctxpar_algorithm_choose(cfg->params.algo, &pb, NULL, cfg->backward);
    ctxpar_status st = ctxpar_algorithm_check(algo, &pb, NULL, cfg->backward);
    if (st != CTXPAR_OK) {
        ctxpar_layout_map_free(&map);
        return st;
    }
    res->algo = algo->id;
    res->nranks = cfg->ranks;
    const int u = cpt_plan_group_size(algo, &pb);
    res->ulysses = u;
    res->rank = calloc((size_t)cfg->ranks, sizeof *res->rank);
    st = res->rank
             ? cpt_plan_device_create(&c.dev)
             : CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "plan: no memory for %d ranks", cfg->ranks);
    c.ws.dev = c.dev;
    if (st == CTXPAR_OK)
        st = ctxpar_count_cache_create(&c.counts);
    cpt_plan_cover cover = {0, NULL, 0};
    if (st == CTXPAR_OK && cfg->coverage)
        st = cpt_plan_cover_init(&cover, cfg->seq);
    // What every rank shares once (the ring's plan; the hybrid's group rows and its ring's plan).
    if (st == CTXPAR_OK && algo->dry_make)
        st = algo->dry_make(&pb, &c.dry);
    // The members of an all-to-all group the algorithm splits (the hybrid's) run the same ring on
    // the same rows with as many heads each and exchange blocks of one size (hybrid.c): the first
    // member's counts stand for the others' and its blocks are recorded once for each (u times
    // fewer ring steps), when share_members asks for it; by default every member runs, so that the
    // coverage proof counts what each one computes (plan_test asserts both give the same plan and
    // every member a real run's counts). Only the backward's workspace has a part sized by the
    // member's own rows: the registry's size (the larger direction's) is what a member's calls
    // acquire then.
    const int share = u > 1 && cfg->share_members;
    char stage[48]; // the ranks' loop is what takes the time, minutes over thousands of ranks
    snprintf(stage, sizeof stage, "dry run of %d ranks", cfg->ranks);
    for (int r = 0; r < cfg->ranks && st == CTXPAR_OK; r++) {
        if (cfg->progress)
            cfg->progress(cfg->progress_user, stage, r, cfg->ranks);
        ctxpar_problem rpb = pb;
        rpb.rank = r;
        rpb.seq_local = map.count[r];
        if (share && r % u != 0) {
            res->rank[r] = res->rank[r - r % u];
            if (cfg->backward)
                res->rank[r].workspace_bytes = algo->workspace_bytes(&rpb);
            continue;
        }
        tensors_of(cfg, rpb.seq_local, &c);
        st = run_rank(&c, algo, &rpb, cfg->coverage ? &cover : NULL, share ? (uint64_t)u : 1,
                      &res->rank[r]);
    }
    if (st == CTXPAR_OK && cfg->coverage)
        st = cpt_plan_device_flush(c.dev); // the blocks still waiting (plan_device.h)
    if (st == CTXPAR_OK && cfg->coverage)
        check_coverage(&pb, &cover, res);
    if (st == CTXPAR_OK)
        summarize(res);
    cpt_plan_cover_free(&cover);
    if (c.dry)
        algo->dry_free(c.dry);
    if (c.dev) {
        (void)ctxpar_workspace_release(&c.ws);
        ctxpar_device_destroy(c.dev);
    }
    ctxpar_count_cache_destroy(c.counts);
    ctxpar_layout_map_free(&map);
    res->seconds = ctxpar_now() - t0;
    return st;
}

void cpt_plan_result_free(cpt_plan_result *res) {
    free(res->rank);
    res->rank = NULL;
}
