// Services the algorithms share: tracing and work accounting.
#include <stdint.h>
#include <stdlib.h>

#include "algorithms.h"
#include "ctxpar_count.h"

void ctxpar_run_trace(const ctxpar_run *run, ctxpar_event_kind kind, const char *name, int step,
                      int peer, double t_begin, double t_end, uint64_t bytes) {
    if (!run->trace)
        return;
    ctxpar_trace_event ev = {kind, name, step, peer, t_begin, t_end, bytes};
    run->trace(run->trace_user, &ev);
}

static int64_t floor_div(int64_t a, int64_t b) {
    return a / b - (a % b != 0 && (a < 0) != (b < 0));
}

// The keys a query at pos sees (ctxpar_mask_keys_of), within the sequence: never empty.
static void visible_interval(const ctxpar_mask_desc *m, int64_t pos, int64_t seq_global,
                             int64_t *lo_out, int64_t *hi_out) {
    ctxpar_mask_keys_of(m, pos, lo_out, hi_out);
    if (*lo_out < 0)
        *lo_out = 0;
    if (*hi_out > seq_global - 1)
        *hi_out = seq_global - 1;
}

int64_t ctxpar_visible_keys(const ctxpar_mask_desc *m, int64_t pos, const ctxpar_span *k,
                            int64_t seq_global) {
    // An interval holds a closed-form number of a span's positions.
    int64_t lo, hi;
    visible_interval(m, pos, seq_global, &lo, &hi);
    // Positions k->start + t*k->stride in [lo, hi], for t in [0, k->len).
    int64_t t_lo = -floor_div(k->start - lo, k->stride), t_hi = floor_div(hi - k->start, k->stride);
    if (t_lo < 0)
        t_lo = 0;
    if (t_hi > k->len - 1)
        t_hi = k->len - 1;
    return t_hi >= t_lo ? t_hi - t_lo + 1 : 0;
}

// sum over t in [0, n) of max(0, g0 + slope * t), slope in {-1, 0, 1}.
static double positive_sum(int64_t g0, int slope, int64_t n) {
    if (n <= 0)
        return 0.0;
    if (slope == 0)
        return g0 > 0 ? (double)g0 * (double)n : 0.0;
    if (slope > 0) { // g0 + t > 0 from t0 on
        const int64_t t0 = g0 > 0 ? 0 : 1 - g0;
        if (t0 >= n)
            return 0.0;
        const int64_t first = g0 + t0, last = g0 + n - 1, m = n - t0;
        return ((double)first + (double)last) * (double)m / 2.0;
    }
    const int64_t m = g0 <= 0 ? 0 : g0 < n ? g0 : n; // g0 - t > 0 for t < g0
    return (double)m * (double)g0 - (double)m * (double)(m - 1) / 2.0;
}

// The pairs of queries [a, b] (one document, or no documents) with keys [ks, ke], in closed
// form: a query p sees max(0, min(U, p + uo) - max(V, p + vo) + 1) of those keys, where U, V
// are the constant bounds and uo, vo the causal/window offsets (absent: INT64_MAX / MIN). That
// is linear between the two points where a min or max switches, so the sum is arithmetic.
static double pairs_of_segment(int64_t a, int64_t b, int64_t U, int64_t uo, int64_t V,
                               int64_t vo, int64_t ks, int64_t ke) {
    U = U < ke ? U : ke;
    V = V > ks ? V : ks;
    // The first query past each switch: min(U, p + uo) is p + uo up to U - uo, then U;
    // max(V, p + vo) is V up to V - vo, then p + vo.
    int64_t cut[4] = {a, b + 1, b + 1, b + 1};
    if (uo != INT64_MAX && U - uo + 1 > a && U - uo + 1 <= b)
        cut[1] = U - uo + 1;
    if (vo != INT64_MIN && V - vo + 1 > a && V - vo + 1 <= b)
        cut[2] = V - vo + 1;
    if (cut[2] < cut[1]) {
        int64_t t = cut[1];
        cut[1] = cut[2];
        cut[2] = t;
    }
    double n = 0;
    for (int i = 0; i < 3; i++) {
        const int64_t p0 = cut[i], p1 = cut[i + 1]; // [p0, p1)
        if (p1 <= p0)
            continue;
        const int u_lin = uo != INT64_MAX && p0 + uo < U, v_lin = vo != INT64_MIN && p0 + vo > V;
        const int64_t g0 = (u_lin ? p0 + uo : U) - (v_lin ? p0 + vo : V) + 1;
        n += positive_sum(g0, u_lin - v_lin, p1 - p0);
    }
    return n;
}

