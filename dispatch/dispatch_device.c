// The device dispatch: the only code that calls through a device ops table. It checks tables
// once at creation, owns the fallbacks for optional ops and counts the memory the library holds.
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dispatch.h"

// One live allocation: what a free needs to know without trusting its caller.
struct ctxpar_dev_block {
    void *ptr;
    size_t bytes;
    ctxpar_mem_kind kind;
};

// The object ctxpar_device_create allocates: the backend's view first, the dispatch's books after.
typedef struct device_state {
    struct ctxpar_device dev;
    ctxpar_dev_books books;
} device_state;

#define DEV_OPS struct ctxpar_device_ops
#define HAS(dev, member) CTXPAR_OPS_HAS((dev)->ops, DEV_OPS, member)

// Every op the algorithms need; a table without one of them is rejected, naming it.
#define REQUIRED_DEVICE_OPS(X)                                                                    \
    X(destroy)                                                                                    \
    X(alloc)                                                                                      \
    X(free)                                                                                       \
    X(copy)                                                                                       \
    X(memset)                                                                                     \
    X(attn_block_fwd)                                                                             \
    X(attn_merge)                                                                                 \
    X(attn_bwd_prep)                                                                              \
    X(attn_block_bwd)                                                                             \
    X(cast)                                                                                       \
    X(add)                                                                                        \
    X(fill)

#define STREAM_OPS(X)                                                                             \
    X(stream_create)                                                                              \
    X(stream_destroy)                                                                             \
    X(stream_sync)                                                                                \
    X(event_create)                                                                               \
    X(event_destroy)                                                                              \
    X(event_record)                                                                               \
    X(stream_wait_event)

// Reproducible mode's binned accumulators (ctxpar_bins.h): all or none.
#define BINS_OPS(X)                                                                                \
    X(bins_clear)                                                                                  \
    X(bins_add)                                                                                    \
    X(bins_add_attn)                                                                               \
    X(bins_merge)                                                                                  \
    X(bins_finish)                                                                                 \
    X(bins_finish_attn)

ctxpar_status ctxpar_device_create(const DEV_OPS *ops, void *impl, int host_memory,
                                   ctxpar_device **device_out) {
    if (!ops || !device_out)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "ops (%p) and device_out (%p) must be set",
                            (const void *)ops, (void *)device_out);
    if (ops->version != CTXPAR_DEVICE_OPS_VERSION)
        return CTXPAR_ERROR(CTXPAR_ERR_NOT_SUPPORTED,
                            "device ops version %u is not supported (this library knows %u; "
                            "rebuild the backend against its ctxpar_backend.h)",
                            ops->version, CTXPAR_DEVICE_OPS_VERSION);
    const char *name = ops->name ? ops->name : "(unnamed)";
#define CHECK_REQUIRED(member)                                                                    \
    if (!CTXPAR_OPS_HAS(ops, DEV_OPS, member))                                                    \
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "device '%s' lacks the required op '%s'", name, \
                            #member);
    REQUIRED_DEVICE_OPS(CHECK_REQUIRED)
#undef CHECK_REQUIRED
    int n_stream = 0, n_stream_total = 0;
#define COUNT_STREAM(member)                                                                      \
    n_stream_total++;                                                                             \
    if (CTXPAR_OPS_HAS(ops, DEV_OPS, member))                                                     \
        n_stream++;
    STREAM_OPS(COUNT_STREAM)
#undef COUNT_STREAM
    if (n_stream != 0 && n_stream != n_stream_total)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG,
                            "device '%s' sets %d of the %d stream/event ops: all or none", name,
                            n_stream, n_stream_total);
    int n_bins = 0, n_bins_total = 0;
#define COUNT_BINS(member)                                                                         \
    n_bins_total++;                                                                                \
    if (CTXPAR_OPS_HAS(ops, DEV_OPS, member))                                                      \
        n_bins++;
    BINS_OPS(COUNT_BINS)
#undef COUNT_BINS
    if (n_bins != 0 && n_bins != n_bins_total)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG,
                            "device '%s' sets %d of the %d bins ops: all or none", name, n_bins,
                            n_bins_total);
    device_state *d = calloc(1, sizeof *d);
    if (!d)
        return CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "cannot allocate a device object");
    d->dev.ops = ops;
    d->dev.impl = impl;
    d->dev.host_memory = host_memory;
    *device_out = &d->dev;
    return CTXPAR_OK;
}

