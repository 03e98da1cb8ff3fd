// Halves meeting in channels: matching, the copies, reduce_scatter's sums, completion, timeouts
// and retirement. Every function here is entered with the group lock held.
#define _POSIX_C_SOURCE 200809L
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "local_internal.h"

// reduce_scatter sums through a stack tile of this many floats, so that the result is written
// once (never read back half-summed) and the summation order is rank order for every element.
#define LOCAL_SUM_TILE 1024

const char *ctxpar_local_op_name(local_op op) {
    switch (op) {
    case LOCAL_OP_SENDRECV:
        return "sendrecv";
    case LOCAL_OP_ALLGATHER:
        return "allgather";
    case LOCAL_OP_REDUCE_SCATTER:
        return "reduce_scatter";
    case LOCAL_OP_ALLTOALL:
        return "alltoall";
    case LOCAL_OP_ALLREDUCE:
        return "allreduce_i64";
    case LOCAL_OP_BARRIER:
        return "barrier";
    }
    return "?";
}

/* ---------------------------------------------------------------- queues */

static void queue_push(local_queue *q, local_half *h) {
    h->next = NULL;
    if (q->tail)
        q->tail->next = h;
    else
        q->head = h;
    q->tail = h;
}

static local_half *queue_pop(local_queue *q) {
    local_half *h = q->head;
    q->head = h->next;
    if (!q->head)
        q->tail = NULL;
    h->next = NULL;
    return h;
}

// Puts `repl` where `old` is (repl == NULL removes old). Queues are short: a linear walk.
static void queue_replace(local_queue *q, local_half *old, local_half *repl) {
    local_half **link = &q->head, *prev = NULL;
    while (*link != old) {
        prev = *link;
        link = &(*link)->next;
    }
    if (repl) {
        repl->next = old->next;
        *link = repl;
        if (q->tail == old)
            q->tail = repl;
    } else {
        *link = old->next;
        if (q->tail == old)
            q->tail = prev;
    }
    old->next = NULL;
}

void ctxpar_local_unlink_from(local_queue *q, local_half *h) {
    queue_replace(q, h, NULL);
}

static local_queue *queue_of(ctxpar_local_group *g, const local_half *h, int own_side) {
    int tag = h->op == LOCAL_OP_SENDRECV ? LOCAL_TAG_P2P : LOCAL_TAG_COLL;
    int src = h->is_send ? h->owner : h->peer;
    int dst = h->is_send ? h->peer : h->owner;
    local_channel *ch = ctxpar_local_channel(g, tag, src, dst);
    int sends = own_side ? h->is_send : !h->is_send;
    return sends ? &ch->sends : &ch->recvs;
}

/* ---------------------------------------------------------------- half state */

void ctxpar_local_fail_half(local_half *h, ctxpar_status status, const char *fmt, ...) {
    // A BUSY half finishes by itself; DONE and FAILED are final.
    if (h->state != LOCAL_HALF_QUEUED && h->state != LOCAL_HALF_MATCHED)
        return;
    if (h->state == LOCAL_HALF_QUEUED)
        ctxpar_local_unlink_from(queue_of(h->req->comm->group, h, 1), h);
    h->state = LOCAL_HALF_FAILED;
    h->status = status;
    h->partner = NULL;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(h->msg, sizeof h->msg, fmt, ap);
    va_end(ap);
    h->req->pending--;
    h->req->failed++;
}

static void mark_done(local_half *h, ctxpar_status status, const char *msg) {
    if (status == CTXPAR_OK) {
        h->state = LOCAL_HALF_DONE;
        h->req->pending--;
        return;
    }
    h->state = LOCAL_HALF_FAILED;
    h->status = status;
    snprintf(h->msg, sizeof h->msg, "%s", msg);
    h->req->pending--;
    h->req->failed++;
}

static int finished(const struct ctxpar_request *req) {
    return req->pending == 0 || req->failed;
}

/* ---------------------------------------------------------------- matching */

