// Hybrid (2-D) attention: P = u x r ranks. Inside each group of u consecutive ranks an
// all-to-all turns sequence shards into head shards (alltoall.c's pieces): each rank then holds
// its group's rows for Hq/u query heads. The ranks of equal index in the r groups run ring
// attention (ring.c) over those rows on a sub-comm, a ring rank holding a whole group's
// positions (ctxpar_problem_spans), so masks, windows, documents and the ring's transfer plan
// apply unchanged; a second all-to-all brings every rank its own rows for all heads. Backward
// the same way, the replicated K/V heads' dK/dV (Hkv < u) summed at the token owner as in
// alltoall.c. The sub-comms are split once per context and group size (ctxpar_grid).
#include <math.h>

#include "a2a_parts.h"
#include "ctxpar_count.h"
#include "hybrid.h"
#include "registry.h"

extern const ctxpar_algorithm ctxpar_ring_algorithm;

int ctxpar_hybrid_valid_u(const ctxpar_problem *pb, int64_t u) {
    return u >= 1 && u <= CTXPAR_MAX_ULYSSES && pb->nranks % u == 0 && pb->heads_q % u == 0 &&
           (pb->heads_kv % u == 0 || u % pb->heads_kv == 0);
}

ctxpar_problem ctxpar_hybrid_group_problem(const ctxpar_problem *pb, int u) {
    ctxpar_problem g = *pb;
    g.rank = pb->rank % u;
    g.nranks = u;
    return g;
}

ctxpar_problem ctxpar_hybrid_ring_problem(const ctxpar_problem *pb, int u) {
    ctxpar_problem g = ctxpar_hybrid_group_problem(pb, u);
    const ctxpar_heads_plan h = ctxpar_a2a_plan_heads(&g);
    ctxpar_problem r = *pb;
    r.rank = pb->rank / u;
    r.nranks = pb->nranks / u;
    r.seq_local = pb->seq_local * u;
    r.heads_q = h.hq;
    r.heads_kv = h.hk;
    r.seq_max = r.seq_local; // shards are even (hybrid_check)
    r.map = NULL;
    r.lse_lo = NULL; // the ring's rows are not the caller's: the LSE's low part stays 0
    return r;
}

// Values moved per rank in the unit of registry.h (D·(S/P)·(P-1)/P): the two all-to-alls move
// 2·(Hq+Hkv)·(u-1)/u of the local rows, not hidden (x2, as alltoall_cost); the ring moves the
// K/V of the other r-1 groups' u·S/P rows, hk heads each, behind compute (as ring_cost).
static double cost_u(const ctxpar_problem *pb, int u) {
    const int P = pb->nranks, r = P / u;
    if (P == 1) // nothing moves; the ring is the same computation without the splits
        return HUGE_VAL;
    const ctxpar_problem g = ctxpar_hybrid_group_problem(pb, u);
    const ctxpar_heads_plan h = ctxpar_a2a_plan_heads(&g);
    const double per_unit = (double)P / (double)(P - 1);
    const double a2a = 2.0 * 2.0 * (double)(pb->heads_q + h.hk * u) * (u - 1) / u * per_unit;
    const double ring = 2.0 * (double)(h.hk * u) * (r - 1) * per_unit;
    return a2a + ring;
}

int ctxpar_hybrid_ulysses(const ctxpar_problem *pb) {
    if (pb->ulysses != 0)
        return ctxpar_hybrid_valid_u(pb, pb->ulysses) ? (int)pb->ulysses : 0;
    int best = 0;
    double best_cost = 0.0;
    for (int u = 1; u <= CTXPAR_MAX_ULYSSES && u <= pb->nranks; u++) {
        if (!ctxpar_hybrid_valid_u(pb, u))
            continue;
        const double c = cost_u(pb, u);
        if (!best || c < best_cost) {
            best = u;
            best_cost = c;
        }
    }
    return best;
}