ctxpar_dev_books *ctxpar_dev_books_of(const ctxpar_device *dev) {
    // dev is the first member of the device_state ctxpar_device_create allocated.
    return &((device_state *)(uintptr_t)dev)->books;
}


int ctxpar_device_host_memory(const ctxpar_device *dev) { return dev && dev->host_memory; }

void ctxpar_device_destroy(ctxpar_device *dev) {
    if (!dev)
        return;
    (void)ctxpar_dev_scratch_release(dev); // a device going away has no caller left to tell
    dev->ops->destroy(dev);
    free(ctxpar_dev_books_of(dev)->blocks);
    free((device_state *)dev);
}

static ctxpar_status remember(ctxpar_device *dev, void *ptr, size_t bytes, ctxpar_mem_kind kind) {
    ctxpar_dev_books *bk = ctxpar_dev_books_of(dev);
    if (bk->n_blocks == bk->cap_blocks) {
        size_t cap = bk->cap_blocks ? 2 * bk->cap_blocks : 16;
        struct ctxpar_dev_block *grown = realloc(bk->blocks, cap * sizeof *grown);
        if (!grown)
            return CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "cannot record an allocation");
        bk->blocks = grown;
        bk->cap_blocks = cap;
    }
    bk->blocks[bk->n_blocks++] = (struct ctxpar_dev_block){ptr, bytes, kind};
    return CTXPAR_OK;
}

static ctxpar_status backend_free(ctxpar_device *dev, void *ptr, ctxpar_mem_kind kind) {
    return dev->ops->free(dev, ptr, kind);
}

ctxpar_status ctxpar_dev_alloc(ctxpar_device *dev, size_t bytes, ctxpar_mem_kind kind,
                               void **ptr_out) {
    ctxpar_dev_books *bk = ctxpar_dev_books_of(dev);
    void *p = NULL;
    // Zero-byte buffers happen (an empty shard); hand out a real allocation anyway so that NULL
    // always means "nothing allocated".
    CTXPAR_CHECK(dev->ops->alloc(dev, bytes ? bytes : 1, kind, &p));
    bk->alloc_count++;
    ctxpar_status st = remember(dev, p, bytes, kind);
    if (st != CTXPAR_OK) {
        (void)backend_free(dev, p, kind); // the failure to remember it is the message kept
        return st;
    }
    bk->mem_current += bytes;
    if (bk->mem_current > bk->mem_peak)
        bk->mem_peak = bk->mem_current;
    *ptr_out = p;
    return CTXPAR_OK;
}

ctxpar_status ctxpar_dev_free(ctxpar_device *dev, void *ptr, size_t bytes, ctxpar_mem_kind kind) {
    ctxpar_dev_books *bk = ctxpar_dev_books_of(dev);
    if (!ptr)
        return CTXPAR_OK;
    size_t i = bk->n_blocks;
    while (i > 0 && bk->blocks[i - 1].ptr != ptr) // recent blocks are freed first
        i--;
    if (i == 0)
        return CTXPAR_ERROR(CTXPAR_ERR_INTERNAL,
                            "free of %p, which device '%s' did not allocate (or freed already)",
                            ptr, dev->ops->name ? dev->ops->name : "?");
    struct ctxpar_dev_block b = bk->blocks[i - 1];
    if ((bytes != 0 && bytes != b.bytes) || kind != b.kind)
        return CTXPAR_ERROR(CTXPAR_ERR_INTERNAL,
                            "free of %p as %zu bytes of kind %d: it was allocated as %zu bytes of "
                            "kind %d",
                            ptr, bytes, (int)kind, b.bytes, (int)b.kind);
    // Forgotten whatever the backend says: a failed release cannot be retried, and its status
    // is the caller's to merge.
    bk->blocks[i - 1] = bk->blocks[--bk->n_blocks];
    bk->mem_current -= b.bytes;
    return backend_free(dev, ptr, kind);
}

