/*
 * Block attention forward on the CPU.
 *
 *   q [B, Sq, Hq, D], k and v [B, Sk, Hkv, D]    F32, F16 or BF16 (one dtype), any row strides
 *   out_acc [B, Sq, Hq, D], lse_acc [B, Hq, Sq]  F32, dense: overwritten (merge = 0) or merged
 *
 * One work item is (batch, query head, a group of tiles of CTXPAR_CPU_TILE_Q query rows); items
 * are handed out dynamically, those with the most key tiles to visit first, and one thread
 * computes an item from start to end: its rows are its own, so nothing depends on the thread
 * count or on which thread ran it. Inside an item the query rows are the vector lanes: Q^T is
 * packed once per tile, then for each key tile of CTXPAR_CPU_TILE_K rows, in increasing order
 * from the start of the K/V block:
 *   S = Q^T-rows x K (register-tiled), mask if the tile is PARTIAL, online softmax in base 2
 *   (scale * log2(e) applied inside it), O^T += P V in F32 over a pair of tiles, then folded into
 *   F64 running sums (docs/numerics.md),
 * where the P V of a PARTIAL tile selects the masked pairs away (a masked P is 0, but 0 times a
 * NaN or inf in V is NaN, and the oracle never touches masked pairs). Every step treats each lane
 * alone (cpu_kernels.h), so a query row's result depends only on its q row, its position and the
 * K/V rows: not on the other rows of the call or its place in the tile (what makes the all-gather
 * algorithm bitwise equal to one rank). SKIP tiles are left out, which is bit-neutral: for a row
 * that sees none of a tile's keys, visiting it would rescale by exactly 1, add exact zeros to the
 * sum and leave O^T as it was (the select keeps it, whatever V holds), and a visible key gives the
 * same bits whether its tile is FULL or PARTIAL.
 */
#include <float.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "backends/cpu/cpu_internal.h"

#define LN2 0.693147180559945309417

#define TQ CTXPAR_CPU_TILE_Q
#define TK CTXPAR_CPU_TILE_K

// Query tiles per work item: each K/V tile is loaded once for all of them. As many as keep the
// item's running state (Q^T, the F32 part and the F64 sums of O^T: 64 x (4 D + 12 Dv) bytes a
// tile) within FWD_GROUP_BYTES, 8 at head_dim 128 (measured on an Intel server core: 3-4 %
// faster than 4), 16 at 64; 4 when there are too few items for the threads. Which tiles share
// an item changes no bit.
#define FWD_GROUP_MAX 16
#define FWD_GROUP_MIN 4
#define FWD_GROUP_BYTES (1 << 20)

static int fwd_group(const ctxpar_cpu_plan *p, int threads) {
    int group = FWD_GROUP_MAX;
    while (group > FWD_GROUP_MIN && group * 64 * (4 * p->dim + 12 * p->dim_v) > FWD_GROUP_BYTES)
        group /= 2;
    if (p->batch * p->heads_q * ((p->q_tiles + group - 1) / group) < 2 * (int64_t)threads)
        group = FWD_GROUP_MIN; // fewer, bigger items would leave threads idle
    return group;
}

// Per-thread workspace, in floats, each part a multiple of 16 (64 bytes), for the item's query
// tiles (at most FWD_GROUP_MAX).
typedef struct fwd_ws {
    float *qt[FWD_GROUP_MAX];  // [D, lanes]  Q^T
    float *ot[FWD_GROUP_MAX];  // [D, lanes]  this key tile pair's part of O^T (F32, from 0)
    double *od[FWD_GROUP_MAX]; // [D, lanes]  unnormalised O^T: the tiles' parts, in F64
    float *m[FWD_GROUP_MAX];   // [lanes]     running max (base 2)
    float *l[FWD_GROUP_MAX];   // [lanes]     this key tile pair's row sum (F32, from 0)
    float *a[FWD_GROUP_MAX];   // [lanes]     the pair's rescale factors, multiplied
    double *ld[FWD_GROUP_MAX]; // [lanes]     running row sum, in F64
    float *alpha;                // [lanes]     rescale factor of the current step
    float *s;                    // [TK, lanes] scores, then probabilities
    uint32_t *vis;               // [TK, lanes] visibility of a PARTIAL tile (cpu_kernels.h)
    float *kbuf, *vbuf;          // [TK, D]     the K and V tile as dense F32
    float *row;                  // [D]         one converted q row
} fwd_ws;

static size_t round16(size_t n) {
    return (n + 15) / 16 * 16;
}