// Both sides of a pair must describe the same transfer; a mismatch fails both.
static int check_pair(local_half *h, local_half *o) {
    const local_half *s = h->is_send ? h : o, *r = h->is_send ? o : h;
    if (s->op == r->op && s->seq == r->seq && s->bytes == r->bytes && s->arg == r->arg)
        return 1;
    char desc[LOCAL_MSG_LEN];
    snprintf(desc, sizeof desc,
             "rank %d sends %s #%llu (%zu bytes, arg %lld) but rank %d receives %s #%llu (%zu "
             "bytes, arg %lld)",
             s->owner, ctxpar_local_op_name(s->op), (unsigned long long)s->seq, s->bytes,
             (long long)s->arg, r->owner, ctxpar_local_op_name(r->op), (unsigned long long)r->seq,
             r->bytes, (long long)r->arg);
    // Point-to-point halves that differ only in their tag mean a message was lost or extra on
    // the way (a fault of the transfer, not of the call): report it as a comm error.
    ctxpar_status st = s->op == LOCAL_OP_SENDRECV && r->op == LOCAL_OP_SENDRECV &&
                               s->bytes == r->bytes && s->arg != r->arg
                           ? CTXPAR_ERR_COMM
                           : CTXPAR_ERR_INVALID_USAGE;
    h->state = o->state = LOCAL_HALF_MATCHED; // so that fail_half takes them
    ctxpar_local_fail_half(h, st, "%s", desc);
    ctxpar_local_fail_half(o, st, "%s", desc);
    return 0;
}

static void post_half(ctxpar_local_group *g, local_half *h) {
    local_queue *theirs = queue_of(g, h, 0);
    if (!theirs->head) {
        h->state = LOCAL_HALF_QUEUED;
        queue_push(queue_of(g, h, 1), h);
        return;
    }
    local_half *o = queue_pop(theirs);
    if (!o->req) { // the peer gave up on this transfer before we arrived
        h->state = LOCAL_HALF_MATCHED;
        ctxpar_local_fail_half(h, CTXPAR_ERR_REMOTE, "rank %d: %s #%llu: peer rank %d %s it",
                               h->owner, ctxpar_local_op_name(h->op), (unsigned long long)h->seq,
                               o->owner, o->msg);
        free(o);
        return;
    }
    if (!check_pair(h, o))
        return;
    h->partner = o;
    o->partner = h;
    if (h->op == LOCAL_OP_REDUCE_SCATTER) {
        h->state = o->state = LOCAL_HALF_MATCHED; // the receiver sums all P at once
    } else {
        h->state = o->state = LOCAL_HALF_BUSY;
        h->copy_here = 1;
    }
}

/* ---------------------------------------------------------------- data movement (unlocked) */

static ctxpar_status copy_bytes(local_comm *c, const struct ctxpar_request *req, void *dst,
                                const void *src, size_t n) {
    if (n == 0)
        return CTXPAR_OK;
    if (!c->dev || req->host_only) {
        memcpy(dst, src, n);
        return CTXPAR_OK;
    }
    CTXPAR_CHECK(ctxpar_dev_copy(c->dev, dst, src, n, CTXPAR_COPY_D2D, req->stream));
    // The peer may read the data as soon as the half is DONE.
    if (ctxpar_dev_has_streams(c->dev))
        CTXPAR_CHECK(ctxpar_dev_stream_sync(c->dev, req->stream));
    return CTXPAR_OK;
}

/* out[i] = sum over s = 0..P-1 of src_s[i] (i < count), added in that order, where src_s is the
 * send buffer block of the s-th receive half's partner. */
static ctxpar_status sum_blocks(local_comm *c, struct ctxpar_request *req, float *out,
                                size_t count) {
    int nranks = req->nhalves / 2;
    const local_half *in = &req->half[nranks];
    if (c->dev) {
        size_t bytes = count * sizeof(float);
        CTXPAR_CHECK(
            ctxpar_dev_copy(c->dev, out, in[0].partner->sbuf, bytes, CTXPAR_COPY_D2D, req->stream));
        for (int s = 1; s < nranks; s++)
            CTXPAR_CHECK(ctxpar_dev_add(c->dev, out, in[s].partner->sbuf, count, req->stream));
        if (ctxpar_dev_has_streams(c->dev))
            CTXPAR_CHECK(ctxpar_dev_stream_sync(c->dev, req->stream));
        return CTXPAR_OK;
    }
    float tile[LOCAL_SUM_TILE];
    for (size_t off = 0; off < count; off += LOCAL_SUM_TILE) {
        size_t n = count - off < LOCAL_SUM_TILE ? count - off : LOCAL_SUM_TILE;
        memcpy(tile, (const float *)in[0].partner->sbuf + off, n * sizeof(float));
        for (int s = 1; s < nranks; s++) {
            const float *src = (const float *)in[s].partner->sbuf + off;
            for (size_t i = 0; i < n; i++)
                tile[i] += src[i];
        }
        memcpy(out + off, tile, n * sizeof(float));
    }
    return CTXPAR_OK;
}

/* ---------------------------------------------------------------- posting and progress */

