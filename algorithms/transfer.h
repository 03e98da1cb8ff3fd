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

/* What travels: with the step, it makes the transfer's tag, so that a lost message can never
 * let a later one land in the wrong buffer. */
typedef enum ctxpar_xfer_kind {
    CTXPAR_XFER_KV = 1,       /* a K/V block */
    CTXPAR_XFER_DKV = 2,      /* a dK/dV partial sum, along the ring */
    CTXPAR_XFER_DKV_HOME = 3, /* a finished dK/dV, to its owner */
} ctxpar_xfer_kind;

typedef struct ctxpar_xfer {
    ctxpar_request *req; /* NULL when nothing is in flight */
    const char *name;    /* for traces and messages */
    int step, dst, src;
    size_t bytes; /* payload bytes, each way */
    void *recvbuf;
    double t_post;
} ctxpar_xfer;

/* Posts: send `bytes` of sendbuf to dst and receive as many into recvbuf from src. */
ctxpar_status ctxpar_xfer_post(const ctxpar_run *run, ctxpar_xfer *x, ctxpar_xfer_kind kind,
                               int step, void *sendbuf, int dst, void *recvbuf, int src,
                               size_t bytes);

/* Completes a posted transfer (no-op when none is in flight) and checks the checksum. */
ctxpar_status ctxpar_xfer_wait(const ctxpar_run *run, ctxpar_xfer *x);

/* Abandons a transfer after an error elsewhere; safe when none is in flight. */
void ctxpar_xfer_cancel(const ctxpar_run *run, ctxpar_xfer *x);

#ifdef __cplusplus
}
#endif

#endif /* CTXPAR_TRANSFER_H */
