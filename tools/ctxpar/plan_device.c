// The planner's device (see plan_device.h): every op succeeds at once and touches nothing (the
// binned accumulators of reproducible mode included); the forward block op records what it
// would compute for the coverage proof.
#include <stdlib.h>
#include <string.h>

#include "algorithms.h"
#include "plan_device.h"

// Whole classes of keys (ctxpar_span_whole_class) computed against one query span under one
// mask, kept until the span's rows take them all at once (flush_classes): mult[b] is how many
// times class b of stride d was computed (x batch x heads), so that a striped block costs O(1),
// and each of the span's rows O(1) per flush instead of a pass over the rows per block. The
// members of a hybrid group compute against the same spans: one flush serves them all.
typedef struct class_set {
    ctxpar_span q;
    ctxpar_mask_desc mask;
    int64_t d;
    uint64_t *mult; // [d]
    int64_t cap;    // mult's room
} class_set;

// Query spans with classes pending: a hybrid group's spans (at most 16), with room.
#define CLASS_SETS 32

typedef struct plan_dev {
    uintptr_t next; // the next address alloc hands out (never dereferenced)
    cpt_plan_cover *cover;
    uint64_t copies;
    class_set set[CLASS_SETS];
    int nsets;                 // sets in use: set[0 .. nsets)
    cpt_plan_cover *set_cover; // the cover they belong to
} plan_dev;

// sum of i and of i^2 for i in [0, t] (t >= -1), modulo 2^64: the divisions are exact on the
// factors, before the product wraps.
static uint64_t sum_to(int64_t t) {
    int64_t a = t, b = t + 1;
    if (a % 2 == 0)
        a /= 2;
    else
        b /= 2;
    return (uint64_t)a * (uint64_t)b;
}
static uint64_t sumsq_to(int64_t t) {
    int64_t f[3] = {t, t + 1, 2 * t + 1};
    for (int i = 0; i < 2; i++)
        if (f[i] % 2 == 0) {
            f[i] /= 2;
            break;
        }
    for (int i = 0; i < 3; i++)
        if (f[i] % 3 == 0) {
            f[i] /= 3;
            break;
        }
    return (uint64_t)f[0] * (uint64_t)f[1] * (uint64_t)f[2];
}

// Keys k->start + t * k->stride for t in [t0, t1] (arithmetic series).
static cpt_plan_keys series(const ctxpar_span *k, int64_t t0, int64_t t1) {
    cpt_plan_keys r = {0, 0, 0};
    if (t1 < t0)
        return r;
    const uint64_t n = (uint64_t)(t1 - t0 + 1), a = (uint64_t)k->start, d = (uint64_t)k->stride;
    const uint64_t s1 = sum_to(t1) - sum_to(t0 - 1), s2 = sumsq_to(t1) - sumsq_to(t0 - 1);
    r.count = n;
    r.sum = n * a + d * s1;
    r.sumsq = n * a * a + 2 * a * d * s1 + d * d * s2;
    return r;
}

static int64_t floor_div(int64_t a, int64_t b) {
    return a / b - (a % b != 0 && (a < 0) != (b < 0));
}

// The document holding a position, [d0, d1] (the whole sequence without documents): found once
// per document a run of rows crosses, not once per row.
typedef struct doc_cursor {
    int64_t d0, d1;
} doc_cursor;

static void doc_at(const ctxpar_mask_desc *m, int64_t pos, int64_t seq, doc_cursor *d) {
    if (pos >= d->d0 && pos <= d->d1)
        return;
    d->d0 = 0;
    d->d1 = seq - 1;
    if (m->cu_seqlens) {
        const int64_t i = ctxpar_mask_doc_of(m, pos);
        d->d0 = m->cu_seqlens[i];
        d->d1 = m->cu_seqlens[i + 1] - 1;
    }
}
#define NO_DOC ((doc_cursor){1, 0})

