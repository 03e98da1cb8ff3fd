// The local comm's ops table: argument checks, building the halves of each op, blocking ops.
#include <stdint.h>
#include <stdlib.h>

#include "local_internal.h"

static local_comm *impl_of(ctxpar_comm *comm) {
    return (local_comm *)comm->impl;
}

// Buffers shared with other threads must be final before they are exposed: with an asynchronous
// device, finish the work queued on `stream` first (it may write sendbuf or still read recvbuf).
static ctxpar_status sync_stream(local_comm *c, ctxpar_stream *stream) {
    if (c->dev && ctxpar_dev_has_streams(c->dev))
        return ctxpar_dev_stream_sync(c->dev, stream);
    return CTXPAR_OK;
}

static struct ctxpar_request *new_request(local_comm *c, local_op op, int nhalves, int host_only) {
    struct ctxpar_request *req = calloc(1, sizeof *req + (size_t)nhalves * sizeof(local_half));
    if (!req)
        return NULL;
    req->comm = c;
    req->op = op;
    req->host_only = host_only;
    req->nhalves = nhalves;
    req->pending = nhalves;
    if (op != LOCAL_OP_SENDRECV)
        req->seq = c->coll_seq++;
    return req;
}

static void set_half(struct ctxpar_request *req, int i, int is_send, int peer, size_t bytes,
                     int64_t arg, const void *sbuf, void *rbuf) {
    local_half *h = &req->half[i];
    h->req = req;
    h->is_send = is_send;
    h->owner = req->comm->rank;
    h->peer = peer;
    h->op = req->op;
    h->seq = req->seq;
    h->bytes = bytes;
    h->arg = arg;
    h->sbuf = sbuf;
    h->rbuf = rbuf;
}

// A collective's halves: sends to every rank first (so the rank's own pair meets), then receives.
static struct ctxpar_request *collective(local_comm *c, local_op op, const void *sendbuf,
                                         size_t send_stride, void *recvbuf, size_t recv_stride,
                                         size_t bytes, int64_t arg, int host_only) {
    int p = c->group->nranks;
    struct ctxpar_request *req = new_request(c, op, 2 * p, host_only);
    if (!req)
        return NULL;
    for (int j = 0; j < p; j++) {
        const void *s = sendbuf ? (const char *)sendbuf + (size_t)j * send_stride : NULL;
        void *r = recvbuf ? (char *)recvbuf + (size_t)j * recv_stride : NULL;
        set_half(req, j, 1, j, bytes, arg, s, NULL);
        set_half(req, p + j, 0, j, bytes, arg, NULL, r);
    }
    return req;
}

// Registers req and posts its halves, unless this rank or a peer it needs is known dead.
// Frees req on failure.
// Posts req; the copies and sums this rank makes for it are ordered on `stream` (the op's).
static ctxpar_status start(local_comm *c, struct ctxpar_request *req, ctxpar_stream *stream) {
    ctxpar_local_group *g = c->group;
    req->stream = stream;
    ctxpar_status st = CTXPAR_OK;
    pthread_mutex_lock(&g->mu);
    if (g->state[c->rank] == LOCAL_RANK_DEAD) {
        st = CTXPAR_ERROR(CTXPAR_ERR_REMOTE, "rank %d: %s: this rank's comm was aborted", c->rank,
                          ctxpar_local_op_name(req->op));
    }
    for (int i = 0; i < req->nhalves && st == CTXPAR_OK; i++) {
        int peer = req->half[i].peer;
        if (g->state[peer] == LOCAL_RANK_DEAD)
            st = CTXPAR_ERROR(CTXPAR_ERR_REMOTE,
                              "rank %d: %s #%llu: peer rank %d has failed (aborted or destroyed "
                              "its comm)",
                              c->rank, ctxpar_local_op_name(req->op), (unsigned long long)req->seq,
                              peer);
    }
    if (st == CTXPAR_OK) {
        req->next = c->live;
        if (c->live)
            c->live->prev = req;
        c->live = req;
        ctxpar_local_post(c, req);
    }
    pthread_mutex_unlock(&g->mu);
    if (st != CTXPAR_OK)
        free(req);
    return st;
}

