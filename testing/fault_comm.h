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
 * split wraps the inner comm's sub-comm: the faulty rank's sub-comm has the same fault (at its
 * own n-th transfer); the other ranks' sub-comms forward every op. The wrapper counts its splits
 * and its sub-comms still alive (a sub-comm must be destroyed before its parent).
 */
#ifndef CPT_TESTING_FAULT_COMM_H
#define CPT_TESTING_FAULT_COMM_H

#include "ctxpar.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum cpt_fault_kind {
    CPT_FAULT_NONE = 0,
    CPT_FAULT_DELAY,
    CPT_FAULT_DROP,
    CPT_FAULT_CORRUPT,
    CPT_FAULT_DEAD,
} cpt_fault_kind;

typedef struct cpt_fault {
    cpt_fault_kind kind;
    int rank;        /* the faulty rank */
    int transfer;    /* which of its point-to-point transfers (0-based) */
    double delay_s;  /* DELAY */
    int announce;    /* DEAD: abort the inner comm so that peers see REMOTE */
} cpt_fault;

/* Wraps `inner` (borrowed: destroy it after the wrapper). The wrapper has inner's rank, size and
 * timeout. */
ctxpar_status cpt_comm_create_fault(ctxpar_comm *inner, const cpt_fault *fault,
                                       ctxpar_comm **comm_out);

/* Point-to-point transfers the wrapper has posted so far. */
int cpt_fault_transfers(const ctxpar_comm *fault_comm);

/* Sub-comms the wrapper's split has made so far, and how many of them are not destroyed yet (a
 * sub-comm's own splits are its own). */
int cpt_fault_splits(const ctxpar_comm *fault_comm);
int cpt_fault_splits_live(const ctxpar_comm *fault_comm);

#ifdef __cplusplus
}
#endif

#endif /* CPT_TESTING_FAULT_COMM_H */
