// Hybrid (2-D) attention: P = u x r ranks. Inside each group of u consecutive ranks an
// all-to-all turns sequence shards into head shards (alltoall.c's pieces): each rank then holds
// its group's rows for Hq/u query heads. The ranks of equal index in the r groups run ring
// attention (ring.c) over those rows on a sub-comm, a ring rank holding a whole group's
// positions (its members' spans in position order: ctxpar_layout_map_group), so masks, windows,
// documents, layouts and shards of any size, MLA, sinks and the ring's transfer plan apply
// unchanged; a second all-to-all brings every rank its own rows for all heads. Backward
// the same way, the replicated K/V heads' dK/dV (Hkv < u) summed at the token owner as in
// alltoall.c. The sub-comms are split once per context and group size: the algorithm's state
// (hyb_grid, the table's state hooks).
#include <math.h>
#include <stdlib.h>

#include "a2a_parts.h"
#include "ctxpar_count.h"
#include "registry.h"
#include "repro.h"
#include "ring_plan.h"

extern const ctxpar_algorithm ctxpar_ring_algorithm;

// Whether u ranks per group can run this problem: u divides P and Hq, Hkv divides by u or u by
// Hkv (by u in reproducible mode: a K/V head's gradient must not be split between members),
// u <= CTXPAR_MAX_ULYSSES.
static int valid_u(const ctxpar_problem *pb, int64_t u) {
    return u >= 1 && u <= CTXPAR_MAX_ULYSSES && pb->nranks % u == 0 && pb->heads_q % u == 0 &&
           (pb->heads_kv % u == 0 || (u % pb->heads_kv == 0 && !pb->reproducible));
}

// The problem of the all-to-all inside a group: rank pb->rank % u of u.
static ctxpar_problem group_problem(const ctxpar_problem *pb, int u) {
    ctxpar_problem g = *pb;
    g.rank = pb->rank % u;
    g.nranks = u;
    return g;
}

// Tokens of group member j (rank grp*u + j): from the call's map, else counted (sizing).
static int64_t member_count(const ctxpar_problem *pb, int u, int j) {
    const int rank = (pb->rank / u) * u + j;
    if (pb->map)
        return pb->map->count[rank];
    return ctxpar_layout_count(pb->layout, pb->assignment, pb->seq_global, rank, pb->nranks);
}

// The problem one rank of the ring across groups solves: rank pb->rank / u of P / u, the
// group's rows (its members' tokens, in member order; seq_max u x pb->seq_max on every rank),
// this rank's share of the heads and of the sink logits. Its map (positions) and lse_lo are
// NULL: a call sets them (the group rows' map, hyb_rows; the group rows' low part).
static ctxpar_problem ring_problem(const ctxpar_problem *pb, int u) {
    ctxpar_problem g = group_problem(pb, u);
    const ctxpar_heads_plan h = ctxpar_a2a_plan_heads(&g);
    ctxpar_problem r = *pb;
    r.rank = pb->rank / u;
    r.nranks = pb->nranks / u;
    r.seq_local = 0;
    for (int j = 0; j < u; j++)
        r.seq_local += member_count(pb, u, j);
    // A bound on every group's rows that every rank computes alike (exact for even shards): the
    // ring's buffers and transfers are sized by it.
    r.seq_max = pb->seq_max * u;
    r.heads_q = h.hq;
    r.heads_kv = h.hk;
    r.map = NULL;
    // This rank's heads' sink logits; their gradient is the caller's call (ctxpar_sinks_backward
    // on the whole problem).
    r.sinks = pb->sinks ? pb->sinks + g.rank * h.hq : NULL;
    r.dsinks = NULL;
    r.lse_lo = NULL; // a call points it at the group's rows (hyb_ws.lse_lo)
    return r;
}

