// The local group: its lifetime, its channels, its clock, and what happens when a rank dies.
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdlib.h>
#include <time.h>

#include "local_internal.h"

// Channels grow as P^2; threads as ranks beyond this make no sense on one machine anyway.
#define LOCAL_MAX_RANKS 256

// Frees what the channels still hold. Only tombstones can be there: every comm has retired its
// requests before it detached.
static void clear_channels(ctxpar_local_group *g) {
    for (int i = 0; i < LOCAL_NUM_TAGS * g->nranks * g->nranks; i++) {
        local_queue *qs[2] = {&g->chan[i].sends, &g->chan[i].recvs};
        for (int k = 0; k < 2; k++) {
            for (local_half *h = qs[k]->head, *next; h; h = next) {
                next = h->next;
                free(h);
            }
            qs[k]->head = qs[k]->tail = NULL;
        }
    }
}

static void free_group(ctxpar_local_group *g) {
    clear_channels(g);
    pthread_cond_destroy(&g->cv);
    pthread_mutex_destroy(&g->mu);
    free(g->chan);
    free(g->state);
    free(g->comm);
    free(g);
}

ctxpar_status ctxpar_local_group_create(int nranks, ctxpar_local_group **group_out) {
    if (!group_out)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "group_out is NULL");
    if (nranks < 1 || nranks > LOCAL_MAX_RANKS)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "nranks (%d) must be in [1, %d]", nranks,
                            LOCAL_MAX_RANKS);
    ctxpar_local_group *g = calloc(1, sizeof *g);
    if (!g)
        return CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "cannot allocate a local group");
    g->nranks = nranks;
    g->comm = calloc((size_t)nranks, sizeof *g->comm);
    g->state = calloc((size_t)nranks, sizeof *g->state);
    g->chan = calloc((size_t)LOCAL_NUM_TAGS * (size_t)nranks * (size_t)nranks, sizeof *g->chan);
    if (!g->comm || !g->state || !g->chan) {
        free(g->chan);
        free(g->state);
        free(g->comm);
        free(g);
        return CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "cannot allocate a local group of %d ranks",
                            nranks);
    }
    pthread_condattr_t attr;
    int rc = pthread_condattr_init(&attr);
    if (rc == 0) {
        rc = pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
        if (rc == 0)
            rc = pthread_cond_init(&g->cv, &attr);
        pthread_condattr_destroy(&attr);
    }
    if (rc == 0) {
        rc = pthread_mutex_init(&g->mu, NULL);
        if (rc != 0)
            pthread_cond_destroy(&g->cv);
    }
    if (rc != 0) {
        free(g->chan);
        free(g->state);
        free(g->comm);
        free(g);
        return CTXPAR_ERROR(CTXPAR_ERR_INTERNAL, "cannot initialise the group's lock (error %d)",
                            rc);
    }
    *group_out = g;
    return CTXPAR_OK;
}

void ctxpar_local_group_destroy(ctxpar_local_group *group) {
    if (!group)
        return;
    pthread_mutex_lock(&group->mu);
    // Comms still hold the group: the last one to go frees it.
    int defer = group->attached > 0;
    group->destroy_requested = 1;
    pthread_mutex_unlock(&group->mu);
    if (!defer)
        free_group(group);
}

ctxpar_status ctxpar_local_attach(ctxpar_local_group *g, int rank, local_comm *c) {
    ctxpar_status st = CTXPAR_OK;
    pthread_mutex_lock(&g->mu);
    if (g->destroy_requested)
        st = CTXPAR_ERROR(CTXPAR_ERR_INVALID_USAGE,
                          "local group: cannot create rank %d's comm: the group is being destroyed",
                          rank);
    else if (g->comm[rank])
        st = CTXPAR_ERROR(CTXPAR_ERR_INVALID_USAGE,
                          "local group: rank %d already has a comm (destroy it first)", rank);
    else {
        g->comm[rank] = c;
        g->state[rank] = LOCAL_RANK_ALIVE;
        g->attached++;
        if (g->to_attach > 0)
            g->to_attach--;
    }
    pthread_mutex_unlock(&g->mu);
    return st;
}

