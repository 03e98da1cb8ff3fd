// The MPI comm: constructor, ops table, retiring requests, abort and destroy.
#include <stdlib.h>

#include "ctxpar_mpi_testing.h"
#include "mpi_internal.h"

static mpi_comm_impl *impl_of(ctxpar_comm *comm) {
    return (mpi_comm_impl *)comm->impl;
}

static ctxpar_status check_owner(const mpi_comm_impl *c, const struct ctxpar_request *req,
                                 const char *what) {
    if (req->c != c)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_USAGE,
                            "%s: the request belongs to another comm (rank %d's)", what,
                            req->c->rank);
    return CTXPAR_OK;
}

static ctxpar_status mpicomm_wait(ctxpar_comm *comm, ctxpar_request *req, ctxpar_stream *stream) {
    (void)stream; // host memory: complete on the host when wait returns
    mpi_comm_impl *c = impl_of(comm);
    CTXPAR_CHECK(check_owner(c, req, "wait"));
    return ctxpar_mpi_wait(c, req);
}

static ctxpar_status mpicomm_test(ctxpar_comm *comm, ctxpar_request *req, int *done_out) {
    mpi_comm_impl *c = impl_of(comm);
    CTXPAR_CHECK(check_owner(c, req, "test")); // done_out: checked by the dispatch
    return ctxpar_mpi_test(c, req, done_out);
}

static void mpicomm_cancel(ctxpar_comm *comm, ctxpar_request *req) {
    mpi_comm_impl *c = impl_of(comm);
    if (req->c == c) // not ours: touching it would be worse than leaking it
        ctxpar_mpi_retire(c, req);
}

static void mpicomm_abort(ctxpar_comm *comm) {
    mpi_comm_impl *c = impl_of(comm);
    if (c->aborted)
        return;
    c->aborted = 1;
    c->abandoned = 1;
    // A 4-byte notice to every peer (eager: it leaves at once); the requests are kept as orphans
    // until they complete or the comm is destroyed.
    int tag = ctxpar_mpi_tag(c, KIND_ABORT, 0);
    for (int r = 0; r < c->size; r++) {
        if (r == c->rank)
            continue;
        MPI_Request q = MPI_REQUEST_NULL;
        if (MPI_Isend(&c->abort_payload, 1, MPI_INT, r, tag, c->comm, &q) == MPI_SUCCESS)
            ctxpar_mpi_add_orphan(c, q);
    }
}

static void free_impl(mpi_comm_impl *c) {
    free(c->orphans);
    free(c->stashes);
    free(c->dead);
    free(c->recv_seq);
    free(c->send_seq);
    free(c);
}

static void mpicomm_destroy(ctxpar_comm *comm) {
    mpi_comm_impl *c = impl_of(comm);
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) { // after MPI_Finalize no MPI call is allowed: just free our memory
        while (c->live)
            ctxpar_mpi_retire(c, c->live);
        if (c->abort_req != MPI_REQUEST_NULL) {
            MPI_Cancel(&c->abort_req);
            ctxpar_mpi_add_orphan(c, c->abort_req);
            c->abort_req = MPI_REQUEST_NULL;
        }
        ctxpar_mpi_release_orphans(c, 0.05);
        if (!c->abandoned) // else late messages could reach a comm that reuses its id
            MPI_Comm_free(&c->comm);
    }
    free_impl(c);
}

static ctxpar_status mpicomm_split(ctxpar_comm *comm, int color, int key,
                                   ctxpar_comm **comm_out);

static const struct ctxpar_comm_ops mpicomm_ops = {
    .version = CTXPAR_COMM_OPS_VERSION,
    .struct_size = sizeof(struct ctxpar_comm_ops),
    .name = "mpi",
    .destroy = mpicomm_destroy,
    .sendrecv = ctxpar_mpi_sendrecv,
    .allgather = ctxpar_mpi_allgather,
    .reduce_scatter = ctxpar_mpi_reduce_scatter,
    .alltoall = ctxpar_mpi_alltoall,
    .wait = mpicomm_wait,
    .cancel = mpicomm_cancel,
    .allreduce_i64 = ctxpar_mpi_allreduce_i64,
    .barrier = ctxpar_mpi_barrier,
    .test = mpicomm_test,
    .abort = mpicomm_abort,
    .split = mpicomm_split,
};

static ctxpar_status mpicomm_failure(int rc, const char *call) {
    char text[CTXPAR_MPI_MSG_LEN];
    ctxpar_status st = ctxpar_mpi_translate(rc, text, sizeof text);
    return CTXPAR_ERROR(st, "%s failed: %s", call, text);
}

