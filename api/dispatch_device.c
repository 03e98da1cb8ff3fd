// The device dispatch: the only code that calls through a device ops table. It checks tables
// once at creation, owns the fallbacks for optional ops and counts the memory the library holds.
#include <stdlib.h>
#include <string.h>

#include "ctxpar_backend.h"

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

ctxpar_status ctxpar_device_create(const DEV_OPS *ops, void *impl, int host_memory,
                                   ctxpar_device **device_out) {
    if (!ops || !device_out)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "ops (%p) and device_out (%p) must be set",
                            (const void *)ops, (void *)device_out);
    if (ops->version < 1 || ops->version > CTXPAR_DEVICE_OPS_VERSION)
        return CTXPAR_ERROR(CTXPAR_ERR_NOT_SUPPORTED,
                            "device ops version %u is not supported (this library knows 1..%u)",
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
    ctxpar_device *dev = calloc(1, sizeof *dev);
    if (!dev)
        return CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "cannot allocate a device object");
    dev->ops = ops;
    dev->impl = impl;
    dev->host_memory = host_memory;
    *device_out = dev;
    return CTXPAR_OK;
}

// One live allocation: what a free needs to know without trusting its caller.
struct ctxpar_dev_block {
    void *ptr;
    size_t bytes;
    ctxpar_mem_kind kind;
};

void ctxpar_device_destroy(ctxpar_device *dev) {
    if (!dev)
        return;
    (void)ctxpar_dev_scratch_release(dev); // a device going away has no caller left to tell
    dev->ops->destroy(dev);
    free(dev->blocks);
    free(dev);
}

static ctxpar_status remember(ctxpar_device *dev, void *ptr, size_t bytes, ctxpar_mem_kind kind) {
    if (dev->n_blocks == dev->cap_blocks) {
        size_t cap = dev->cap_blocks ? 2 * dev->cap_blocks : 16;
        struct ctxpar_dev_block *grown = realloc(dev->blocks, cap * sizeof *grown);
        if (!grown)
            return CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "cannot record an allocation");
        dev->blocks = grown;
        dev->cap_blocks = cap;
    }
    dev->blocks[dev->n_blocks++] = (struct ctxpar_dev_block){ptr, bytes, kind};
    return CTXPAR_OK;
}

ctxpar_status ctxpar_dev_alloc(ctxpar_device *dev, size_t bytes, ctxpar_mem_kind kind,
                               void **ptr_out) {
    void *p = NULL;
    // Zero-byte buffers happen (an empty shard); hand out a real allocation anyway so that NULL
    // always means "nothing allocated".
    CTXPAR_CHECK(dev->ops->alloc(dev, bytes ? bytes : 1, kind, &p));
    dev->alloc_count++;
    ctxpar_status st = remember(dev, p, bytes, kind);
    if (st != CTXPAR_OK) {
        dev->ops->free(dev, p, kind);
        return st;
    }
    dev->mem_current += bytes;
    if (dev->mem_current > dev->mem_peak)
        dev->mem_peak = dev->mem_current;
    *ptr_out = p;
    return CTXPAR_OK;
}

ctxpar_status ctxpar_dev_free(ctxpar_device *dev, void *ptr, size_t bytes, ctxpar_mem_kind kind) {
    if (!ptr)
        return CTXPAR_OK;
    size_t i = dev->n_blocks;
    while (i > 0 && dev->blocks[i - 1].ptr != ptr) // recent blocks are freed first
        i--;
    if (i == 0)
        return CTXPAR_ERROR(CTXPAR_ERR_INTERNAL,
                            "free of %p, which device '%s' did not allocate (or freed already)",
                            ptr, dev->ops->name ? dev->ops->name : "?");
    struct ctxpar_dev_block b = dev->blocks[i - 1];
    if ((bytes != 0 && bytes != b.bytes) || kind != b.kind)
        return CTXPAR_ERROR(CTXPAR_ERR_INTERNAL,
                            "free of %p as %zu bytes of kind %d: it was allocated as %zu bytes of "
                            "kind %d",
                            ptr, bytes, (int)kind, b.bytes, (int)b.kind);
    dev->blocks[i - 1] = dev->blocks[--dev->n_blocks];
    dev->ops->free(dev, ptr, kind);
    dev->mem_current -= b.bytes;
    return CTXPAR_OK;
}

ctxpar_status ctxpar_dev_scratch(ctxpar_device *dev, size_t bytes, void **ptr_out) {
    if (dev->scratch && dev->scratch_bytes >= bytes) {
        *ptr_out = dev->scratch;
        return CTXPAR_OK;
    }
    CTXPAR_CHECK(ctxpar_dev_scratch_release(dev));
    CTXPAR_CHECK(ctxpar_dev_alloc(dev, bytes, CTXPAR_MEM_DEVICE, &dev->scratch));
    dev->scratch_bytes = bytes;
    *ptr_out = dev->scratch;
    return CTXPAR_OK;
}

ctxpar_status ctxpar_dev_scratch_release(ctxpar_device *dev) {
    void *p = dev->scratch;
    size_t bytes = dev->scratch_bytes;
    dev->scratch = NULL;
    dev->scratch_bytes = 0;
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

ctxpar_status ctxpar_dev_attn_block_fwd(ctxpar_device *dev, const ctxpar_attn_block *blk,
                                        float *out_acc, float *lse_acc, int merge,
                                        ctxpar_stream *stream) {
    return dev->ops->attn_block_fwd(dev, blk, out_acc, lse_acc, merge, stream);
}

ctxpar_status ctxpar_dev_attn_merge(ctxpar_device *dev, float *out_acc, float *lse_acc,
                                    const float *out_b, const float *lse_b, int64_t batch,
                                    int64_t seq, int64_t heads, int64_t head_dim,
                                    ctxpar_stream *stream) {
    return dev->ops->attn_merge(dev, out_acc, lse_acc, out_b, lse_b, batch, seq, heads, head_dim,
                                stream);
}

ctxpar_status ctxpar_dev_attn_bwd_prep(ctxpar_device *dev, const ctxpar_tensor *out,
                                       const ctxpar_tensor *dout, float *delta,
                                       ctxpar_stream *stream) {
    return dev->ops->attn_bwd_prep(dev, out, dout, delta, stream);
}

ctxpar_status ctxpar_dev_attn_block_bwd(ctxpar_device *dev, const ctxpar_attn_block *blk,
                                        const ctxpar_tensor *dout, const float *lse,
                                        const float *delta, float *dq_acc, float *dk_acc,
                                        float *dv_acc, ctxpar_stream *stream) {
    return dev->ops->attn_block_bwd(dev, blk, dout, lse, delta, dq_acc, dk_acc, dv_acc, stream);
}

ctxpar_status ctxpar_dev_cast(ctxpar_device *dev, const ctxpar_tensor *src, ctxpar_tensor *dst,
                              ctxpar_stream *stream) {
    return dev->ops->cast(dev, src, dst, stream);
}

ctxpar_status ctxpar_dev_add(ctxpar_device *dev, float *dst, const float *src, size_t n,
                             ctxpar_stream *stream) {
    return n ? dev->ops->add(dev, dst, src, n, stream) : CTXPAR_OK;
}

ctxpar_status ctxpar_dev_fill(ctxpar_device *dev, float *dst, float value, size_t n,
                              ctxpar_stream *stream) {
    return n ? dev->ops->fill(dev, dst, value, n, stream) : CTXPAR_OK;
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
