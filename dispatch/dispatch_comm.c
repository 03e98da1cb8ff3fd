// The comm dispatch: the only code that calls through a comm ops table. It checks tables once at
// creation, owns the fallbacks for optional ops and counts the bytes each rank sends.
#include <stdint.h>
#include <stdlib.h>

#include "dispatch.h"

// The object ctxpar_comm_create allocates: the comm's view first, the dispatch's counts after.
typedef struct comm_state {
    struct ctxpar_comm comm;
    uint64_t bytes_sent; // what this rank's transfers sent, as the wrappers count it
} comm_state;

static comm_state *state_of(const ctxpar_comm *comm) {
    return (comm_state *)(uintptr_t)comm; // comm is the first member
}

uint64_t ctxpar_comm_bytes_sent(const ctxpar_comm *comm) {
    return comm ? state_of(comm)->bytes_sent : 0;
}

void ctxpar_comm_count_sent(ctxpar_comm *comm, uint64_t bytes) {
    state_of(comm)->bytes_sent += bytes;
}

#define COMM_OPS struct ctxpar_comm_ops
#define HAS(comm, member) CTXPAR_OPS_HAS((comm)->ops, COMM_OPS, member)

#define REQUIRED_COMM_OPS(X)                                                                       \
    X(destroy)                                                                                     \
    X(sendrecv)                                                                                    \
    X(allgather)                                                                                   \
    X(reduce_scatter)                                                                              \
    X(alltoall)                                                                                    \
    X(wait)                                                                                        \
    X(cancel)                                                                                      \
    X(allreduce_i64)                                                                               \
    X(barrier)

#define DEFAULT_TIMEOUT_S 60.0

static int overlaps(const void *a, size_t na, const void *b, size_t nb) {
    if (!a || !b || na == 0 || nb == 0)
        return 0;
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return x < y + nb && y < x + na;
}

// n * k, or INVALID_ARG when it overflows size_t.
static ctxpar_status times(const char *op, size_t n, size_t k, size_t *out) {
    if (k != 0 && n > SIZE_MAX / k)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "%s: %zu x %zu bytes overflows", op, n, k);
    *out = n * k;
    return CTXPAR_OK;
}

// The argument checks every comm would otherwise repeat: done here once, before any op runs.
static ctxpar_status check_buffers(const char *op, const void *sendbuf, size_t send_total,
                                   const void *recvbuf, size_t recv_total,
                                   ctxpar_request **req_out) {
    if (!req_out)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "%s: req_out is NULL", op);
    if ((send_total > 0 && !sendbuf) || (recv_total > 0 && !recvbuf))
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG,
                            "%s: sendbuf (%p, %zu bytes) or recvbuf (%p, %zu bytes) is NULL", op,
                            sendbuf, send_total, recvbuf, recv_total);
    if (overlaps(sendbuf, send_total, recvbuf, recv_total))
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG,
                            "%s: sendbuf (%zu bytes) and recvbuf (%zu bytes) overlap", op,
                            send_total, recv_total);
    return CTXPAR_OK;
}

ctxpar_status ctxpar_comm_create(const COMM_OPS *ops, void *impl, int rank, int size,
                                 ctxpar_comm **comm_out) {
    if (!ops || !comm_out)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "ops (%p) and comm_out (%p) must be set",
                            (const void *)ops, (void *)comm_out);
    if (ops->version < 1 || ops->version > CTXPAR_COMM_OPS_VERSION)
        return CTXPAR_ERROR(CTXPAR_ERR_NOT_SUPPORTED,
                            "comm ops version %u is not supported (this library knows 1..%u)",
                            ops->version, CTXPAR_COMM_OPS_VERSION);
    const char *name = ops->name ? ops->name : "(unnamed)";
#define CHECK_REQUIRED(member)                                                                     \
    if (!CTXPAR_OPS_HAS(ops, COMM_OPS, member))                                                    \
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "comm '%s' lacks the required op '%s'", name,  \
                            #member);
    REQUIRED_COMM_OPS(CHECK_REQUIRED)
#undef CHECK_REQUIRED
    if (size < 1 || rank < 0 || rank >= size)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "comm '%s': rank %d is not in [0, %d)", name,
                            rank, size);
    comm_state *cs = calloc(1, sizeof *cs);
    if (!cs)
        return CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "cannot allocate a comm object");
    ctxpar_comm *comm = &cs->comm;
    comm->ops = ops;
    comm->impl = impl;
    comm->rank = rank;
    comm->size = size;
    comm->timeout_s = DEFAULT_TIMEOUT_S;
    *comm_out = comm;
    return CTXPAR_OK;
}

void ctxpar_comm_destroy(ctxpar_comm *comm) {
    if (!comm)
        return;
    comm->ops->destroy(comm);
    free(state_of(comm));
}

int ctxpar_comm_rank(const ctxpar_comm *comm) {
    return comm ? comm->rank : -1;
}
int ctxpar_comm_size(const ctxpar_comm *comm) {
    return comm ? comm->size : 0;
}

ctxpar_status ctxpar_comm_set_timeout(ctxpar_comm *comm, double seconds) {
    if (!comm)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "comm is NULL");
    if (!(seconds > 0))
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "timeout (%g s) must be > 0", seconds);
    comm->timeout_s = seconds;
    return CTXPAR_OK;
}