// Values moved per rank in the unit of registry.h (D·(S/P)·(P-1)/P): the two all-to-alls move
// 2·(Hq+Hkv)·(u-1)/u of the local rows, not hidden (x2, as alltoall_cost); the ring moves the
// K/V of the other r-1 groups' u·S/P rows, hk heads each, behind compute (as ring_cost).
static double cost_u(const ctxpar_problem *pb, int u) {
    const int P = pb->nranks, r = P / u;
    if (P == 1) // nothing moves; the ring is the same computation without the splits
        return HUGE_VAL;
    const ctxpar_problem g = group_problem(pb, u);
    const ctxpar_heads_plan h = ctxpar_a2a_plan_heads(&g);
    const double per_unit = (double)P / (double)(P - 1);
    const double a2a = 2.0 * 2.0 * (double)(pb->heads_q + h.hk * u) * (u - 1) / u * per_unit;
    const double ring = 2.0 * (double)(h.hk * u) * (r - 1) * per_unit;
    return a2a + ring;
}

// The group size the hybrid uses: pb->ulysses if set (0 if not valid), else the valid u of the
// lowest cost (ties: the smaller u).
static int ulysses_of(const ctxpar_problem *pb) {
    if (pb->ulysses != 0)
        return valid_u(pb, pb->ulysses) ? (int)pb->ulysses : 0;
    int best = 0;
    double best_cost = 0.0;
    for (int u = 1; u <= CTXPAR_MAX_ULYSSES && u <= pb->nranks; u++) {
        if (!valid_u(pb, u))
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
    ctxpar_problem fast = *pb; // the same problem outside reproducible mode
    fast.reproducible = 0;
    if (pb->reproducible && ulysses_of(pb) == 0 && ulysses_of(&fast) != 0)
        return CTXPAR_ERROR(CTXPAR_ERR_NOT_SUPPORTED,
                            "reproducible mode with hybrid needs the k/v heads (%lld) to divide "
                            "by the group size (params.ulysses %lld; 0 = any): a k/v head's "
                            "gradient would be split between the group's ranks",
                            (long long)pb->heads_kv, (long long)pb->ulysses);
    if (ulysses_of(pb) == 0)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG,
                            "hybrid needs params.ulysses (%lld; 0 = any) to divide the ranks (%d) "
                            "and the q heads (%lld), and the k/v heads (%lld) to divide by it or "
                            "it by them",
                            (long long)pb->ulysses, pb->nranks, (long long)pb->heads_q,
                            (long long)pb->heads_kv);
    // Reproducible mode: the ring across groups takes whole chunks when every member's shard is.
    return pb->reproducible ? ctxpar_repro_check_shards(pb, "hybrid") : CTXPAR_OK;
}

// Plus ½ so that it loses ties (it needs two sub-comms): with the all-to-all and the ring at
// the ends of its range (u = P, u = 1) it is taken only where it moves strictly less.
static double hybrid_cost(const ctxpar_problem *pb) {
    return cost_u(pb, ulysses_of(pb)) + 0.5;
}

// The ring's blocks: a group's rows against a group's rows, this rank's heads.
static void hybrid_blocks(const ctxpar_problem *pb, ctxpar_attn_query *q) {
    const ctxpar_problem r = ring_problem(pb, ulysses_of(pb));
    q->seq_q = q->seq_k = r.seq_max; // the same bound on every rank
    q->heads_q = r.heads_q;
    q->heads_kv = r.heads_kv;
}

/* ---------------------------------------------------------------- sub-comms */

// The 2-D grid of the run's comm, the hybrid's state kept between calls (run->state): `group`
// joins the u consecutive ranks of an all-to-all group, `ring` the ranks of equal index across
// groups.
typedef struct hyb_grid {
    int u;
    ctxpar_comm *group, *ring;
} hyb_grid;

// Destroys the sub-comms (the state's release: the context's destroy).
static void grid_release(void *state) {
    hyb_grid *grid = state;
    ctxpar_comm_destroy(grid->group);
    ctxpar_comm_destroy(grid->ring);
    grid->group = grid->ring = NULL;
    grid->u = 0;
}