// visible_pairs for two runs of consecutive positions: per document segment, in closed form.
static double visible_pairs_runs_1(const ctxpar_mask_desc *m, const ctxpar_span *q,
                                   const ctxpar_span *k, int64_t seq_global) {
    const int64_t ks = k->start, ke = k->start + k->len - 1;
    // The causal and window cut is the same for every query, shifted: its offsets are the keys
    // query 0 sees without documents (absent: INT64_MIN / INT64_MAX).
    int64_t vo, uo;
    ctxpar_mask_interval(m->causal, m->window_left, m->window_right, INT64_MIN, INT64_MAX, 0, &vo,
                         &uo);
    double n = 0;
    for (int64_t a = q->start, end = q->start + q->len - 1; a <= end;) {
        int64_t lo = 0, hi = seq_global - 1, b = end;
        if (m->cu_seqlens) {
            const int64_t d = ctxpar_mask_doc_of(m, a);
            lo = m->cu_seqlens[d];
            hi = m->cu_seqlens[d + 1] - 1;
            b = hi < end ? hi : end;
        }
        n += pairs_of_segment(a, b, hi, uo, lo, vo, ks, ke);
        a = b + 1;
    }
    return n;
}

/* ---------------------------------------------------------------- the dry run's count cache */

// One query span's rows under one mask, for the classes of stride d. A row that sees the keys
// [lo, hi] (visible_interval: never empty, it holds the row) sees floor((hi - b)/d) -
// floor((lo - 1 - b)/d) keys of class b, and floor((x - b)/d) = floor(x/d) - (x mod d < b) for
// 0 <= b < d: over the rows, a constant (base) minus the rows whose hi mod d is below b plus
// those whose (lo - 1) mod d is, counted by binary search in the sorted residues.
typedef struct count_entry {
    ctxpar_span q;
    ctxpar_mask_desc mask;
    int64_t seq_global, d, base;
    int64_t *hi_mod, *lo_mod; // [q.len], sorted
    int64_t cap;              // their room
} count_entry;

// Entries by the query span's address (a span stays in its map for all of its blocks, a hybrid
// group's spans side by side) and its mask row's documents: direct-mapped.
#define COUNT_ENTRIES 64

struct ctxpar_count_cache {
    count_entry entry[COUNT_ENTRIES];
};

ctxpar_status ctxpar_count_cache_create(ctxpar_count_cache **cache_out) {
    *cache_out = calloc(1, sizeof **cache_out);
    return *cache_out ? CTXPAR_OK
                      : CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "no memory for a count cache");
}

void ctxpar_count_cache_destroy(ctxpar_count_cache *cache) {
    if (!cache)
        return;
    for (int i = 0; i < COUNT_ENTRIES; i++) {
        free(cache->entry[i].hi_mod);
        free(cache->entry[i].lo_mod);
    }
    free(cache);
}

static int same_mask(const ctxpar_mask_desc *a, const ctxpar_mask_desc *b) {
    return a->causal == b->causal && a->window_left == b->window_left &&
           a->window_right == b->window_right && a->cu_seqlens == b->cu_seqlens &&
           a->num_docs == b->num_docs && a->doc_rows == b->doc_rows;
}

static int entry_is(const count_entry *e, const ctxpar_mask_desc *m, const ctxpar_span *q,
                    int64_t seq_global, int64_t d) {
    return e->hi_mod && e->q.start == q->start && e->q.len == q->len && e->q.stride == q->stride &&
           e->d == d && e->seq_global == seq_global && same_mask(&e->mask, m);
}