static ctxpar_status hybrid_check(const ctxpar_problem *pb) {
    if (!pb->comm_splits)
        return CTXPAR_ERROR(CTXPAR_ERR_NOT_SUPPORTED,
                            "hybrid needs a comm that can split (this comm has no split op)");
    if (pb->ulysses > CTXPAR_MAX_ULYSSES)
        return CTXPAR_ERROR(CTXPAR_ERR_NOT_SUPPORTED,
                            "hybrid: params.ulysses (%lld) is above the largest group supported "
                            "(%d)",
                            (long long)pb->ulysses, CTXPAR_MAX_ULYSSES);
    // The all-to-all pieces it shares with the ring move equal shards: a group's rows are u
    // times a rank's. Uneven shards and custom layouts run on the ring or all-gather for now.
    const int64_t unit = pb->layout == CTXPAR_LAYOUT_ZIGZAG ? 2 * (int64_t)pb->nranks : pb->nranks;
    if (pb->layout == CTXPAR_LAYOUT_CUSTOM || pb->seq_global % unit != 0)
        return CTXPAR_ERROR(CTXPAR_ERR_NOT_SUPPORTED,
                            "hybrid needs equal shards: a sequence length (%lld) that divides by "
                            "%lld (%s layout, %d ranks); use ring or all-gather for others",
                            (long long)pb->seq_global, (long long)unit,
                            ctxpar_layout_name(pb->layout), pb->nranks);
    if (pb->head_dim_v != pb->head_dim || pb->sinks)
        return CTXPAR_ERROR(CTXPAR_ERR_NOT_SUPPORTED,
                            "hybrid: %s not supported yet; use ring, all-gather or all-to-all",
                            pb->sinks ? "attention sinks are" : "a v head_dim of its own (MLA) is");
    if (ctxpar_hybrid_ulysses(pb) == 0)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG,
                            "hybrid needs params.ulysses (%lld; 0 = any) to divide the ranks (%d) "
                            "and the q heads (%lld), and the k/v heads (%lld) to divide by it or "
                            "it by them",
                            (long long)pb->ulysses, pb->nranks, (long long)pb->heads_q,
                            (long long)pb->heads_kv);
    return CTXPAR_OK;
}

// Plus ½ so that it loses ties (it needs two sub-comms): with the all-to-all and the ring at
// the ends of its range (u = P, u = 1) it is taken only where it moves strictly less.
static double hybrid_cost(const ctxpar_problem *pb) {
    return cost_u(pb, ctxpar_hybrid_ulysses(pb)) + 0.5;
}

// The ring's blocks: a group's rows against a group's rows, this rank's heads.
static void hybrid_blocks(const ctxpar_problem *pb, ctxpar_attn_query *q) {
    const ctxpar_problem r = ctxpar_hybrid_ring_problem(pb, ctxpar_hybrid_ulysses(pb));
    q->seq_q = q->seq_k = r.seq_local;
    q->heads_q = r.heads_q;
    q->heads_kv = r.heads_kv;
}

/* ---------------------------------------------------------------- sub-comms */

void ctxpar_grid_release(ctxpar_grid *grid) {
    ctxpar_comm_destroy(grid->group);
    ctxpar_comm_destroy(grid->ring);
    grid->group = grid->ring = NULL;
    grid->u = 0;
}

// The grid of run->comm for groups of u (split when the context has none of that size yet;
// collective, in the same order on every rank as the ranks agreed on u). They take the parent's
// timeout at every call.
static ctxpar_status get_grid(const ctxpar_run *run, ctxpar_grid *grid, int u) {
    if (grid->u != u || !grid->group || !grid->ring) {
        ctxpar_grid_release(grid);
        const int rk = run->comm->rank;
        ctxpar_status st = ctxpar_comm_split(run->comm, rk / u, rk % u, &grid->group);
        if (st == CTXPAR_OK)
            st = ctxpar_comm_split(run->comm, rk % u, rk / u, &grid->ring);
        if (st != CTXPAR_OK) {
            ctxpar_grid_release(grid);
            return st;
        }
        grid->u = u;
    }
    grid->group->timeout_s = run->comm->timeout_s;
    grid->ring->timeout_s = run->comm->timeout_s;
    return CTXPAR_OK;
}

/* ---------------------------------------------------------------- workspace */