ctxpar_status ctxpar_comm_sendrecv(ctxpar_comm *comm, const void *sendbuf, size_t send_bytes,
                                   int dst, void *recvbuf, size_t recv_bytes, int src, int tag,
                                   ctxpar_stream *stream, ctxpar_request **req_out) {
    if (tag < 0)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "sendrecv: tag (%d) must be >= 0", tag);
    if (dst >= comm->size || src >= comm->size)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "sendrecv: dst (%d) and src (%d) must be < %d",
                            dst, src, comm->size);
    CTXPAR_CHECK(check_buffers("sendrecv", dst >= 0 ? sendbuf : NULL, dst >= 0 ? send_bytes : 0,
                               src >= 0 ? recvbuf : NULL, src >= 0 ? recv_bytes : 0, req_out));
    CTXPAR_CHECK(comm->ops->sendrecv(comm, sendbuf, send_bytes, dst, recvbuf, recv_bytes, src, tag,
                                     stream, req_out));
    if (dst >= 0)
        state_of(comm)->bytes_sent += send_bytes;
    return CTXPAR_OK;
}

ctxpar_status ctxpar_comm_allgather(ctxpar_comm *comm, const void *sendbuf, void *recvbuf,
                                    size_t bytes, ctxpar_stream *stream, ctxpar_request **req_out) {
    size_t total = 0;
    CTXPAR_CHECK(times("allgather", bytes, (size_t)comm->size, &total));
    CTXPAR_CHECK(check_buffers("allgather", sendbuf, bytes, recvbuf, total, req_out));
    CTXPAR_CHECK(comm->ops->allgather(comm, sendbuf, recvbuf, bytes, stream, req_out));
    state_of(comm)->bytes_sent += bytes * (size_t)(comm->size - 1); // what a ring/direct exchange sends
    return CTXPAR_OK;
}

ctxpar_status ctxpar_comm_reduce_scatter(ctxpar_comm *comm, const float *sendbuf, float *recvbuf,
                                         size_t count, ctxpar_stream *stream,
                                         ctxpar_request **req_out) {
    size_t bytes = 0, total = 0;
    CTXPAR_CHECK(times("reduce_scatter", count, sizeof(float), &bytes));
    CTXPAR_CHECK(times("reduce_scatter", bytes, (size_t)comm->size, &total));
    CTXPAR_CHECK(check_buffers("reduce_scatter", sendbuf, total, recvbuf, bytes, req_out));
    CTXPAR_CHECK(comm->ops->reduce_scatter(comm, sendbuf, recvbuf, count, stream, req_out));
    state_of(comm)->bytes_sent += count * sizeof(float) * (size_t)(comm->size - 1);
    return CTXPAR_OK;
}

ctxpar_status ctxpar_comm_alltoall(ctxpar_comm *comm, const void *sendbuf, void *recvbuf,
                                   size_t bytes, ctxpar_stream *stream, ctxpar_request **req_out) {
    size_t total = 0;
    CTXPAR_CHECK(times("alltoall", bytes, (size_t)comm->size, &total));
    CTXPAR_CHECK(check_buffers("alltoall", sendbuf, total, recvbuf, total, req_out));
    CTXPAR_CHECK(comm->ops->alltoall(comm, sendbuf, recvbuf, bytes, stream, req_out));
    state_of(comm)->bytes_sent += bytes * (size_t)(comm->size - 1);
    return CTXPAR_OK;
}

ctxpar_status ctxpar_comm_wait(ctxpar_comm *comm, ctxpar_request *req, ctxpar_stream *stream) {
    if (!req)
        return CTXPAR_OK;
    return comm->ops->wait(comm, req, stream);
}

void ctxpar_comm_cancel(ctxpar_comm *comm, ctxpar_request *req) {
    if (req)
        comm->ops->cancel(comm, req);
}

ctxpar_status ctxpar_comm_test(ctxpar_comm *comm, ctxpar_request *req, int *done_out) {
    if (!done_out)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "test: done_out is NULL");
    if (!req) {
        *done_out = 1;
        return CTXPAR_OK;
    }
    if (!HAS(comm, test)) {
        *done_out = 0;
        return CTXPAR_OK;
    }
    return comm->ops->test(comm, req, done_out);
}

ctxpar_status ctxpar_comm_allreduce_i64(ctxpar_comm *comm, int64_t *buf, size_t count,
                                        ctxpar_reduce_op op) {
    if (count > 0 && !buf)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "allreduce_i64: buf is NULL (count %zu)",
                            count);
    if (op != CTXPAR_REDUCE_SUM && op != CTXPAR_REDUCE_MIN && op != CTXPAR_REDUCE_MAX)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "allreduce_i64: unknown op %d", (int)op);
    return comm->ops->allreduce_i64(comm, buf, count, op);
}

ctxpar_status ctxpar_comm_barrier(ctxpar_comm *comm) {
    return comm->ops->barrier(comm);
}

void ctxpar_comm_abort(ctxpar_comm *comm) {
    if (HAS(comm, abort))
        comm->ops->abort(comm);
}

int ctxpar_comm_can_split(const ctxpar_comm *comm) {
    return comm && HAS(comm, split);
}

ctxpar_status ctxpar_comm_split(ctxpar_comm *comm, int color, int key, ctxpar_comm **comm_out) {
    if (!comm || !comm_out)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "split: comm (%p) and comm_out (%p) must be set",
                            (void *)comm, (void *)comm_out);
    if (!HAS(comm, split))
        return CTXPAR_ERROR(CTXPAR_ERR_NOT_SUPPORTED, "split: comm '%s' cannot be split",
                            comm->ops->name ? comm->ops->name : "(unnamed)");
    ctxpar_comm *sub = NULL;
    CTXPAR_CHECK(comm->ops->split(comm, color, key, &sub));
    if (sub)
        sub->timeout_s = comm->timeout_s;
    *comm_out = sub;
    return CTXPAR_OK;
}
