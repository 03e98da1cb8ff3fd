/*
 * transfer.h - one point-to-point transfer of the ring, with tracing and optional checksums.
 *
 * Every buffer that travels is allocated CTXPAR_XFER_TRAILER bytes longer than its payload: with
 * verify_transfers on, the sender writes a checksum of the payload there and the receiver
 * compares, so a corrupted transfer is an error that names the step and the peer.
 */
#ifndef CTXPAR_TRANSFER_H
#define CTXPAR_TRANSFER_H

#include "algorithms.h"

#ifdef __cplusplus
extern "C" {
#endif

#define CTXPAR_XFER_TRAILER 8

typedef struct ctxpar_xfer {
    ctxpar_request *req; /* NULL when nothing is in flight */
    const char *name;
    int step, dst, src;
    size_t bytes; /* payload bytes, each way */
    void *recvbuf;
    double t_post;
} ctxpar_xfer;

/* Posts: send `bytes` of sendbuf to dst and receive as many into recvbuf from src. */
ctxpar_status ctxpar_xfer_post(const ctxpar_run *run, ctxpar_xfer *x, const char *name, int step,
                               void *sendbuf, int dst, void *recvbuf, int src, size_t bytes);

/* Completes a posted transfer (no-op when none is in flight) and checks the checksum. */
ctxpar_status ctxpar_xfer_wait(const ctxpar_run *run, ctxpar_xfer *x);

/* Abandons a transfer after an error elsewhere; safe when none is in flight. */
void ctxpar_xfer_cancel(const ctxpar_run *run, ctxpar_xfer *x);

#ifdef __cplusplus
}
#endif

#endif /* CTXPAR_TRANSFER_H */
