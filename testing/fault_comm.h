/*
 * fault_comm.h - a comm decorator that injects faults, for reliability tests.
 *
 * It wraps any comm (local, MPI) and forwards every op, except that on one chosen rank, at the
 * n-th point-to-point transfer it posts (counting from 0 over the comm's life), it:
 *   DELAY    sleeps delay_s before posting (the result must not change);
 *   DROP     does not send its half (the receiver must time out, not hang);
 *   CORRUPT  sends a copy with one flipped bit (caught by verify_transfers, else a wrong answer);
 *   DEAD     stops: returns CTXPAR_ERR_REMOTE to its caller and, with `announce`, aborts the
 *            inner comm so peers learn at once (REMOTE) rather than by timing out (TIMEOUT).
 * Buffers must be host memory (the CORRUPT copy is made with memcpy).
 */
#ifndef CTXPAR_TESTING_FAULT_COMM_H
#define CTXPAR_TESTING_FAULT_COMM_H

#include "ctxpar.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum ctxpar_fault_kind {
    CTXPAR_FAULT_NONE = 0,
    CTXPAR_FAULT_DELAY,
    CTXPAR_FAULT_DROP,
    CTXPAR_FAULT_CORRUPT,
    CTXPAR_FAULT_DEAD,
} ctxpar_fault_kind;

typedef struct ctxpar_fault {
    ctxpar_fault_kind kind;
    int rank;        /* the faulty rank */
    int transfer;    /* which of its point-to-point transfers (0-based) */
    double delay_s;  /* DELAY */
    int announce;    /* DEAD: abort the inner comm so that peers see REMOTE */
} ctxpar_fault;

/* Wraps `inner` (borrowed: destroy it after the wrapper). The wrapper has inner's rank, size and
 * timeout. */
ctxpar_status ctxpar_comm_create_fault(ctxpar_comm *inner, const ctxpar_fault *fault,
                                       ctxpar_comm **comm_out);

/* Point-to-point transfers the wrapper has posted so far. */
int ctxpar_fault_transfers(const ctxpar_comm *fault_comm);

#ifdef __cplusplus
}
#endif

#endif /* CTXPAR_TESTING_FAULT_COMM_H */