// The grid of run->comm for groups of u (split when the state has none of that size yet;
// collective, in the same order on every rank as the ranks agreed on u). They take the parent's
// timeout at every call.
static ctxpar_status get_grid(const ctxpar_run *run, hyb_grid *grid, int u) {
    if (grid->u != u || !grid->group || !grid->ring) {
        grid_release(grid);
        const int rk = run->comm->rank;
        ctxpar_status st = ctxpar_comm_split(run->comm, rk / u, rk % u, &grid->group);
        if (st == CTXPAR_OK)
            st = ctxpar_comm_split(run->comm, rk % u, rk / u, &grid->ring);
        if (st != CTXPAR_OK) {
            grid_release(grid);
            return st;
        }
        grid->u = u;
    }
    grid->group->timeout_s = run->comm->timeout_s;
    grid->ring->timeout_s = run->comm->timeout_s;
    return CTXPAR_OK;
}

// What get_grid splits, for a dry run's comm: the group (this rank's all-to-all group), then the
// ring (one rank of each group).
static int hybrid_splits(const ctxpar_problem *pb, ctxpar_split_shape out[CTXPAR_MAX_SPLITS]) {
    const int u = ulysses_of(pb);
    out[0] = (ctxpar_split_shape){pb->rank % u, u, 1};
    out[1] = (ctxpar_split_shape){pb->rank / u, pb->nranks / u, 0};
    return 2;
}

/* ---------------------------------------------------------------- workspace */

// The ring's region first (the ring acquires the same workspace and gets this base back), then
// the exchange blocks, the group's rows of the inputs, the ring's outputs, the group's LSE and
// its low part and, backward, zeros for a caller without a low part and the sums of replicated
// K/V heads' dK/dV.
typedef struct hyb_ws {
    void *send, *recv, *glob, *res;
    float *lse, *lse_lo, *zeros, *dkv_sum;
} hyb_ws;

// What travels in and back, as in all-to-all (alltoall.c): forward q, k, v in and out, lse,
// lse_lo back; backward q, k, v, out, dout, lse, lse_lo in and dq, dk, dv back. The LSE's low
// part travels whether or not a rank's caller keeps it, so that every rank's blocks have one size.
static void parts(const ctxpar_problem *pb, const ctxpar_heads_plan *h, int backward,
                  ctxpar_seg in[7], int *n_in, ctxpar_seg back[3]) {
    const ctxpar_dtype dt = pb->dtype, f32 = CTXPAR_DTYPE_F32;
    const int64_t D = pb->head_dim, Dv = pb->head_dim_v;
    const ctxpar_seg i7[7] = {{dt, h->hq, D},  {dt, h->hk, D},  {dt, h->hk, Dv}, {dt, h->hq, Dv},
                              {dt, h->hq, Dv}, {f32, h->hq, 1}, {f32, h->hq, 1}};
    const ctxpar_seg fb[3] = {{dt, h->hq, Dv}, {f32, h->hq, 1}, {f32, h->hq, 1}};
    const ctxpar_seg bb[3] = {{f32, h->hq, D}, {f32, h->hk, D}, {f32, h->hk, Dv}};
    for (int i = 0; i < 7; i++)
        in[i] = i7[i];
    *n_in = backward ? 7 : 3;
    for (int i = 0; i < 3; i++)
        back[i] = backward ? bb[i] : fb[i];
}