// The ring's region first (the ring acquires the same workspace and gets this base back), then
// the exchange blocks, the group's rows of the inputs, the ring's outputs and, backward, the
// sums of replicated K/V heads' dK/dV.
typedef struct hyb_ws {
    void *send, *recv, *glob, *res;
    float *lse, *dkv_sum;
} hyb_ws;

// What travels in and back; n_in / n_back parts (forward: q, k, v / out, lse; backward: q, k,
// v, out, dout, lse / dq, dk, dv).
static void parts(const ctxpar_problem *pb, const ctxpar_heads_plan *h, int backward,
                  ctxpar_seg in[6], int *n_in, ctxpar_seg back[3], int *n_back) {
    const ctxpar_dtype dt = pb->dtype, f32 = CTXPAR_DTYPE_F32;
    const int64_t D = pb->head_dim;
    const ctxpar_seg i6[6] = {{dt, h->hq, D}, {dt, h->hk, D}, {dt, h->hk, D},
                              {dt, h->hq, D}, {dt, h->hq, D}, {f32, h->hq, 1}};
    const ctxpar_seg fb[2] = {{dt, h->hq, D}, {f32, h->hq, 1}};
    const ctxpar_seg bb[3] = {{f32, h->hq, D}, {f32, h->hk, D}, {f32, h->hk, D}};
    for (int i = 0; i < 6; i++)
        in[i] = i6[i];
    *n_in = backward ? 6 : 3;
    *n_back = backward ? 3 : 2;
    for (int i = 0; i < *n_back; i++)
        back[i] = backward ? bb[i] : fb[i];
}

static size_t hyb_layout(const ctxpar_problem *pb, int u, int backward, char *base, hyb_ws *w) {
    const ctxpar_problem g = ctxpar_hybrid_group_problem(pb, u);
    const ctxpar_problem r = ctxpar_hybrid_ring_problem(pb, u);
    const ctxpar_heads_plan h = ctxpar_a2a_plan_heads(&g);
    ctxpar_seg in[6], back[3];
    int n_in, n_back;
    parts(pb, &h, backward, in, &n_in, back, &n_back);
    const size_t in_b = ctxpar_a2a_block_bytes(&g, in, n_in, pb->seq_local);
    const size_t back_b = ctxpar_a2a_block_bytes(&g, back, n_back, pb->seq_local);
    const size_t big = (in_b > back_b ? in_b : back_b) * (size_t)u;
    const int64_t rows = r.seq_local;
    ctxpar_carve c = {base, 0};
    (void)ctxpar_carve_take(&c, ctxpar_ring_algorithm.workspace_bytes(&r));
    w->send = ctxpar_carve_take(&c, big);
    w->recv = ctxpar_carve_take(&c, big);
    // Inputs without the LSE part (it has a buffer of its own: lse).
    w->glob = ctxpar_carve_take(&c, ctxpar_a2a_block_bytes(&g, in, backward ? 5 : 3, rows));
    w->res = ctxpar_carve_take(&c, ctxpar_a2a_block_bytes(&g, back, backward ? 3 : 1, rows));
    w->lse = ctxpar_carve_take(&c, ctxpar_count(pb->batch, rows, h.hq, 1) * sizeof(float));
    w->dkv_sum = NULL;
    if (backward && h.replicate)
        w->dkv_sum =
            ctxpar_carve_take(&c, 2 * ctxpar_count(pb->batch, pb->seq_local, pb->head_dim, 1) *
                                      (size_t)pb->heads_kv * sizeof(float));
    return c.used;
}

static size_t hybrid_workspace_bytes(const ctxpar_problem *pb) {
    const int u = ctxpar_hybrid_ulysses(pb);
    hyb_ws w;
    size_t f = hyb_layout(pb, u, 0, NULL, &w), b = hyb_layout(pb, u, 1, NULL, &w);
    return f > b ? f : b;
}

/* ---------------------------------------------------------------- one call */

// What a call needs: the grid, the two sub-problems and the two runs.
typedef struct hyb_call {
    int u;
    ctxpar_grid tmp; // when the run has no context's grid
    ctxpar_grid *grid;
    ctxpar_problem g, r;
    ctxpar_layout_map ring_map; // r's positions
    ctxpar_heads_plan h;
    ctxpar_run run_g, run_r;
    uint64_t sent0;
    hyb_ws w;
} hyb_call;

