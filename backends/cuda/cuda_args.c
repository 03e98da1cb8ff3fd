// Checking attention arguments and building the kernels' argument structs.
#include <stdlib.h>
#include <string.h>

#include "cuda_args.h"

// Grid dimensions y and z of the attention kernels carry heads and batch.
#define GRID_YZ_MAX 65535

// What the dispatch (dispatch/dispatch_device.c) does not check: the kernels' grids need every
// dimension but seq to be at least 1, and their index arithmetic non-negative strides.
ctxpar_status ctxpar_cuda_check_tensor(const char *op, const char *name, const ctxpar_tensor *t) {
    for (int i = 0; i < 4; i++) {
        if (i != 1 && t->shape[i] < 1)
            return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "%s: %s.shape[%d] (%lld) must be >= 1", op,
                                name, i, (long long)t->shape[i]);
        if (t->stride[i] < 0)
            return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "%s: %s.stride[%d] (%lld) is negative", op,
                                name, i, (long long)t->stride[i]);
    }
    return CTXPAR_OK;
}

ctxpar_cuda_view ctxpar_cuda_view_of(const ctxpar_tensor *t) {
    ctxpar_cuda_view v = {t->data, {t->stride[0], t->stride[1], t->stride[2]}};
    return v;
}

// The block's own limits on this backend; the dispatch checked its shapes, dtypes and spans.
static ctxpar_status check_block(const char *op, const ctxpar_attn_block *blk) {
    CTXPAR_CHECK(ctxpar_cuda_check_tensor(op, "blk->q", &blk->q));
    CTXPAR_CHECK(ctxpar_cuda_check_tensor(op, "blk->k", &blk->k));
    CTXPAR_CHECK(ctxpar_cuda_check_tensor(op, "blk->v", &blk->v));
    const ctxpar_tensor *q = &blk->q;
    if (q->shape[3] > CTXPAR_CUDA_MAX_HEAD_DIM)
        return CTXPAR_ERROR(CTXPAR_ERR_NOT_SUPPORTED,
                            "%s: head_dim %lld is above the CUDA backend's limit of %d", op,
                            (long long)q->shape[3], CTXPAR_CUDA_MAX_HEAD_DIM);
    if (q->shape[0] > GRID_YZ_MAX || q->shape[2] > GRID_YZ_MAX)
        return CTXPAR_ERROR(CTXPAR_ERR_NOT_SUPPORTED, "%s: batch (%lld) and heads (%lld) must be <= %d",
                            op, (long long)q->shape[0], (long long)q->shape[2], GRID_YZ_MAX);
    if (blk->mask.cu_seqlens && blk->mask.num_docs > INT32_MAX)
        return CTXPAR_ERROR(CTXPAR_ERR_NOT_SUPPORTED, "%s: mask.num_docs (%lld) is above %d", op,
                            (long long)blk->mask.num_docs, INT32_MAX);
    return CTXPAR_OK;
}

static int aligned16(const ctxpar_tensor *t) {
    return (uintptr_t)t->data % 16 == 0 && t->stride[0] % 8 == 0 && t->stride[1] % 8 == 0 &&
           t->stride[2] % 8 == 0;
}

// One diagonal block of a causal mask that cuDNN's own causal mask reproduces: both sides one
// stride-1 span starting at the same position, no window, at most one document.
static int is_causal_aligned(const ctxpar_attn_block *blk) {
    const ctxpar_mask_desc *m = &blk->mask;
    if (!m->causal || m->window_left > 0 || (m->cu_seqlens && m->num_docs > 1))
        return 0;
    if (blk->q_pos.count != 1 || blk->k_pos.count != 1)
        return 0;
    const ctxpar_span *a = &blk->q_pos.span[0], *b = &blk->k_pos.span[0];
    return (a->stride == 1 || a->len == 1) && (b->stride == 1 || b->len == 1) &&
           a->start == b->start && a->len == b->len;
}

