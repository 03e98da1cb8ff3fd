// Streams and events of the CUDA device, and the wrapper for a caller's own cudaStream_t.
#include <stdlib.h>

#include "cuda_internal.h"

struct ctxpar_event {
    cudaEvent_t event;
};

ctxpar_status ctxpar_cuda_stream_create(struct ctxpar_device *dev, ctxpar_stream **stream_out) {
    CTXPAR_CHECK(ctxpar_cuda_enter(dev));
    ctxpar_stream *s = calloc(1, sizeof *s);
    if (!s)
        return CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "cannot allocate a stream");
    // Non-blocking: the algorithms order their streams with events, and a stray legacy-stream op
    // of someone else must not serialise compute with transfers.
    cudaError_t e = cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
        free(s);
        return ctxpar_cuda_fail(e, __FILE__, __LINE__, "cudaStreamCreateWithFlags");
    }
    s->owned = 1;
    *stream_out = s;
    return CTXPAR_OK;
}

void ctxpar_cuda_stream_destroy(struct ctxpar_device *dev, ctxpar_stream *stream) {
    if (!stream)
        return;
    if (stream->owned && ctxpar_cuda_enter(dev) == CTXPAR_OK)
        (void)cudaStreamDestroy(stream->stream); // pending work still completes
    free(stream);
}

ctxpar_status ctxpar_cuda_stream_sync(struct ctxpar_device *dev, ctxpar_stream *stream) {
    CTXPAR_CHECK(ctxpar_cuda_enter(dev));
    CTXPAR_CUDA_CHECK(cudaStreamSynchronize(ctxpar_cuda_stream_of(stream)));
    return CTXPAR_OK;
}

ctxpar_status ctxpar_cuda_event_create(struct ctxpar_device *dev, ctxpar_event **event_out) {
    CTXPAR_CHECK(ctxpar_cuda_enter(dev));
    ctxpar_event *ev = calloc(1, sizeof *ev);
    if (!ev)
        return CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "cannot allocate an event");
    cudaError_t e = cudaEventCreateWithFlags(&ev->event, cudaEventDisableTiming);
    if (e != cudaSuccess) {
        free(ev);
        return ctxpar_cuda_fail(e, __FILE__, __LINE__, "cudaEventCreateWithFlags");
    }
    *event_out = ev;
    return CTXPAR_OK;
}

void ctxpar_cuda_event_destroy(struct ctxpar_device *dev, ctxpar_event *event) {
    if (!event)
        return;
    if (ctxpar_cuda_enter(dev) == CTXPAR_OK)
        (void)cudaEventDestroy(event->event);
    free(event);
}

ctxpar_status ctxpar_cuda_event_record(struct ctxpar_device *dev, ctxpar_event *event,
                                       ctxpar_stream *stream) {
    if (!event)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "event is NULL");
    CTXPAR_CHECK(ctxpar_cuda_enter(dev));
    CTXPAR_CUDA_CHECK(cudaEventRecord(event->event, ctxpar_cuda_stream_of(stream)));
    return CTXPAR_OK;
}

ctxpar_status ctxpar_cuda_stream_wait_event(struct ctxpar_device *dev, ctxpar_stream *stream,
                                            ctxpar_event *event) {
    if (!event)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "event is NULL");
    CTXPAR_CHECK(ctxpar_cuda_enter(dev));
    CTXPAR_CUDA_CHECK(cudaStreamWaitEvent(ctxpar_cuda_stream_of(stream), event->event, 0));
    return CTXPAR_OK;
}

ctxpar_status ctxpar_cuda_stream_wrap(ctxpar_device *device, cudaStream_t stream,
                                      ctxpar_stream **stream_out) {
    int ordinal;
    CTXPAR_CHECK(ctxpar_cuda_device_ordinal(device, &ordinal));
    if (!stream_out)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "stream_out is NULL");
    ctxpar_stream *s = calloc(1, sizeof *s);
    if (!s)
        return CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "cannot allocate a stream wrapper");
    s->stream = stream;
    s->owned = 0;
    *stream_out = s;
    return CTXPAR_OK;
}

void ctxpar_cuda_stream_release(ctxpar_stream *stream) {
    if (stream && !stream->owned)
        free(stream);
}