static ctxpar_status begin(const ctxpar_run *run, const ctxpar_problem *pb, int backward,
                           hyb_call *c) {
    c->u = ctxpar_hybrid_ulysses(pb);
    c->tmp = (ctxpar_grid){0, NULL, NULL};
    c->grid = run->grid ? run->grid : &c->tmp;
    c->g = ctxpar_hybrid_group_problem(pb, c->u);
    c->r = ctxpar_hybrid_ring_problem(pb, c->u);
    c->h = ctxpar_a2a_plan_heads(&c->g);
    c->ring_map = (ctxpar_layout_map){0};
    CTXPAR_CHECK(get_grid(run, c->grid, c->u));
    c->sent0 = c->grid->group->bytes_sent + c->grid->ring->bytes_sent;
    CTXPAR_CHECK(ctxpar_layout_map_group(pb->map, c->u, &c->ring_map));
    c->r.map = &c->ring_map;
    c->run_g = *run;
    c->run_g.comm = c->grid->group;
    c->run_r = *run;
    c->run_r.comm = c->grid->ring;
    void *base = NULL;
    CTXPAR_CHECK(ctxpar_run_workspace(run, hyb_layout(pb, c->u, backward, NULL, &c->w), &base));
    (void)hyb_layout(pb, c->u, backward, base, &c->w);
    return CTXPAR_OK;
}

// Counts the sub-comms' traffic as the run's comm's (ctxpar_context_bytes_sent). After a failure
// the sub-comms are aborted, so that peers waiting on this rank in them fail promptly (REMOTE),
// and dropped: the next call splits again.
static ctxpar_status end(const ctxpar_run *run, hyb_call *c, ctxpar_status st) {
    if (c->grid->group && c->grid->ring)
        run->comm->bytes_sent += c->grid->group->bytes_sent + c->grid->ring->bytes_sent - c->sent0;
    if (st != CTXPAR_OK && c->grid->group) {
        ctxpar_comm_abort(c->grid->group);
        ctxpar_comm_abort(c->grid->ring);
        ctxpar_grid_release(c->grid);
    }
    if (c->grid == &c->tmp)
        ctxpar_grid_release(&c->tmp);
    ctxpar_layout_map_free(&c->ring_map);
    return st;
}

// Rows [j*S_l, (j+1)*S_l) of a group tensor: the rows group member j owns.
static ctxpar_tensor member_rows(const ctxpar_tensor *t, const ctxpar_problem *pb, int j) {
    return ctxpar_tensor_rows(t, (int64_t)j * pb->seq_local, pb->seq_local);
}

// The local tensors' heads to every member, then the group's rows in member order.
static ctxpar_status scatter_heads(hyb_call *c, const ctxpar_problem *pb,
                                   const ctxpar_tensor *const *src, const int *kinds,
                                   const ctxpar_seg *in, int n_in, ctxpar_tensor *glob,
                                   const char *name) {
    const size_t in_b = ctxpar_a2a_block_bytes(&c->g, in, n_in, pb->seq_local);
    for (int j = 0; j < c->u; j++)
        CTXPAR_CHECK(ctxpar_a2a_pack_heads(&c->run_g, &c->g, &c->h, src, kinds, in, n_in,
                                           (char *)c->w.send + (size_t)j * in_b, j));
    CTXPAR_CHECK(ctxpar_a2a_exchange(&c->run_g, &c->g, c->w.send, c->w.recv, in_b, name));
    for (int i = 0; i < c->u; i++)
        for (int s = 0; s < n_in; s++) {
            ctxpar_tensor part = ctxpar_a2a_seg_view((char *)c->w.recv + (size_t)i * in_b, &c->g,
                                                     in, s, pb->seq_local);
            ctxpar_tensor to = member_rows(&glob[s], pb, i);
            CTXPAR_CHECK(ctxpar_dev_cast(c->run_g.dev, &part, &to, c->run_g.stream));
        }
    return CTXPAR_OK;
}