// Lays the workspace out from base; with base NULL it only measures (*floats_out).
static fwd_ws fwd_ws_at(float *base, int64_t dim, int64_t dim_v, int group, size_t *floats_out) {
    const size_t d = (size_t)dim, dv = (size_t)dim_v;
    size_t off = 0;
    fwd_ws w;
#define TAKE(ptr, n) ((ptr) = base ? (void *)(base + off) : NULL, off += round16(n))
    for (int g = 0; g < group; g++) {
        TAKE(w.qt[g], d * TQ);
        TAKE(w.ot[g], dv * TQ);
        TAKE(w.od[g], 2 * dv * TQ); // doubles, counted as 2 floats
        TAKE(w.m[g], TQ);
        TAKE(w.l[g], TQ);
        TAKE(w.a[g], TQ);
        TAKE(w.ld[g], 2 * TQ);
    }
    TAKE(w.alpha, TQ);
    TAKE(w.s, (size_t)TK * TQ);
    TAKE(w.vis, (size_t)TK * TQ); // 32-bit words, counted as floats
    TAKE(w.kbuf, (size_t)TK * d);
    TAKE(w.vbuf, (size_t)TK * dv);
    TAKE(w.row, d);
#undef TAKE
    *floats_out = off;
    return w;
}

static int64_t tile_rows(int64_t seq, int64_t t, int64_t tile) {
    return seq - t * tile < tile ? seq - t * tile : tile;
}

static int64_t lanes_for(const ctxpar_cpu_kernels *kern, int64_t rows) {
    return (rows + kern->lane_block - 1) / kern->lane_block * kern->lane_block;
}

// Packs query tile qt (Q^T with the scale's sign, padding lanes 0) and resets its running state.
static void fwd_begin(const ctxpar_cpu_plan *p, const ctxpar_cpu_kernels *kern, const fwd_ws *w,
                      int g, int64_t b, int64_t h, int64_t qt) {
    const ctxpar_attn_block *blk = p->blk;
    const int64_t dim = p->dim, i0 = qt * TQ, nq = tile_rows(p->seq_q, qt, TQ);
    const int64_t lanes = lanes_for(kern, nq);
    const float sign = ctxpar_cpu_score_sign(blk->scale);
    for (int64_t r = 0; r < lanes; r++) {
        if (r < nq)
            kern->to_f32(w->row, ctxpar_cpu_row(&blk->q, b, i0 + r, h), blk->q.dtype, dim);
        for (int64_t d = 0; d < dim; d++)
            w->qt[g][d * lanes + r] = r < nq ? w->row[d] * sign : 0.0f;
        w->m[g][r] = -FLT_MAX;
        w->l[g][r] = 0.0f;
        w->a[g][r] = 1.0f;
        w->ld[g][r] = 0.0;
    }
    memset(w->ot[g], 0, (size_t)(p->dim_v * lanes) * sizeof(float));
    memset(w->od[g], 0, (size_t)(p->dim_v * lanes) * sizeof(double));
}

// Key tiles are summed in F32 by pairs (0-1, 2-3, ...), each pair's part then folded into the F64
// sums: which pair a tile belongs to depends on its index only, and a tile whose keys a row does
// not see adds exact zeros at a rescale of exactly 1, so skipping it or not changes no bit.
// Groups of four were 3-4 % faster on an Intel server core but took PyTorch's inputs (uniform
// [0, 1)) at seq 4096 from 0.55x to 0.85x naive float32's `out` error and dq to 0.98x
// (docs/performance.md): too close to the bound for the reference.
#define FOLD_TILES 2

// Whether key tile kt is the last tile of its group of FOLD_TILES that query tile qt visits:
// then its P V also folds the group's part into the F64 sums, in the same pass.
static int fold_group_ends(const ctxpar_cpu_plan *p, int64_t qt, int64_t kt) {
    const int64_t end = (kt / FOLD_TILES + 1) * FOLD_TILES;
    for (int64_t k = kt + 1; k < end && k < p->k_tiles; k++)
        if (ctxpar_cpu_plan_classify(p, qt, k) != CTXPAR_BLOCK_SKIP)
            return 0;
    return 1;
}

