/*
 * local_internal.h - the in-process comm's shared state (not installed; comm/local only).
 *
 * Model. Every transfer between two ranks is a pair of *halves*: a send half posted by the
 * source and a receive half posted by the destination. A collective is P send halves and P
 * receive halves (one per peer, the rank itself included). Halves meet in a *channel*, one per
 * (tag, src, dst), which holds the unmatched halves of one side in posting order, so the k-th
 * send from s to d meets the k-th receive at d from s (ops are issued in the same order on every
 * rank; collectives carry a sequence number that is checked when halves meet).
 *
 * Whoever posts the second half of a pair performs the copy, straight from the send buffer into
 * the receive buffer (no staging), outside the group lock. A receiver that posts and then
 * computes therefore gets its data as soon as the sender posts. reduce_scatter is the exception:
 * the receiver sums the P contributions itself, in rank order, once all have arrived.
 *
 * Safety. A half being copied is BUSY; a request is only freed (wait, cancel, timeout, destroy)
 * after none of its halves is BUSY, and its unmatched halves are then replaced in their channel
 * by group-owned *tombstones*, so that the peer's matching half fails with CTXPAR_ERR_REMOTE
 * instead of touching freed memory or matching the wrong transfer.
 *
 * One mutex per group guards everything here; one condition variable (CLOCK_MONOTONIC) is
 * broadcast on every state change.
 */
#ifndef CTXPAR_COMM_LOCAL_INTERNAL_H
#define CTXPAR_COMM_LOCAL_INTERNAL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "ctxpar_backend.h"
#include "ctxpar_local.h"

#define LOCAL_MSG_LEN 224

typedef enum local_op {
    LOCAL_OP_SENDRECV = 0,
    LOCAL_OP_ALLGATHER,
    LOCAL_OP_REDUCE_SCATTER,
    LOCAL_OP_ALLTOALL,
    LOCAL_OP_ALLREDUCE,
    LOCAL_OP_BARRIER,
} local_op;

// Channels: point-to-point traffic and collectives never meet each other's halves.
enum { LOCAL_TAG_P2P = 0, LOCAL_TAG_COLL = 1, LOCAL_NUM_TAGS = 2 };

typedef enum local_half_state {
    LOCAL_HALF_QUEUED,  // waiting in its channel for the peer's half
    LOCAL_HALF_MATCHED, // reduce_scatter only: met its peer, waits for the receiver's sum
    LOCAL_HALF_BUSY,    // a thread is copying or summing through it, outside the lock
    LOCAL_HALF_DONE,
    LOCAL_HALF_FAILED,
} local_half_state;

typedef enum local_rank_state {
    LOCAL_RANK_ABSENT = 0, // no comm yet: peers wait for it (and may time out)
    LOCAL_RANK_ALIVE,
    LOCAL_RANK_DEAD, // aborted or destroyed its comm: peers get CTXPAR_ERR_REMOTE
} local_rank_state;

typedef struct local_half {
    struct local_half *next;    // in its channel while QUEUED
    struct local_half *partner; // the peer's half once matched
    struct ctxpar_request *req; // owner; NULL for a tombstone
    int is_send;
    int owner, peer; // ranks
    local_op op;
    uint64_t seq; // collective sequence number (0 for sendrecv)
    size_t bytes; // bytes to move (per peer)
    int64_t arg;  // op-specific value both sides must agree on (the allreduce op)
    const void *sbuf;
    void *rbuf;
    local_half_state state;
    int copy_here;        // this half's poster matched it and owes the copy
    ctxpar_status status; // when FAILED
    char msg[LOCAL_MSG_LEN];
} local_half;

typedef struct local_queue {
    local_half *head, *tail;
} local_queue;

typedef struct local_channel {
    local_queue sends, recvs; // at most one of them is non-empty
} local_channel;

typedef struct local_comm local_comm;