// The ring's results (group rows, this rank's heads) back to the members owning the rows.
static ctxpar_status gather_rows(hyb_call *c, const ctxpar_problem *pb, const ctxpar_tensor *res,
                                 const ctxpar_seg *back, int n_back, const char *name) {
    const size_t back_b = ctxpar_a2a_block_bytes(&c->g, back, n_back, pb->seq_local);
    for (int j = 0; j < c->u; j++)
        for (int s = 0; s < n_back; s++) {
            ctxpar_tensor from = member_rows(&res[s], pb, j);
            ctxpar_tensor to = ctxpar_a2a_seg_view((char *)c->w.send + (size_t)j * back_b, &c->g,
                                                   back, s, pb->seq_local);
            CTXPAR_CHECK(ctxpar_dev_cast(c->run_g.dev, &from, &to, c->run_g.stream));
        }
    return ctxpar_a2a_exchange(&c->run_g, &c->g, c->w.send, c->w.recv, back_b, name);
}

static ctxpar_status hybrid_fwd_body(const ctxpar_run *run, const ctxpar_problem *pb, hyb_call *c,
                                     const ctxpar_tensor *q, const ctxpar_tensor *k,
                                     const ctxpar_tensor *v, ctxpar_tensor *out, float *lse) {
    ctxpar_seg in[6], back[3];
    int n_in, n_back;
    parts(pb, &c->h, 0, in, &n_in, back, &n_back);
    const int64_t rows = c->r.seq_local;
    ctxpar_tensor glob[3];
    for (int s = 0; s < 3; s++)
        glob[s] = ctxpar_a2a_seg_view(c->w.glob, &c->g, in, s, rows);
    const ctxpar_tensor *src[3] = {q, k, v};
    const int kinds[3] = {0, 1, 1};
    CTXPAR_CHECK(scatter_heads(c, pb, src, kinds, in, 3, glob, "hybrid_qkv"));

    ctxpar_tensor res[2] = {ctxpar_a2a_seg_view(c->w.res, &c->g, back, 0, rows),
                            ctxpar_a2a_lse_view(c->w.lse, &c->g, rows, c->h.hq)};
    CTXPAR_CHECK(ctxpar_ring_algorithm.forward(&c->run_r, &c->r, &glob[0], &glob[1], &glob[2],
                                               &res[0], c->w.lse));
    CTXPAR_CHECK(gather_rows(c, pb, res, back, 2, "hybrid_out"));
    const size_t back_b = ctxpar_a2a_block_bytes(&c->g, back, 2, pb->seq_local);
    for (int i = 0; i < c->u; i++) {
        char *blk = (char *)c->w.recv + (size_t)i * back_b;
        ctxpar_tensor o = ctxpar_a2a_seg_view(blk, &c->g, back, 0, pb->seq_local);
        ctxpar_tensor dst = ctxpar_a2a_heads(out, i * c->h.hq, c->h.hq);
        CTXPAR_CHECK(ctxpar_dev_cast(run->dev, &o, &dst, run->stream));
        if (lse) {
            ctxpar_tensor l = ctxpar_a2a_seg_view(blk, &c->g, back, 1, pb->seq_local);
            ctxpar_tensor user = ctxpar_a2a_lse_view(lse, pb, pb->seq_local, pb->heads_q);
            ctxpar_tensor ldst = ctxpar_a2a_heads(&user, i * c->h.hq, c->h.hq);
            CTXPAR_CHECK(ctxpar_dev_cast(run->dev, &l, &ldst, run->stream));
        }
    }
    if (pb->lse_lo) // not kept across the hybrid's ring (its rows are the group's): none
        CTXPAR_CHECK(ctxpar_dev_fill(run->dev, pb->lse_lo, 0.0f,
                                     ctxpar_count(pb->batch, pb->heads_q, pb->seq_local, 1),
                                     run->stream));
    return CTXPAR_OK;
}