void ctxpar_local_post(local_comm *c, struct ctxpar_request *req) {
    ctxpar_local_group *g = c->group;
    int owe = 0;
    for (int i = 0; i < req->nhalves; i++) {
        post_half(g, &req->half[i]);
        owe += req->half[i].copy_here;
    }
    if (!owe)
        return;
    // Copy outside the lock: the halves are BUSY, so neither owner can free its buffer meanwhile.
    pthread_mutex_unlock(&g->mu);
    for (int i = 0; i < req->nhalves; i++) {
        local_half *h = &req->half[i];
        if (!h->copy_here)
            continue;
        const local_half *s = h->is_send ? h : h->partner;
        local_half *r = h->is_send ? h->partner : h;
        ctxpar_status st = copy_bytes(c, req, r->rbuf, s->sbuf, s->bytes);
        h->status = st;
        if (st != CTXPAR_OK)
            snprintf(h->msg, sizeof h->msg, "rank %d copying %s #%llu (%zu bytes) from rank %d: %s",
                     c->rank, ctxpar_local_op_name(h->op), (unsigned long long)h->seq, s->bytes,
                     s->owner, ctxpar_last_error());
    }
    pthread_mutex_lock(&g->mu);
    for (int i = 0; i < req->nhalves; i++) {
        local_half *h = &req->half[i];
        if (!h->copy_here)
            continue;
        char msg[LOCAL_MSG_LEN];
        snprintf(msg, sizeof msg, "%s", h->msg);
        h->copy_here = 0;
        mark_done(h->partner, h->status, msg);
        mark_done(h, h->status, msg);
    }
    pthread_cond_broadcast(&g->cv);
}

// The receiver's side of reduce_scatter: sum once every contribution has arrived.
static void reduce_if_ready(local_comm *c, struct ctxpar_request *req) {
    int nranks = req->nhalves / 2;
    local_half *in = &req->half[nranks];
    for (int s = 0; s < nranks; s++)
        if (in[s].state != LOCAL_HALF_MATCHED)
            return;
    req->reduced = 1;
    for (int s = 0; s < nranks; s++)
        in[s].state = in[s].partner->state = LOCAL_HALF_BUSY;
    ctxpar_local_group *g = c->group;
    pthread_mutex_unlock(&g->mu);
    ctxpar_status st = sum_blocks(c, req, in[0].rbuf, in[0].bytes / sizeof(float));
    char msg[LOCAL_MSG_LEN] = "";
    if (st != CTXPAR_OK)
        snprintf(msg, sizeof msg, "rank %d summing reduce_scatter #%llu: %s", c->rank,
                 (unsigned long long)req->seq, ctxpar_last_error());
    pthread_mutex_lock(&g->mu);
    for (int s = 0; s < nranks; s++) {
        mark_done(in[s].partner, st, msg);
        mark_done(&in[s], st, msg);
    }
    pthread_cond_broadcast(&g->cv);
}

void ctxpar_local_progress(local_comm *c) {
    // Only this rank's thread adds or removes its requests, so the list is stable here even
    // though reduce_if_ready drops the lock.
    for (struct ctxpar_request *q = c->live; q; q = q->next)
        if (q->op == LOCAL_OP_REDUCE_SCATTER && !q->reduced && !q->failed)
            reduce_if_ready(c, q);
}

/* ---------------------------------------------------------------- completion */

static int any_busy(const struct ctxpar_request *req) {
    for (int i = 0; i < req->nhalves; i++)
        if (req->half[i].state == LOCAL_HALF_BUSY)
            return 1;
    return 0;
}

// Leaves a group-owned marker where h waited, so that the peer's matching half fails promptly
// instead of matching a later transfer. Without memory for it, h just leaves (the peer then times
// out).
static void leave_tombstone(ctxpar_local_group *g, local_half *h, const char *why) {
    local_queue *q = queue_of(g, h, 1);
    local_half *t = malloc(sizeof *t);
    if (t) {
        *t = *h;
        t->req = NULL;
        t->partner = NULL;
        snprintf(t->msg, sizeof t->msg, "%s", why);
    }
    queue_replace(q, h, t);
}

void ctxpar_local_retire(local_comm *c, struct ctxpar_request *req, const char *why) {
    ctxpar_local_group *g = c->group;
    while (any_busy(req))
        ctxpar_local_cond_wait(g, NULL); // a copy in flight: bounded, never waits on a peer
    for (int i = 0; i < req->nhalves; i++) {
        local_half *h = &req->half[i];
        if (h->state == LOCAL_HALF_QUEUED) {
            leave_tombstone(g, h, why);
        } else if (h->state == LOCAL_HALF_MATCHED) {
            local_half *mate = h->partner;
            ctxpar_local_fail_half(mate, CTXPAR_ERR_REMOTE, "rank %d: %s #%llu: peer rank %d %s it",
                                   mate->owner, ctxpar_local_op_name(mate->op),
                                   (unsigned long long)mate->seq, c->rank, why);
        }
    }
    if (req->prev)
        req->prev->next = req->next;
    else
        c->live = req->next;
    if (req->next)
        req->next->prev = req->prev;
    free(req);
    pthread_cond_broadcast(&g->cv);
}

