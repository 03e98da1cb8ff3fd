// Launchers of the binned-accumulator kernels (bins.cu; reproducible mode, api/ctxpar_bins.h).
// Every kernel computes each value of a block with the SDK's own functions, one thread per value
// (or per row for bins_finish_attn), no atomics: the bits are ctxpar_bins.h's whatever the launch
// configuration. Arguments as the ops of ctxpar_backend.h, already checked by the dispatch.
#ifndef CTXPAR_CUDA_BINS_H
#define CTXPAR_CUDA_BINS_H

#include <cuda_runtime_api.h>
#include <stdint.h>

#include "ctxpar_bins.h"

#ifdef __cplusplus
extern "C" {
#endif

cudaError_t ctxpar_cuda_launch_bins_clear(void *bins, int64_t rows, int64_t width,
                                          cudaStream_t stream);
cudaError_t ctxpar_cuda_launch_bins_add(void *bins, const float *src, ctxpar_bins_shape shape,
                                        cudaStream_t stream);
cudaError_t ctxpar_cuda_launch_bins_add_attn(void *bins, const float *out_b, const float *lse_b,
                                             const float *lse_lo_b, ctxpar_bins_shape shape,
                                             cudaStream_t stream);
cudaError_t ctxpar_cuda_launch_bins_merge(void *dst, const void *src, int64_t rows, int64_t width,
                                          cudaStream_t stream);
cudaError_t ctxpar_cuda_launch_bins_finish(const void *bins, int64_t rows, int64_t width,
                                           float *dst, cudaStream_t stream);
cudaError_t ctxpar_cuda_launch_bins_finish_attn(const void *bins, ctxpar_bins_shape shape,
                                                float *out, float *lse, float *lse_lo,
                                                cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif // CTXPAR_CUDA_BINS_H