ctxpar_status ctxpar_dev_scratch(ctxpar_device *dev, size_t bytes, void **ptr_out) {
    ctxpar_dev_books *bk = ctxpar_dev_books_of(dev);
    if (bk->scratch && bk->scratch_bytes >= bytes) {
        *ptr_out = bk->scratch;
        return CTXPAR_OK;
    }
    CTXPAR_CHECK(ctxpar_dev_scratch_release(dev));
    CTXPAR_CHECK(ctxpar_dev_alloc(dev, bytes, CTXPAR_MEM_DEVICE, &bk->scratch));
    bk->scratch_bytes = bytes;
    *ptr_out = bk->scratch;
    return CTXPAR_OK;
}

ctxpar_status ctxpar_dev_scratch_release(ctxpar_device *dev) {
    ctxpar_dev_books *bk = ctxpar_dev_books_of(dev);
    void *p = bk->scratch;
    size_t bytes = bk->scratch_bytes;
    bk->scratch = NULL;
    bk->scratch_bytes = 0;
    return ctxpar_dev_free(dev, p, bytes, CTXPAR_MEM_DEVICE);
}

ctxpar_status ctxpar_dev_copy(ctxpar_device *dev, void *dst, const void *src, size_t bytes,
                              ctxpar_copy_kind kind, ctxpar_stream *stream) {
    if (bytes == 0)
        return CTXPAR_OK;
    return dev->ops->copy(dev, dst, src, bytes, kind, stream);
}

ctxpar_status ctxpar_dev_memset(ctxpar_device *dev, void *dst, int value, size_t bytes,
                                ctxpar_stream *stream) {
    if (bytes == 0)
        return CTXPAR_OK;
    return dev->ops->memset(dev, dst, value, bytes, stream);
}

int ctxpar_dev_has_streams(const ctxpar_device *dev) { return HAS(dev, stream_create); }

ctxpar_status ctxpar_dev_stream_create(ctxpar_device *dev, ctxpar_stream **stream_out) {
    if (!HAS(dev, stream_create)) { // synchronous backend: the NULL stream is the only one
        *stream_out = NULL;
        return CTXPAR_OK;
    }
    return dev->ops->stream_create(dev, stream_out);
}

void ctxpar_dev_stream_destroy(ctxpar_device *dev, ctxpar_stream *stream) {
    if (stream && HAS(dev, stream_destroy))
        dev->ops->stream_destroy(dev, stream);
}

ctxpar_status ctxpar_dev_stream_sync(ctxpar_device *dev, ctxpar_stream *stream) {
    return HAS(dev, stream_sync) ? dev->ops->stream_sync(dev, stream) : CTXPAR_OK;
}

ctxpar_status ctxpar_dev_event_create(ctxpar_device *dev, ctxpar_event **event_out) {
    if (!HAS(dev, event_create)) {
        *event_out = NULL;
        return CTXPAR_OK;
    }
    return dev->ops->event_create(dev, event_out);
}

void ctxpar_dev_event_destroy(ctxpar_device *dev, ctxpar_event *event) {
    if (event && HAS(dev, event_destroy))
        dev->ops->event_destroy(dev, event);
}

ctxpar_status ctxpar_dev_event_record(ctxpar_device *dev, ctxpar_event *event,
                                      ctxpar_stream *stream) {
    return HAS(dev, event_record) ? dev->ops->event_record(dev, event, stream) : CTXPAR_OK;
}

ctxpar_status ctxpar_dev_stream_wait_event(ctxpar_device *dev, ctxpar_stream *stream,
                                           ctxpar_event *event) {
    return HAS(dev, stream_wait_event) ? dev->ops->stream_wait_event(dev, stream, event)
                                       : CTXPAR_OK;
}

// ---- argument checks of the block and elementwise ops: here once, not in every backend (a
// backend checks only its own limits, e.g. CUDA's head_dim).

#define BAD(...) CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, __VA_ARGS__)