static size_t hyb_layout(const ctxpar_problem *pb, int u, int backward, char *base, hyb_ws *w) {
    const ctxpar_problem g = group_problem(pb, u);
    const ctxpar_problem r = ring_problem(pb, u);
    const ctxpar_heads_plan h = ctxpar_a2a_plan_heads(&g);
    ctxpar_seg in[7], back[3];
    int n_in;
    parts(pb, &h, backward, in, &n_in, back);
    // Every block is sized for the largest shard; each holds its owner's count of rows.
    const size_t in_b = ctxpar_a2a_block_bytes(&g, in, n_in, pb->seq_max);
    const size_t back_b = ctxpar_a2a_block_bytes(&g, back, 3, pb->seq_max);
    const size_t big = (in_b > back_b ? in_b : back_b) * (size_t)u;
    const int64_t rows = r.seq_local;
    const size_t lse_bytes = ctxpar_count(pb->batch, rows, h.hq, 1) * sizeof(float);
    ctxpar_carve c = {base, 0};
    (void)ctxpar_carve_take(&c, ctxpar_ring_algorithm.workspace_bytes(&r));
    w->send = ctxpar_carve_take(&c, big);
    w->recv = ctxpar_carve_take(&c, big);
    // Inputs without the LSE parts (they have buffers of their own: lse, lse_lo).
    w->glob = ctxpar_carve_take(&c, ctxpar_a2a_block_bytes(&g, in, backward ? 5 : 3, rows));
    w->res = ctxpar_carve_take(&c, ctxpar_a2a_block_bytes(&g, back, backward ? 3 : 1, rows));
    w->lse = ctxpar_carve_take(&c, lse_bytes);
    w->lse_lo = ctxpar_carve_take(&c, lse_bytes);
    w->zeros = w->dkv_sum = NULL;
    if (backward)
        w->zeros = ctxpar_carve_take(&c, ctxpar_count(pb->batch, pb->heads_q, pb->seq_local, 1) *
                                             sizeof(float));
    if (backward && h.replicate)
        w->dkv_sum = ctxpar_carve_take(
            &c, ctxpar_count(pb->batch, pb->seq_local, pb->head_dim + pb->head_dim_v, 1) *
                    (size_t)pb->heads_kv * sizeof(float));
    return c.used;
}

static size_t hybrid_workspace_bytes(const ctxpar_problem *pb) {
    const int u = ulysses_of(pb);
    hyb_ws w;
    size_t f = hyb_layout(pb, u, 0, NULL, &w), b = hyb_layout(pb, u, 1, NULL, &w);
    return f > b ? f : b;
}

/* ---------------------------------------------------------------- one call */

// The ring's positions for groups of u (ctxpar_layout_map_group of a call's map) and the row of
// its group's rows where each span of the call's map starts: made by each call, or once by a dry
// run for every rank (hyb_dry).
typedef struct hyb_rows {
    int u;
    ctxpar_layout_map ring_map;
    int64_t *span_row; /* [spans of the call's map] */
} hyb_rows;

// One span of a member: its local rows [local, local + len) are the group's rows [row, ...).
typedef struct hyb_piece {
    int64_t local, row, len;
} hyb_piece;

// What a call needs: the grid, the two sub-problems and the two runs.
typedef struct hyb_call {
    int u;
    hyb_grid tmp; // when the run has no state
    hyb_grid *grid;
    ctxpar_problem g, r;
    hyb_rows own_rows;    // when the run has none for this u
    const hyb_rows *rows; // r's positions (rows->ring_map) and the spans' rows
    // Where the members' rows lie in the group's rows (in position order, ring_map): member j's
    // spans are pieces [pfirst[j], pfirst[j + 1]).
    hyb_piece *piece;
    int64_t pfirst[CTXPAR_MAX_ULYSSES + 1];
    ctxpar_heads_plan h;
    ctxpar_run run_g, run_r;
    uint64_t sent0;
    size_t in_b, back_b; // one member's block of each exchange
    hyb_ws w;
} hyb_call;

static void rows_free(hyb_rows *rows) {
    ctxpar_layout_map_free(&rows->ring_map);
    free(rows->span_row);
    rows->span_row = NULL;
}

static ctxpar_status rows_make(const ctxpar_layout_map *m, int u, hyb_rows *out) {
    const int64_t total = m->first[m->nranks];
    *out = (hyb_rows){u, {0}, malloc(sizeof *out->span_row * (size_t)(total > 0 ? total : 1))};
    if (!out->span_row)
        return CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "hybrid: cannot allocate %lld spans",
                            (long long)total);
    ctxpar_status st = ctxpar_layout_map_group(m, u, &out->ring_map, out->span_row);
    if (st != CTXPAR_OK)
        rows_free(out);
    return st;
}

// What a dry run's calls share (run->dry): the group rows and the ring's plan over them.
typedef struct hyb_dry {
    hyb_rows rows;
    ctxpar_ring_dry ring;
} hyb_dry;

static void hybrid_dry_free(void *dry) {
    hyb_dry *d = dry;
    if (!d)
        return;
    rows_free(&d->rows);
    ctxpar_ring_dry_free(&d->ring);
    free(d);
}

