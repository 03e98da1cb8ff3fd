// The fault-injecting comm decorator (see fault_comm.h).
#define _POSIX_C_SOURCE 200809L
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dispatch.h"
#include "fault_comm.h"

typedef struct fault_impl {
    ctxpar_comm *inner;
    cpt_fault fault;
    int transfers;
    int dead;
    int owns_inner;   // a split's wrapper destroys its inner comm
    int splits, live; // sub-comms made by split; those not destroyed yet
    int *parent_live; // a split's wrapper: its parent's `live`
} fault_impl;

// A wrapped request: the inner one, and the corrupted copy that must outlive it.
struct ctxpar_request {
    ctxpar_request *inner;
    void *copy;
};

static fault_impl *impl_of(ctxpar_comm *c) { return c->impl; }

static ctxpar_comm *inner_of(ctxpar_comm *c) {
    fault_impl *f = impl_of(c);
    f->inner->timeout_s = c->timeout_s; // the wrapper's timeout is the one callers set
    return f->inner;
}

static ctxpar_status wrap(ctxpar_request *inner, void *copy, ctxpar_request **req_out) {
    ctxpar_request *r = malloc(sizeof *r);
    if (!r) {
        free(copy);
        return CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "fault comm: cannot allocate a request");
    }
    r->inner = inner;
    r->copy = copy;
    *req_out = r;
    return CTXPAR_OK;
}

static ctxpar_status dead_error(ctxpar_comm *c) {
    return CTXPAR_ERROR(CTXPAR_ERR_REMOTE, "fault comm: rank %d was made to stop responding",
                        c->rank);
}

static ctxpar_status fault_sendrecv(ctxpar_comm *c, const void *sendbuf, size_t send_bytes,
                                    int dst, void *recvbuf, size_t recv_bytes, int src, int tag,
                                    ctxpar_stream *stream, ctxpar_request **req_out) {
    fault_impl *f = impl_of(c);
    if (f->dead)
        return dead_error(c);
    int hit = c->rank == f->fault.rank && f->transfers == f->fault.transfer;
    f->transfers++;
    void *copy = NULL;
    if (hit) {
        switch (f->fault.kind) {
        case CPT_FAULT_DELAY: {
            struct timespec ts = {(time_t)f->fault.delay_s,
                                  (long)((f->fault.delay_s - (double)(time_t)f->fault.delay_s) *
                                         1e9)};
            nanosleep(&ts, NULL);
            break;
        }
        case CPT_FAULT_DROP:
            dst = -1; // the peer waits for a message that never comes
            break;
        case CPT_FAULT_CORRUPT:
            if (dst >= 0 && send_bytes > 0) {
                copy = malloc(send_bytes);
                if (!copy)
                    return CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "fault comm: no memory");
                memcpy(copy, sendbuf, send_bytes);
                ((unsigned char *)copy)[send_bytes / 3] ^= 0x10;
                sendbuf = copy;
            }
            break;
        case CPT_FAULT_DEAD:
            f->dead = 1;
            if (f->fault.announce)
                ctxpar_comm_abort(f->inner);
            return dead_error(c);
        case CPT_FAULT_NONE:
            break;
        }
    }
    ctxpar_request *inner = NULL;
    ctxpar_status st = ctxpar_comm_sendrecv(inner_of(c), sendbuf, send_bytes, dst, recvbuf,
                                            recv_bytes, src, tag, stream, &inner);
    if (st != CTXPAR_OK) {
        free(copy);
        return st;
    }
    return wrap(inner, copy, req_out);
}

static ctxpar_status fault_allgather(ctxpar_comm *c, const void *sendbuf, void *recvbuf,
                                     size_t bytes, ctxpar_stream *stream,
                                     ctxpar_request **req_out) {
    if (impl_of(c)->dead)
        return dead_error(c);
    ctxpar_request *inner = NULL;
    CTXPAR_CHECK(ctxpar_comm_allgather(inner_of(c), sendbuf, recvbuf, bytes, stream, &inner));
    return wrap(inner, NULL, req_out);
}

static ctxpar_status fault_reduce_scatter(ctxpar_comm *c, const float *sendbuf, float *recvbuf,
                                          size_t count, ctxpar_stream *stream,
                                          ctxpar_request **req_out) {
    if (impl_of(c)->dead)
        return dead_error(c);
    ctxpar_request *inner = NULL;
    CTXPAR_CHECK(
        ctxpar_comm_reduce_scatter(inner_of(c), sendbuf, recvbuf, count, stream, &inner));
    return wrap(inner, NULL, req_out);
}

static ctxpar_status fault_alltoall(ctxpar_comm *c, const void *sendbuf, void *recvbuf,
                                    size_t bytes, ctxpar_stream *stream,
                                    ctxpar_request **req_out) {
    if (impl_of(c)->dead)
        return dead_error(c);
    ctxpar_request *inner = NULL;
    CTXPAR_CHECK(ctxpar_comm_alltoall(inner_of(c), sendbuf, recvbuf, bytes, stream, &inner));
    return wrap(inner, NULL, req_out);
}