// The mask's rules (ctxpar_mask_visible) for one query make an interval of key positions
// [lo, hi], which holds the query itself: the planner reads them itself, so that the blocks'
// accounting it checks is not also its measure.
static void seen_interval(const ctxpar_mask_desc *m, int64_t pos, const doc_cursor *d,
                          int64_t *lo_out, int64_t *hi_out) {
    int64_t lo = d->d0, hi = d->d1;
    if (m->causal && pos < hi)
        hi = pos;
    if (m->window_left > 0 && pos - m->window_left + 1 > lo)
        lo = pos - m->window_left + 1;
    if (m->window_right > 0 && pos + m->window_right < hi)
        hi = pos + m->window_right;
    *lo_out = lo;
    *hi_out = hi;
}

// The keys of span k that a query sees.
static cpt_plan_keys keys_seen(const ctxpar_mask_desc *m, int64_t pos, const doc_cursor *d,
                               const ctxpar_span *k) {
    int64_t lo, hi;
    seen_interval(m, pos, d, &lo, &hi);
    int64_t t0 = -floor_div(k->start - lo, k->stride), t1 = floor_div(hi - k->start, k->stride);
    if (t0 < 0)
        t0 = 0;
    if (t1 > k->len - 1)
        t1 = k->len - 1;
    return series(k, t0, t1);
}

cpt_plan_keys cpt_plan_mask_keys(const ctxpar_mask_desc *m, int64_t pos, const ctxpar_span *k,
                                 int64_t seq) {
    doc_cursor d = NO_DOC;
    doc_at(m, pos, seq, &d);
    return keys_seen(m, pos, &d, k);
}

ctxpar_status cpt_plan_cover_init(cpt_plan_cover *c, int64_t seq) {
    c->seq = seq;
    c->settled = 0;
    c->row = calloc((size_t)seq + 1, sizeof *c->row);
    if (!c->row)
        return CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "plan: no memory for %lld positions",
                            (long long)seq);
    return CTXPAR_OK;
}

void cpt_plan_cover_settle(cpt_plan_cover *c) {
    if (c->settled)
        return;
    cpt_plan_keys run = {0, 0, 0};
    for (int64_t i = 0; i < c->seq; i++) {
        run.count += c->row[i].count;
        run.sum += c->row[i].sum;
        run.sumsq += c->row[i].sumsq;
        c->row[i] = run;
    }
    c->settled = 1;
}

void cpt_plan_cover_free(cpt_plan_cover *c) {
    free(c->row);
    c->row = NULL;
}

// Adds mult x v to positions [at, end) (as differences).
static void add_range(cpt_plan_cover *c, int64_t at, int64_t end, cpt_plan_keys v, uint64_t mult) {
    c->row[at].count += mult * v.count;
    c->row[at].sum += mult * v.sum;
    c->row[at].sumsq += mult * v.sumsq;
    c->row[end].count -= mult * v.count;
    c->row[end].sum -= mult * v.sum;
    c->row[end].sumsq -= mult * v.sumsq;
}

int cpt_plan_cover_check(cpt_plan_cover *c, const ctxpar_mask_desc *m, int64_t batch, int64_t heads,
                         int64_t *bad_out, double *computed, double *visible) {
    cpt_plan_cover_settle(c);
    const ctxpar_span all = {0, c->seq, 1};
    const int64_t rows = m->doc_rows > 0 ? m->doc_rows : 1;
    const uint64_t mult = (uint64_t)heads * (uint64_t)(m->doc_rows > 0 ? 1 : batch);
    doc_cursor d = NO_DOC;
    int ok = 1;
    *bad_out = -1;
    for (int64_t pos = 0; pos < c->seq; pos++) {
        cpt_plan_keys want = {0, 0, 0};
        for (int64_t b = 0; b < rows; b++) {
            const ctxpar_mask_desc mr = ctxpar_mask_row(m, b);
            if (rows > 1) // each batch row its own documents
                d = NO_DOC;
            doc_at(&mr, pos, c->seq, &d);
            const cpt_plan_keys v = keys_seen(&mr, pos, &d, &all);
            want.count += mult * v.count;
            want.sum += mult * v.sum;
            want.sumsq += mult * v.sumsq;
        }
        const cpt_plan_keys got = c->row[pos];
        *visible += (double)want.count;
        *computed += (double)got.count;
        if (ok && (got.count != want.count || got.sum != want.sum || got.sumsq != want.sumsq)) {
            ok = 0;
            *bad_out = pos;
        }
    }
    return ok;
}