static ctxpar_status out_of_memory(const char *op, size_t halves) {
    return CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "%s: cannot allocate a request of %zu halves", op,
                        halves);
}

// n * p, or INVALID_ARG when it overflows size_t.
static ctxpar_status times_ranks(const char *op, size_t n, int p, size_t *out) {
    if (n > SIZE_MAX / (size_t)p)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "%s: %zu bytes per rank x %d ranks overflows",
                            op, n, p);
    *out = n * (size_t)p;
    return CTXPAR_OK;
}

/* ---------------------------------------------------------------- nonblocking ops */

static ctxpar_status local_sendrecv(ctxpar_comm *comm, const void *sendbuf, size_t send_bytes,
                                    int dst, void *recvbuf, size_t recv_bytes, int src, int tag,
                                    ctxpar_stream *stream, ctxpar_request **req_out) {
    local_comm *c = impl_of(comm);
    // Arguments were checked by the dispatch (dispatch/dispatch_comm.c).
    CTXPAR_CHECK(sync_stream(c, stream));
    int n = (dst >= 0) + (src >= 0);
    struct ctxpar_request *req = new_request(c, LOCAL_OP_SENDRECV, n, 0);
    if (!req)
        return out_of_memory("sendrecv", (size_t)n);
    int i = 0;
    // The tag travels as the halves' `arg`: halves that meet with different tags fail both.
    if (dst >= 0) // the send first, so that a rank sending to itself meets its own receive
        set_half(req, i++, 1, dst, send_bytes, tag, sendbuf, NULL);
    if (src >= 0)
        set_half(req, i++, 0, src, recv_bytes, tag, NULL, recvbuf);
    CTXPAR_CHECK(start(c, req, stream));
    *req_out = req;
    return CTXPAR_OK;
}

static ctxpar_status local_allgather(ctxpar_comm *comm, const void *sendbuf, void *recvbuf,
                                     size_t bytes, ctxpar_stream *stream,
                                     ctxpar_request **req_out) {
    local_comm *c = impl_of(comm);
    CTXPAR_CHECK(sync_stream(c, stream));
    struct ctxpar_request *req =
        collective(c, LOCAL_OP_ALLGATHER, sendbuf, 0, recvbuf, bytes, bytes, 0, 0);
    if (!req)
        return out_of_memory("allgather", 2 * (size_t)comm->size);
    CTXPAR_CHECK(start(c, req, stream));
    *req_out = req;
    return CTXPAR_OK;
}

static ctxpar_status local_alltoall(ctxpar_comm *comm, const void *sendbuf, void *recvbuf,
                                    size_t bytes, ctxpar_stream *stream, ctxpar_request **req_out) {
    local_comm *c = impl_of(comm);
    CTXPAR_CHECK(sync_stream(c, stream));
    struct ctxpar_request *req =
        collective(c, LOCAL_OP_ALLTOALL, sendbuf, bytes, recvbuf, bytes, bytes, 0, 0);
    if (!req)
        return out_of_memory("alltoall", 2 * (size_t)comm->size);
    CTXPAR_CHECK(start(c, req, stream));
    *req_out = req;
    return CTXPAR_OK;
}

static ctxpar_status local_reduce_scatter(ctxpar_comm *comm, const float *sendbuf, float *recvbuf,
                                          size_t count, ctxpar_stream *stream,
                                          ctxpar_request **req_out) {
    local_comm *c = impl_of(comm);
    size_t bytes = count * sizeof(float); // no overflow: checked by the dispatch
    CTXPAR_CHECK(sync_stream(c, stream));
    // Every receive half points at the whole recvbuf: the receiver sums into it (stride 0).
    struct ctxpar_request *req =
        collective(c, LOCAL_OP_REDUCE_SCATTER, sendbuf, bytes, recvbuf, 0, bytes, 0, 0);
    if (!req)
        return out_of_memory("reduce_scatter", 2 * (size_t)comm->size);
    CTXPAR_CHECK(start(c, req, stream));
    *req_out = req;
    return CTXPAR_OK;
}

