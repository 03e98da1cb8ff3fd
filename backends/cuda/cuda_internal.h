// State of a CUDA device and the helpers the host files of backends/cuda share.
#ifndef CTXPAR_CUDA_INTERNAL_H
#define CTXPAR_CUDA_INTERNAL_H

#include <cuda_runtime_api.h>
#include <stdint.h>

#include "ctxpar_backend.h"
#include "ctxpar_cuda.h"
#include "cuda_stream.h"

typedef struct ctxpar_cudnn ctxpar_cudnn; // cuda_cudnn.h

#define CTXPAR_CUDA_REASON_LEN 320

typedef struct ctxpar_cuda_impl {
    int ordinal;
    int cc_major, cc_minor;
    size_t smem_optin;          // largest dynamic shared memory a block may opt in to
    size_t smem_fwd, smem_bwd;  // what the SIMT kernels were allowed at creation
    cudaMemPool_t pool;         // stream-ordered memory; NULL: cudaMalloc (no pool support)
    int peers_granted;          // other GPUs given read/write access to the pool
    cudaStream_t util_stream;   // device-owned: frees outside any caller stream, after fences
    cudaStream_t alloc_stream;  // device-owned: allocations outside any caller stream
    cudaEvent_t legacy_fence;   // recorded on the legacy stream by every free
    struct ctxpar_stream *live; // the device's own streams (stream_create), for frees to fence
    uint64_t *checksum_dev;     // one word of device memory for the checksum kernel
    uint64_t *checksum_host;    // pinned
    ctxpar_cudnn *cudnn;        // NULL when cuDNN is off or unavailable
    uint64_t fwd_cudnn, fwd_native;
    // Why the latest forward block did not run on cuDNN ("" when it did); with cuDNN off or
    // unavailable, why it is.
    char cudnn_reason[CTXPAR_CUDA_REASON_LEN];
    const char *cudnn_graph; // the graph form of the latest cuDNN plan used, NULL before one
} ctxpar_cuda_impl;

// The ops table of the backend (cuda_device.c), to recognise our own devices.
extern const struct ctxpar_device_ops ctxpar_cuda_device_ops;

static inline ctxpar_cuda_impl *ctxpar_cuda_impl_of(struct ctxpar_device *dev) {
    return (ctxpar_cuda_impl *)dev->impl;
}

// Records a failed CUDA call as CTXPAR_ERR_DEVICE (CTXPAR_ERR_OUT_OF_MEMORY for an allocation
// failure) naming the call and the CUDA error, and returns that status.
ctxpar_status ctxpar_cuda_fail(cudaError_t err, const char *file, int line, const char *what);