int ctxpar_local_detach(ctxpar_local_group *g, int rank) {
    g->comm[rank] = NULL;
    g->attached--;
    if (g->attached == 0) {
        // A fresh start for the next set of comms: nobody is dead, no tombstone lingers.
        for (int r = 0; r < g->nranks; r++)
            g->state[r] = LOCAL_RANK_ABSENT;
        clear_channels(g);
    }
    return g->attached == 0 && (g->destroy_requested || (g->self_owned && g->to_attach == 0));
}

void ctxpar_local_forgo(ctxpar_local_group *g) {
    pthread_mutex_lock(&g->mu);
    if (g->to_attach > 0)
        g->to_attach--;
    int free_it = g->self_owned && g->attached == 0 && g->to_attach == 0;
    pthread_mutex_unlock(&g->mu);
    if (free_it)
        free_group(g);
}

void ctxpar_local_free_group(ctxpar_local_group *g) {
    free_group(g);
}

local_channel *ctxpar_local_channel(ctxpar_local_group *g, int tag, int src, int dst) {
    return &g->chan[((size_t)tag * (size_t)g->nranks + (size_t)src) * (size_t)g->nranks +
                    (size_t)dst];
}

int ctxpar_local_cond_wait(ctxpar_local_group *g, const struct timespec *deadline) {
    if (!deadline) {
        pthread_cond_wait(&g->cv, &g->mu);
        return 0;
    }
    return pthread_cond_timedwait(&g->cv, &g->mu, deadline) == ETIMEDOUT;
}

// Fails the queued halves of one channel queue that belong to live requests, frees tombstones.
static void sweep_queue(local_queue *q, int rank, const char *why) {
    local_half *h = q->head;
    while (h) {
        local_half *next = h->next;
        if (!h->req) {
            ctxpar_local_unlink_from(q, h);
            free(h);
        } else if (h->owner == rank) {
            ctxpar_local_fail_half(h, CTXPAR_ERR_REMOTE, "rank %d: %s #%llu: this rank %s", rank,
                                   ctxpar_local_op_name(h->op), (unsigned long long)h->seq, why);
        } else {
            ctxpar_local_fail_half(h, CTXPAR_ERR_REMOTE, "rank %d: %s #%llu: peer rank %d %s",
                                   h->owner, ctxpar_local_op_name(h->op),
                                   (unsigned long long)h->seq, rank, why);
        }
        h = next;
    }
}

void ctxpar_local_kill_rank(ctxpar_local_group *g, int rank, const char *why) {
    g->state[rank] = LOCAL_RANK_DEAD;
    for (int tag = 0; tag < LOCAL_NUM_TAGS; tag++) {
        for (int other = 0; other < g->nranks; other++) {
            local_channel *a = ctxpar_local_channel(g, tag, rank, other);
            local_channel *b = ctxpar_local_channel(g, tag, other, rank);
            sweep_queue(&a->sends, rank, why);
            sweep_queue(&a->recvs, rank, why);
            if (b != a) {
                sweep_queue(&b->sends, rank, why);
                sweep_queue(&b->recvs, rank, why);
            }
        }
    }
    // reduce_scatter pairs that met but wait for the receiver's sum.
    for (int r = 0; r < g->nranks; r++) {
        if (!g->comm[r])
            continue;
        for (struct ctxpar_request *q = g->comm[r]->live; q; q = q->next) {
            for (int i = 0; i < q->nhalves; i++) {
                local_half *h = &q->half[i];
                if (h->state != LOCAL_HALF_MATCHED || (h->owner != rank && h->peer != rank))
                    continue;
                local_half *mate = h->partner;
                ctxpar_local_fail_half(h, CTXPAR_ERR_REMOTE, "rank %d: %s #%llu: rank %d %s",
                                       h->owner, ctxpar_local_op_name(h->op),
                                       (unsigned long long)h->seq, rank, why);
                ctxpar_local_fail_half(mate, CTXPAR_ERR_REMOTE, "rank %d: %s #%llu: rank %d %s",
                                       mate->owner, ctxpar_local_op_name(mate->op),
                                       (unsigned long long)mate->seq, rank, why);
            }
        }
    }
    pthread_cond_broadcast(&g->cv);
}