/* ---------------------------------------------------------------- retiring */

static ctxpar_status check_owner(local_comm *c, const struct ctxpar_request *req,
                                 const char *what) {
    if (req->comm != c)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_USAGE,
                            "%s: the request belongs to rank %d's comm, not rank %d's", what,
                            req->comm->rank, c->rank);
    return CTXPAR_OK;
}

static ctxpar_status local_wait(ctxpar_comm *comm, ctxpar_request *req, ctxpar_stream *stream) {
    (void)stream; // every copy has completed when the halves are DONE
    local_comm *c = impl_of(comm);
    CTXPAR_CHECK(check_owner(c, req, "wait"));
    pthread_mutex_lock(&c->group->mu);
    ctxpar_status st = ctxpar_local_complete(c, req);
    pthread_mutex_unlock(&c->group->mu);
    return st;
}

static ctxpar_status local_test(ctxpar_comm *comm, ctxpar_request *req, int *done_out) {
    local_comm *c = impl_of(comm);
    CTXPAR_CHECK(check_owner(c, req, "test")); // done_out: checked by the dispatch
    pthread_mutex_lock(&c->group->mu);
    ctxpar_local_progress(c);
    int done = req->pending == 0 || req->failed;
    pthread_mutex_unlock(&c->group->mu);
    *done_out = done;
    return CTXPAR_OK;
}

static void local_cancel(ctxpar_comm *comm, ctxpar_request *req) {
    local_comm *c = impl_of(comm);
    if (req->comm != c)
        return; // not ours: touching it would be worse than leaking it
    pthread_mutex_lock(&c->group->mu);
    ctxpar_local_retire(c, req, "cancelled");
    pthread_mutex_unlock(&c->group->mu);
}

/* ---------------------------------------------------------------- blocking ops */

// Blocking ops move host memory only (req->host_only): no stream orders them.
static ctxpar_status run_blocking(local_comm *c, struct ctxpar_request *req) {
    CTXPAR_CHECK(start(c, req, NULL));
    pthread_mutex_lock(&c->group->mu);
    ctxpar_status st = ctxpar_local_complete(c, req);
    pthread_mutex_unlock(&c->group->mu);
    return st;
}

static int64_t combine(int64_t a, int64_t b, ctxpar_reduce_op op) {
    switch (op) {
    case CTXPAR_REDUCE_SUM:
        return (int64_t)((uint64_t)a + (uint64_t)b); // wraps, never UB
    case CTXPAR_REDUCE_MIN:
        return a < b ? a : b;
    case CTXPAR_REDUCE_MAX:
        return a > b ? a : b;
    }
    return a;
}

static ctxpar_status local_allreduce_i64(ctxpar_comm *comm, int64_t *buf, size_t count,
                                         ctxpar_reduce_op op) {
    local_comm *c = impl_of(comm);
    int p = comm->size;
    // buf and op were checked by the dispatch.
    size_t bytes = 0, total = 0;
    CTXPAR_CHECK(times_ranks("allreduce_i64", count, (int)sizeof(int64_t), &bytes));
    CTXPAR_CHECK(times_ranks("allreduce_i64", bytes, p, &total));
    // Gather every rank's values, then reduce in rank order: buf is written only on success.
    int64_t *all = malloc(total ? total : 1);
    if (!all)
        return CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "allreduce_i64: cannot allocate %zu bytes",
                            total);
    struct ctxpar_request *req =
        collective(c, LOCAL_OP_ALLREDUCE, buf, 0, all, bytes, bytes, (int64_t)op, 1);
    if (!req) {
        free(all);
        return out_of_memory("allreduce_i64", 2 * (size_t)p);
    }
    ctxpar_status st = run_blocking(c, req);
    if (st == CTXPAR_OK) {
        for (size_t i = 0; i < count; i++) {
            int64_t v = all[i];
            for (int r = 1; r < p; r++)
                v = combine(v, all[(size_t)r * count + i], op);
            buf[i] = v;
        }
    }
    free(all);
    return st;
}

