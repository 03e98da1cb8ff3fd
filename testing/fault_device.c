// The fault-injecting device decorator (see fault_device.h).
#include <stdlib.h>
#include <string.h>

#include "dispatch.h"
#include "fault_device.h"

#define MAX_OPS 32

typedef struct fault_dev {
    ctxpar_device *inner;
    cpt_fault_device_config cfg;
    const char *name[MAX_OPS];
    int calls[MAX_OPS];
    int n_ops;
    void *last;
    size_t last_bytes;
} fault_dev;

static fault_dev *fd_of(const ctxpar_device *d) { return d->impl; }

static int *counter(fault_dev *f, const char *op) {
    for (int i = 0; i < f->n_ops; i++)
        if (strcmp(f->name[i], op) == 0)
            return &f->calls[i];
    if (f->n_ops == MAX_OPS)
        return NULL;
    f->name[f->n_ops] = op;
    return &f->calls[f->n_ops++];
}

// Counts a call of `op`; DEVICE when it is the one configured to fail.
static ctxpar_status hit(ctxpar_device *d, const char *op) {
    fault_dev *f = fd_of(d);
    int *n = counter(f, op);
    int k = n ? (*n)++ : -1;
    if (f->cfg.fail_op && strcmp(f->cfg.fail_op, op) == 0 && k == f->cfg.fail_at)
        return CTXPAR_ERROR(CTXPAR_ERR_DEVICE, "fault device: %s call %d failed (injected)", op,
                            k);
    return CTXPAR_OK;
}

static void fd_destroy(ctxpar_device *d) { free(d->impl); }

static ctxpar_status fd_alloc(ctxpar_device *d, size_t bytes, ctxpar_mem_kind kind, void **p) {
    CTXPAR_CHECK(hit(d, "alloc"));
    CTXPAR_CHECK(ctxpar_dev_alloc(fd_of(d)->inner, bytes, kind, p));
    fd_of(d)->last = *p;
    fd_of(d)->last_bytes = bytes;
    return CTXPAR_OK;
}

// The block is released whether or not the injected fault is reported (as a device that
// reports a fault late has still released it).
static ctxpar_status fd_free(ctxpar_device *d, void *p, ctxpar_mem_kind kind) {
    ctxpar_status fault = hit(d, "free");
    ctxpar_status st = ctxpar_dev_free(fd_of(d)->inner, p, 0, kind);
    return fault != CTXPAR_OK ? fault : st;
}

static ctxpar_status fd_copy(ctxpar_device *d, void *dst, const void *src, size_t n,
                             ctxpar_copy_kind kind, ctxpar_stream *s) {
    (void)s;
    CTXPAR_CHECK(hit(d, "copy"));
    return ctxpar_dev_copy(fd_of(d)->inner, dst, src, n, kind, NULL);
}

static ctxpar_status fd_memset(ctxpar_device *d, void *dst, int v, size_t n, ctxpar_stream *s) {
    (void)s;
    CTXPAR_CHECK(hit(d, "memset"));
    return ctxpar_dev_memset(fd_of(d)->inner, dst, v, n, NULL);
}

// Streams and events are tokens: the inner device is synchronous.
static ctxpar_status fd_stream_create(ctxpar_device *d, ctxpar_stream **out) {
    CTXPAR_CHECK(hit(d, "stream_create"));
    *out = malloc(1);
    return *out ? CTXPAR_OK : CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "fault device: no memory");
}
static void fd_stream_destroy(ctxpar_device *d, ctxpar_stream *s) {
    (void)d;
    free(s);
}
static ctxpar_status fd_stream_sync(ctxpar_device *d, ctxpar_stream *s) {
    (void)s;
    return hit(d, "stream_sync");
}
static ctxpar_status fd_event_create(ctxpar_device *d, ctxpar_event **out) {
    CTXPAR_CHECK(hit(d, "event_create"));
    *out = malloc(1);
    return *out ? CTXPAR_OK : CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "fault device: no memory");
}
static void fd_event_destroy(ctxpar_device *d, ctxpar_event *e) {
    (void)d;
    free(e);
}
static ctxpar_status fd_event_record(ctxpar_device *d, ctxpar_event *e, ctxpar_stream *s) {
    (void)e;
    (void)s;
    return hit(d, "event_record");
}
static ctxpar_status fd_stream_wait_event(ctxpar_device *d, ctxpar_stream *s, ctxpar_event *e) {
    (void)e;
    (void)s;
    return hit(d, "stream_wait_event");
}