static ctxpar_status check_tensor(const char *op, const char *name, const ctxpar_tensor *t) {
    if (!t)
        return BAD("%s: %s is NULL", op, name);
    if (ctxpar_dtype_size(t->dtype) == 0)
        return CTXPAR_ERROR(CTXPAR_ERR_NOT_SUPPORTED, "%s: %s.dtype (%d) is not a ctxpar_dtype",
                            op, name, (int)t->dtype);
    int64_t n = 1;
    for (int i = 0; i < 4; i++) {
        if (t->shape[i] < 0)
            return BAD("%s: %s.shape[%d] (%lld) is negative", op, name, i,
                       (long long)t->shape[i]);
        n *= t->shape[i];
    }
    if (t->shape[3] > 1 && t->stride[3] != 1)
        return BAD("%s: %s.stride[3] (%lld) must be 1", op, name, (long long)t->stride[3]);
    if (n > 0 && !t->data)
        return BAD("%s: %s.data is NULL for %lld elements", op, name, (long long)n);
    return CTXPAR_OK;
}

static ctxpar_status check_same_shape(const char *op, const char *name, const ctxpar_tensor *t,
                                      const char *like_name, const ctxpar_tensor *like) {
    for (int i = 0; i < 4; i++)
        if (t->shape[i] != like->shape[i])
            return BAD("%s: %s.shape[%d] (%lld) != %s.shape[%d] (%lld)", op, name, i,
                       (long long)t->shape[i], like_name, i, (long long)like->shape[i]);
    return CTXPAR_OK;
}

static ctxpar_status check_spans(const char *op, const char *name, ctxpar_spans s,
                                 int64_t rows) {
    if (s.count < 0 || (s.count > 0 && !s.span))
        return BAD("%s: %s has count %d and span %p", op, name, s.count, (const void *)s.span);
    for (int i = 0; i < s.count; i++)
        if (s.span[i].len < 0)
            return BAD("%s: %s.span[%d].len (%lld) is negative", op, name, i,
                       (long long)s.span[i].len);
    const int64_t total = ctxpar_spans_total(s);
    if (total != rows)
        return BAD("%s: %s holds %lld positions but the tensor has %lld rows", op, name,
                   (long long)total, (long long)rows);
    return CTXPAR_OK;
}

static ctxpar_status check_block(const char *op, const ctxpar_attn_block *blk) {
    if (!blk)
        return BAD("%s: blk is NULL", op);
    const ctxpar_tensor *q = &blk->q, *k = &blk->k, *v = &blk->v;
    CTXPAR_CHECK(check_tensor(op, "q", q));
    CTXPAR_CHECK(check_tensor(op, "k", k));
    CTXPAR_CHECK(check_tensor(op, "v", v));
    if (k->dtype != q->dtype || v->dtype != q->dtype)
        return BAD("%s: dtypes differ: q %s, k %s, v %s", op, ctxpar_dtype_name(q->dtype),
                   ctxpar_dtype_name(k->dtype), ctxpar_dtype_name(v->dtype));
    for (int i = 0; i < 3; i++) // v's head_dim is its own (MLA)
        if (v->shape[i] != k->shape[i])
            return BAD("%s: v.shape[%d] (%lld) != k.shape[%d] (%lld)", op, i,
                       (long long)v->shape[i], i, (long long)k->shape[i]);
    if (v->shape[3] < 1)
        return BAD("%s: v's head_dim (%lld) must be >= 1", op, (long long)v->shape[3]);
    if (k->shape[0] != q->shape[0] || k->shape[3] != q->shape[3])
        return BAD("%s: k is [%lld, _, _, %lld] but q is [%lld, _, _, %lld] (batch, head_dim)",
                   op, (long long)k->shape[0], (long long)k->shape[3], (long long)q->shape[0],
                   (long long)q->shape[3]);
    if (q->shape[3] < 1)
        return BAD("%s: head_dim (%lld) must be >= 1", op, (long long)q->shape[3]);
    if (k->shape[2] < 1 || q->shape[2] % k->shape[2] != 0)
        return BAD("%s: q heads (%lld) must be a multiple of k/v heads (%lld)", op,
                   (long long)q->shape[2], (long long)k->shape[2]);
    if (!isfinite(blk->scale) || blk->scale == 0.0f)
        return BAD("%s: scale (%g) must be finite and non-zero", op, (double)blk->scale);
    if (blk->mask.window_left < 0 || blk->mask.window_right < 0)
        return BAD("%s: mask.window_left (%lld) or window_right (%lld) is negative", op,
                   (long long)blk->mask.window_left, (long long)blk->mask.window_right);
    if (blk->mask.cu_seqlens && blk->mask.num_docs < 1)
        return BAD("%s: mask.cu_seqlens is set but mask.num_docs is %lld", op,
                   (long long)blk->mask.num_docs);
    CTXPAR_CHECK(check_spans(op, "q_pos", blk->q_pos, q->shape[1]));
    return check_spans(op, "k_pos", blk->k_pos, k->shape[1]);
}