static ctxpar_status local_barrier(ctxpar_comm *comm) {
    local_comm *c = impl_of(comm);
    // Zero-byte pairs with every rank: a rank's barrier completes once every peer has posted.
    struct ctxpar_request *req = collective(c, LOCAL_OP_BARRIER, NULL, 0, NULL, 0, 0, 0, 1);
    if (!req)
        return out_of_memory("barrier", 2 * (size_t)comm->size);
    return run_blocking(c, req);
}

/* ---------------------------------------------------------------- lifetime */

static void local_abort(ctxpar_comm *comm) {
    local_comm *c = impl_of(comm);
    pthread_mutex_lock(&c->group->mu);
    ctxpar_local_kill_rank(c->group, c->rank, "aborted");
    pthread_mutex_unlock(&c->group->mu);
}

static void local_destroy(ctxpar_comm *comm) {
    local_comm *c = impl_of(comm);
    ctxpar_local_group *g = c->group;
    pthread_mutex_lock(&g->mu);
    // Peers waiting on this rank fail now; then its own unretired requests go.
    ctxpar_local_kill_rank(g, c->rank, "destroyed its comm");
    while (c->live)
        ctxpar_local_retire(c, c->live, "destroyed its comm with");
    int free_group = ctxpar_local_detach(g, c->rank);
    pthread_mutex_unlock(&g->mu);
    if (free_group)
        ctxpar_local_free_group(g);
    free(c);
}

static const struct ctxpar_comm_ops local_ops = {
    .version = CTXPAR_COMM_OPS_VERSION,
    .struct_size = sizeof(struct ctxpar_comm_ops),
    .name = "local",
    .destroy = local_destroy,
    .sendrecv = local_sendrecv,
    .allgather = local_allgather,
    .reduce_scatter = local_reduce_scatter,
    .alltoall = local_alltoall,
    .wait = local_wait,
    .cancel = local_cancel,
    .allreduce_i64 = local_allreduce_i64,
    .barrier = local_barrier,
    .test = local_test,
    .abort = local_abort,
    .split = ctxpar_local_split,
};

ctxpar_status ctxpar_comm_create_local(ctxpar_local_group *group, int rank,
                                       ctxpar_device *copy_device, ctxpar_comm **comm_out) {
    if (!group || !comm_out)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "group (%p) and comm_out (%p) must be set",
                            (void *)group, (void *)comm_out);
    if (rank < 0 || rank >= group->nranks)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "rank (%d) must be in [0, %d)", rank,
                            group->nranks);
    local_comm *c = calloc(1, sizeof *c);
    if (!c) {
        ctxpar_local_forgo(group); // a split group must not wait for this rank
        return CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "cannot allocate rank %d's local comm", rank);
    }
    c->group = group;
    c->rank = rank;
    c->dev = copy_device;
    ctxpar_status st = ctxpar_local_attach(group, rank, c);
    if (st != CTXPAR_OK) {
        free(c);
        ctxpar_local_forgo(group);
        return st;
    }
    ctxpar_comm *base = NULL;
    st = ctxpar_comm_create(&local_ops, c, rank, group->nranks, &base);
    if (st != CTXPAR_OK) {
        pthread_mutex_lock(&group->mu);
        group->state[rank] = LOCAL_RANK_ABSENT; // it never took part
        int free_group = ctxpar_local_detach(group, rank);
        pthread_mutex_unlock(&group->mu);
        if (free_group)
            ctxpar_local_free_group(group);
        free(c);
        return st;
    }
    c->base = base;
    *comm_out = base;
    return CTXPAR_OK;
}