static ctxpar_status hybrid_dry_make(const ctxpar_problem *pb, void **dry_out) {
    hyb_dry *d = calloc(1, sizeof *d);
    if (!d)
        return CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "hybrid: no memory for a dry run's plan");
    const int u = ulysses_of(pb);
    ctxpar_problem rp = ring_problem(pb, u);
    ctxpar_status st = rows_make(pb->map, u, &d->rows);
    rp.map = &d->rows.ring_map;
    if (st == CTXPAR_OK)
        st = ctxpar_ring_dry_make(&rp, &d->ring);
    if (st != CTXPAR_OK) {
        hybrid_dry_free(d);
        return st;
    }
    *dry_out = d;
    return CTXPAR_OK;
}

// The ring's map (the run's, or made here) and this group's pieces.
static ctxpar_status group_rows(const ctxpar_run *run, const ctxpar_problem *pb, hyb_call *c) {
    const ctxpar_layout_map *m = pb->map;
    const int base = (pb->rank / c->u) * c->u;
    const int64_t lo = m->first[base], hi = m->first[base + c->u];
    c->piece = malloc(sizeof *c->piece * (size_t)(hi > lo ? hi - lo : 1));
    if (!c->piece)
        return CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "hybrid: cannot allocate %lld spans",
                            (long long)(hi - lo));
    const hyb_dry *dry = run->dry;
    c->rows = dry ? &dry->rows : NULL;
    if (!c->rows || c->rows->u != c->u) {
        CTXPAR_CHECK(rows_make(m, c->u, &c->own_rows));
        c->rows = &c->own_rows;
    }
    for (int j = 0; j < c->u; j++) {
        int64_t local = 0;
        c->pfirst[j] = m->first[base + j] - lo;
        for (int64_t k = m->first[base + j]; k < m->first[base + j + 1]; k++) {
            c->piece[k - lo] = (hyb_piece){local, c->rows->span_row[k], m->span[k].len};
            local += m->span[k].len;
        }
    }
    c->pfirst[c->u] = hi - lo;
    return CTXPAR_OK;
}

static ctxpar_status begin(const ctxpar_run *run, const ctxpar_problem *pb, int backward,
                           hyb_call *c) {
    c->u = ulysses_of(pb);
    c->tmp = (hyb_grid){0, NULL, NULL};
    c->grid = run->state ? run->state : &c->tmp;
    c->g = group_problem(pb, c->u);
    c->r = ring_problem(pb, c->u);
    c->h = ctxpar_a2a_plan_heads(&c->g);
    c->own_rows = (hyb_rows){0, {0}, NULL};
    c->piece = NULL;
    CTXPAR_CHECK(get_grid(run, c->grid, c->u));
    c->sent0 = ctxpar_comm_bytes_sent(c->grid->group) + ctxpar_comm_bytes_sent(c->grid->ring);
    CTXPAR_CHECK(group_rows(run, pb, c));
    c->r.map = &c->rows->ring_map;
    ctxpar_seg in[7], back[3];
    int n_in;
    parts(pb, &c->h, backward, in, &n_in, back);
    c->in_b = ctxpar_a2a_block_bytes(&c->g, in, n_in, pb->seq_max);
    c->back_b = ctxpar_a2a_block_bytes(&c->g, back, 3, pb->seq_max);
    // The sub-runs are of other algorithms' pieces: no hybrid state; the ring's dry-run plan.
    hyb_dry *dry = run->dry; // the ring's cache in it is written
    c->run_g = *run;
    c->run_g.comm = c->grid->group;
    c->run_g.state = c->run_g.dry = NULL;
    c->run_r = c->run_g;
    c->run_r.comm = c->grid->ring;
    c->run_r.dry = dry ? &dry->ring : NULL;
    void *base = NULL;
    CTXPAR_CHECK(ctxpar_run_workspace(run, hyb_layout(pb, c->u, backward, NULL, &c->w), &base));
    (void)hyb_layout(pb, c->u, backward, base, &c->w);
    c->r.lse_lo = c->w.lse_lo; // the ring keeps the group rows' low part for the way back
    return CTXPAR_OK;
}

