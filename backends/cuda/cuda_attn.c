// The attention ops of the CUDA device: pick cuDNN or a kernel for each block, launch, count.
#include <math.h>
#include <stdio.h>

#include "cuda_args.h"
#include "cuda_cudnn.h"

// Writes the result of a block with no visible key when it is not merged: out 0, lse -inf.
static ctxpar_status write_empty(const ctxpar_cuda_attn_args *a, float *out_acc, float *lse_acc,
                                 cudaStream_t stream) {
    size_t rows = (size_t)(a->batch * a->seq_q * a->heads_q);
    CTXPAR_CUDA_CHECK(
        cudaMemsetAsync(out_acc, 0, rows * (size_t)a->head_dim * sizeof(float), stream));
    CTXPAR_CUDA_CHECK(ctxpar_cuda_launch_fill(lse_acc, -INFINITY, rows, stream));
    return CTXPAR_OK;
}

// The SIMT kernels keep whole tiles in shared memory; a GPU with less than they need for this
// head_dim cannot run them. `allowed` is what creation let the kernels use (the need at the
// largest head_dim, or the GPU's opt-in limit when smaller).
static ctxpar_status check_smem(const ctxpar_cuda_impl *impl, const char *op, size_t need,
                                size_t allowed, int64_t head_dim) {
    if (need > allowed)
        return CTXPAR_ERROR(CTXPAR_ERR_NOT_SUPPORTED,
                            "%s: head_dim %lld needs %zu bytes of shared "
                            "memory per block; CUDA device %d allows %zu",
                            op, (long long)head_dim, need, impl->ordinal, allowed);
    return CTXPAR_OK;
}

static ctxpar_status run_fwd(struct ctxpar_device *dev, ctxpar_cuda_block *b, float *out_acc,
                             float *lse_acc, int merge, cudaStream_t stream) {
    ctxpar_cuda_impl *impl = ctxpar_cuda_impl_of(dev);
    const ctxpar_cuda_attn_args *a = &b->args;
    if (b->cls == CTXPAR_BLOCK_SKIP)
        return merge ? CTXPAR_OK : write_empty(a, out_acc, lse_acc, stream);
    if (impl->cudnn && (b->cls == CTXPAR_BLOCK_FULL || b->causal_aligned)) {
        int ran = 0;
        CTXPAR_CHECK(ctxpar_cudnn_attn_fwd(dev, impl->cudnn, a, b->causal_aligned, out_acc, lse_acc,
                                           merge, stream, &ran));
        if (ran) {
            impl->fwd_cudnn++;
            return CTXPAR_OK;
        }
    } else if (impl->cudnn) {
        snprintf(impl->cudnn_reason, sizeof impl->cudnn_reason, "%s",
                 "mask: the block is neither unmasked nor an aligned causal diagonal");
    }
    const int tensor_cores = a->dtype != CTXPAR_DTYPE_F32 && a->head_dim % 8 == 0;
    if (!tensor_cores)
        CTXPAR_CHECK(check_smem(impl, "attn_block_fwd", ctxpar_cuda_simt_fwd_smem(a->head_dim),
                                impl->smem_fwd, a->head_dim));
    CTXPAR_CUDA_CHECK(
        ctxpar_cuda_launch_attn_fwd(a, tensor_cores ? CTXPAR_CUDA_FWD_MMA : CTXPAR_CUDA_FWD_SIMT,
                                    out_acc, lse_acc, merge, stream));
    impl->fwd_native++;
    return CTXPAR_OK;
}

ctxpar_status ctxpar_cuda_attn_block_fwd(struct ctxpar_device *dev, const ctxpar_attn_block *blk,
                                         float *out_acc, float *lse_acc, int merge,
                                         ctxpar_stream *stream) {
    // blk, merge and the accumulators were checked by the dispatch.
    CTXPAR_CHECK(ctxpar_cuda_enter(dev));
    cudaStream_t s = ctxpar_cuda_stream_of(stream);
    ctxpar_cuda_block b;
    CTXPAR_CHECK(ctxpar_cuda_block_prepare(dev, "attn_block_fwd", blk, s, &b));
    ctxpar_status st = run_fwd(dev, &b, out_acc, lse_acc, merge, s);
    ctxpar_status freed = ctxpar_cuda_block_release(dev, &b, s);
    return st != CTXPAR_OK ? st : freed;
}

