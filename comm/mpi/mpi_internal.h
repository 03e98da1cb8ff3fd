/*
 * mpi_internal.h - the MPI comm's state (comm/mpi only).
 *
 * Every op is point-to-point traffic on a private duplicate of the user's communicator:
 * nonblocking MPI_Isend / MPI_Irecv of at most `max_message` bytes each (larger buffers go as
 * several messages, which MPI keeps in order), so that every request can be tested against a
 * deadline and cancelled, and buffers larger than INT_MAX bytes work. Collectives are built from
 * the same pairs (direct exchange with every peer); reduce_scatter and allreduce land the
 * peers' contributions in a buffer of the request and reduce them in rank order once all have
 * arrived, so results are deterministic and outputs are written only on success.
 *
 * Tags carry the op kind and a sequence number (per peer for sendrecv, per comm for
 * collectives), so a rank that skips an op never has its next op's data matched to the skipped
 * one: its peers time out instead.
 *
 * Failure: waits poll with MPI_Test until comm->timeout_s passes (CTXPAR_ERR_TIMEOUT). A rank
 * that calls abort sends a small notice to every peer on a reserved tag; each comm keeps a
 * receive for it posted, so peers waiting on that rank return CTXPAR_ERR_REMOTE promptly.
 * A peer process that dies: Open MPI's runtime normally ends the whole job; told to carry on
 * (orte_enable_recovery), it leaves the survivors' requests with the dead rank pending forever
 * (Open MPI 4 has no ULFM), so their waits end in CTXPAR_ERR_TIMEOUT naming it. An MPI that
 * reports MPIX_ERR_PROC_FAILED gives CTXPAR_ERR_REMOTE.
 * Cancelling (or timing out) cancels the MPI requests; receives cancel at once, but Open MPI
 * cannot cancel a send: a send still pending after a short grace is kept by the comm (an
 * *orphan*), tested on later calls and freed at destroy. So that MPI never reads memory its
 * caller has freed or reused, every send goes from a copy the comm owns (the request's `stash`,
 * one memcpy per send): a request retired with sends still pending hands its stash to the comm,
 * which frees it once no orphan is left, or at MPI_Finalize (an attribute of MPI_COMM_SELF) when
 * orphans outlive the comm.
 *
 * Late messages. Traffic a rank abandoned may reach a peer after the peer freed its communicator.
 * Open MPI routes messages by context id and hands such a message to the next communicator that
 * reuses the id, where it breaks the per-peer message order (the new comm's first message from
 * that peer is never matched). So a comm that abandoned traffic (cancel, timeout, failure, abort,
 * a peer's abort) does not free its duplicate at destroy: it is left to MPI_Finalize, and as the
 * context id of a new communicator must be free on every member, the id is never reused.
 */
#ifndef CTXPAR_COMM_MPI_INTERNAL_H
#define CTXPAR_COMM_MPI_INTERNAL_H

#include <mpi.h>
#include <stddef.h>
#include <stdint.h>

#include "ctxpar_backend.h"
#include "ctxpar_mpi.h"

#define CTXPAR_MPI_MSG_LEN 320

typedef enum mpi_kind {
    KIND_SENDRECV = 0,
    KIND_ALLGATHER,
    KIND_REDUCE_SCATTER,
    KIND_ALLTOALL,
    KIND_ALLREDUCE,
    KIND_BARRIER,
    KIND_ABORT, // the reserved tag of abort notices (sequence number 0)
    KIND_COUNT,
} mpi_kind;

// Largest single MPI message (MPI counts are int).
#define CTXPAR_MPI_MAX_MESSAGE ((size_t)1 << 30)

typedef struct mpi_comm_impl {
    MPI_Comm comm; // our duplicate, MPI_ERRORS_RETURN
    ctxpar_comm *base;
    int rank, size;
    size_t max_message;
    uint64_t tag_period; // sequence numbers wrap at this so that tags stay <= MPI_TAG_UB
    uint64_t coll_seq;
    uint64_t *send_seq, *recv_seq; // [size]: sendrecv messages to / from each peer so far
    unsigned char *dead;           // [size]: peers whose abort notice arrived
    int aborted;                   // this rank called abort
    int abandoned;                 // traffic was abandoned: keep the communicator (see above)
    int abort_payload;             // what our abort notices carry (our rank)
    int abort_from;                // lands the notice of an aborting peer
    MPI_Request abort_req;         // the standing receive for abort notices
    MPI_Request *orphans;          // requests MPI could not cancel
    size_t n_orphans, cap_orphans;
    void **stashes; // send copies orphans may still read (see above)
    size_t n_stashes, cap_stashes;
    struct ctxpar_request *live; // requests not yet retired
} mpi_comm_impl;