struct ctxpar_local_group {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int nranks;
    int attached;          // comms alive
    int destroy_requested; // freed when the last comm goes
    // A group made by split has no user to destroy it: it is freed when its last comm goes, once
    // every member it was made for has attached (or given up: to_attach counts those left).
    int self_owned;
    int to_attach;
    local_comm **comm;     // [nranks], NULL when absent
    local_rank_state *state;
    local_channel *chan; // [LOCAL_NUM_TAGS][nranks (src)][nranks (dst)]
};

struct local_comm {
    ctxpar_local_group *group;
    ctxpar_comm *base; // for timeout_s
    int rank;
    ctxpar_device *dev;          // copies go through it; NULL = memcpy
    uint64_t coll_seq;           // collectives posted so far
    struct ctxpar_request *live; // requests not yet retired (doubly linked)
};

struct ctxpar_request {
    struct ctxpar_request *prev, *next;
    local_comm *comm;
    local_op op;
    uint64_t seq;
    int host_only; // buffers are host memory whatever the device (allreduce, barrier)
    // The op's stream: the device copies and sums this rank makes for the request are ordered on
    // it and waited for there, so that ranks on one GPU, each with its own stream, do not wait
    // for each other's work (a NULL-stream sync would wait for the whole device).
    ctxpar_stream *stream;
    int pending;   // halves not yet DONE or FAILED
    int failed;    // halves FAILED: the request is finished as soon as one fails
    int nhalves;
    int reduced; // reduce_scatter: the sum has been done (or abandoned)
    local_half half[];
};

/* ---- local_group.c */

// Registers c as rank's comm (takes the lock).
ctxpar_status ctxpar_local_attach(ctxpar_local_group *g, int rank, local_comm *c);
// Unregisters rank's comm (lock held). Returns nonzero when the caller must free the group (with
// ctxpar_local_free_group, after unlocking): it was destroyed and this was its last comm.
int ctxpar_local_detach(ctxpar_local_group *g, int rank);
void ctxpar_local_free_group(ctxpar_local_group *g);
// A member of a split group that will not attach (its comm could not be made): frees the group
// when that leaves it with nobody (takes the lock).
void ctxpar_local_forgo(ctxpar_local_group *g);

/* ---- local_split.c */

// The split op (see ctxpar_backend.h): the members' colors and keys travel by allreduce over the
// parent, the first member makes the group and its address travels the same way.
ctxpar_status ctxpar_local_split(ctxpar_comm *comm, int color, int key, ctxpar_comm **comm_out);

local_channel *ctxpar_local_channel(ctxpar_local_group *g, int tag, int src, int dst);
// Waits on the group's condition variable until *deadline (CLOCK_MONOTONIC); NULL = no limit.
// Returns nonzero when the deadline passed.
int ctxpar_local_cond_wait(ctxpar_local_group *g, const struct timespec *deadline);
// Marks `rank` dead and fails every half that waits on it (see local_group.c).
void ctxpar_local_kill_rank(ctxpar_local_group *g, int rank, const char *why);

/* ---- local_transfer.c (all with the group lock held) */

const char *ctxpar_local_op_name(local_op op);
// Fails h (and unlinks it when queued); reports the message to the owner's wait.
void ctxpar_local_fail_half(local_half *h, ctxpar_status status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
// Removes h from queue q (it must be there).
void ctxpar_local_unlink_from(local_queue *q, local_half *h);
// Posts every half of req into the channels and performs the copies this rank now owes
// (releases the lock while copying).
void ctxpar_local_post(local_comm *c, struct ctxpar_request *req);
// Performs the reduce_scatter sums that have become possible for this rank's requests.
void ctxpar_local_progress(local_comm *c);
// Waits for req within the comm's timeout; then retires and frees it whatever happened.
ctxpar_status ctxpar_local_complete(local_comm *c, struct ctxpar_request *req);
// Abandons req: waits for BUSY halves, leaves tombstones, frees it.
void ctxpar_local_retire(local_comm *c, struct ctxpar_request *req, const char *why);

#endif /* CTXPAR_COMM_LOCAL_INTERNAL_H */