static ctxpar_status hybrid_fwd(const ctxpar_run *run, const ctxpar_problem *pb,
                                const ctxpar_tensor *q, const ctxpar_tensor *k,
                                const ctxpar_tensor *v, ctxpar_tensor *out, float *lse) {
    hyb_call c;
    ctxpar_status st = begin(run, pb, 0, &c);
    if (st == CTXPAR_OK)
        st = hybrid_fwd_body(run, pb, &c, q, k, v, out, lse);
    return end(run, &c, st);
}

static ctxpar_status hybrid_bwd_body(const ctxpar_run *run, const ctxpar_problem *pb, hyb_call *c,
                                     const ctxpar_tensor *q, const ctxpar_tensor *k,
                                     const ctxpar_tensor *v, const ctxpar_tensor *out,
                                     const float *lse, const ctxpar_tensor *dout, ctxpar_tensor *dq,
                                     ctxpar_tensor *dk, ctxpar_tensor *dv) {
    ctxpar_seg in[6], back[3];
    int n_in, n_back;
    parts(pb, &c->h, 1, in, &n_in, back, &n_back);
    const int64_t rows = c->r.seq_local;
    ctxpar_tensor glob[6];
    for (int s = 0; s < 5; s++)
        glob[s] = ctxpar_a2a_seg_view(c->w.glob, &c->g, in, s, rows);
    glob[5] = ctxpar_a2a_lse_view(c->w.lse, &c->g, rows, c->h.hq);
    ctxpar_tensor lse_t = ctxpar_a2a_lse_view(lse, pb, pb->seq_local, pb->heads_q);
    const ctxpar_tensor *src[6] = {q, k, v, out, dout, &lse_t};
    const int kinds[6] = {0, 1, 1, 0, 0, 0};
    CTXPAR_CHECK(scatter_heads(c, pb, src, kinds, in, 6, glob, "hybrid_bwd_in"));

    ctxpar_tensor res[3];
    for (int s = 0; s < 3; s++)
        res[s] = ctxpar_a2a_seg_view(c->w.res, &c->g, back, s, rows);
    CTXPAR_CHECK(ctxpar_ring_algorithm.backward(&c->run_r, &c->r, &glob[0], &glob[1], &glob[2],
                                                &glob[3], c->w.lse, &glob[4], &res[0], &res[1],
                                                &res[2]));
    CTXPAR_CHECK(gather_rows(c, pb, res, back, 3, "hybrid_grads"));
    const size_t back_b = ctxpar_a2a_block_bytes(&c->g, back, 3, pb->seq_local);
    for (int i = 0; i < c->u; i++) {
        ctxpar_tensor part = ctxpar_a2a_seg_view((char *)c->w.recv + (size_t)i * back_b, &c->g,
                                                 back, 0, pb->seq_local);
        ctxpar_tensor to = ctxpar_a2a_heads(dq, i * c->h.hq, c->h.hq);
        CTXPAR_CHECK(ctxpar_dev_cast(run->dev, &part, &to, run->stream));
    }
    return ctxpar_a2a_store_dkv(&c->run_g, &c->g, &c->h, back, c->w.recv, back_b, c->w.dkv_sum, dk,
                                dv);
}

static ctxpar_status hybrid_bwd(const ctxpar_run *run, const ctxpar_problem *pb,
                                const ctxpar_tensor *q, const ctxpar_tensor *k,
                                const ctxpar_tensor *v, const ctxpar_tensor *out, const float *lse,
                                const ctxpar_tensor *dout, ctxpar_tensor *dq, ctxpar_tensor *dk,
                                ctxpar_tensor *dv) {
    hyb_call c;
    ctxpar_status st = begin(run, pb, 1, &c);
    if (st == CTXPAR_OK)
        st = hybrid_bwd_body(run, pb, &c, q, k, v, out, lse, dout, dq, dk, dv);
    return end(run, &c, st);
}

const ctxpar_algorithm ctxpar_hybrid_algorithm = {
    .id = CTXPAR_ALGO_HYBRID,
    .name = "hybrid",
    .check = hybrid_check,
    .forward = hybrid_fwd,
    .backward = hybrid_bwd,
    .blocks = hybrid_blocks,
    .workspace_bytes = hybrid_workspace_bytes,
    .cost = hybrid_cost,
};