static int by_value(const void *a, const void *b) {
    const int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

// Makes e the entry of (m, q, d); 0 when out of memory.
static int entry_fill(count_entry *e, const ctxpar_mask_desc *m, const ctxpar_span *q,
                      int64_t seq_global, int64_t d) {
    if (e->cap < q->len) {
        free(e->hi_mod);
        free(e->lo_mod);
        e->hi_mod = malloc(sizeof *e->hi_mod * (size_t)q->len);
        e->lo_mod = malloc(sizeof *e->lo_mod * (size_t)q->len);
        e->cap = e->hi_mod && e->lo_mod ? q->len : 0;
        if (!e->cap) {
            free(e->hi_mod);
            free(e->lo_mod);
            e->hi_mod = e->lo_mod = NULL;
            return 0;
        }
    }
    e->q = *q;
    e->mask = *m;
    e->seq_global = seq_global;
    e->d = d;
    e->base = 0;
    for (int64_t i = 0; i < q->len; i++) {
        int64_t lo, hi;
        visible_interval(m, q->start + i * q->stride, seq_global, &lo, &hi);
        const int64_t h = floor_div(hi, d), l = floor_div(lo - 1, d);
        e->base += h - l;
        e->hi_mod[i] = hi - h * d;
        e->lo_mod[i] = lo - 1 - l * d;
    }
    qsort(e->hi_mod, (size_t)q->len, sizeof *e->hi_mod, by_value);
    qsort(e->lo_mod, (size_t)q->len, sizeof *e->lo_mod, by_value);
    return 1;
}

// How many of n sorted values are below x. Branch-free halving: a dry run asks this twice per
// (rank, block) pair, and a mispredicted branch per level cost more than the loads.
static int64_t count_below(const int64_t *v, int64_t n, int64_t x) {
    if (n <= 0)
        return 0;
    const int64_t *base = v;
    while (n > 1) { // the answer is in [base - v, base - v + n]
        const int64_t half = n / 2;
        base = base[half - 1] < x ? base + half : base;
        n -= half;
    }
    return (base - v) + (*base < x);
}

// The visible pairs of q against the whole class k, from the cache; 0 when it cannot say (out
// of memory).
static int cached_pairs(ctxpar_count_cache *cache, const ctxpar_mask_desc *m, const ctxpar_span *q,
                        const ctxpar_span *k, int64_t seq_global, double *pairs_out) {
    const int64_t d = k->stride;
    const uint64_t row = (uint64_t)(uintptr_t)m->cu_seqlens * 0x9e3779b97f4a7c15ull;
    const uint64_t h = (uint64_t)(uintptr_t)q / sizeof *q + (row >> 40) + (uint64_t)d;
    count_entry *e = &cache->entry[h % COUNT_ENTRIES];
    if (!entry_is(e, m, q, seq_global, d) && !entry_fill(e, m, q, seq_global, d))
        return 0;
    const int64_t b = k->start;
    *pairs_out =
        (double)(e->base - count_below(e->hi_mod, q->len, b) + count_below(e->lo_mod, q->len, b));
    return 1;
}

// Exactly how many (q, k) pairs of two spans the mask lets through: O(1) for a block the mask
// sees whole, O(documents the queries cross) for runs of consecutive positions, O(log len) for a
// whole class of keys with a count cache, else O(len of the query span); a statistic only.
static double visible_pairs(ctxpar_count_cache *cache, const ctxpar_mask_desc *m,
                            ctxpar_block_class c, const ctxpar_span *q, const ctxpar_span *k,
                            int64_t seq_global) {
    if (c == CTXPAR_BLOCK_FULL)
        return (double)q->len * (double)k->len;
    if ((q->stride == 1 || q->len == 1) && (k->stride == 1 || k->len == 1))
        return visible_pairs_runs_1(m, q, k, seq_global);
    double n = 0;
    if (cache && ctxpar_span_whole_class(k, seq_global) &&
        cached_pairs(cache, m, q, k, seq_global, &n))
        return n;
    for (int64_t i = 0; i < q->len; i++)
        n += (double)ctxpar_visible_keys(m, q->start + i * q->stride, k, seq_global);
    return n;
}

// Above this many (q span, k span) pairs (a custom layout's runs), classifying each pair would
// cost as much as the attention: the lists are then classified as a whole (a SKIP is still an
// exact claim; anything else runs the kernel, which masks element by element) and the visible
// pairs are counted per query against the key runs' prefix sums.
#define SPAN_PAIRS_MAX CTXPAR_SPAN_PAIRS_MAX

// Key runs in increasing order, stride 1, not overlapping: what the per-query count needs.
int ctxpar_spans_sorted_runs(ctxpar_spans k) {
    for (int j = 0; j < k.count; j++)
        if ((k.span[j].stride != 1 && k.span[j].len > 1) ||
            (j > 0 && k.span[j].start < k.span[j - 1].start + k.span[j - 1].len))
            return 0;
    return 1;
}

// Key positions <= x, from the runs' prefix sums (prefix[j]: positions in runs before j).
static int64_t keys_upto(ctxpar_spans k, const int64_t *prefix, int64_t x) {
    int lo = 0, hi = k.count - 1, at = -1; // the last run starting at or before x
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        if (k.span[mid].start <= x) {
            at = mid;
            lo = mid + 1;
        } else {
            hi = mid - 1;
        }
    }
    if (at < 0)
        return 0;
    int64_t in = x - k.span[at].start + 1;
    return prefix[at] + (in < k.span[at].len ? in : k.span[at].len);
}

