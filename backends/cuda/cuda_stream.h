// The CUDA stream behind a ctxpar_stream. Internal to backends/cuda, with one allowed reader
// outside it: comm/nccl, which enqueues its transfers after the caller's stream.
#ifndef CTXPAR_CUDA_STREAM_H
#define CTXPAR_CUDA_STREAM_H

#include <cuda_runtime_api.h>

#include "ctxpar.h"

#ifdef __cplusplus
extern "C" {
#endif

struct ctxpar_stream {
    cudaStream_t stream;
    int owned; // made by stream_create (destroy it) or wrapped (the caller's)
    // The fence a device free records here, and the links of the device's list of live
    // streams (its own and the callers' it wrapped).
    cudaEvent_t fence;
    struct ctxpar_stream *prev, *next;
    struct ctxpar_cuda_impl *owner; // the device whose list holds the stream
};

// The stream work for `s` goes to: a NULL ctxpar_stream is the legacy default stream, which
// orders itself with every blocking stream of the device.
static inline cudaStream_t ctxpar_cuda_stream_of(const ctxpar_stream *s) {
    return s ? s->stream : cudaStreamLegacy;
}

#ifdef __cplusplus
}
#endif

#endif // CTXPAR_CUDA_STREAM_H