// One (query span, key span) pair of a block: a whole block adds the same keys to every query
// row (a range add for contiguous rows), a partial one row by row.
static void cover_pair(cpt_plan_cover *c, const ctxpar_mask_desc *m, const ctxpar_span *q,
                       const ctxpar_span *k, uint64_t mult) {
    int64_t qmin, qmax, kmin, kmax;
    ctxpar_spans_range((ctxpar_spans){q, 1}, &qmin, &qmax);
    ctxpar_spans_range((ctxpar_spans){k, 1}, &kmin, &kmax);
    const ctxpar_block_class cls = ctxpar_mask_classify(m, qmin, qmax, kmin, kmax);
    if (cls == CTXPAR_BLOCK_SKIP)
        return;
    if (cls == CTXPAR_BLOCK_FULL) {
        const cpt_plan_keys all = series(k, 0, k->len - 1);
        if (q->stride == 1) {
            add_range(c, q->start, q->start + q->len, all, mult);
            return;
        }
        for (int64_t i = 0; i < q->len; i++)
            add_range(c, q->start + i * q->stride, q->start + i * q->stride + 1, all, mult);
        return;
    }
    doc_cursor d = NO_DOC;
    for (int64_t i = 0; i < q->len; i++) {
        const int64_t pos = q->start + i * q->stride;
        doc_at(m, pos, c->seq, &d);
        add_range(c, pos, pos + 1, keys_seen(m, pos, &d, k), mult);
    }
}

/* ---------------------------------------------------------------- whole classes of keys */

// Sums over a set of classes b (of stride d) of mult[b] x (1, b, b^2). The keys b + t·d, t <= j,
// of one class add up to (j+1) x (1, b, b^2) + sum(t) x (0, d, 2 d b) + sum(t^2) x (0, 0, d^2)
// (count, sum, sum of squares), so these sums are all a set of classes needs.
typedef struct class_sums {
    uint64_t n, b, bb;
} class_sums;

// The keys b + t·d, t <= j, of the classes summed in c (j >= -1; mod 2^64).
static cpt_plan_keys class_series(class_sums c, int64_t d, int64_t j) {
    const uint64_t n = (uint64_t)(j + 1), s1 = sum_to(j), s2 = sumsq_to(j), ud = (uint64_t)d;
    const cpt_plan_keys r = {n * c.n, n * c.b + s1 * ud * c.n,
                             n * c.bb + 2 * s1 * ud * c.b + s2 * ud * ud * c.n};
    return r;
}

// The keys <= x (x >= -1) of every class of a set, from below[t] (the classes b <= t summed):
// class b holds floor((x - b)/d) + 1 of them, which is floor(x/d) + 1 for b <= x mod d and one
// fewer above.
static cpt_plan_keys classes_upto(const class_sums *below, int64_t d, int64_t x) {
    const int64_t J = floor_div(x, d), t = x - J * d;
    const class_sums lo = below[t], all = below[d - 1];
    const class_sums hi = {all.n - lo.n, all.b - lo.b, all.bb - lo.bb};
    const cpt_plan_keys a = class_series(lo, d, J), b = class_series(hi, d, J - 1);
    return (cpt_plan_keys){a.count + b.count, a.sum + b.sum, a.sumsq + b.sumsq};
}

