// The context's workspace (see algorithms.h): one block, grown on demand, reused stream-ordered.
#include "algorithms.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define WS_POISON(p, n) ASAN_POISON_MEMORY_REGION((p), (n))
#define WS_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION((p), (n))
#else
#define WS_POISON(p, n) ((void)(p), (void)(n))
#define WS_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

// Only host-addressable memory can be poisoned (ASan shadows host addresses).
static void set_poison(ctxpar_workspace *ws, int on) {
    if (!ws->base || !ws->dev->host_memory)
        return;
    if (on)
        WS_POISON(ws->base, ws->bytes);
    else
        WS_UNPOISON(ws->base, ws->bytes);
}

void *ctxpar_carve_take(ctxpar_carve *c, size_t bytes) {
    size_t at = c->used;
    c->used += (bytes + CTXPAR_WS_ALIGN - 1) / CTXPAR_WS_ALIGN * CTXPAR_WS_ALIGN;
    return c->base ? c->base + at : NULL;
}

// Frees the block (memory only; the event stays).
static ctxpar_status drop_block(ctxpar_workspace *ws) {
    set_poison(ws, 0); // the allocator owns it again
    void *p = ws->base;
    size_t n = ws->bytes;
    ws->base = NULL;
    ws->bytes = 0;
    return ctxpar_dev_free(ws->dev, p, n, CTXPAR_MEM_DEVICE);
}

ctxpar_status ctxpar_workspace_acquire(ctxpar_workspace *ws, size_t bytes, ctxpar_stream *stream,
                                       void **base_out) {
    // Work of the previous call on another stream may still use the block: wait for it there.
    if (ws->recorded && stream != ws->last)
        CTXPAR_CHECK(ctxpar_dev_stream_wait_event(ws->dev, stream, ws->done));
    ws->recorded = 0;
    ws->last = stream;
    if (!ws->done && ctxpar_dev_has_streams(ws->dev))
        CTXPAR_CHECK(ctxpar_dev_event_create(ws->dev, &ws->done));
    if (bytes > ws->bytes || !ws->base) {
        // Only the old block's size was too small: its free is stream-ordered (dispatch).
        CTXPAR_CHECK(drop_block(ws));
        CTXPAR_CHECK(ctxpar_dev_alloc(ws->dev, bytes, CTXPAR_MEM_DEVICE, &ws->base));
        ws->bytes = bytes;
    } else {
        set_poison(ws, 0);
    }
    *base_out = ws->base;
    return CTXPAR_OK;
}

ctxpar_status ctxpar_workspace_finish(ctxpar_workspace *ws, ctxpar_stream *stream) {
    if (!ws->base)
        return CTXPAR_OK;
    ctxpar_status st = CTXPAR_OK;
    if (ws->done) {
        st = ctxpar_dev_event_record(ws->dev, ws->done, stream);
        ws->recorded = st == CTXPAR_OK;
    }
    if (!ctxpar_dev_has_streams(ws->dev))
        set_poison(ws, 1); // synchronous: nothing can read it any more
    return st;
}

ctxpar_status ctxpar_workspace_release(ctxpar_workspace *ws) {
    ctxpar_status st = drop_block(ws);
    ctxpar_dev_event_destroy(ws->dev, ws->done);
    ws->done = NULL;
    ws->recorded = 0;
    ws->last = NULL;
    return st;
}

ctxpar_status ctxpar_run_workspace(const ctxpar_run *run, size_t bytes, void **base_out) {
    return ctxpar_workspace_acquire(run->ws, bytes, run->stream, base_out);
}