ctxpar_status ctxpar_comm_create_mpi(MPI_Comm mpi_comm, ctxpar_comm **comm_out) {
    if (!comm_out)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "comm_out is NULL");
    if (mpi_comm == MPI_COMM_NULL)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "mpi_comm is MPI_COMM_NULL");
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (!initialized || finalized)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_USAGE,
                            "MPI is %s: call ctxpar_comm_create_mpi between MPI_Init and "
                            "MPI_Finalize",
                            finalized ? "finalized" : "not initialised");
    mpi_comm_impl *c = calloc(1, sizeof *c);
    if (!c)
        return CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "cannot allocate an MPI comm");
    c->abort_req = MPI_REQUEST_NULL;
    c->max_message = CTXPAR_MPI_MAX_MESSAGE;
    int rc = MPI_Comm_dup(mpi_comm, &c->comm);
    if (rc != MPI_SUCCESS) {
        free(c);
        return mpicomm_failure(rc, "MPI_Comm_dup");
    }
    ctxpar_status st = CTXPAR_OK;
    int *tag_ub = NULL, flag = 0;
    rc = MPI_Comm_set_errhandler(c->comm, MPI_ERRORS_RETURN);
    if (rc == MPI_SUCCESS)
        rc = MPI_Comm_rank(c->comm, &c->rank);
    if (rc == MPI_SUCCESS)
        rc = MPI_Comm_size(c->comm, &c->size);
    if (rc == MPI_SUCCESS)
        rc = MPI_Comm_get_attr(c->comm, MPI_TAG_UB, &tag_ub, &flag);
    if (rc != MPI_SUCCESS) {
        st = mpicomm_failure(rc, "setting up the duplicated communicator");
        goto fail_comm;
    }
    // MPI guarantees MPI_TAG_UB >= 32767.
    c->tag_period = (uint64_t)((flag && tag_ub ? (int64_t)*tag_ub : 32767) + 1) / KIND_COUNT;
    c->send_seq = calloc((size_t)c->size, sizeof *c->send_seq);
    c->recv_seq = calloc((size_t)c->size, sizeof *c->recv_seq);
    c->dead = calloc((size_t)c->size, 1);
    if (!c->send_seq || !c->recv_seq || !c->dead) {
        st = CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "cannot allocate an MPI comm of %d ranks",
                          c->size);
        goto fail_comm;
    }
    c->abort_payload = c->rank;
    rc = MPI_Irecv(&c->abort_from, 1, MPI_INT, MPI_ANY_SOURCE, ctxpar_mpi_tag(c, KIND_ABORT, 0),
                   c->comm, &c->abort_req);
    if (rc != MPI_SUCCESS) {
        c->abort_req = MPI_REQUEST_NULL;
        st = mpicomm_failure(rc, "MPI_Irecv of the abort notices");
        goto fail_comm;
    }
    ctxpar_comm *base = NULL;
    CTXPAR_CHECK_GOTO(ctxpar_comm_create(&mpicomm_ops, c, c->rank, c->size, &base), st, fail_recv);
    c->base = base;
    *comm_out = base;
    return CTXPAR_OK;

fail_recv:
    MPI_Cancel(&c->abort_req);
    MPI_Wait(&c->abort_req, MPI_STATUS_IGNORE); // a cancelled receive completes at once
fail_comm:
    MPI_Comm_free(&c->comm);
    free_impl(c);
    return st;
}

ctxpar_status ctxpar_mpi_set_max_message(ctxpar_comm *comm, size_t bytes) {
    if (!comm || comm->ops != &mpicomm_ops)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "not an MPI comm");
    if (bytes < 1 || bytes > CTXPAR_MPI_MAX_MESSAGE)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "max message (%zu bytes) must be in [1, %zu]",
                            bytes, CTXPAR_MPI_MAX_MESSAGE);
    impl_of(comm)->max_message = bytes;
    return CTXPAR_OK;
}

// MPI_Comm_split waits without a deadline: a barrier through this comm's own ops first, which
// honours the timeout and abort notices, so that a missing or failed peer gives TIMEOUT or REMOTE
// as every other op does. The new comm is a duplicate made by ctxpar_comm_create_mpi (with this
// comm's message size); the split's own communicator is freed at once.
static ctxpar_status mpicomm_split(ctxpar_comm *comm, int color, int key,
                                   ctxpar_comm **comm_out) {
    mpi_comm_impl *c = impl_of(comm);
    CTXPAR_CHECK(ctxpar_mpi_barrier(comm));
    MPI_Comm sub = MPI_COMM_NULL;
    int rc = MPI_Comm_split(c->comm, color < 0 ? MPI_UNDEFINED : color, key, &sub);
    if (rc != MPI_SUCCESS)
        return mpicomm_failure(rc, "MPI_Comm_split");
    if (sub == MPI_COMM_NULL) {
        *comm_out = NULL;
        return CTXPAR_OK;
    }
    ctxpar_comm *out = NULL;
    ctxpar_status st = ctxpar_comm_create_mpi(sub, &out);
    MPI_Comm_free(&sub);
    if (st != CTXPAR_OK)
        return st;
    impl_of(out)->max_message = c->max_message;
    *comm_out = out;
    return CTXPAR_OK;
}
