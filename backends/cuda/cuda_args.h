// Checking the arguments of the attention ops and turning them into kernel arguments.
#ifndef CTXPAR_CUDA_ARGS_H
#define CTXPAR_CUDA_ARGS_H

#include "cuda_internal.h"
#include "cuda_kernels.h"

// The CUDA kernels' own limits on a tensor (dimensions but seq >= 1, strides >= 0); the dispatch
// checked the rest.
ctxpar_status ctxpar_cuda_check_tensor(const char *op, const char *name, const ctxpar_tensor *t);

// The kernel view (data and b, s, h strides) of a checked tensor.
ctxpar_cuda_view ctxpar_cuda_view_of(const ctxpar_tensor *t);

// A checked block in kernel form. Lists too long to travel in the kernel arguments live in
// `upload` (device scratch, enqueued for release by ctxpar_cuda_block_release).
typedef struct ctxpar_cuda_block {
    ctxpar_cuda_attn_args args;
    ctxpar_block_class cls; // of the whole block, from the host's ctxpar_mask_classify
    int causal_aligned;     // causal mask on one diagonal block: equal stride-1 spans
    void *upload;
} ctxpar_cuda_block;

// Checks blk (op names the caller in messages) and fills *out, uploading long span or document
// lists on `stream`. Release with ctxpar_cuda_block_release after the launches.
ctxpar_status ctxpar_cuda_block_prepare(struct ctxpar_device *dev, const char *op,
                                        const ctxpar_attn_block *blk, cudaStream_t stream,
                                        ctxpar_cuda_block *out);
ctxpar_status ctxpar_cuda_block_release(struct ctxpar_device *dev, ctxpar_cuda_block *b,
                                        cudaStream_t stream);

#endif // CTXPAR_CUDA_ARGS_H
