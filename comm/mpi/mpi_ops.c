// The MPI comm's ops: argument checks and the messages each op posts.
#include <limits.h>
#include <stdint.h>
#include <string.h>

#include "mpi_internal.h"

static mpi_comm_impl *impl_of(ctxpar_comm *comm) {
    return (mpi_comm_impl *)comm->impl;
}

// n * k, or INVALID_ARG when it overflows size_t.
static ctxpar_status times(const char *op, size_t n, size_t k, size_t *out) {
    if (k != 0 && n > SIZE_MAX / k)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "%s: %zu x %zu bytes overflows", op, n, k);
    *out = n * k;
    return CTXPAR_OK;
}

// Refuses ops on an aborted comm or with a peer known to have aborted (peer < 0: every peer).
static ctxpar_status check_alive(const mpi_comm_impl *c, const char *op, int peer_a, int peer_b) {
    if (c->aborted)
        return CTXPAR_ERROR(CTXPAR_ERR_REMOTE, "rank %d: %s: this rank aborted its comm", c->rank,
                            op);
    for (int r = 0; r < c->size; r++) {
        int involved = (peer_a < 0 && peer_b < 0) || r == peer_a || r == peer_b;
        if (involved && c->dead[r])
            return CTXPAR_ERROR(CTXPAR_ERR_REMOTE, "rank %d: %s: peer rank %d has aborted", c->rank,
                                op, r);
    }
    return CTXPAR_OK;
}

// Keeps the number of MPI requests of one op far below INT_MAX.
static ctxpar_status count_messages(const mpi_comm_impl *c, const char *op, size_t bytes,
                                    size_t transfers, int *n_out) {
    size_t per = bytes == 0 ? 1 : (bytes - 1) / c->max_message + 1;
    if (transfers != 0 && per > (size_t)(INT_MAX / 4) / transfers)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG,
                            "%s: %zu bytes in messages of %zu bytes is too many messages", op,
                            bytes, c->max_message);
    *n_out = (int)(per * transfers);
    return CTXPAR_OK;
}

static ctxpar_status no_memory(const char *op) {
    return CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "%s: cannot allocate a request", op);
}

ctxpar_status ctxpar_mpi_sendrecv(ctxpar_comm *comm, const void *sendbuf, size_t send_bytes,
                                  int dst, void *recvbuf, size_t recv_bytes, int src, int tag,
                                  ctxpar_stream *stream, ctxpar_request **req_out) {
    (void)stream; // host memory: MPI reads and writes the buffers directly
    mpi_comm_impl *c = impl_of(comm);
    // Arguments were checked by the dispatch (dispatch/dispatch_comm.c).
    CTXPAR_CHECK(check_alive(c, "sendrecv", dst >= 0 ? dst : INT_MAX, src >= 0 ? src : INT_MAX));
    int ns = 0, nr = 0;
    if (dst >= 0)
        CTXPAR_CHECK(count_messages(c, "sendrecv", send_bytes, 1, &ns));
    if (src >= 0)
        CTXPAR_CHECK(count_messages(c, "sendrecv", recv_bytes, 1, &nr));
    struct ctxpar_request *req = ctxpar_mpi_request_new(c, KIND_SENDRECV, 0, ns + nr, 0);
    if (!req)
        return no_memory("sendrecv");
    // The caller's tag shifts the per-peer sequence number, so that a message sent under another
    // tag (after a lost one, say) never matches this receive.
    const uint64_t shift = (uint64_t)tag * 7919u;
    if (src >= 0) // the receive first, so that the message need not wait as unexpected
        ctxpar_mpi_post_recv(req, recvbuf, recv_bytes, src,
                             ctxpar_mpi_tag(c, KIND_SENDRECV, c->recv_seq[src]++ + shift));
    if (dst >= 0)
        ctxpar_mpi_post_send(req, sendbuf, send_bytes, dst,
                             ctxpar_mpi_tag(c, KIND_SENDRECV, c->send_seq[dst]++ + shift));
    CTXPAR_CHECK(ctxpar_mpi_start(req));
    *req_out = req;
    return CTXPAR_OK;
}

/*
 * The direct exchange every collective uses: rank r receives `bytes` from every peer j into
 * recvbase + j*recv_stride and sends sendbase + j*send_stride to every peer j. The rank's own
 * block is not sent (each op handles it). scratch_bytes of landing space come with the request.
 */
