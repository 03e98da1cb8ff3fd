/*
 * ctxpar_cuda.h - the CUDA device: attention kernels on one GPU (tensor cores for F16/BF16 on
 * sm_80 and newer), with cuDNN's fused attention for the forward blocks it supports.
 *
 * Tensors given to a context on this device are device pointers (cudaMalloc or managed memory).
 * Work is ordered on CUDA streams: a NULL ctxpar_stream is the legacy default stream of the
 * device; ctxpar_cuda_stream_wrap lets a caller's own cudaStream_t (e.g. the framework's current
 * stream) be used. Results are deterministic run to run (no float atomics anywhere).
 *
 * Status: the CUDA backend (and the NCCL comm, ctxpar_nccl.h) compiles, but has not yet run on a
 * GPU: its test suites (testing:cuda_ops_test, testing/gpu) skip without one. Treat it as
 * unverified until they have run and passed on a GPU.
 */
#ifndef CTXPAR_CUDA_H
#define CTXPAR_CUDA_H

#include <cuda_runtime_api.h>

#include "ctxpar.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Whether the forward blocks use cuDNN's fused attention. */
typedef enum ctxpar_cuda_cudnn {
    CTXPAR_CUDA_CUDNN_AUTO = 0, /* use it where it applies and builds, else ctxpar's kernels */
    CTXPAR_CUDA_CUDNN_ON = 1,   /* require it: creation fails without cuDNN */
    CTXPAR_CUDA_CUDNN_OFF = 2,  /* never: always ctxpar's own kernels */
} ctxpar_cuda_cudnn;

/* Options for the CUDA device. Initialise with CTXPAR_CUDA_OPTIONS_INIT. */
typedef struct ctxpar_cuda_options {
    size_t struct_size;
    int device_ordinal; /* the GPU, as numbered by cudaSetDevice */
    ctxpar_cuda_cudnn use_cudnn;
} ctxpar_cuda_options;

#define CTXPAR_CUDA_OPTIONS_INIT                                                                   \
    { sizeof(ctxpar_cuda_options), 0, CTXPAR_CUDA_CUDNN_AUTO }

/* Creates a CUDA device on options->device_ordinal (options may be NULL: GPU 0, cuDNN AUTO).
 * The registry's "cuda" (ctxpar_device_create_by_name, the tool's --backend cuda) is GPU 0 with
 * use_cudnn from the environment: CTXPAR_CUDNN=auto (or unset), on or off; any other value is
 * CTXPAR_ERR_INVALID_ARG.
 * Fails with CTXPAR_ERR_DEVICE naming the CUDA error when there is no usable GPU (no driver, no
 * device, ordinal out of range, compute capability below 8.0), and with
 * CTXPAR_ERR_NOT_SUPPORTED when use_cudnn is ON and cuDNN cannot be initialised. Destroy with
 * ctxpar_device_destroy. Thread safety: a device is used by one thread at a time. */
CTXPAR_API ctxpar_status ctxpar_device_create_cuda(const ctxpar_cuda_options *options,
                                                   ctxpar_device **device_out);

/* The GPU ordinal of a device made by ctxpar_device_create_cuda; INVALID_ARG for any other
 * device. */
CTXPAR_API ctxpar_status ctxpar_cuda_device_ordinal(const ctxpar_device *device, int *ordinal_out);

/* Whether the device would send forward blocks to cuDNN: 1 when use_cudnn resolved to cuDNN
 * (ON, or AUTO with cuDNN present), 0 otherwise. A block cuDNN cannot do (masks other than none
 * or an aligned causal diagonal, F32, head_dim it rejects) still runs ctxpar's kernels; the
 * counters below tell what really ran. For `ctxpar bench` to print. */
CTXPAR_API ctxpar_status ctxpar_cuda_device_uses_cudnn(const ctxpar_device *device, int *uses_out);

/* Forward block calls served by cuDNN and by ctxpar's own kernels since creation. */
CTXPAR_API ctxpar_status ctxpar_cuda_device_fwd_counts(const ctxpar_device *device,
                                                       uint64_t *cudnn_out, uint64_t *native_out);

/* Wraps a caller-owned cudaStream_t (of this device's GPU) as a ctxpar_stream to pass to
 * ctxpar calls. The stream stays the caller's: release the wrapper with
 * ctxpar_cuda_stream_release, before destroying the cudaStream_t. */
CTXPAR_API ctxpar_status ctxpar_cuda_stream_wrap(ctxpar_device *device, cudaStream_t stream,
                                                 ctxpar_stream **stream_out);
CTXPAR_API void ctxpar_cuda_stream_release(ctxpar_stream *stream);

#ifdef __cplusplus
}
#endif

#endif /* CTXPAR_CUDA_H */