// Rows of a block: batch x query heads x query rows (what the F32 accumulators hold).
static int64_t block_rows(const ctxpar_attn_block *blk) {
    return blk->q.shape[0] * blk->q.shape[2] * blk->q.shape[1];
}

// Documents per batch row (mask.doc_rows > 0): backends see one batch row at a time, with its own
// documents, so no kernel needs to know. Row b of a block and of its dense F32 accumulators.
static ctxpar_status check_rows(const char *op, const ctxpar_attn_block *blk) {
    if (blk->mask.doc_rows != blk->q.shape[0] || !blk->mask.cu_seqlens)
        return BAD("%s: mask.doc_rows (%lld) must be the batch (%lld), with cu_seqlens", op,
                   (long long)blk->mask.doc_rows, (long long)blk->q.shape[0]);
    return CTXPAR_OK;
}

static ctxpar_tensor batch_row(const ctxpar_tensor *t, int64_t b) {
    ctxpar_tensor r = *t;
    r.data = (char *)t->data + (size_t)(b * t->stride[0]) * ctxpar_dtype_size(t->dtype);
    r.shape[0] = 1;
    return r;
}

static ctxpar_attn_block block_row(const ctxpar_attn_block *blk, int64_t b) {
    ctxpar_attn_block r = *blk;
    r.q = batch_row(&blk->q, b);
    r.k = batch_row(&blk->k, b);
    r.v = batch_row(&blk->v, b);
    r.mask = ctxpar_mask_row(&blk->mask, b);
    return r;
}

// What a backend receives: the caller's block with its size as this library knows it. The
// algorithms set it themselves, so the per-block copy (planner: millions of blocks) is only for
// other callers.
static const ctxpar_attn_block *stamped(const ctxpar_attn_block *blk, ctxpar_attn_block *copy) {
    if (blk->struct_size == sizeof *blk)
        return blk;
    *copy = *blk;
    copy->struct_size = sizeof *copy;
    return copy;
}

// Elements of one batch row of a dense [B, ...] accumulator of t's other dimensions.
static size_t row_elems(const ctxpar_tensor *t) {
    return (size_t)(t->shape[1] * t->shape[2] * t->shape[3]);
}

static float *at_row(float *p, size_t n, int64_t b) {
    return p ? p + (size_t)b * n : NULL;
}

ctxpar_status ctxpar_dev_attn_block_fwd(ctxpar_device *dev, const ctxpar_attn_block *blk,
                                        float *out_acc, float *lse_acc, int merge,
                                        ctxpar_stream *stream) {
    if (blk && blk->mask.doc_rows > 0) {
        CTXPAR_CHECK(check_rows("attn_block_fwd", blk));
        // out_acc is [B, Sq, Hq, Dv]: v's head_dim, not q's (they differ with MLA).
        const size_t l = (size_t)(blk->q.shape[1] * blk->q.shape[2]);
        const size_t o = l * (size_t)blk->v.shape[3];
        for (int64_t b = 0; b < blk->q.shape[0]; b++) {
            ctxpar_attn_block r = block_row(blk, b);
            CTXPAR_CHECK(ctxpar_dev_attn_block_fwd(dev, &r, at_row(out_acc, o, b),
                                                   at_row(lse_acc, l, b), merge, stream));
        }
        return CTXPAR_OK;
    }
    CTXPAR_CHECK(check_block("attn_block_fwd", blk));
    if (merge != 0 && merge != 1)
        return BAD("attn_block_fwd: merge (%d) must be 0 or 1", merge);
    if (block_rows(blk) > 0 && (!out_acc || !lse_acc))
        return BAD("attn_block_fwd: out_acc (%p) or lse_acc (%p) is NULL", (void *)out_acc,
                   (void *)lse_acc);
    ctxpar_attn_block copy;
    return dev->ops->attn_block_fwd(dev, stamped(blk, &copy), out_acc, lse_acc, merge, stream);
}