static double visible_pairs_runs(const ctxpar_mask_desc *m, ctxpar_spans q, ctxpar_spans k,
                                 const int64_t *prefix, int64_t seq_global) {
    double n = 0;
    for (int i = 0; i < q.count; i++)
        for (int64_t t = 0; t < q.span[i].len; t++) {
            int64_t lo, hi;
            visible_interval(m, q.span[i].start + t * q.span[i].stride, seq_global, &lo, &hi);
            if (hi >= lo)
                n += (double)(keys_upto(k, prefix, hi) - keys_upto(k, prefix, lo - 1));
        }
    return n;
}

static void span_range(const ctxpar_span *s, int64_t *min_out, int64_t *max_out) {
    ctxpar_spans_range((ctxpar_spans){s, 1}, min_out, max_out);
}

int ctxpar_spans_ordered(ctxpar_spans s) {
    int64_t lo0, hi0, lo1, hi1;
    for (int j = 1; j < s.count; j++) {
        span_range(&s.span[j - 1], &lo0, &hi0);
        span_range(&s.span[j], &lo1, &hi1);
        if (lo1 < lo0 || hi1 < hi0)
            return 0;
    }
    return 1;
}

// The key positions some query of span q may see, [*lo, *hi]: from what its first query sees
// to what its last one does (the ends only grow), with documents of one row only - past them
// ctxpar_mask_classify calls a block SKIP.
static void reach_of(const ctxpar_mask_desc *m, const ctxpar_span *q, int64_t *lo_out,
                     int64_t *hi_out) {
    int64_t qmin, qmax, lo, hi;
    span_range(q, &qmin, &qmax);
    ctxpar_mask_desc r = *m;
    if (m->doc_rows != 0)
        r.cu_seqlens = NULL;
    ctxpar_mask_keys_of(&r, qmin, lo_out, &hi);
    ctxpar_mask_keys_of(&r, qmax, &lo, hi_out);
}