struct ctxpar_request {
    struct ctxpar_request *prev, *next;
    mpi_comm_impl *c;
    mpi_kind kind;
    uint64_t seq;
    int n;                // MPI requests
    int used;             // of them posted so far
    MPI_Request *req;     // [n]
    int *peer;            // [n]
    int *expect;          // [n]: bytes each receive must bring; -1 for a send
    ctxpar_status status; // first failure seen (by test or wait); OK until then
    char msg[CTXPAR_MPI_MSG_LEN];
    int complete; // every MPI request done and the result finished
    void **stash; // [n]: the comm's copies of the send buffers (NULL where none)
    int n_stash;
    // Finishing step, once every message has landed.
    void *scratch; // landing buffer owned by the request (reduce_scatter, allreduce)
    float *rs_out;
    const float *rs_own; // this rank's own block of the reduce_scatter send buffer
    int64_t *ar_buf;
    size_t count;
    ctxpar_reduce_op ar_op;
};

/* ---- mpi_ops.c: the ops of the table in mpi_comm.c */

ctxpar_status ctxpar_mpi_sendrecv(ctxpar_comm *comm, const void *sendbuf, size_t send_bytes,
                                  int dst, void *recvbuf, size_t recv_bytes, int src, int tag,
                                  ctxpar_stream *stream, ctxpar_request **req_out);
ctxpar_status ctxpar_mpi_allgather(ctxpar_comm *comm, const void *sendbuf, void *recvbuf,
                                   size_t bytes, ctxpar_stream *stream, ctxpar_request **req_out);
ctxpar_status ctxpar_mpi_reduce_scatter(ctxpar_comm *comm, const float *sendbuf, float *recvbuf,
                                        size_t count, ctxpar_stream *stream,
                                        ctxpar_request **req_out);
ctxpar_status ctxpar_mpi_alltoall(ctxpar_comm *comm, const void *sendbuf, void *recvbuf,
                                  size_t bytes, ctxpar_stream *stream, ctxpar_request **req_out);
ctxpar_status ctxpar_mpi_allreduce_i64(ctxpar_comm *comm, int64_t *buf, size_t count,
                                       ctxpar_reduce_op op);
ctxpar_status ctxpar_mpi_barrier(ctxpar_comm *comm);

/* ---- mpi_request.c */

const char *ctxpar_mpi_kind_name(mpi_kind kind);
int ctxpar_mpi_tag(const mpi_comm_impl *c, mpi_kind kind, uint64_t seq);
// A request with room for n MPI requests and `scratch_bytes` of landing space; NULL without
// memory.
struct ctxpar_request *ctxpar_mpi_request_new(mpi_comm_impl *c, mpi_kind kind, uint64_t seq, int n,
                                              size_t scratch_bytes);
// MPI messages needed for `bytes` (at least 1: an empty message still synchronises).
int ctxpar_mpi_num_messages(const mpi_comm_impl *c, size_t bytes);
// Posts the messages of one transfer; on failure records it in req->status / req->msg.
void ctxpar_mpi_post_send(struct ctxpar_request *req, const void *buf, size_t bytes, int peer,
                          int tag);
void ctxpar_mpi_post_recv(struct ctxpar_request *req, void *buf, size_t bytes, int peer, int tag);
// Registers a fully posted request; if posting failed, retires it and returns the failure.
ctxpar_status ctxpar_mpi_start(struct ctxpar_request *req);
ctxpar_status ctxpar_mpi_wait(mpi_comm_impl *c, struct ctxpar_request *req);
ctxpar_status ctxpar_mpi_test(mpi_comm_impl *c, struct ctxpar_request *req, int *done_out);
// Cancels what MPI can, keeps what it cannot as orphans, frees req.
void ctxpar_mpi_retire(mpi_comm_impl *c, struct ctxpar_request *req);
// Tests the orphans and the abort inbox (cheap; called from every wait and test).
void ctxpar_mpi_poll_background(mpi_comm_impl *c);
void ctxpar_mpi_add_orphan(mpi_comm_impl *c, MPI_Request r);
// Drops the orphans that complete within `grace_s`, then frees the rest (at destroy); send copies
// still in use are left to MPI_Finalize.
void ctxpar_mpi_release_orphans(mpi_comm_impl *c, double grace_s);
// Records the first failure of req.
void ctxpar_mpi_fail(struct ctxpar_request *req, ctxpar_status status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
// The ctxpar status for an MPI error code (COMM, or REMOTE for a failed process), and MPI's
// own description of it in buf.
ctxpar_status ctxpar_mpi_translate(int rc, char *buf, size_t len);

#endif /* CTXPAR_COMM_MPI_INTERNAL_H */