// Writes (or merges) the finished rows of query tile qt.
static void fwd_end(const ctxpar_cpu_plan *p, const ctxpar_cpu_kernels *kern, const fwd_ws *w,
                    int g, int64_t b, int64_t h, int64_t qt, float *out_acc, float *lse_acc,
                    int merge) {
    const int64_t dim = p->dim_v, i0 = qt * TQ, nq = tile_rows(p->seq_q, qt, TQ);
    const int64_t lanes = lanes_for(kern, nq);
    for (int64_t r = 0; r < nq; r++) {
        int64_t i = i0 + r;
        float *out = out_acc + ((b * p->seq_q + i) * p->heads_q + h) * dim;
        float *lse = lse_acc + (b * p->heads_q + h) * p->seq_q + i;
        float *lo = p->blk->lse_lo ? p->blk->lse_lo + (lse - lse_acc) : NULL;
        const double sum = w->ld[g][r];
        const double lse_b = sum == 0.0 ? -INFINITY : ((double)w->m[g][r] + log2(sum)) * LN2;
        if (merge) { // from the F64 values: rounded once, after the merge
            ctxpar_cpu_merge_row(out, lse, lo, NULL, w->od[g] + r, lanes, sum, lse_b, dim);
        } else if (sum == 0.0) { // no visible key
            memset(out, 0, (size_t)dim * sizeof *out);
            ctxpar_cpu_store_lse(lse, lo, -INFINITY);
        } else { // in F64, rounded once
            for (int64_t d = 0; d < dim; d++)
                out[d] = (float)(w->od[g][d * lanes + r] / sum);
            ctxpar_cpu_store_lse(lse, lo, lse_b);
        }
    }
}

// The order items are handed out in: query tile groups by decreasing count of key tiles to visit
// (ties in group order), each for every (batch, head). Under a causal mask the last group visits
// all key tiles and the first a few; handed out round-robin they left one of 2 threads idle for
// 12 % of a forward at seq 8192. Largest first, whoever finishes early takes the small ones.
typedef struct group_cost {
    int64_t tiles, grp;
} group_cost;

static int by_cost(const void *a, const void *b) {
    const group_cost *x = a, *y = b;
    if (x->tiles != y->tiles)
        return x->tiles > y->tiles ? -1 : 1;
    return (x->grp > y->grp) - (x->grp < y->grp);
}

// The groups sorted into the order they are handed out in; NULL when they cannot be allocated.
static group_cost *group_order(const ctxpar_cpu_plan *p, int group, int64_t groups) {
    group_cost *c = malloc((size_t)groups * sizeof *c);
    if (!c)
        return NULL;
    for (int64_t grp = 0; grp < groups; grp++) {
        c[grp] = (group_cost){0, grp};
        for (int64_t qt = grp * group; qt < p->q_tiles && qt < (grp + 1) * group; qt++)
            for (int64_t kt = 0; kt < p->k_tiles; kt++)
                c[grp].tiles += ctxpar_cpu_plan_classify(p, qt, kt) != CTXPAR_BLOCK_SKIP;
    }
    qsort(c, (size_t)groups, sizeof *c, by_cost);
    return c;
}

// One work item: query tiles qt0 .. qt0+ng-1 of (b, h) against every key tile in order.
static void fwd_item(const ctxpar_cpu_plan *p, const ctxpar_cpu_kernels *kern, const fwd_ws *w,
                     int64_t b, int64_t h, int64_t qt0, int ng, float *out_acc, float *lse_acc,
                     int merge) {
    const ctxpar_attn_block *blk = p->blk;
    const int64_t dim = p->dim, hk = h / p->group;
    const float *krows[TK], *vrows[TK];
    const double c = ctxpar_cpu_softmax_c(blk); // into base 2 inside the softmax
    ctxpar_block_class cls[FWD_GROUP_MAX];
    for (int g = 0; g < ng; g++)
        fwd_begin(p, kern, w, g, b, h, qt0 + g);
    for (int64_t kt = 0; kt < p->k_tiles; kt++) {
        int any = 0;
        for (int g = 0; g < ng; g++) {
            cls[g] = ctxpar_cpu_plan_classify(p, qt0 + g, kt);
            any |= cls[g] != CTXPAR_BLOCK_SKIP;
        }
        if (!any)
            continue;
        const int64_t j0 = kt * TK, nk = tile_rows(p->seq_k, kt, TK);
        ctxpar_cpu_load_rows(kern, &blk->k, b, j0, nk, hk, w->kbuf, krows);
        ctxpar_cpu_load_rows(kern, &blk->v, b, j0, nk, hk, w->vbuf, vrows);
        for (int g = 0; g < ng; g++) {
            if (cls[g] == CTXPAR_BLOCK_SKIP)
                continue;
            const int64_t i0 = (qt0 + g) * TQ, nq = tile_rows(p->seq_q, qt0 + g, TQ);
            const int64_t lanes = lanes_for(kern, nq);
            const uint32_t *vis = NULL; // FULL: nothing masked, no select
            kern->scores(w->s, lanes, w->qt[g], lanes, krows, nk, lanes, dim);
            if (cls[g] == CTXPAR_BLOCK_PARTIAL) {
                ctxpar_cpu_plan_mask(p, w->s, w->vis, lanes, i0, j0, nk, nq, 1);
                vis = w->vis;
            }
            if (blk->softcap > 0.0f)
                ctxpar_cpu_softcap(kern, blk, w->s, NULL, vis, lanes, nk);
            kern->softmax_step(w->s, lanes, nk, lanes, c, w->m[g], w->l[g], w->alpha);
            for (int64_t r = 0; r < lanes; r++) // the F64 sums get the group's rescale at the fold
                w->a[g][r] *= w->alpha[r];
            if (!fold_group_ends(p, qt0 + g, kt)) {
                kern->accum(w->ot[g], lanes, w->alpha, w->s, vis, lanes, vrows, nk, lanes,
                            p->dim_v);
                continue;
            }
            kern->accum_fold(w->ot[g], w->od[g], lanes, w->alpha, w->a[g], w->s, vis, lanes, vrows,
                             nk, lanes, p->dim_v);
            kern->fold(w->ld[g], lanes, w->l[g], lanes, w->a[g], 1, lanes);
            for (int64_t r = 0; r < lanes; r++)
                w->a[g][r] = 1.0f;
        }
    }
    for (int g = 0; g < ng; g++)
        fwd_end(p, kern, w, g, b, h, qt0 + g, out_acc, lse_acc, merge);
}