#define CTXPAR_CUDA_CHECK(call)                                                                    \
    do {                                                                                           \
        cudaError_t ctxpar_cuda_e_ = (call);                                                       \
        if (ctxpar_cuda_e_ != cudaSuccess)                                                         \
            return ctxpar_cuda_fail(ctxpar_cuda_e_, __FILE__, __LINE__, #call);                    \
    } while (0)

// Makes the device current on the calling thread (every op starts with it: ranks may be threads
// of one process, each with its own GPU).
ctxpar_status ctxpar_cuda_enter(struct ctxpar_device *dev);

// Stream-ordered scratch from the device pool: usable by work enqueued on `stream` after the
// call; ctxpar_cuda_scratch_free enqueues the release after the work already on `stream`.
// Without a pool (GPUs or drivers without memory-pool support) these are cudaMalloc/cudaFree,
// which order themselves against the whole device.
ctxpar_status ctxpar_cuda_scratch_alloc(struct ctxpar_device *dev, size_t bytes,
                                        cudaStream_t stream, void **ptr_out);
ctxpar_status ctxpar_cuda_scratch_free(struct ctxpar_device *dev, void *ptr, cudaStream_t stream);

// Makes util_stream wait for everything already enqueued on the legacy stream (and so on every
// blocking stream) and on every stream of the device: work after it may reuse what that work
// used. Does not block the host.
ctxpar_status ctxpar_cuda_fence_util(struct ctxpar_device *dev);

// Blocks until every stream of the device (its own, the wrapped ones, the legacy stream, the
// util and alloc streams) is idle: for destruction. Not cudaDeviceSynchronize: other devices on
// the same GPU (ranks sharing it) keep running.
void ctxpar_cuda_drain(ctxpar_cuda_impl *impl);

// The registry of the device's streams (cuda_stream.c).
void ctxpar_cuda_stream_register(ctxpar_cuda_impl *impl, struct ctxpar_stream *s);
void ctxpar_cuda_stream_unregister(ctxpar_cuda_impl *impl, struct ctxpar_stream *s);

// Ops implemented in the other files, gathered into the table by cuda_device.c.
ctxpar_status ctxpar_cuda_alloc(struct ctxpar_device *dev, size_t bytes, ctxpar_mem_kind kind,
                                void **ptr_out);
ctxpar_status ctxpar_cuda_free(struct ctxpar_device *dev, void *ptr, ctxpar_mem_kind kind);
ctxpar_status ctxpar_cuda_copy(struct ctxpar_device *dev, void *dst, const void *src, size_t bytes,
                               ctxpar_copy_kind kind, ctxpar_stream *stream);
ctxpar_status ctxpar_cuda_memset(struct ctxpar_device *dev, void *dst, int value, size_t bytes,
                                 ctxpar_stream *stream);

ctxpar_status ctxpar_cuda_stream_create(struct ctxpar_device *dev, ctxpar_stream **stream_out);
void ctxpar_cuda_stream_destroy(struct ctxpar_device *dev, ctxpar_stream *stream);
ctxpar_status ctxpar_cuda_stream_sync(struct ctxpar_device *dev, ctxpar_stream *stream);
ctxpar_status ctxpar_cuda_event_create(struct ctxpar_device *dev, ctxpar_event **event_out);
void ctxpar_cuda_event_destroy(struct ctxpar_device *dev, ctxpar_event *event);
ctxpar_status ctxpar_cuda_event_record(struct ctxpar_device *dev, ctxpar_event *event,
                                       ctxpar_stream *stream);
ctxpar_status ctxpar_cuda_stream_wait_event(struct ctxpar_device *dev, ctxpar_stream *stream,
                                            ctxpar_event *event);

ctxpar_status ctxpar_cuda_attn_block_fwd(struct ctxpar_device *dev, const ctxpar_attn_block *blk,
                                         float *out_acc, float *lse_acc, int merge,
                                         ctxpar_stream *stream);
ctxpar_status ctxpar_cuda_attn_merge(struct ctxpar_device *dev, float *out_acc, float *lse_acc,
                                     const float *out_b, const float *lse_b, int64_t batch,
                                     int64_t seq, int64_t heads, int64_t head_dim,
                                     ctxpar_stream *stream);
ctxpar_status ctxpar_cuda_attn_bwd_prep(struct ctxpar_device *dev, const ctxpar_tensor *out,
                                        const ctxpar_tensor *dout, float *delta,
                                        ctxpar_stream *stream);
ctxpar_status ctxpar_cuda_attn_block_bwd(struct ctxpar_device *dev, const ctxpar_attn_block *blk,
                                         const ctxpar_tensor *dout, const float *lse,
                                         const float *delta, float *dq_acc, float *dk_acc,
                                         float *dv_acc, ctxpar_stream *stream);

ctxpar_status ctxpar_cuda_cast(struct ctxpar_device *dev, const ctxpar_tensor *src,
                               ctxpar_tensor *dst, ctxpar_stream *stream);
ctxpar_status ctxpar_cuda_add(struct ctxpar_device *dev, float *dst, const float *src, size_t n,
                              ctxpar_stream *stream);
ctxpar_status ctxpar_cuda_fill(struct ctxpar_device *dev, float *dst, float value, size_t n,
                               ctxpar_stream *stream);
ctxpar_status ctxpar_cuda_checksum(struct ctxpar_device *dev, const void *data, size_t bytes,
                                   ctxpar_stream *stream, uint64_t *sum_out);
// The binned accumulators of reproducible mode (cuda_bins.c, kernels in bins.cu).
ctxpar_status ctxpar_cuda_bins_clear(struct ctxpar_device *dev, void *bins, int64_t rows,
                                     int64_t width, ctxpar_stream *stream);
ctxpar_status ctxpar_cuda_bins_add(struct ctxpar_device *dev, void *bins, const float *src,
                                   const ctxpar_bins_shape *shape, ctxpar_stream *stream);
ctxpar_status ctxpar_cuda_bins_add_attn(struct ctxpar_device *dev, void *bins, const float *out_b,
                                        const float *lse_b, const float *lse_lo_b,
                                        const ctxpar_bins_shape *shape, ctxpar_stream *stream);
ctxpar_status ctxpar_cuda_bins_merge(struct ctxpar_device *dev, void *dst, const void *src,
                                     int64_t rows, int64_t width, ctxpar_stream *stream);
ctxpar_status ctxpar_cuda_bins_finish(struct ctxpar_device *dev, const void *bins, int64_t rows,
                                      int64_t width, float *dst, ctxpar_stream *stream);
ctxpar_status ctxpar_cuda_bins_finish_attn(struct ctxpar_device *dev, const void *bins,
                                           const ctxpar_bins_shape *shape, float *out, float *lse,
                                           float *lse_lo, ctxpar_stream *stream);
// Whether the kernels can run a problem (cuda_supported.c).
ctxpar_status ctxpar_cuda_attn_supported(const struct ctxpar_device *dev,
                                         const ctxpar_attn_query *query);

#endif // CTXPAR_CUDA_INTERNAL_H