// Adds each row of the set's query span the keys of its classes it sees ([lo, hi]: those up to
// hi less those up to lo - 1), with below as scratch for d prefix sums.
static void flush_classes(cpt_plan_cover *c, const class_set *s, class_sums *below) {
    class_sums run = {0, 0, 0};
    for (int64_t b = 0; b < s->d; b++) {
        const uint64_t m = s->mult[b], ub = (uint64_t)b;
        run.n += m;
        run.b += m * ub;
        run.bb += m * ub * ub;
        below[b] = run;
    }
    doc_cursor doc = NO_DOC;
    for (int64_t i = 0; i < s->q.len; i++) {
        const int64_t pos = s->q.start + i * s->q.stride;
        int64_t lo, hi;
        doc_at(&s->mask, pos, c->seq, &doc);
        seen_interval(&s->mask, pos, &doc, &lo, &hi);
        const cpt_plan_keys up = classes_upto(below, s->d, hi);
        const cpt_plan_keys under = classes_upto(below, s->d, lo - 1);
        const cpt_plan_keys v = {up.count - under.count, up.sum - under.sum,
                                 up.sumsq - under.sumsq};
        add_range(c, pos, pos + 1, v, 1);
    }
}

// Flushes every pending set into its cover; 0 when out of memory (the sets stay pending).
static int flush_all(plan_dev *p) {
    if (p->nsets == 0)
        return 1;
    int64_t d = 1;
    for (int i = 0; i < p->nsets; i++)
        d = p->set[i].d > d ? p->set[i].d : d;
    class_sums *below = malloc(sizeof *below * (size_t)d);
    if (!below)
        return 0;
    for (int i = 0; i < p->nsets; i++)
        flush_classes(p->set_cover, &p->set[i], below);
    free(below);
    p->nsets = 0;
    return 1;
}

static int same_set(const class_set *s, const ctxpar_mask_desc *m, const ctxpar_span *q,
                    int64_t d) {
    const ctxpar_mask_desc *a = &s->mask;
    return s->q.start == q->start && s->q.len == q->len && s->q.stride == q->stride && s->d == d &&
           a->causal == m->causal && a->window_left == m->window_left &&
           a->window_right == m->window_right && a->cu_seqlens == m->cu_seqlens &&
           a->num_docs == m->num_docs;
}

// The pending set of (m, q, d), a new one if there is none; NULL when out of memory.
static class_set *set_of(plan_dev *p, const ctxpar_mask_desc *m, const ctxpar_span *q, int64_t d) {
    for (int i = 0; i < p->nsets; i++)
        if (same_set(&p->set[i], m, q, d))
            return &p->set[i];
    if (p->nsets == CLASS_SETS && !flush_all(p))
        return NULL;
    class_set *s = &p->set[p->nsets];
    if (s->cap < d) {
        uint64_t *more = realloc(s->mult, sizeof *more * (size_t)d);
        if (!more)
            return NULL;
        s->mult = more;
        s->cap = d;
    }
    memset(s->mult, 0, sizeof *s->mult * (size_t)d);
    s->q = *q;
    s->mask = *m;
    s->d = d;
    p->nsets++;
    p->set_cover = p->cover;
    return s;
}

// Records query span q against every key span of k: a whole class of keys joins q's pending set
// (looked up once per stride), any other key span (or a class that finds no memory for its set)
// is covered now.
static void record_span(plan_dev *p, const ctxpar_mask_desc *m, const ctxpar_span *q,
                        ctxpar_spans k, int ordered, uint64_t mult) {
    class_set *s = NULL;
    int j0, j1; // the others see nothing of q
    ctxpar_spans_reach(m, q, k, ordered, &j0, &j1);
    for (int j = j0; j < j1; j++) {
        const ctxpar_span *kj = &k.span[j];
        const int whole = ctxpar_span_whole_class(kj, p->cover->seq);
        if (whole && (!s || s->d != kj->stride))
            s = set_of(p, m, q, kj->stride);
        if (whole && s)
            s->mult[kj->start] += mult;
        else
            cover_pair(p->cover, m, q, kj, mult);
    }
}

static ctxpar_status pd_fwd(ctxpar_device *dev, const ctxpar_attn_block *blk, float *out_acc,
                            float *lse_acc, int merge, ctxpar_stream *stream) {
    (void)out_acc, (void)lse_acc, (void)merge, (void)stream;
    plan_dev *p = dev->impl;
    if (!p->cover)
        return CTXPAR_OK;
    const uint64_t mult =
        p->copies * (uint64_t)(blk->q.shape[0] * blk->q.shape[2]); // batch x heads
    const int ordered = ctxpar_spans_ordered(blk->k_pos);
    for (int i = 0; i < blk->q_pos.count; i++)
        record_span(p, &blk->mask, &blk->q_pos.span[i], blk->k_pos, ordered, mult);
    return CTXPAR_OK;
}