static struct timespec deadline_after(double seconds) {
    if (seconds > 1e8) // keep tv_sec far from overflow
        seconds = 1e8;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    time_t whole = (time_t)seconds;
    long nsec = ts.tv_nsec + (long)((seconds - (double)whole) * 1e9);
    ts.tv_sec += whole + nsec / 1000000000L;
    ts.tv_nsec = nsec % 1000000000L;
    return ts;
}

// The half that best names whom we wait for: one still queued (its peer never posted), else one
// that met its peer but waits for a reduce_scatter sum.
static const local_half *first_waiting(const struct ctxpar_request *req) {
    for (int i = 0; i < req->nhalves; i++)
        if (req->half[i].state == LOCAL_HALF_QUEUED)
            return &req->half[i];
    for (int i = 0; i < req->nhalves; i++)
        if (req->half[i].state == LOCAL_HALF_MATCHED)
            return &req->half[i];
    return NULL;
}

// Whom the request waited for, and for a collective how many ranks made the call: a rank alone
// (a one-rank program run on a comm of several) learns that every rank must call.
static void timeout_message(const local_comm *c, const struct ctxpar_request *req, double timeout_s,
                            char *msg, size_t n) {
    const local_half *h = first_waiting(req);
    int o = snprintf(msg, n, "%s #%llu timed out after %g s: rank %d waited for rank %d to %s",
                     ctxpar_local_op_name(req->op), (unsigned long long)req->seq, timeout_s,
                     c->rank, h ? h->peer : -1,
                     !h           ? "arrive"
                     : h->is_send ? (h->state == LOCAL_HALF_MATCHED ? "sum" : "receive")
                                  : "send");
    if (req->op == LOCAL_OP_SENDRECV || o < 0 || (size_t)o >= n)
        return;
    // A peer none of whose halves met ours has not made this call.
    const int p = c->group->nranks;
    int arrived = p;
    for (int r = 0; r < p; r++)
        for (int i = 0; i < req->nhalves; i++)
            if (req->half[i].peer == r && req->half[i].state == LOCAL_HALF_QUEUED) {
                arrived--;
                break;
            }
    snprintf(msg + o, n - (size_t)o,
             "; %d of %d ranks made this call: every rank of the comm must make the same calls "
             "in the same order (one thread or process per rank)",
             arrived, p);
}

ctxpar_status ctxpar_local_complete(local_comm *c, struct ctxpar_request *req) {
    ctxpar_local_group *g = c->group;
    double timeout_s = c->base->timeout_s;
    struct timespec deadline = deadline_after(timeout_s);
    int timed_out = 0;
    for (;;) {
        ctxpar_local_progress(c);
        if (finished(req) || timed_out)
            break;
        timed_out = ctxpar_local_cond_wait(g, &deadline);
    }
    while (!finished(req) && any_busy(req)) // data in flight at the deadline: let it land
        ctxpar_local_cond_wait(g, NULL);
    if (!finished(req)) {
        char msg[400];
        timeout_message(c, req, timeout_s, msg, sizeof msg);
        ctxpar_local_retire(c, req, "timed out on");
        return CTXPAR_ERROR(CTXPAR_ERR_TIMEOUT, "%s", msg);
    }
    // Report the root cause: a failure involving a dead peer rather than its echo (a live peer
    // that gave up because of it).
    const local_half *bad = NULL;
    for (int i = 0; i < req->nhalves; i++) {
        const local_half *h = &req->half[i];
        if (h->state != LOCAL_HALF_FAILED)
            continue;
        if (!bad ||
            (g->state[h->peer] == LOCAL_RANK_DEAD && g->state[bad->peer] != LOCAL_RANK_DEAD))
            bad = h;
    }
    ctxpar_status st = bad ? bad->status : CTXPAR_OK;
    char msg[LOCAL_MSG_LEN] = "";
    if (bad)
        snprintf(msg, sizeof msg, "%s", bad->msg);
    ctxpar_local_retire(c, req, "gave up on");
    if (st != CTXPAR_OK)
        return CTXPAR_ERROR(st, "%s", msg);
    return CTXPAR_OK;
}
