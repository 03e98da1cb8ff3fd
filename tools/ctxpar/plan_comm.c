// The planner's comm (see plan_comm.h).
#include <stdlib.h>

#include "plan_comm.h"

typedef struct plan_comm {
    int group_size, link;
    int g0; // the first rank of this rank's group: a peer's link is a compare, not a division
    cpt_plan_traffic *t;
    ctxpar_split_shape splits[CTXPAR_MAX_SPLITS];
    int nsplits, next; // next: the splits made so far
} plan_comm;

static int link_of(ctxpar_comm *c, int peer) {
    const plan_comm *p = c->impl;
    if (p->link >= 0)
        return p->link;
    return peer >= p->g0 && peer - p->g0 < p->group_size ? CPT_LINK_GROUP : CPT_LINK_ACROSS;
}

static ctxpar_status pc_sendrecv(ctxpar_comm *c, const void *sendbuf, size_t send_bytes, int dst,
                                 void *recvbuf, size_t recv_bytes, int src, int tag,
                                 ctxpar_stream *stream, ctxpar_request **req_out) {
    (void)sendbuf, (void)recvbuf, (void)tag, (void)stream;
    plan_comm *p = c->impl;
    if (dst >= 0) {
        p->t->p2p_bytes[link_of(c, dst)] += send_bytes;
        p->t->p2p_msgs[link_of(c, dst)]++;
    }
    if (src >= 0)
        p->t->p2p_recv_bytes[link_of(c, src)] += recv_bytes;
    *req_out = NULL; // complete: wait has nothing to do
    return CTXPAR_OK;
}

// A collective exchanging with every other rank: `sent` bytes to each, `received` from each.
// Peers are counted per link class in O(1) (a loop over them made an all-gather plan O(P^2)).
static void with_every_peer(ctxpar_comm *c, size_t sent, size_t received) {
    plan_comm *p = c->impl;
    uint64_t peers[CPT_LINKS] = {0, 0};
    if (p->link >= 0) {
        peers[p->link] = (uint64_t)(c->size - 1);
    } else {
        const int g0 = p->g0;
        const int g1 = g0 + p->group_size < c->size ? g0 + p->group_size : c->size;
        peers[CPT_LINK_GROUP] = (uint64_t)(g1 - g0 - 1);
        peers[CPT_LINK_ACROSS] = (uint64_t)(c->size - 1) - peers[CPT_LINK_GROUP];
    }
    for (int l = 0; l < CPT_LINKS; l++) {
        p->t->coll_bytes[l] += peers[l] * sent;
        p->t->coll_msgs[l] += peers[l];
        p->t->coll_recv_bytes[l] += peers[l] * received;
    }
}

// Per peer: an all-gather sends this rank's block and receives the peer's (recvbuf holds size
// blocks); a reduce-scatter sends the peer's part and receives this rank's part of the peer's
// block; an all-to-all one block each way.
static ctxpar_status pc_allgather(ctxpar_comm *c, const void *sendbuf, void *recvbuf, size_t bytes,
                                  ctxpar_stream *stream, ctxpar_request **req_out) {
    (void)sendbuf, (void)recvbuf, (void)stream;
    with_every_peer(c, bytes, bytes);
    *req_out = NULL;
    return CTXPAR_OK;
}

static ctxpar_status pc_reduce_scatter(ctxpar_comm *c, const float *sendbuf, float *recvbuf,
                                       size_t count, ctxpar_stream *stream,
                                       ctxpar_request **req_out) {
    (void)sendbuf, (void)recvbuf, (void)stream;
    with_every_peer(c, count * sizeof(float), count * sizeof(float));
    *req_out = NULL;
    return CTXPAR_OK;
}

static ctxpar_status pc_alltoall(ctxpar_comm *c, const void *sendbuf, void *recvbuf, size_t bytes,
                                 ctxpar_stream *stream, ctxpar_request **req_out) {
    (void)sendbuf, (void)recvbuf, (void)stream;
    with_every_peer(c, bytes, bytes);
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

// The next shape the algorithm described (color and key are the peers' business, and there are
// none to meet).
static ctxpar_status pc_split(ctxpar_comm *c, int color, int key, ctxpar_comm **comm_out) {
    (void)key;
    plan_comm *p = c->impl;
    if (color < 0) {
        *comm_out = NULL;
        return CTXPAR_OK;
    }
    if (p->nsplits == 0)
        return CTXPAR_ERROR(CTXPAR_ERR_NOT_SUPPORTED,
                            "plan: the algorithm splits its comm but its table entry describes "
                            "no splits");
    const ctxpar_split_shape *s = &p->splits[p->next++ % p->nsplits];
    return cpt_plan_comm_create(s->rank, s->size, 1, s->group ? CPT_LINK_GROUP : CPT_LINK_ACROSS,
                                NULL, 0, p->t, comm_out);
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
    .split = pc_split,
};

ctxpar_status cpt_plan_comm_create(int rank, int size, int group_size, int link,
                                   const ctxpar_split_shape *splits, int nsplits,
                                   cpt_plan_traffic *traffic, ctxpar_comm **comm_out) {
    if (nsplits < 0 || nsplits > CTXPAR_MAX_SPLITS)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "plan: %d splits (at most %d)", nsplits,
                            CTXPAR_MAX_SPLITS);
    plan_comm *p = calloc(1, sizeof *p);
    if (!p)
        return CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "plan: no memory for a comm");
    for (int i = 0; i < nsplits; i++)
        p->splits[i] = splits[i];
    p->nsplits = nsplits;
    p->group_size = group_size > 0 ? group_size : 1;
    p->g0 = rank / p->group_size * p->group_size;
    p->link = link;
    p->t = traffic;
    ctxpar_status st = ctxpar_comm_create(&plan_comm_ops, p, rank, size, comm_out);
    if (st != CTXPAR_OK)
        free(p);
    return st;
}
