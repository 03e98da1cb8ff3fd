// The ring's transfer plan under a mask: how far each K/V block must travel.
#include <math.h>
#include <stdlib.h>

#include "ring_plan.h"

int ctxpar_shards_interact(const ctxpar_problem *pb, int q_rank, int k_rank) {
    return ctxpar_spans_interact(&pb->mask, ctxpar_problem_spans(pb, q_rank),
                                 ctxpar_problem_spans(pb, k_rank));
}

ctxpar_status ctxpar_ring_plan_make(const ctxpar_problem *pb, ctxpar_ring_plan *plan) {
    const int P = pb->nranks;
    plan->nranks = P;
    plan->borrowed = 0;
    plan->seen = NULL;
    plan->last = malloc((size_t)P * sizeof *plan->last);
    plan->sum_last = malloc((size_t)P * sizeof *plan->sum_last);
    if (!plan->last || !plan->sum_last) {
        ctxpar_ring_plan_free(plan);
        return CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "cannot allocate a ring plan for %d ranks",
                            P);
    }
    for (int j = 0; j < P; j++) {
        plan->last[j] = j;
        for (int t = P - 1; t > 0; t--)
            if (ctxpar_shards_interact(pb, (j + t) % P, j)) {
                plan->last[j] = (j + t) % P;
                break;
            }
        plan->sum_last[j] = plan->last[j];
    }
    // A sum sent home from last[j] before the last step arrives in the owner's other partial-sum
    // buffer (the one its step-t sum is not in) and stays there to the end: allowed only if no
    // partial sum of another block uses that buffer afterwards, i.e. none arrives at a step
    // u >= t with u = t (mod 2). Otherwise the sum goes on around the ring. Sending a sum further
    // only adds hops, so the fixpoint is reached after at most P rounds.
    for (int changed = 1; changed;) {
        changed = 0;
        for (int r = 0; r < P; r++) {
            const int t = ctxpar_ring_dist(r, plan->sum_last[r], P);
            if (t == 0 || t == P - 1)
                continue;
            const int prev = (r + P - 1) % P;
            for (int u = t; u <= P - 2; u += 2)
                if (ctxpar_ring_sum_hop(plan, prev, u)) {
                    plan->sum_last[r] = prev;
                    changed = 1;
                    break;
                }
        }
    }
    return CTXPAR_OK;
}

static ctxpar_status ring_seen_init(ctxpar_ring_seen *seen, int nranks);
static void ring_seen_free(ctxpar_ring_seen *seen);

ctxpar_status ctxpar_ring_dry_make(const ctxpar_problem *pb, ctxpar_ring_dry *dry) {
    *dry = (ctxpar_ring_dry){{0, NULL, NULL, 0, NULL}, {-1, 0, NULL, NULL, 0, NAN}};
    CTXPAR_CHECK(ctxpar_ring_plan_make(pb, &dry->plan));
    if (ring_seen_init(&dry->seen, pb->nranks) == CTXPAR_OK) {
        dry->plan.seen = &dry->seen;
        dry->seen.sorted_runs = 1;
        for (int j = 0; j < pb->nranks && dry->seen.sorted_runs; j++)
            dry->seen.sorted_runs = ctxpar_spans_sorted_runs(ctxpar_problem_spans(pb, j));
    }
    return CTXPAR_OK;
}

void ctxpar_ring_dry_free(ctxpar_ring_dry *dry) {
    ctxpar_ring_plan_free(&dry->plan);
    ring_seen_free(&dry->seen);
}

ctxpar_status ctxpar_ring_plan_for(const ctxpar_run *run, const ctxpar_problem *pb,
                                   ctxpar_ring_plan *plan) {
    const ctxpar_ring_dry *dry = run->dry;
    if (dry && dry->plan.nranks == pb->nranks) {
        *plan = dry->plan;
        plan->borrowed = 1;
        return CTXPAR_OK;
    }
    return ctxpar_ring_plan_make(pb, plan);
}