ctxpar_status ctxpar_dev_attn_merge(ctxpar_device *dev, float *out_acc, float *lse_acc,
                                    const float *out_b, const float *lse_b, int64_t batch,
                                    int64_t seq, int64_t heads, int64_t head_dim,
                                    ctxpar_stream *stream) {
    if (batch < 0 || seq < 0 || heads < 0 || head_dim < 0)
        return BAD("attn_merge: negative size (batch %lld, seq %lld, heads %lld, head_dim %lld)",
                   (long long)batch, (long long)seq, (long long)heads, (long long)head_dim);
    if (batch * seq * heads == 0)
        return CTXPAR_OK;
    if (!out_acc || !lse_acc || !out_b || !lse_b)
        return BAD("attn_merge: NULL buffer (out_acc %p, lse_acc %p, out_b %p, lse_b %p)",
                   (void *)out_acc, (void *)lse_acc, (const void *)out_b, (const void *)lse_b);
    return dev->ops->attn_merge(dev, out_acc, lse_acc, out_b, lse_b, batch, seq, heads, head_dim,
                                stream);
}

ctxpar_status ctxpar_dev_attn_bwd_prep(ctxpar_device *dev, const ctxpar_tensor *out,
                                       const ctxpar_tensor *dout, float *delta,
                                       ctxpar_stream *stream) {
    CTXPAR_CHECK(check_tensor("attn_bwd_prep", "out", out));
    CTXPAR_CHECK(check_tensor("attn_bwd_prep", "dout", dout));
    CTXPAR_CHECK(check_same_shape("attn_bwd_prep", "dout", dout, "out", out));
    if (out->shape[0] * out->shape[1] * out->shape[2] == 0)
        return CTXPAR_OK;
    if (!delta)
        return BAD("attn_bwd_prep: delta is NULL");
    return dev->ops->attn_bwd_prep(dev, out, dout, delta, stream);
}

ctxpar_status ctxpar_dev_attn_block_bwd(ctxpar_device *dev, const ctxpar_attn_block *blk,
                                        const ctxpar_tensor *dout, const float *lse,
                                        const float *delta, float *dq_acc, float *dk_acc,
                                        float *dv_acc, ctxpar_stream *stream) {
    if (blk && blk->mask.doc_rows > 0 && dout) {
        CTXPAR_CHECK(check_rows("attn_block_bwd", blk));
        const size_t o = row_elems(&blk->q), l = (size_t)(blk->q.shape[1] * blk->q.shape[2]);
        const size_t kn = row_elems(&blk->k), vn = row_elems(&blk->v);
        for (int64_t b = 0; b < blk->q.shape[0]; b++) {
            ctxpar_attn_block r = block_row(blk, b);
            ctxpar_tensor d = batch_row(dout, b);
            CTXPAR_CHECK(ctxpar_dev_attn_block_bwd(
                dev, &r, &d, lse ? lse + (size_t)b * l : NULL,
                delta ? delta + (size_t)b * l : NULL, at_row(dq_acc, o, b), at_row(dk_acc, kn, b),
                at_row(dv_acc, vn, b), stream));
        }
        return CTXPAR_OK;
    }
    CTXPAR_CHECK(check_block("attn_block_bwd", blk));
    CTXPAR_CHECK(check_tensor("attn_block_bwd", "dout", dout));
    if (dout->dtype != blk->q.dtype)
        return BAD("attn_block_bwd: dout.dtype (%s) != q.dtype (%s)",
                   ctxpar_dtype_name(dout->dtype), ctxpar_dtype_name(blk->q.dtype));
    for (int i = 0; i < 4; i++) { // dout is [B, Sq, Hq, Dv]
        const int64_t want = i < 3 ? blk->q.shape[i] : blk->v.shape[3];
        if (dout->shape[i] != want)
            return BAD("attn_block_bwd: dout.shape[%d] (%lld) != %lld (q's batch, seq, heads and "
                       "v's head_dim)",
                       i, (long long)dout->shape[i], (long long)want);
    }
    if (block_rows(blk) > 0 && (!lse || !delta))
        return BAD("attn_block_bwd: lse (%p) or delta (%p) is NULL", (const void *)lse,
                   (const void *)delta);
    ctxpar_attn_block copy;
    return dev->ops->attn_block_bwd(dev, stamped(blk, &copy), dout, lse, delta, dq_acc, dk_acc,
                                    dv_acc, stream);
}