static ctxpar_status exchange(mpi_comm_impl *c, mpi_kind kind, const void *sendbase,
                              size_t send_stride, void *recvbase, size_t recv_stride, size_t bytes,
                              size_t scratch_bytes, struct ctxpar_request **req_out) {
    const char *op = ctxpar_mpi_kind_name(kind);
    CTXPAR_CHECK(check_alive(c, op, -1, -1));
    int n = 0;
    CTXPAR_CHECK(count_messages(c, op, bytes, 2 * (size_t)(c->size - 1), &n));
    uint64_t seq = c->coll_seq++;
    struct ctxpar_request *req = ctxpar_mpi_request_new(c, kind, seq, n, scratch_bytes);
    if (!req)
        return no_memory(op);
    if (!recvbase) // the landing space of the request
        recvbase = req->scratch;
    int tag = ctxpar_mpi_tag(c, kind, seq);
    for (int j = 0; j < c->size; j++) {
        if (j != c->rank) {
            void *r = recvbase ? (char *)recvbase + (size_t)j * recv_stride : NULL;
            ctxpar_mpi_post_recv(req, r, bytes, j, tag);
        }
    }
    for (int j = 0; j < c->size; j++) {
        if (j != c->rank) {
            const void *s = sendbase ? (const char *)sendbase + (size_t)j * send_stride : NULL;
            ctxpar_mpi_post_send(req, s, bytes, j, tag);
        }
    }
    *req_out = req;
    return CTXPAR_OK;
}

ctxpar_status ctxpar_mpi_allgather(ctxpar_comm *comm, const void *sendbuf, void *recvbuf,
                                   size_t bytes, ctxpar_stream *stream, ctxpar_request **req_out) {
    (void)stream;
    mpi_comm_impl *c = impl_of(comm);
    struct ctxpar_request *req = NULL;
    CTXPAR_CHECK(exchange(c, KIND_ALLGATHER, sendbuf, 0, recvbuf, bytes, bytes, 0, &req));
    if (bytes > 0)
        memcpy((char *)recvbuf + (size_t)c->rank * bytes, sendbuf, bytes);
    CTXPAR_CHECK(ctxpar_mpi_start(req));
    *req_out = req;
    return CTXPAR_OK;
}

ctxpar_status ctxpar_mpi_alltoall(ctxpar_comm *comm, const void *sendbuf, void *recvbuf,
                                  size_t bytes, ctxpar_stream *stream, ctxpar_request **req_out) {
    (void)stream;
    mpi_comm_impl *c = impl_of(comm);
    struct ctxpar_request *req = NULL;
    CTXPAR_CHECK(exchange(c, KIND_ALLTOALL, sendbuf, bytes, recvbuf, bytes, bytes, 0, &req));
    size_t own = (size_t)c->rank * bytes;
    if (bytes > 0)
        memcpy((char *)recvbuf + own, (const char *)sendbuf + own, bytes);
    CTXPAR_CHECK(ctxpar_mpi_start(req));
    *req_out = req;
    return CTXPAR_OK;
}

ctxpar_status ctxpar_mpi_reduce_scatter(ctxpar_comm *comm, const float *sendbuf, float *recvbuf,
                                        size_t count, ctxpar_stream *stream,
                                        ctxpar_request **req_out) {
    (void)stream;
    mpi_comm_impl *c = impl_of(comm);
    // Sizes cannot overflow: the dispatch checked them.
    size_t bytes = count * sizeof(float), total = bytes * (size_t)c->size;
    // Peers' contributions to this rank's block land in the request, [rank][count]; the sum runs
    // in rank order when all are there.
    struct ctxpar_request *req = NULL;
    CTXPAR_CHECK(exchange(c, KIND_REDUCE_SCATTER, sendbuf, bytes, NULL, bytes, bytes, total, &req));
    req->rs_out = recvbuf;
    req->rs_own = sendbuf ? sendbuf + (size_t)c->rank * count : NULL;
    req->count = count;
    CTXPAR_CHECK(ctxpar_mpi_start(req));
    *req_out = req;
    return CTXPAR_OK;
}

ctxpar_status ctxpar_mpi_allreduce_i64(ctxpar_comm *comm, int64_t *buf, size_t count,
                                       ctxpar_reduce_op op) {
    mpi_comm_impl *c = impl_of(comm);
    // buf and op were checked by the dispatch.
    size_t bytes = 0, total = 0;
    CTXPAR_CHECK(times("allreduce_i64", count, sizeof(int64_t), &bytes));
    CTXPAR_CHECK(times("allreduce_i64", bytes, (size_t)c->size, &total));
    // Every rank's values land in the request; buf is written (in rank order) only on success.
    struct ctxpar_request *req = NULL;
    CTXPAR_CHECK(exchange(c, KIND_ALLREDUCE, buf, 0, NULL, bytes, bytes, total, &req));
    if (bytes > 0)
        memcpy((char *)req->scratch + (size_t)c->rank * bytes, buf, bytes);
    req->ar_buf = buf;
    req->count = count;
    req->ar_op = op;
    CTXPAR_CHECK(ctxpar_mpi_start(req));
    return ctxpar_mpi_wait(c, req);
}

ctxpar_status ctxpar_mpi_barrier(ctxpar_comm *comm) {
    mpi_comm_impl *c = impl_of(comm);
    // An empty message to and from every peer: done once every peer has arrived.
    struct ctxpar_request *req = NULL;
    CTXPAR_CHECK(exchange(c, KIND_BARRIER, NULL, 0, NULL, 0, 0, 0, &req));
    CTXPAR_CHECK(ctxpar_mpi_start(req));
    return ctxpar_mpi_wait(c, req);
}