ctxpar_status ctxpar_cuda_attn_merge(struct ctxpar_device *dev, float *out_acc, float *lse_acc,
                                     const float *out_b, const float *lse_b, int64_t batch,
                                     int64_t seq, int64_t heads, int64_t head_dim,
                                     ctxpar_stream *stream) {
    // Sizes and buffers were checked by the dispatch (which returns before an empty merge).
    CTXPAR_CHECK(ctxpar_cuda_enter(dev));
    CTXPAR_CUDA_CHECK(ctxpar_cuda_launch_merge(out_acc, lse_acc, out_b, CTXPAR_DTYPE_F32, lse_b,
                                               batch, seq, heads, head_dim, 1,
                                               ctxpar_cuda_stream_of(stream)));
    return CTXPAR_OK;
}

ctxpar_status ctxpar_cuda_attn_bwd_prep(struct ctxpar_device *dev, const ctxpar_tensor *out,
                                        const ctxpar_tensor *dout, float *delta,
                                        ctxpar_stream *stream) {
    CTXPAR_CHECK(ctxpar_cuda_check_tensor("attn_bwd_prep", "out", out));
    CTXPAR_CHECK(ctxpar_cuda_check_tensor("attn_bwd_prep", "dout", dout));
    // The dispatch checked the shapes and delta, and returned before an empty call.
    CTXPAR_CHECK(ctxpar_cuda_enter(dev));
    CTXPAR_CUDA_CHECK(ctxpar_cuda_launch_bwd_prep(
        ctxpar_cuda_view_of(out), out->dtype, ctxpar_cuda_view_of(dout), dout->dtype, out->shape[0],
        out->shape[1], out->shape[2], out->shape[3], delta, ctxpar_cuda_stream_of(stream)));
    return CTXPAR_OK;
}

ctxpar_status ctxpar_cuda_attn_block_bwd(struct ctxpar_device *dev, const ctxpar_attn_block *blk,
                                         const ctxpar_tensor *dout, const float *lse,
                                         const float *delta, float *dq_acc, float *dk_acc,
                                         float *dv_acc, ctxpar_stream *stream) {
    // blk, dout (as q), lse and delta were checked by the dispatch.
    CTXPAR_CHECK(ctxpar_cuda_check_tensor("attn_block_bwd", "dout", dout));
    if (!dq_acc && !dk_acc && !dv_acc)
        return CTXPAR_OK;
    CTXPAR_CHECK(ctxpar_cuda_enter(dev));
    cudaStream_t s = ctxpar_cuda_stream_of(stream);
    ctxpar_cuda_block b;
    CTXPAR_CHECK(ctxpar_cuda_block_prepare(dev, "attn_block_bwd", blk, s, &b));
    ctxpar_status st = CTXPAR_OK;
    if (b.cls != CTXPAR_BLOCK_SKIP) {
        const ctxpar_cuda_impl *impl = ctxpar_cuda_impl_of(dev);
        st = check_smem(impl, "attn_block_bwd", ctxpar_cuda_simt_bwd_smem(b.args.head_dim),
                        impl->smem_bwd, b.args.head_dim);
        if (st == CTXPAR_OK) {
            ctxpar_cuda_bwd_args g = {
                ctxpar_cuda_view_of(dout), lse, delta, dq_acc, dk_acc, dv_acc};
            cudaError_t e = ctxpar_cuda_launch_attn_bwd(&b.args, &g, s);
            if (e != cudaSuccess)
                st = ctxpar_cuda_fail(e, __FILE__, __LINE__, "ctxpar_cuda_launch_attn_bwd");
        }
    }
    ctxpar_status freed = ctxpar_cuda_block_release(dev, &b, s);
    return st != CTXPAR_OK ? st : freed;
}
