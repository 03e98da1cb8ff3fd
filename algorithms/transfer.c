// Ring transfers: post, wait, trace, and the optional end-to-end checksum.
#include "transfer.h"

static ctxpar_status write_trailer(const ctxpar_run *run, void *buf, size_t bytes) {
    uint64_t sum = 0;
    CTXPAR_CHECK(ctxpar_dev_checksum(run->dev, buf, bytes, run->stream, &sum));
    CTXPAR_CHECK(ctxpar_dev_copy(run->dev, (char *)buf + bytes, &sum, sizeof sum, CTXPAR_COPY_H2D,
                                 run->stream));
    // `sum` lives on this stack frame: the copy must finish before it goes away.
    return ctxpar_dev_stream_sync(run->dev, run->stream);
}

static const char *kind_name(ctxpar_xfer_kind kind) {
    switch (kind) {
    case CTXPAR_XFER_KV:
        return "kv";
    case CTXPAR_XFER_DKV:
        return "dkv";
    case CTXPAR_XFER_DKV_HOME:
        return "dkv_home";
    }
    return "?";
}

ctxpar_status ctxpar_xfer_post(const ctxpar_run *run, ctxpar_xfer *x, ctxpar_xfer_kind kind,
                               int step, void *sendbuf, int dst, void *recvbuf, int src,
                               size_t bytes) {
    size_t wire = bytes;
    if (run->verify_transfers) {
        if (dst >= 0)
            CTXPAR_CHECK(write_trailer(run, sendbuf, bytes));
        wire += CTXPAR_XFER_TRAILER;
    }
    x->name = kind_name(kind);
    x->step = step;
    x->dst = dst;
    x->src = src;
    x->bytes = bytes;
    x->recvbuf = recvbuf;
    x->t_post = run->trace ? ctxpar_now() : 0.0; // the clock only for the trace
    x->req = NULL;
    // Steps are < P <= 2^20 (checked at the front door), so kind and step fit one tag.
    int tag = (int)kind << 20 | step;
    CTXPAR_CHECK(ctxpar_comm_sendrecv(run->comm, sendbuf, wire, dst, recvbuf, wire, src, tag,
                                      run->stream, &x->req));
    // A comm may move the data inside the post (the local comm copies there when the peer is
    // already waiting): that time is not hidden behind compute, so it counts as waiting.
    if (run->trace)
        ctxpar_run_trace(run, CTXPAR_EVENT_WAIT, x->name, step, src, x->t_post, ctxpar_now(), 0);
    return CTXPAR_OK;
}

static ctxpar_status check_trailer(const ctxpar_run *run, const ctxpar_xfer *x) {
    uint64_t want = 0, got = 0;
    CTXPAR_CHECK(ctxpar_dev_copy(run->dev, &want, (const char *)x->recvbuf + x->bytes, sizeof want,
                                 CTXPAR_COPY_D2H, run->stream));
    CTXPAR_CHECK(ctxpar_dev_stream_sync(run->dev, run->stream));
    CTXPAR_CHECK(ctxpar_dev_checksum(run->dev, x->recvbuf, x->bytes, run->stream, &got));
    if (got != want)
        return CTXPAR_ERROR(CTXPAR_ERR_COMM,
                            "corrupted transfer '%s' at step %d from rank %d: checksum %016llx, "
                            "sender's %016llx",
                            x->name, x->step, x->src, (unsigned long long)got,
                            (unsigned long long)want);
    return CTXPAR_OK;
}

ctxpar_status ctxpar_xfer_wait(const ctxpar_run *run, ctxpar_xfer *x) {
    if (!x->req)
        return CTXPAR_OK;
    double t0 = run->trace ? ctxpar_now() : 0.0;
    ctxpar_request *req = x->req;
    x->req = NULL; // wait retires the request whatever it returns
    CTXPAR_CHECK(ctxpar_comm_wait(run->comm, req, run->stream));
    double t1 = run->trace ? ctxpar_now() : 0.0;
    uint64_t wire = x->bytes + (run->verify_transfers ? CTXPAR_XFER_TRAILER : 0);
    ctxpar_run_trace(run, CTXPAR_EVENT_TRANSFER, x->name, x->step, x->dst, x->t_post, t1,
                     x->dst >= 0 ? wire : 0);
    ctxpar_run_trace(run, CTXPAR_EVENT_WAIT, x->name, x->step, x->src, t0, t1, 0);
    if (run->verify_transfers && x->src >= 0)
        CTXPAR_CHECK(check_trailer(run, x));
    return CTXPAR_OK;
}

void ctxpar_xfer_cancel(const ctxpar_run *run, ctxpar_xfer *x) {
    if (!x->req)
        return;
    ctxpar_comm_cancel(run->comm, x->req);
    x->req = NULL;
}
