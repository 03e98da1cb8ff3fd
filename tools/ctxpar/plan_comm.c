// The planner's comm (see plan_comm.h).
#include <stdlib.h>

#include "plan_comm.h"

typedef struct plan_comm {
    int group_size, link;
    cpt_plan_traffic *t;
} plan_comm;

static int link_of(ctxpar_comm *c, int peer) {
    const plan_comm *p = c->impl;
    if (p->link >= 0)
        return p->link;
    return peer / p->group_size == c->rank / p->group_size ? CPT_LINK_GROUP : CPT_LINK_ACROSS;
}

static ctxpar_status pc_sendrecv(ctxpar_comm *c, const void *sendbuf, size_t send_bytes, int dst,
                                 void *recvbuf, size_t recv_bytes, int src, int tag,
                                 ctxpar_stream *stream, ctxpar_request **req_out) {
    (void)sendbuf, (void)recvbuf, (void)recv_bytes, (void)src, (void)tag, (void)stream;
    plan_comm *p = c->impl;
    if (dst >= 0) {
        p->t->p2p_bytes[link_of(c, dst)] += send_bytes;
        p->t->p2p_msgs[link_of(c, dst)]++;
    }
    *req_out = NULL; // complete: wait has nothing to do
    return CTXPAR_OK;
}

// A collective sending `bytes` to every other rank.
static void to_every_peer(ctxpar_comm *c, size_t bytes) {
    plan_comm *p = c->impl;
    for (int r = 0; r < c->size; r++)
        if (r != c->rank) {
            p->t->coll_bytes[link_of(c, r)] += bytes;
            p->t->coll_msgs[link_of(c, r)]++;
        }
}

static ctxpar_status pc_allgather(ctxpar_comm *c, const void *sendbuf, void *recvbuf, size_t bytes,
                                  ctxpar_stream *stream, ctxpar_request **req_out) {
    (void)sendbuf, (void)recvbuf, (void)stream;
    to_every_peer(c, bytes);
    *req_out = NULL;
    return CTXPAR_OK;
}

static ctxpar_status pc_reduce_scatter(ctxpar_comm *c, const float *sendbuf, float *recvbuf,
                                       size_t count, ctxpar_stream *stream,
                                       ctxpar_request **req_out) {
    (void)sendbuf, (void)recvbuf, (void)stream;
    to_every_peer(c, count * sizeof(float));
    *req_out = NULL;
    return CTXPAR_OK;
}

static ctxpar_status pc_alltoall(ctxpar_comm *c, const void *sendbuf, void *recvbuf, size_t bytes,
                                 ctxpar_stream *stream, ctxpar_request **req_out) {
    (void)sendbuf, (void)recvbuf, (void)stream;
    to_every_peer(c, bytes);
    *req_out = NULL;
    return CTXPAR_OK;
}

static ctxpar_status pc_wait(ctxpar_comm *c, ctxpar_request *req, ctxpar_stream *stream) {
    (void)c, (void)req, (void)stream;
    return CTXPAR_OK;
}
static void pc_cancel(ctxpar_comm *c, ctxpar_request *req) {
    (void)c, (void)req;
}
static ctxpar_status pc_allreduce(ctxpar_comm *c, int64_t *buf, size_t count, ctxpar_reduce_op op) {
    (void)c, (void)buf, (void)count, (void)op; // every rank holds the same values: unchanged
    return CTXPAR_OK;
}
static ctxpar_status pc_barrier(ctxpar_comm *c) {
    (void)c;
    return CTXPAR_OK;
}
static void pc_destroy(ctxpar_comm *c) {
    free(c->impl);
}

static const struct ctxpar_comm_ops plan_comm_ops = {
    .version = CTXPAR_COMM_OPS_VERSION,
    .struct_size = sizeof(struct ctxpar_comm_ops),
    .name = "plan",
    .destroy = pc_destroy,
    .sendrecv = pc_sendrecv,
    .allgather = pc_allgather,
    .reduce_scatter = pc_reduce_scatter,
    .alltoall = pc_alltoall,
    .wait = pc_wait,
    .cancel = pc_cancel,
    .allreduce_i64 = pc_allreduce,
    .barrier = pc_barrier,
};

ctxpar_status cpt_plan_comm_create(int rank, int size, int group_size, int link,
                                   cpt_plan_traffic *traffic, ctxpar_comm **comm_out) {
    plan_comm *p = calloc(1, sizeof *p);
    if (!p)
        return CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "plan: no memory for a comm");
    p->group_size = group_size > 0 ? group_size : 1;
    p->link = link;
    p->t = traffic;
    ctxpar_status st = ctxpar_comm_create(&plan_comm_ops, p, rank, size, comm_out);
    if (st != CTXPAR_OK)
        free(p);
    return st;
}