// Lists that do not fit the kernel arguments go to one scratch buffer: q spans, k spans, then
// the document boundaries. The host source is packed here and the stream synchronised after
// the copy, so nothing depends on when the driver reads pageable memory; it costs one sync per
// call and only with more than CTXPAR_CUDA_INLINE_SPANS spans or CTXPAR_CUDA_INLINE_BOUNDS - 1
// documents.
static ctxpar_status upload_lists(struct ctxpar_device *dev, const ctxpar_attn_block *blk,
                                  cudaStream_t stream, ctxpar_cuda_block *b) {
    const int up_q = blk->q_pos.count > CTXPAR_CUDA_INLINE_SPANS;
    const int up_k = blk->k_pos.count > CTXPAR_CUDA_INLINE_SPANS;
    const int64_t nb = blk->mask.cu_seqlens ? blk->mask.num_docs + 1 : 0;
    const int up_cu = nb > CTXPAR_CUDA_INLINE_BOUNDS;
    size_t q_bytes = up_q ? (size_t)blk->q_pos.count * sizeof(ctxpar_span) : 0;
    size_t k_bytes = up_k ? (size_t)blk->k_pos.count * sizeof(ctxpar_span) : 0;
    size_t cu_bytes = up_cu ? (size_t)nb * sizeof(int32_t) : 0;
    size_t total = q_bytes + k_bytes + cu_bytes;
    if (total == 0)
        return CTXPAR_OK;
    unsigned char *host = malloc(total);
    if (!host)
        return CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "cannot stage %zu bytes of spans", total);
    if (q_bytes)
        memcpy(host, blk->q_pos.span, q_bytes);
    if (k_bytes)
        memcpy(host + q_bytes, blk->k_pos.span, k_bytes);
    if (cu_bytes)
        memcpy(host + q_bytes + k_bytes, blk->mask.cu_seqlens, cu_bytes);
    unsigned char *d = NULL;
    ctxpar_status st = ctxpar_cuda_scratch_alloc(dev, total, stream, (void **)&d);
    if (st == CTXPAR_OK) {
        cudaError_t e = cudaMemcpyAsync(d, host, total, cudaMemcpyHostToDevice, stream);
        if (e == cudaSuccess)
            e = cudaStreamSynchronize(stream);
        if (e != cudaSuccess) {
            (void)ctxpar_cuda_scratch_free(dev, d, stream); // the copy's error wins
            st = ctxpar_cuda_fail(e, __FILE__, __LINE__, "uploading spans");
        }
    }
    free(host);
    CTXPAR_CHECK(st);
    b->upload = d;
    if (up_q)
        b->args.q_pos.list = (const ctxpar_span *)d;
    if (up_k)
        b->args.k_pos.list = (const ctxpar_span *)(d + q_bytes);
    if (up_cu)
        b->args.mask.cu_list = (const int32_t *)(d + q_bytes + k_bytes);
    return CTXPAR_OK;
}

static void inline_spans(ctxpar_cuda_positions *p, ctxpar_spans s) {
    p->count = s.count;
    p->list = NULL;
    for (int i = 0; i < s.count && i < CTXPAR_CUDA_INLINE_SPANS; i++)
        p->inline_span[i] = s.span[i];
}

ctxpar_status ctxpar_cuda_block_prepare(struct ctxpar_device *dev, const char *op,
                                        const ctxpar_attn_block *blk, cudaStream_t stream,
                                        ctxpar_cuda_block *out) {
    CTXPAR_CHECK(check_block(op, blk));
    ctxpar_cuda_block b;
    memset(&b, 0, sizeof b);
    ctxpar_cuda_attn_args *a = &b.args;
    a->dtype = blk->q.dtype;
    a->batch = blk->q.shape[0];
    a->seq_q = blk->q.shape[1];
    a->seq_k = blk->k.shape[1];
    a->heads_q = blk->q.shape[2];
    a->heads_kv = blk->k.shape[2];
    a->head_dim = blk->q.shape[3];
    a->q = ctxpar_cuda_view_of(&blk->q);
    a->k = ctxpar_cuda_view_of(&blk->k);
    a->v = ctxpar_cuda_view_of(&blk->v);
    inline_spans(&a->q_pos, blk->q_pos);
    inline_spans(&a->k_pos, blk->k_pos);
    a->mask.causal = blk->mask.causal != 0;
    a->mask.window_left = blk->mask.window_left;
    a->mask.window_right = blk->mask.window_right;
    a->mask.num_docs = blk->mask.cu_seqlens ? blk->mask.num_docs : 0;
    for (int64_t i = 0; i < a->mask.num_docs + 1 && i < CTXPAR_CUDA_INLINE_BOUNDS; i++)
        a->mask.cu_inline[i] = a->mask.num_docs ? blk->mask.cu_seqlens[i] : 0;
    a->scale = blk->scale;
    a->aligned16 = aligned16(&blk->q) && aligned16(&blk->k) && aligned16(&blk->v);
    a->k_increasing =
        blk->k_pos.count == 1 && (blk->k_pos.span[0].stride > 0 || blk->k_pos.span[0].len <= 1);

    if (a->seq_q == 0 || a->seq_k == 0) {
        b.cls = CTXPAR_BLOCK_SKIP;
    } else {
        int64_t qmin, qmax, kmin, kmax;
        ctxpar_spans_range(blk->q_pos, &qmin, &qmax);
        ctxpar_spans_range(blk->k_pos, &kmin, &kmax);
        b.cls = ctxpar_mask_classify(&blk->mask, qmin, qmax, kmin, kmax);
    }
    a->block_full = b.cls == CTXPAR_BLOCK_FULL;
    b.causal_aligned = b.cls == CTXPAR_BLOCK_PARTIAL && is_causal_aligned(blk);
    if (b.cls != CTXPAR_BLOCK_SKIP && !a->block_full)
        CTXPAR_CHECK(upload_lists(dev, blk, stream, &b));
    *out = b;
    return CTXPAR_OK;
}

ctxpar_status ctxpar_cuda_block_release(struct ctxpar_device *dev, ctxpar_cuda_block *b,
                                        cudaStream_t stream) {
    void *upload = b->upload;
    b->upload = NULL;
    return ctxpar_cuda_scratch_free(dev, upload, stream);
}