// The whole block pair is masked: every row is empty (out 0, lse -inf), which merges to nothing.
static void fwd_empty(const ctxpar_cpu_plan *p, float *out_acc, float *lse_acc, int merge) {
    if (merge)
        return;
    size_t rows = (size_t)(p->batch * p->seq_q * p->heads_q);
    memset(out_acc, 0, rows * (size_t)p->dim_v * sizeof *out_acc);
    for (size_t i = 0; i < rows; i++)
        ctxpar_cpu_store_lse(lse_acc + i, p->blk->lse_lo ? p->blk->lse_lo + i : NULL, -INFINITY);
}

ctxpar_status ctxpar_cpu_attn_block_fwd(ctxpar_device *dev, const ctxpar_attn_block *blk,
                                        float *out_acc, float *lse_acc, int merge,
                                        ctxpar_stream *stream) {
    (void)stream; // synchronous device
    ctxpar_cpu_device *cpu = dev->impl;
    ctxpar_cpu_plan p;
    CTXPAR_CHECK(ctxpar_cpu_plan_init(blk, "attn_block_fwd", &p));
    ctxpar_status st = CTXPAR_OK; // the dispatch checked merge and the accumulators
    const int nt = ctxpar_cpu_threads(cpu);
    const int group = fwd_group(&p, nt);
    const int64_t groups = (p.q_tiles + group - 1) / group;
    const int64_t items = p.batch * p.heads_q * groups;
    if (items == 0)
        goto done;
    if (p.whole == CTXPAR_BLOCK_SKIP) {
        fwd_empty(&p, out_acc, lse_acc, merge);
        goto done;
    }
    size_t per_thread;
    (void)fwd_ws_at(NULL, p.dim, p.dim_v, group, &per_thread); // only measures
    float *ws = ctxpar_cpu_kernel_ws(cpu, (size_t)nt * per_thread * sizeof(float));
    if (!ws) {
        st = CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY,
                          "attn_block_fwd: cannot allocate %d workspaces of %zu bytes", nt,
                          per_thread * sizeof(float));
        goto done;
    }
    group_cost *order = group_order(&p, group, groups);
    if (!order) {
        st = CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY,
                          "attn_block_fwd: cannot allocate the order of %lld query tile groups",
                          (long long)groups);
        goto done;
    }
    const ctxpar_cpu_kernels *kern = cpu->kern;
    const int64_t bh = p.batch * p.heads_q;
#pragma omp parallel num_threads(nt)
    {
        size_t unused;
        fwd_ws w = fwd_ws_at(ws + (size_t)omp_get_thread_num() * per_thread, p.dim, p.dim_v, group,
                             &unused);
#pragma omp for schedule(dynamic, 1)
        for (int64_t it = 0; it < items; it++) {
            int64_t grp = order[it / bh].grp, h = (it % bh) % p.heads_q, b = (it % bh) / p.heads_q;
            int64_t qt0 = grp * group;
            int ng = p.q_tiles - qt0 < group ? (int)(p.q_tiles - qt0) : group;
            fwd_item(&p, kern, &w, b, h, qt0, ng, out_acc, lse_acc, merge);
        }
    }
    free(order);
done:
    ctxpar_cpu_plan_release(&p);
    return st;
}
