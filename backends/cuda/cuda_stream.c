// Streams and events of the CUDA device, and the wrapper for a caller's own cudaStream_t.
#include <stdlib.h>

#include "cuda_internal.h"

struct ctxpar_event {
    cudaEvent_t event;
};

void ctxpar_cuda_stream_register(ctxpar_cuda_impl *impl, ctxpar_stream *s) {
    s->owner = impl;
    s->prev = NULL;
    s->next = impl->live;
    if (impl->live)
        impl->live->prev = s;
    impl->live = s;
}

void ctxpar_cuda_stream_unregister(ctxpar_cuda_impl *impl, ctxpar_stream *s) {
    if (s->prev)
        s->prev->next = s->next;
    else if (impl->live == s)
        impl->live = s->next;
    if (s->next)
        s->next->prev = s->prev;
    s->prev = s->next = NULL;
    s->owner = NULL;
}

// A stream leaving the list hands its pending work to util_stream first: a free after the
// stream is gone must still wait for what was enqueued on it.
static void retire(ctxpar_cuda_impl *impl, ctxpar_stream *s) {
    if (cudaEventRecord(s->fence, s->stream) == cudaSuccess)
        (void)cudaStreamWaitEvent(impl->util_stream, s->fence, 0);
    ctxpar_cuda_stream_unregister(impl, s);
}

// A device free may not know which stream last used the buffer: it orders the release after
// every stream the device made (non-blocking, so the legacy stream does not cover them) and
// after the legacy stream, which itself waits for every blocking stream. Only events and
// stream waits: the host never blocks.
ctxpar_status ctxpar_cuda_fence_util(struct ctxpar_device *dev) {
    ctxpar_cuda_impl *impl = ctxpar_cuda_impl_of(dev);
    CTXPAR_CUDA_CHECK(cudaEventRecord(impl->legacy_fence, cudaStreamLegacy));
    CTXPAR_CUDA_CHECK(cudaStreamWaitEvent(impl->util_stream, impl->legacy_fence, 0));
    for (ctxpar_stream *s = impl->live; s; s = s->next) {
        CTXPAR_CUDA_CHECK(cudaEventRecord(s->fence, s->stream));
        CTXPAR_CUDA_CHECK(cudaStreamWaitEvent(impl->util_stream, s->fence, 0));
    }
    return CTXPAR_OK;
}

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
    e = cudaEventCreateWithFlags(&s->fence, cudaEventDisableTiming);
    if (e != cudaSuccess) {
        (void)cudaStreamDestroy(s->stream);
        free(s);
        return ctxpar_cuda_fail(e, __FILE__, __LINE__, "cudaEventCreateWithFlags(fence)");
    }
    s->owned = 1;
    ctxpar_cuda_stream_register(ctxpar_cuda_impl_of(dev), s);
    *stream_out = s;
    return CTXPAR_OK;
}

void ctxpar_cuda_stream_destroy(struct ctxpar_device *dev, ctxpar_stream *stream) {
    if (!stream)
        return;
    if (stream->owned) {
        if (ctxpar_cuda_enter(dev) == CTXPAR_OK) {
            retire(ctxpar_cuda_impl_of(dev), stream);
            (void)cudaEventDestroy(stream->fence);
            (void)cudaStreamDestroy(stream->stream); // pending work still completes
        } else {
            ctxpar_cuda_stream_unregister(ctxpar_cuda_impl_of(dev), stream);
        }
    }
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
    CTXPAR_CHECK(ctxpar_cuda_enter(device));
    ctxpar_stream *s = calloc(1, sizeof *s);
    if (!s)
        return CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "cannot allocate a stream wrapper");
    // The caller's stream may be non-blocking: device frees fence it like the device's own.
    cudaError_t e = cudaEventCreateWithFlags(&s->fence, cudaEventDisableTiming);
    if (e != cudaSuccess) {
        free(s);
        return ctxpar_cuda_fail(e, __FILE__, __LINE__, "cudaEventCreateWithFlags(fence)");
    }
    s->stream = stream;
    s->owned = 0;
    ctxpar_cuda_stream_register(ctxpar_cuda_impl_of(device), s);
    *stream_out = s;
    return CTXPAR_OK;
}

void ctxpar_cuda_stream_release(ctxpar_stream *stream) {
    if (!stream || stream->owned)
        return;
    if (stream->owner) {
        (void)cudaSetDevice(stream->owner->ordinal);
        retire(stream->owner, stream);
    }
    (void)cudaEventDestroy(stream->fence);
    free(stream);
}