static ctxpar_status fault_wait(ctxpar_comm *c, ctxpar_request *req, ctxpar_stream *stream) {
    ctxpar_status st = ctxpar_comm_wait(inner_of(c), req->inner, stream);
    free(req->copy);
    free(req);
    return st;
}

static void fault_cancel(ctxpar_comm *c, ctxpar_request *req) {
    ctxpar_comm_cancel(inner_of(c), req->inner);
    free(req->copy);
    free(req);
}

static ctxpar_status fault_test(ctxpar_comm *c, ctxpar_request *req, int *done_out) {
    return ctxpar_comm_test(inner_of(c), req->inner, done_out);
}

static ctxpar_status fault_allreduce(ctxpar_comm *c, int64_t *buf, size_t count,
                                     ctxpar_reduce_op op) {
    if (impl_of(c)->dead)
        return dead_error(c);
    return ctxpar_comm_allreduce_i64(inner_of(c), buf, count, op);
}

static ctxpar_status fault_barrier(ctxpar_comm *c) {
    if (impl_of(c)->dead)
        return dead_error(c);
    return ctxpar_comm_barrier(inner_of(c));
}

static void fault_abort(ctxpar_comm *c) { ctxpar_comm_abort(inner_of(c)); }

static void fault_destroy(ctxpar_comm *c) {
    fault_impl *f = impl_of(c);
    if (f->parent_live)
        (*f->parent_live)--;
    if (f->owns_inner)
        ctxpar_comm_destroy(f->inner);
    free(f);
}

static ctxpar_status wrap_comm(ctxpar_comm *inner, const cpt_fault *fault, int owns_inner,
                               ctxpar_comm **comm_out);

// The inner comm's split, wrapped: the faulty rank stays faulty in its sub-comm (the same fault
// at the same transfer, counted there), the others' sub-comms forward faithfully.
static ctxpar_status fault_split(ctxpar_comm *c, int color, int key, ctxpar_comm **comm_out) {
    fault_impl *f = impl_of(c);
    if (f->dead)
        return dead_error(c);
    ctxpar_comm *sub = NULL;
    CTXPAR_CHECK(ctxpar_comm_split(inner_of(c), color, key, &sub));
    if (!sub) {
        *comm_out = NULL;
        return CTXPAR_OK;
    }
    cpt_fault fault = f->fault;
    fault.rank = c->rank == f->fault.rank ? sub->rank : -1;
    ctxpar_status st = wrap_comm(sub, &fault, 1, comm_out);
    if (st != CTXPAR_OK) {
        ctxpar_comm_destroy(sub);
        return st;
    }
    impl_of(*comm_out)->parent_live = &f->live;
    f->splits++;
    f->live++;
    return CTXPAR_OK;
}

static const struct ctxpar_comm_ops fault_ops = {
    .version = CTXPAR_COMM_OPS_VERSION,
    .struct_size = sizeof(struct ctxpar_comm_ops),
    .name = "fault",
    .destroy = fault_destroy,
    .sendrecv = fault_sendrecv,
    .allgather = fault_allgather,
    .reduce_scatter = fault_reduce_scatter,
    .alltoall = fault_alltoall,
    .wait = fault_wait,
    .cancel = fault_cancel,
    .allreduce_i64 = fault_allreduce,
    .barrier = fault_barrier,
    .test = fault_test,
    .abort = fault_abort,
    .split = fault_split,
};

ctxpar_status cpt_comm_create_fault(ctxpar_comm *inner, const cpt_fault *fault,
                                       ctxpar_comm **comm_out) {
    if (!inner || !fault || !comm_out)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "inner, fault and comm_out must be set");
    return wrap_comm(inner, fault, 0, comm_out);
}

static ctxpar_status wrap_comm(ctxpar_comm *inner, const cpt_fault *fault, int owns_inner,
                               ctxpar_comm **comm_out) {
    fault_impl *f = calloc(1, sizeof *f);
    if (!f)
        return CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "fault comm: cannot allocate");
    f->inner = inner;
    f->fault = *fault;
    f->owns_inner = owns_inner;
    ctxpar_status st = ctxpar_comm_create(&fault_ops, f, inner->rank, inner->size, comm_out);
    if (st != CTXPAR_OK) {
        free(f);
        return st;
    }
    (*comm_out)->timeout_s = inner->timeout_s;
    return CTXPAR_OK;
}

int cpt_fault_transfers(const ctxpar_comm *fault_comm) {
    return ((const fault_impl *)fault_comm->impl)->transfers;
}

int cpt_fault_splits(const ctxpar_comm *fault_comm) {
    return ((const fault_impl *)fault_comm->impl)->splits;
}

int cpt_fault_splits_live(const ctxpar_comm *fault_comm) {
    return ((const fault_impl *)fault_comm->impl)->live;
}
