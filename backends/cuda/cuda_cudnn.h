// cuDNN's fused attention for the forward blocks it can do, through the cuDNN 9 graph (backend)
// API: one execution plan per shape, built on first use and cached.
#ifndef CTXPAR_CUDA_CUDNN_H
#define CTXPAR_CUDA_CUDNN_H

#include <cuda_runtime_api.h>

#include "cuda_internal.h"
#include "cuda_kernels.h"

// A cuDNN handle on GPU `ordinal` and the plan cache. Fails (NOT_SUPPORTED, with the reason)
// when cuDNN is too old or cannot initialise on the device. destroy(NULL) is a no-op.
ctxpar_status ctxpar_cudnn_create(int ordinal, ctxpar_cudnn **cudnn_out);
void ctxpar_cudnn_destroy(ctxpar_cudnn *c);

// cudnnGetVersion() of the library in use; 0 for NULL (cuDNN off or unavailable).
int ctxpar_cudnn_runtime_version(const ctxpar_cudnn *c);

// Runs block `a` (F16/BF16, no mask or, with `causal`, the causal mask of a diagonal block:
// key j visible from query i iff j <= i) on cuDNN and writes or merges the result into
// out_acc/lse_acc as attn_block_fwd does. *ran_out = 0 (and CTXPAR_OK) when cuDNN has no plan
// for this shape: the caller then runs its own kernel, and the device's cudnn_reason says why
// (cuDNN's own message for a shape it rejected). Errors while running are returned.
ctxpar_status ctxpar_cudnn_attn_fwd(struct ctxpar_device *dev, ctxpar_cudnn *c,
                                    const ctxpar_cuda_attn_args *a, int causal, float *out_acc,
                                    float *lse_acc, int merge, cudaStream_t stream, int *ran_out);

#endif // CTXPAR_CUDA_CUDNN_H