// Counts the sub-comms' traffic as the run's comm's (ctxpar_context_bytes_sent). After a failure
// the sub-comms are aborted, so that peers waiting on this rank in them fail promptly (REMOTE),
// and dropped: the next call splits again.
static ctxpar_status end(const ctxpar_run *run, hyb_call *c, ctxpar_status st) {
    if (c->grid->group && c->grid->ring)
        ctxpar_comm_count_sent(run->comm, ctxpar_comm_bytes_sent(c->grid->group) +
                                              ctxpar_comm_bytes_sent(c->grid->ring) - c->sent0);
    if (st != CTXPAR_OK && c->grid->group) {
        ctxpar_comm_abort(c->grid->group);
        ctxpar_comm_abort(c->grid->ring);
        grid_release(c->grid);
    }
    if (c->grid == &c->tmp)
        grid_release(&c->tmp);
    rows_free(&c->own_rows);
    free(c->piece);
    c->piece = NULL;
    return st;
}

// Member j's rows: `local` (its count of rows, in its order) to or from its pieces of the
// group's rows in `group`.
static ctxpar_status move_member(const hyb_call *c, int j, const ctxpar_tensor *local,
                                 const ctxpar_tensor *group, int to_group) {
    for (int64_t x = c->pfirst[j]; x < c->pfirst[j + 1]; x++) {
        const hyb_piece *p = &c->piece[x];
        ctxpar_tensor l = ctxpar_tensor_rows(local, p->local, p->len);
        ctxpar_tensor g = ctxpar_tensor_rows(group, p->row, p->len);
        CTXPAR_CHECK(to_group ? ctxpar_dev_cast(c->run_g.dev, &l, &g, c->run_g.stream)
                              : ctxpar_dev_cast(c->run_g.dev, &g, &l, c->run_g.stream));
    }
    return CTXPAR_OK;
}

// Member j's count of rows.
static int64_t member_count_of(const hyb_call *c, const ctxpar_problem *pb, int j) {
    return pb->map->count[(pb->rank / c->u) * c->u + j];
}

// The local tensors' heads to every member, then the group's rows in member order.
static ctxpar_status scatter_heads(hyb_call *c, const ctxpar_problem *pb,
                                   const ctxpar_tensor *const *src, const int *kinds,
                                   const ctxpar_seg *in, int n_in, ctxpar_tensor *glob,
                                   const char *name) {
    for (int j = 0; j < c->u; j++)
        CTXPAR_CHECK(ctxpar_a2a_pack_heads(&c->run_g, &c->g, &c->h, src, kinds, in, n_in,
                                           (char *)c->w.send + (size_t)j * c->in_b, j));
    CTXPAR_CHECK(ctxpar_a2a_exchange(&c->run_g, &c->g, c->w.send, c->w.recv, c->in_b, name));
    for (int i = 0; i < c->u; i++)
        for (int s = 0; s < n_in; s++) {
            ctxpar_tensor part = ctxpar_a2a_seg_view((char *)c->w.recv + (size_t)i * c->in_b, &c->g,
                                                     in, s, member_count_of(c, pb, i));
            CTXPAR_CHECK(move_member(c, i, &part, &glob[s], 1));
        }
    return CTXPAR_OK;
}

// The ring's results (group rows, this rank's heads) back to the members owning the rows.
static ctxpar_status gather_rows(hyb_call *c, const ctxpar_problem *pb, const ctxpar_tensor *res,
                                 const ctxpar_seg *back, const char *name) {
    for (int j = 0; j < c->u; j++)
        for (int s = 0; s < 3; s++) {
            ctxpar_tensor to = ctxpar_a2a_seg_view((char *)c->w.send + (size_t)j * c->back_b, &c->g,
                                                   back, s, member_count_of(c, pb, j));
            CTXPAR_CHECK(move_member(c, j, &to, &res[s], 0));
        }
    return ctxpar_a2a_exchange(&c->run_g, &c->g, c->w.send, c->w.recv, c->back_b, name);
}