void ctxpar_ring_plan_free(ctxpar_ring_plan *plan) {
    if (plan->borrowed) {
        plan->last = plan->sum_last = NULL;
        return;
    }
    free(plan->last);
    free(plan->sum_last);
    plan->last = NULL;
    plan->sum_last = NULL;
}

// Whether rank `from` passes what it holds at `step` (of block from - step) on to from + 1, for
// paths ending at last[] (K/V: plan->last; partial sums: plan->sum_last).
static int hop(const ctxpar_ring_plan *plan, const int *last, int from, int step) {
    const int P = plan->nranks;
    if (step >= P - 1)
        return 0;
    int j = ctxpar_ring_dist(step, from, P); // block from - step
    // The receiver, step + 1 hops from the owner, is still on the path.
    return step + 1 <= ctxpar_ring_dist(j, last[j], P);
}

// Whether every key of block k lies outside the documents of each query span (bounds d0, d1):
// then no query shares a document with any key, an exact SKIP found without classifying.
static int outside_docs(const ctxpar_problem *pb, int k, int n, const int64_t *d0,
                        const int64_t *d1) {
    const ctxpar_spans ks = ctxpar_problem_spans(pb, k);
    for (int j = 0; j < ks.count; j++) {
        int64_t kmin, kmax;
        ctxpar_spans_range((ctxpar_spans){&ks.span[j], 1}, &kmin, &kmax);
        for (int i = 0; i < n; i++)
            if (kmax >= d0[i] && kmin <= d1[i])
                return 0;
    }
    return 1;
}

// A row entry not classified yet (ring_seen.row): ctxpar_ring_account settles it with the
// block's own accounting, which spares a striped layout (every block seen) a second pass.
#define SEEN_UNKNOWN 2

// The cache's row for rank pb->rank (made when the row is another rank's), or NULL for none.
static ctxpar_ring_seen *seen_row(const ctxpar_ring_plan *plan, const ctxpar_problem *pb) {
    ctxpar_ring_seen *c = plan->seen;
    if (!c || c->nranks != pb->nranks)
        return NULL;
    if (c->rank != pb->rank) {
        // The documents of this rank's query spans (one row of documents, a few spans): most
        // blocks of a long packed sequence fall outside them.
        const ctxpar_spans qs = ctxpar_problem_spans(pb, pb->rank);
        int64_t d0[4], d1[4];
        const int n = pb->mask.cu_seqlens && pb->mask.doc_rows == 0 && qs.count <= 4 ? qs.count : 0;
        for (int i = 0; i < n; i++) {
            int64_t qmin, qmax;
            ctxpar_spans_range((ctxpar_spans){&qs.span[i], 1}, &qmin, &qmax);
            d0[i] = pb->mask.cu_seqlens[ctxpar_mask_doc_of(&pb->mask, qmin)];
            d1[i] = pb->mask.cu_seqlens[ctxpar_mask_doc_of(&pb->mask, qmax) + 1] - 1;
        }
        for (int k = 0; k < pb->nranks; k++) {
            c->row[k] = n > 0 && outside_docs(pb, k, n, d0, d1) ? 0 : SEEN_UNKNOWN;
            c->work[k].live = -1;
        }
        c->rank = pb->rank;
        c->row_flops = NAN;
    }
    return c;
}

int ctxpar_ring_may_see(const ctxpar_ring_plan *plan, const ctxpar_problem *pb, int j) {
    ctxpar_ring_seen *c = seen_row(plan, pb);
    if (!c)
        return 1;
    if (c->row[j] == SEEN_UNKNOWN)
        c->row[j] = (unsigned char)ctxpar_shards_interact(pb, pb->rank, j);
    return c->row[j];
}
// A cache for rings of nranks ranks (no row yet).
static ctxpar_status ring_seen_init(ctxpar_ring_seen *seen, int nranks) {
    seen->rank = -1;
    seen->nranks = nranks;
    seen->row = malloc((size_t)nranks);
    seen->work = malloc(sizeof *seen->work * (size_t)nranks);
    if (seen->row && seen->work)
        return CTXPAR_OK;
    ring_seen_free(seen);
    return CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "no memory for a ring cache of %d ranks", nranks);
}