// The first of n ordered spans whose last position (last = 1) or first position (last = 0) is
// above x.
static int first_above(const ctxpar_span *s, int n, int last, int64_t x) {
    int lo = 0, hi = n;
    while (lo < hi) {
        const int mid = lo + (hi - lo) / 2;
        int64_t a, b;
        span_range(&s[mid], &a, &b);
        if ((last ? b : a) > x)
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo;
}

void ctxpar_spans_reach(const ctxpar_mask_desc *m, const ctxpar_span *q, ctxpar_spans k,
                        int ordered, int *j0, int *j1) {
    *j0 = 0;
    *j1 = k.count;
    if (!ordered || k.count == 0)
        return;
    int64_t lo, hi;
    reach_of(m, q, &lo, &hi);
    *j0 = lo == INT64_MIN ? 0 : first_above(k.span, k.count, 1, lo - 1);
    *j1 = first_above(k.span, k.count, 0, hi);
    *j1 = *j1 < *j0 ? *j0 : *j1;
}

int ctxpar_spans_interact(const ctxpar_mask_desc *mask, ctxpar_spans q, ctxpar_spans k) {
    if (q.count == 0 || k.count == 0)
        return 0;
    int64_t qmin, qmax, kmin, kmax;
    if ((int64_t)q.count * k.count > SPAN_PAIRS_MAX) {
        ctxpar_spans_range(q, &qmin, &qmax);
        ctxpar_spans_range(k, &kmin, &kmax);
        return ctxpar_mask_classify(mask, qmin, qmax, kmin, kmax) != CTXPAR_BLOCK_SKIP;
    }
    const int ordered = ctxpar_spans_ordered(k);
    for (int i = 0; i < q.count; i++) {
        int j0, j1;
        ctxpar_spans_reach(mask, &q.span[i], k, ordered, &j0, &j1);
        span_range(&q.span[i], &qmin, &qmax);
        for (int j = j0; j < j1; j++) {
            span_range(&k.span[j], &kmin, &kmax);
            if (ctxpar_mask_classify(mask, qmin, qmax, kmin, kmax) != CTXPAR_BLOCK_SKIP)
                return 1;
        }
    }
    return 0;
}

// The FLOPs of the queries of q_pos against the keys of k_pos (sorted runs, prefix their
// positions' prefix sums), counted per query, every batch row.
static double runs_flops(const ctxpar_problem *pb, ctxpar_spans q_pos, ctxpar_spans k_pos,
                         const int64_t *prefix) {
    double pairs = 0;
    for (int64_t b = 0; b < (pb->mask.doc_rows > 0 ? pb->mask.doc_rows : 1); b++) {
        ctxpar_mask_desc m = ctxpar_mask_row(&pb->mask, b);
        pairs += visible_pairs_runs(&m, q_pos, k_pos, prefix, pb->seq_global);
    }
    if (pb->mask.doc_rows == 0)
        pairs *= (double)pb->batch;
    return 2.0 * (double)(pb->head_dim + pb->head_dim_v) * (double)pb->heads_q * pairs;
}

double ctxpar_row_flops(const ctxpar_problem *pb, ctxpar_spans q_pos) {
    const ctxpar_span all = {0, pb->seq_global, 1};
    const int64_t prefix = 0;
    return runs_flops(pb, q_pos, (ctxpar_spans){&all, 1}, &prefix);
}

// Many runs: one block for the whole lists, its pairs counted per query (see SPAN_PAIRS_MAX).
static int account_runs(const ctxpar_run *run, const ctxpar_problem *pb, ctxpar_spans q_pos,
                        ctxpar_spans k_pos, int *live) {
    int64_t *prefix = malloc(sizeof *prefix * (size_t)k_pos.count);
    if (!prefix)
        return 0; // the pair by pair count instead
    for (int j = 0; j < k_pos.count; j++)
        prefix[j] = j == 0 ? 0 : prefix[j - 1] + k_pos.span[j - 1].len;
    *live = ctxpar_spans_interact(&pb->mask, q_pos, k_pos);
    if (run->work) {
        if (!*live) {
            run->work->blocks_skipped++;
        } else {
            run->work->blocks_computed++;
            run->work->flops += runs_flops(pb, q_pos, k_pos, prefix);
        }
    }
    free(prefix);
    return 1;
}

// One (q span, k span) pair of a block: its class, counted in the work statistics.
static int account_pair(const ctxpar_run *run, const ctxpar_problem *pb, const ctxpar_span *q,
                        const ctxpar_span *k) {
    int64_t qmin, qmax, kmin, kmax;
    span_range(q, &qmin, &qmax);
    span_range(k, &kmin, &kmax);
    ctxpar_block_class c = ctxpar_mask_classify(&pb->mask, qmin, qmax, kmin, kmax);
    if (!run->work)
        return c != CTXPAR_BLOCK_SKIP;
    if (c == CTXPAR_BLOCK_SKIP) {
        run->work->blocks_skipped++;
        return 0;
    }
    run->work->blocks_computed++;
    // Documents per batch row: each row counts its own pairs.
    double pairs = 0;
    if (pb->mask.doc_rows > 0)
        for (int64_t b = 0; b < pb->mask.doc_rows; b++) {
            ctxpar_mask_desc m = ctxpar_mask_row(&pb->mask, b);
            pairs += visible_pairs(run->counts, &m, c, q, k, pb->seq_global);
        }
    else
        pairs = (double)pb->batch * visible_pairs(run->counts, &pb->mask, c, q, k, pb->seq_global);
    run->work->flops +=
        2.0 * (double)(pb->head_dim + pb->head_dim_v) * (double)pb->heads_q * pairs;
    return 1;
}

int ctxpar_block_account(const ctxpar_run *run, const ctxpar_problem *pb, ctxpar_spans q_pos,
                         ctxpar_spans k_pos) {
    int live = 0;
    if ((int64_t)q_pos.count * k_pos.count > SPAN_PAIRS_MAX && ctxpar_spans_sorted_runs(k_pos) &&
        account_runs(run, pb, q_pos, k_pos, &live))
        return live;
    // Only the key spans within a query span's reach are classified: the others are SKIP.
    const int ordered = ctxpar_spans_ordered(k_pos);
    for (int i = 0; i < q_pos.count; i++) {
        int j0 = 0, j1 = k_pos.count;
        // One key span: its class alone decides (a span past the reach is a SKIP, counted the
        // same), which spares the reach's document lookups once per block.
        if (k_pos.count > 1)
            ctxpar_spans_reach(&pb->mask, &q_pos.span[i], k_pos, ordered, &j0, &j1);
        if (run->work)
            run->work->blocks_skipped += (uint64_t)(k_pos.count - (j1 - j0));
        for (int j = j0; j < j1; j++)
            live |= account_pair(run, pb, &q_pos.span[i], &k_pos.span[j]);
    }
    return live;
}

size_t ctxpar_packed_kv_bytes(ctxpar_dtype dtype, const ctxpar_problem *pb, int64_t seq) {
    return ctxpar_count(pb->batch, seq, pb->heads_kv, pb->head_dim + pb->head_dim_v) *
           ctxpar_dtype_size(dtype);
}

ctxpar_tensor ctxpar_packed_kv(void *buf, ctxpar_dtype dtype, const ctxpar_problem *pb, int64_t seq,
                               int which) {
    size_t k_bytes = ctxpar_count(pb->batch, seq, pb->heads_kv, pb->head_dim) *
                     ctxpar_dtype_size(dtype);
    return ctxpar_tensor_bshd((char *)buf + (which ? k_bytes : 0), dtype, pb->batch, seq,
                              pb->heads_kv, which ? pb->head_dim_v : pb->head_dim);
}

ctxpar_status ctxpar_pack_kv(const ctxpar_run *run, const ctxpar_problem *pb,
                             const ctxpar_tensor *k, const ctxpar_tensor *v, void *buf) {
    if (pb->seq_local == 0)
        return CTXPAR_OK;
    ctxpar_tensor kp = ctxpar_packed_kv(buf, pb->dtype, pb, pb->seq_local, 0);
    ctxpar_tensor vp = ctxpar_packed_kv(buf, pb->dtype, pb, pb->seq_local, 1);
    CTXPAR_CHECK(ctxpar_dev_cast(run->dev, k, &kp, run->stream));
    return ctxpar_dev_cast(run->dev, v, &vp, run->stream);
}

ctxpar_status ctxpar_store_fwd(const ctxpar_run *run, const ctxpar_problem *pb, float *out_acc,
                               float *lse_acc, float *lse_lo_acc, void *fold_scratch,
                               ctxpar_tensor *out, float *lse) {
    if (pb->sinks) { // once, on the finished rows
        CTXPAR_CHECK(ctxpar_sinks_fold(run, pb, out_acc, lse_acc, ctxpar_problem_q_rows(pb),
                                       pb->heads_q, 0, fold_scratch));
        // The fold rounds the new LSE to F32: the old low part no longer belongs to it.
        if (lse_lo_acc)
            CTXPAR_CHECK(ctxpar_dev_fill(
                run->dev, lse_lo_acc, 0.0f,
                ctxpar_count(pb->batch, pb->heads_q, ctxpar_problem_q_rows(pb), 1), run->stream));
    }
    ctxpar_tensor acc = ctxpar_tensor_bshd(out_acc, CTXPAR_DTYPE_F32, pb->batch,
                                           ctxpar_problem_q_rows(pb), pb->heads_q, pb->head_dim_v);
    CTXPAR_CHECK(ctxpar_dev_cast(run->dev, &acc, out, run->stream));
    size_t bytes =
        ctxpar_count(pb->batch, pb->heads_q, ctxpar_problem_q_rows(pb), 1) * sizeof(float);
    if (pb->lse_lo && lse_lo_acc)
        CTXPAR_CHECK(ctxpar_dev_copy(run->dev, pb->lse_lo, lse_lo_acc, bytes, CTXPAR_COPY_D2D,
                                     run->stream));
    if (!lse)
        return CTXPAR_OK;
    return ctxpar_dev_copy(run->dev, lse, lse_acc, bytes, CTXPAR_COPY_D2D, run->stream);
}

ctxpar_status ctxpar_move_shard_rows(const ctxpar_run *run, const ctxpar_problem *pb, int j,
                                     const ctxpar_tensor *local, const ctxpar_tensor *global,
                                     int to_global) {
    ctxpar_spans sp = ctxpar_problem_spans(pb, j);
    int64_t first = 0;
    for (int i = 0; i < sp.count; i++) {
        ctxpar_tensor l = ctxpar_tensor_rows(local, first, sp.span[i].len);
        ctxpar_tensor g = ctxpar_tensor_span(global, &sp.span[i]);
        CTXPAR_CHECK(to_global ? ctxpar_dev_cast(run->dev, &l, &g, run->stream)
                               : ctxpar_dev_cast(run->dev, &g, &l, run->stream));
        first += sp.span[i].len;
    }
    return CTXPAR_OK;
}
