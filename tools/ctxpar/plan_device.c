// The planner's device (see plan_device.h): every op succeeds at once and touches nothing; the
// forward block op counts what it would compute for the coverage proof.
#include <stdlib.h>

#include "algorithms.h"
#include "plan_device.h"

typedef struct plan_dev {
    uintptr_t next; // the next address alloc hands out (never dereferenced)
    cpt_plan_cover *cover;
} plan_dev;

ctxpar_status cpt_plan_cover_init(cpt_plan_cover *c, int64_t seq) {
    c->seq = seq;
    c->count = calloc((size_t)seq, sizeof *c->count);
    c->diff = calloc((size_t)seq + 1, sizeof *c->diff);
    if (!c->count || !c->diff) {
        cpt_plan_cover_free(c);
        return CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "plan: no memory for %lld positions",
                            (long long)seq);
    }
    return CTXPAR_OK;
}

void cpt_plan_cover_settle(cpt_plan_cover *c) {
    int64_t run = 0;
    for (int64_t i = 0; i < c->seq; i++) {
        run += c->diff[i];
        c->diff[i] = 0;
        c->count[i] += run;
    }
    c->diff[c->seq] = 0;
}

void cpt_plan_cover_free(cpt_plan_cover *c) {
    free(c->count);
    free(c->diff);
    c->count = c->diff = NULL;
}

// One (query span, key span) pair of a block: a whole block adds the same number of keys to
// every query row (a range add for contiguous rows), a partial one counts row by row.
static void cover_pair(cpt_plan_cover *c, const ctxpar_mask_desc *m, const ctxpar_span *q,
                       const ctxpar_span *k, int64_t mult) {
    int64_t qmin, qmax, kmin, kmax;
    ctxpar_spans_range((ctxpar_spans){q, 1}, &qmin, &qmax);
    ctxpar_spans_range((ctxpar_spans){k, 1}, &kmin, &kmax);
    const ctxpar_block_class cls = ctxpar_mask_classify(m, qmin, qmax, kmin, kmax);
    if (cls == CTXPAR_BLOCK_SKIP)
        return;
    if (cls == CTXPAR_BLOCK_FULL && q->stride == 1) {
        c->diff[q->start] += mult * k->len;
        c->diff[q->start + q->len] -= mult * k->len;
        return;
    }
    for (int64_t i = 0; i < q->len; i++) {
        const int64_t pos = q->start + i * q->stride;
        c->count[pos] +=
            mult * (cls == CTXPAR_BLOCK_FULL ? k->len : ctxpar_visible_keys(m, pos, k, c->seq));
    }
}

static ctxpar_status pd_fwd(ctxpar_device *dev, const ctxpar_attn_block *blk, float *out_acc,
                            float *lse_acc, int merge, ctxpar_stream *stream) {
    (void)out_acc, (void)lse_acc, (void)merge, (void)stream;
    plan_dev *p = dev->impl;
    if (!p->cover)
        return CTXPAR_OK;
    const int64_t mult = blk->q.shape[0] * blk->q.shape[2]; // batch x heads
    for (int i = 0; i < blk->q_pos.count; i++)
        for (int j = 0; j < blk->k_pos.count; j++)
            cover_pair(p->cover, &blk->mask, &blk->q_pos.span[i], &blk->k_pos.span[j], mult);
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
    (void)dev, (void)dst, (void)src, (void)bytes, (void)kind, (void)stream;
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

static void pd_destroy(ctxpar_device *dev) {
    free(dev->impl);
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

void cpt_plan_device_record(ctxpar_device *dev, cpt_plan_cover *cover) {
    ((plan_dev *)dev->impl)->cover = cover;
}