static ctxpar_status hybrid_fwd_body(const ctxpar_run *run, const ctxpar_problem *pb, hyb_call *c,
                                     const ctxpar_tensor *q, const ctxpar_tensor *k,
                                     const ctxpar_tensor *v, ctxpar_tensor *out, float *lse) {
    ctxpar_seg in[7], back[3];
    int n_in;
    parts(pb, &c->h, 0, in, &n_in, back);
    const int64_t rows = c->r.seq_local;
    ctxpar_tensor glob[3];
    for (int s = 0; s < 3; s++)
        glob[s] = ctxpar_a2a_seg_view(c->w.glob, &c->g, in, s, rows);
    const ctxpar_tensor *src[3] = {q, k, v};
    const int kinds[3] = {0, 1, 1};
    CTXPAR_CHECK(scatter_heads(c, pb, src, kinds, in, 3, glob, "hybrid_qkv"));

    ctxpar_tensor res[3] = {ctxpar_a2a_seg_view(c->w.res, &c->g, back, 0, rows),
                            ctxpar_a2a_lse_view(c->w.lse, &c->g, rows, c->h.hq),
                            ctxpar_a2a_lse_view(c->w.lse_lo, &c->g, rows, c->h.hq)};
    CTXPAR_CHECK(ctxpar_ring_algorithm.forward(&c->run_r, &c->r, &glob[0], &glob[1], &glob[2],
                                               &res[0], c->w.lse));
    CTXPAR_CHECK(gather_rows(c, pb, res, back, "hybrid_out"));
    return ctxpar_a2a_store_out(run, &c->g, &c->h, back, c->w.recv, c->back_b, out, lse);
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
    ctxpar_seg in[7], back[3];
    int n_in;
    parts(pb, &c->h, 1, in, &n_in, back);
    const int64_t rows = c->r.seq_local;
    ctxpar_tensor glob[7];
    for (int s = 0; s < 5; s++)
        glob[s] = ctxpar_a2a_seg_view(c->w.glob, &c->g, in, s, rows);
    glob[5] = ctxpar_a2a_lse_view(c->w.lse, &c->g, rows, c->h.hq);
    glob[6] = ctxpar_a2a_lse_view(c->w.lse_lo, &c->g, rows, c->h.hq);
    // Without the caller's low part, zeros travel (the same answer as none).
    float *lo = pb->lse_lo ? pb->lse_lo : c->w.zeros;
    if (!pb->lse_lo)
        CTXPAR_CHECK(ctxpar_dev_fill(run->dev, lo, 0.0f,
                                     ctxpar_count(pb->batch, pb->heads_q, pb->seq_local, 1),
                                     run->stream));
    ctxpar_tensor lse_t = ctxpar_a2a_lse_view(lse, pb, pb->seq_local, pb->heads_q);
    ctxpar_tensor lo_t = ctxpar_a2a_lse_view(lo, pb, pb->seq_local, pb->heads_q);
    const ctxpar_tensor *src[7] = {q, k, v, out, dout, &lse_t, &lo_t};
    const int kinds[7] = {0, 1, 1, 0, 0, 0, 0};
    CTXPAR_CHECK(scatter_heads(c, pb, src, kinds, in, 7, glob, "hybrid_bwd_in"));

    ctxpar_tensor res[3];
    for (int s = 0; s < 3; s++)
        res[s] = ctxpar_a2a_seg_view(c->w.res, &c->g, back, s, rows);
    CTXPAR_CHECK(ctxpar_ring_algorithm.backward(&c->run_r, &c->r, &glob[0], &glob[1], &glob[2],
                                                &glob[3], c->w.lse, &glob[4], &res[0], &res[1],
                                                &res[2]));
    CTXPAR_CHECK(gather_rows(c, pb, res, back, "hybrid_grads"));
    return ctxpar_a2a_store_grads(&c->run_g, &c->g, &c->h, back, c->w.recv, c->back_b, c->w.dkv_sum,
                                  dq, dk, dv);
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
    .state_bytes = sizeof(hyb_grid),
    .state_release = grid_release,
    .dry_make = hybrid_dry_make,
    .dry_free = hybrid_dry_free,
    .splits = hybrid_splits,
    .reproducible = 1,
};