static ctxpar_status fd_fwd(ctxpar_device *d, const ctxpar_attn_block *blk, float *out,
                            float *lse, int merge, ctxpar_stream *s) {
    (void)s;
    CTXPAR_CHECK(hit(d, "attn_block_fwd"));
    return ctxpar_dev_attn_block_fwd(fd_of(d)->inner, blk, out, lse, merge, NULL);
}

static ctxpar_status fd_merge(ctxpar_device *d, float *out, float *lse, const float *ob,
                              const float *lb, int64_t b, int64_t sq, int64_t h, int64_t dim,
                              ctxpar_stream *s) {
    (void)s;
    CTXPAR_CHECK(hit(d, "attn_merge"));
    return ctxpar_dev_attn_merge(fd_of(d)->inner, out, lse, ob, lb, b, sq, h, dim, NULL);
}

static ctxpar_status fd_prep(ctxpar_device *d, const ctxpar_tensor *out, const ctxpar_tensor *dout,
                             float *delta, ctxpar_stream *s) {
    (void)s;
    CTXPAR_CHECK(hit(d, "attn_bwd_prep"));
    return ctxpar_dev_attn_bwd_prep(fd_of(d)->inner, out, dout, delta, NULL);
}

static ctxpar_status fd_bwd(ctxpar_device *d, const ctxpar_attn_block *blk,
                            const ctxpar_tensor *dout, const float *lse, const float *delta,
                            float *dq, float *dk, float *dv, ctxpar_stream *s) {
    (void)s;
    CTXPAR_CHECK(hit(d, "attn_block_bwd"));
    return ctxpar_dev_attn_block_bwd(fd_of(d)->inner, blk, dout, lse, delta, dq, dk, dv, NULL);
}

static ctxpar_status fd_cast(ctxpar_device *d, const ctxpar_tensor *src, ctxpar_tensor *dst,
                             ctxpar_stream *s) {
    (void)s;
    CTXPAR_CHECK(hit(d, "cast"));
    return ctxpar_dev_cast(fd_of(d)->inner, src, dst, NULL);
}

static ctxpar_status fd_add(ctxpar_device *d, float *dst, const float *src, size_t n,
                            ctxpar_stream *s) {
    (void)s;
    CTXPAR_CHECK(hit(d, "add"));
    return ctxpar_dev_add(fd_of(d)->inner, dst, src, n, NULL);
}

static ctxpar_status fd_fill(ctxpar_device *d, float *dst, float v, size_t n, ctxpar_stream *s) {
    (void)s;
    CTXPAR_CHECK(hit(d, "fill"));
    return ctxpar_dev_fill(fd_of(d)->inner, dst, v, n, NULL);
}

#define COMMON_OPS                                                                                \
    .version = CTXPAR_DEVICE_OPS_VERSION, .struct_size = sizeof(struct ctxpar_device_ops),        \
    .name = "fault", .destroy = fd_destroy, .alloc = fd_alloc, .free = fd_free, .copy = fd_copy,  \
    .memset = fd_memset, .attn_block_fwd = fd_fwd, .attn_merge = fd_merge,                        \
    .attn_bwd_prep = fd_prep, .attn_block_bwd = fd_bwd, .cast = fd_cast, .add = fd_add,           \
    .fill = fd_fill

static const struct ctxpar_device_ops plain_ops = {COMMON_OPS};
static const struct ctxpar_device_ops stream_ops = {
    COMMON_OPS,
    .stream_create = fd_stream_create,
    .stream_destroy = fd_stream_destroy,
    .stream_sync = fd_stream_sync,
    .event_create = fd_event_create,
    .event_destroy = fd_event_destroy,
    .event_record = fd_event_record,
    .stream_wait_event = fd_stream_wait_event,
};

ctxpar_status cpt_device_create_fault(ctxpar_device *inner,
                                         const cpt_fault_device_config *config,
                                         ctxpar_device **device_out) {
    if (!inner || !config || !device_out)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "inner, config and device_out must be set");
    fault_dev *f = calloc(1, sizeof *f);
    if (!f)
        return CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "fault device: cannot allocate");
    f->inner = inner;
    f->cfg = *config;
    ctxpar_status st = ctxpar_device_create(config->streams ? &stream_ops : &plain_ops, f,
                                            inner->host_memory, device_out);
    if (st != CTXPAR_OK)
        free(f);
    return st;
}

int cpt_fault_device_calls(const ctxpar_device *device, const char *op) {
    fault_dev *f = fd_of(device);
    for (int i = 0; i < f->n_ops; i++)
        if (strcmp(f->name[i], op) == 0)
            return f->calls[i];
    return 0;
}

void *cpt_fault_device_last_alloc(const ctxpar_device *device, size_t *bytes_out) {
    const fault_dev *f = fd_of(device);
    if (bytes_out)
        *bytes_out = f->last_bytes;
    return f->last;
}