static ctxpar_status pd_alloc(ctxpar_device *dev, size_t bytes, ctxpar_mem_kind kind,
                              void **ptr_out) {
    (void)kind;
    plan_dev *p = dev->impl;
    *ptr_out = (void *)p->next;
    p->next += (bytes + 4095) / 4096 * 4096 + 4096;
    return CTXPAR_OK;
}

static ctxpar_status pd_free(ctxpar_device *dev, void *ptr, ctxpar_mem_kind kind) {
    (void)dev, (void)ptr, (void)kind;
    return CTXPAR_OK;
}
static ctxpar_status pd_copy(ctxpar_device *dev, void *dst, const void *src, size_t bytes,
                             ctxpar_copy_kind kind, ctxpar_stream *stream) {
    (void)dev, (void)src, (void)stream;
    if (kind == CTXPAR_COPY_D2H) // host memory the caller reads (the dsinks sums): defined
        memset(dst, 0, bytes);
    return CTXPAR_OK;
}
static ctxpar_status pd_memset(ctxpar_device *dev, void *dst, int value, size_t bytes,
                               ctxpar_stream *stream) {
    (void)dev, (void)dst, (void)value, (void)bytes, (void)stream;
    return CTXPAR_OK;
}
static ctxpar_status pd_merge(ctxpar_device *dev, float *out_acc, float *lse_acc,
                              const float *out_b, const float *lse_b, int64_t batch, int64_t seq,
                              int64_t heads, int64_t head_dim, ctxpar_stream *stream) {
    (void)dev, (void)out_acc, (void)lse_acc, (void)out_b, (void)lse_b, (void)batch, (void)seq,
        (void)heads, (void)head_dim, (void)stream;
    return CTXPAR_OK;
}
static ctxpar_status pd_prep(ctxpar_device *dev, const ctxpar_tensor *out,
                             const ctxpar_tensor *dout, float *delta, ctxpar_stream *stream) {
    (void)dev, (void)out, (void)dout, (void)delta, (void)stream;
    return CTXPAR_OK;
}
static ctxpar_status pd_bwd(ctxpar_device *dev, const ctxpar_attn_block *blk,
                            const ctxpar_tensor *dout, const float *lse, const float *delta,
                            float *dq_acc, float *dk_acc, float *dv_acc, ctxpar_stream *stream) {
    (void)dev, (void)blk, (void)dout, (void)lse, (void)delta, (void)dq_acc, (void)dk_acc,
        (void)dv_acc, (void)stream;
    return CTXPAR_OK;
}
static ctxpar_status pd_cast(ctxpar_device *dev, const ctxpar_tensor *src, ctxpar_tensor *dst,
                             ctxpar_stream *stream) {
    (void)dev, (void)src, (void)dst, (void)stream;
    return CTXPAR_OK;
}
static ctxpar_status pd_add(ctxpar_device *dev, float *dst, const float *src, size_t n,
                            ctxpar_stream *stream) {
    (void)dev, (void)dst, (void)src, (void)n, (void)stream;
    return CTXPAR_OK;
}
static ctxpar_status pd_fill(ctxpar_device *dev, float *dst, float value, size_t n,
                             ctxpar_stream *stream) {
    (void)dev, (void)dst, (void)value, (void)n, (void)stream;
    return CTXPAR_OK;
}
static ctxpar_status pd_checksum(ctxpar_device *dev, const void *data, size_t bytes,
                                 ctxpar_stream *stream, uint64_t *sum_out) {
    (void)dev, (void)data, (void)bytes, (void)stream;
    *sum_out = 0;
    return CTXPAR_OK;
}