static void ring_seen_free(ctxpar_ring_seen *seen) {
    free(seen->row);
    free(seen->work);
    seen->row = NULL;
    seen->work = NULL;
}

static void add_work(ctxpar_work_stats *to, const ctxpar_work_stats *w) {
    if (!to)
        return;
    to->blocks_computed += w->blocks_computed;
    to->blocks_skipped += w->blocks_skipped;
    to->flops += w->flops;
}

// A block of a row of many query runs, the keys sorted runs (a custom layout of short runs),
// where counting every block query by query made plans of P^2 blocks take hours. The blocks of a
// row hold the sequence's keys between them, each once, and the ring computes every live one (the
// planner's coverage proof checks that), so the row's pairs against the whole sequence are its
// blocks' pairs: they are counted once and given to its own block. Each block is still classified
// as ctxpar_block_account classifies lists of many runs (computed or skipped).
static int account_in_row(ctxpar_ring_seen *c, const ctxpar_run *run, const ctxpar_problem *pb,
                          ctxpar_spans qp, ctxpar_spans kp, int j) {
    if (kp.count == 0)
        return 0;
    const int live = ctxpar_spans_interact(&pb->mask, qp, kp);
    if (!live) {
        run->work->blocks_skipped++;
        return 0;
    }
    run->work->blocks_computed++;
    if (j == pb->rank) { // a query sees itself: a rank's own block is always live
        if (isnan(c->row_flops))
            c->row_flops = ctxpar_row_flops(pb, qp);
        run->work->flops += c->row_flops;
    }
    return 1;
}

int ctxpar_ring_account(const ctxpar_ring_plan *plan, const ctxpar_run *run,
                        const ctxpar_problem *pb, ctxpar_spans qp, int j) {
    const ctxpar_spans kp = ctxpar_problem_spans(pb, j);
    ctxpar_ring_seen *c = seen_row(plan, pb);
    if (!c) // a real run: no cache
        return ctxpar_block_account(run, pb, qp, kp);
    if (c->row[j] == 0)
        return 0;
    ctxpar_ring_block_work *b = &c->work[j];
    if (b->live < 0) { // the block's counts alone, kept for the next call
        ctxpar_run alone = *run;
        b->work = (ctxpar_work_stats){0, 0, 0.0};
        alone.work = &b->work;
        const int in_row = c->sorted_runs && qp.count > CTXPAR_SPAN_PAIRS_MAX;
        b->live = (signed char)(in_row ? account_in_row(c, &alone, pb, qp, kp, j)
                                       : ctxpar_block_account(&alone, pb, qp, kp));
        // A live block means the shards interact: a pair it computes is inside their ranges,
        // and the mask's classes only widen with the ranges (ctxpar_mask_classify_keys).
        if (c->row[j] == SEEN_UNKNOWN)
            c->row[j] = b->live ? 1 : (unsigned char)ctxpar_shards_interact(pb, pb->rank, j);
    }
    if (!c->row[j]) // as ctxpar_ring_may_see: a block it skips is not accounted
        return 0;
    add_work(run->work, &b->work);
    return b->live;
}

int ctxpar_ring_sum_hop(const ctxpar_ring_plan *plan, int from, int step) {
    return hop(plan, plan->sum_last, from, step);
}

int ctxpar_ring_has_sum(const ctxpar_ring_plan *plan, int r, int step) {
    const int P = plan->nranks;
    if (step == 0)
        return P == 1 || plan->sum_last[r] != r;
    return ctxpar_ring_sum_hop(plan, ctxpar_ring_dist(1, r, P), step - 1);
}

int ctxpar_ring_kv_hop(const ctxpar_ring_plan *plan, int from, int step) {
    return hop(plan, plan->last, from, step);
}

int ctxpar_ring_holds(const ctxpar_ring_plan *plan, int r, int step) {
    if (step == 0)
        return 1;
    const int P = plan->nranks;
    return ctxpar_ring_kv_hop(plan, ctxpar_ring_dist(1, r, P), step - 1);
}