ctxpar_status ctxpar_dev_cast(ctxpar_device *dev, const ctxpar_tensor *src, ctxpar_tensor *dst,
                              ctxpar_stream *stream) {
    CTXPAR_CHECK(check_tensor("cast", "src", src));
    CTXPAR_CHECK(check_tensor("cast", "dst", dst));
    CTXPAR_CHECK(check_same_shape("cast", "dst", dst, "src", src));
    return dev->ops->cast(dev, src, dst, stream);
}

ctxpar_status ctxpar_dev_add(ctxpar_device *dev, float *dst, const float *src, size_t n,
                             ctxpar_stream *stream) {
    if (n == 0)
        return CTXPAR_OK;
    if (!dst || !src)
        return BAD("add of %zu values: dst (%p) or src (%p) is NULL", n, (void *)dst,
                   (const void *)src);
    return dev->ops->add(dev, dst, src, n, stream);
}

ctxpar_status ctxpar_dev_fill(ctxpar_device *dev, float *dst, float value, size_t n,
                              ctxpar_stream *stream) {
    if (n == 0)
        return CTXPAR_OK;
    if (!dst)
        return BAD("fill of %zu values: dst is NULL", n);
    return dev->ops->fill(dev, dst, value, n, stream);
}

// FNV-1a over 8-byte words, then the tail: fast enough on the host and order-sensitive, which
// is what catching a corrupted or reordered transfer needs.
static uint64_t hash_bytes(const unsigned char *p, size_t n) {
    uint64_t h = 1469598103934665603ull;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        h = (h ^ w) * 1099511628211ull;
    }
    for (; i < n; i++)
        h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

ctxpar_status ctxpar_dev_checksum(ctxpar_device *dev, const void *data, size_t bytes,
                                  ctxpar_stream *stream, uint64_t *sum_out) {
    if (HAS(dev, checksum))
        return dev->ops->checksum(dev, data, bytes, stream, sum_out);
    if (dev->host_memory) {
        CTXPAR_CHECK(ctxpar_dev_stream_sync(dev, stream));
        *sum_out = hash_bytes(data, bytes);
        return CTXPAR_OK;
    }
    unsigned char *host = malloc(bytes ? bytes : 1);
    if (!host)
        return CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "checksum: cannot allocate %zu bytes",
                            bytes);
    ctxpar_status st = ctxpar_dev_copy(dev, host, data, bytes, CTXPAR_COPY_D2H, stream);
    if (st == CTXPAR_OK)
        st = ctxpar_dev_stream_sync(dev, stream);
    if (st == CTXPAR_OK)
        *sum_out = hash_bytes(host, bytes);
    free(host);
    return st;
}

ctxpar_status ctxpar_dev_attn_supported(const ctxpar_device *dev, const ctxpar_attn_query *query) {
    if (!HAS(dev, attn_supported))
        return CTXPAR_OK;
    ctxpar_status st = dev->ops->attn_supported(dev, query);
    if (st != CTXPAR_OK && st != CTXPAR_ERR_NOT_SUPPORTED) // the contract allows only these two
        return CTXPAR_ERROR(CTXPAR_ERR_INTERNAL, "device '%s': attn_supported returned %s",
                            dev->ops->name ? dev->ops->name : "?", ctxpar_status_string(st));
    return st;
}

void ctxpar_dev_describe(const ctxpar_device *dev, char *buf, size_t n) {
    if (!buf || n == 0)
        return;
    buf[0] = '\0';
    if (HAS(dev, describe))
        dev->ops->describe(dev, buf, n);
    else
        snprintf(buf, n, "%s", dev->ops->name);
    buf[n - 1] = '\0'; // a backend that filled every byte still ends the line
}