// The binned accumulators of reproducible mode: no data, so nothing to add or round. The
// algorithms' allocations and transfers of the bins blocks are what the plan counts.
static ctxpar_status pd_bins_clear(ctxpar_device *dev, void *bins, int64_t rows, int64_t width,
                                   ctxpar_stream *stream) {
    (void)dev, (void)bins, (void)rows, (void)width, (void)stream;
    return CTXPAR_OK;
}
static ctxpar_status pd_bins_add(ctxpar_device *dev, void *bins, const float *src,
                                 const ctxpar_bins_shape *shape, ctxpar_stream *stream) {
    (void)dev, (void)bins, (void)src, (void)shape, (void)stream;
    return CTXPAR_OK;
}
static ctxpar_status pd_bins_add_attn(ctxpar_device *dev, void *bins, const float *out_b,
                                      const float *lse_b, const float *lse_lo_b,
                                      const ctxpar_bins_shape *shape, ctxpar_stream *stream) {
    (void)dev, (void)bins, (void)out_b, (void)lse_b, (void)lse_lo_b, (void)shape, (void)stream;
    return CTXPAR_OK;
}
static ctxpar_status pd_bins_merge(ctxpar_device *dev, void *dst, const void *src, int64_t rows,
                                   int64_t width, ctxpar_stream *stream) {
    (void)dev, (void)dst, (void)src, (void)rows, (void)width, (void)stream;
    return CTXPAR_OK;
}
static ctxpar_status pd_bins_finish(ctxpar_device *dev, const void *bins, int64_t rows,
                                    int64_t width, float *dst, ctxpar_stream *stream) {
    (void)dev, (void)bins, (void)rows, (void)width, (void)dst, (void)stream;
    return CTXPAR_OK;
}
static ctxpar_status pd_bins_finish_attn(ctxpar_device *dev, const void *bins,
                                         const ctxpar_bins_shape *shape, float *out, float *lse,
                                         float *lse_lo, ctxpar_stream *stream) {
    (void)dev, (void)bins, (void)shape, (void)out, (void)lse, (void)lse_lo, (void)stream;
    return CTXPAR_OK;
}

static void pd_destroy(ctxpar_device *dev) {
    plan_dev *p = dev->impl;
    for (int i = 0; i < CLASS_SETS; i++)
        free(p->set[i].mult);
    free(p);
}

static const struct ctxpar_device_ops plan_ops = {
    .version = CTXPAR_DEVICE_OPS_VERSION,
    .struct_size = sizeof(struct ctxpar_device_ops),
    .name = "plan",
    .destroy = pd_destroy,
    .alloc = pd_alloc,
    .free = pd_free,
    .copy = pd_copy,
    .memset = pd_memset,
    .attn_block_fwd = pd_fwd,
    .attn_merge = pd_merge,
    .attn_bwd_prep = pd_prep,
    .attn_block_bwd = pd_bwd,
    .cast = pd_cast,
    .add = pd_add,
    .fill = pd_fill,
    .checksum = pd_checksum,
    .bins_clear = pd_bins_clear,
    .bins_add = pd_bins_add,
    .bins_add_attn = pd_bins_add_attn,
    .bins_merge = pd_bins_merge,
    .bins_finish = pd_bins_finish,
    .bins_finish_attn = pd_bins_finish_attn,
};

ctxpar_status cpt_plan_device_create(ctxpar_device **dev_out) {
    plan_dev *p = calloc(1, sizeof *p);
    if (!p)
        return CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "plan: no memory for its device");
    p->next = (uintptr_t)1 << 40; // far from anything real; never dereferenced
    ctxpar_status st = ctxpar_device_create(&plan_ops, p, 0, dev_out);
    if (st != CTXPAR_OK)
        free(p);
    return st;
}

ctxpar_status cpt_plan_device_record(ctxpar_device *dev, cpt_plan_cover *cover, uint64_t copies) {
    plan_dev *p = dev->impl;
    if (cover && cover != p->set_cover)
        CTXPAR_CHECK(cpt_plan_device_flush(dev));
    p->cover = cover;
    p->copies = copies;
    return CTXPAR_OK;
}

ctxpar_status cpt_plan_device_flush(ctxpar_device *dev) {
    if (!flush_all(dev->impl))
        return CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "plan: no memory for the coverage");
    return CTXPAR_OK;
}
