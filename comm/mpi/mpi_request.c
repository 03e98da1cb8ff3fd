// MPI requests: posting messages, polling against the deadline, finishing reductions,
// cancellation and the orphans MPI cannot cancel, and the translation of MPI errors.
#define _POSIX_C_SOURCE 200809L
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mpi_internal.h"

// How long a cancelled receive may take to report that it is cancelled.
#define CTXPAR_MPI_CANCEL_GRACE_S 0.05
// Reductions sum through a stack tile: rank order per element, the output written once.
#define CTXPAR_MPI_SUM_TILE 1024

const char *ctxpar_mpi_kind_name(mpi_kind kind) {
    switch (kind) {
    case KIND_SENDRECV:
        return "sendrecv";
    case KIND_ALLGATHER:
        return "allgather";
    case KIND_REDUCE_SCATTER:
        return "reduce_scatter";
    case KIND_ALLTOALL:
        return "alltoall";
    case KIND_ALLREDUCE:
        return "allreduce_i64";
    case KIND_BARRIER:
        return "barrier";
    case KIND_ABORT:
        return "abort";
    case KIND_COUNT:
        break;
    }
    return "?";
}

int ctxpar_mpi_tag(const mpi_comm_impl *c, mpi_kind kind, uint64_t seq) {
    return (int)((seq % c->tag_period) * KIND_COUNT + (uint64_t)kind);
}

int ctxpar_mpi_num_messages(const mpi_comm_impl *c, size_t bytes) {
    size_t n = bytes == 0 ? 1 : (bytes - 1) / c->max_message + 1;
    return (int)n; // callers keep totals far below INT_MAX (see mpi_ops.c)
}

ctxpar_status ctxpar_mpi_translate(int rc, char *buf, size_t len) {
    char text[MPI_MAX_ERROR_STRING] = "";
    int tlen = 0, cls = 0;
    if (MPI_Error_string(rc, text, &tlen) != MPI_SUCCESS)
        snprintf(text, sizeof text, "MPI error %d", rc);
    MPI_Error_class(rc, &cls);
    snprintf(buf, len, "%s", text);
#ifdef MPIX_ERR_PROC_FAILED
    if (cls == MPIX_ERR_PROC_FAILED)
        return CTXPAR_ERR_REMOTE;
#endif
    if (cls == MPI_ERR_TRUNCATE) // a peer sent more than this rank expects: they disagree
        return CTXPAR_ERR_INVALID_USAGE;
    return CTXPAR_ERR_COMM;
}

void ctxpar_mpi_fail(struct ctxpar_request *req, ctxpar_status status, const char *fmt, ...) {
    if (req->status != CTXPAR_OK)
        return; // keep the first failure: it is the cause
    req->status = status;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(req->msg, sizeof req->msg, fmt, ap);
    va_end(ap);
}

/* ---------------------------------------------------------------- posting */

struct ctxpar_request *ctxpar_mpi_request_new(mpi_comm_impl *c, mpi_kind kind, uint64_t seq, int n,
                                              size_t scratch_bytes) {
    // One block: the request, its arrays, then the landing space (16-byte aligned).
    size_t head = sizeof(struct ctxpar_request);
    size_t arrays = (size_t)n * (sizeof(MPI_Request) + 2 * sizeof(int) + sizeof(void *));
    size_t off = (head + arrays + 15) & ~(size_t)15;
    if (scratch_bytes > SIZE_MAX - off)
        return NULL;
    struct ctxpar_request *req = calloc(1, off + scratch_bytes);
    if (!req)
        return NULL;
    char *base = (char *)req;
    req->req = (MPI_Request *)(base + head);
    req->peer = (int *)(base + head + (size_t)n * sizeof(MPI_Request));
    req->expect = req->peer + n;
    req->stash = (void **)(base + head + (size_t)n * (sizeof(MPI_Request) + 2 * sizeof(int)));
    req->scratch = scratch_bytes ? base + off : NULL;
    for (int i = 0; i < n; i++)
        req->req[i] = MPI_REQUEST_NULL;
    req->c = c;
    req->kind = kind;
    req->seq = seq;
    req->n = n;
    return req;
}

static void post(struct ctxpar_request *req, const void *buf, size_t bytes, int peer, int tag,
                 int is_recv) {
    mpi_comm_impl *c = req->c;
    size_t off = 0;
    int msgs = ctxpar_mpi_num_messages(c, bytes);
    for (int k = 0; k < msgs && req->status == CTXPAR_OK; k++) {
        size_t len = bytes - off < c->max_message ? bytes - off : c->max_message;
        int i = req->used++;
        const char *p = buf ? (const char *)buf + off : NULL;
        int rc = is_recv
                     ? MPI_Irecv((void *)p, (int)len, MPI_BYTE, peer, tag, c->comm, &req->req[i])
                     : MPI_Isend(p, (int)len, MPI_BYTE, peer, tag, c->comm, &req->req[i]);
        req->peer[i] = peer;
        req->expect[i] = is_recv ? (int)len : -1;
        if (rc != MPI_SUCCESS) {
            char text[CTXPAR_MPI_MSG_LEN];
            ctxpar_status st = ctxpar_mpi_translate(rc, text, sizeof text);
            ctxpar_mpi_fail(req, st, "rank %d: %s #%llu: %s of %zu bytes %s rank %d: %s", c->rank,
                            ctxpar_mpi_kind_name(req->kind), (unsigned long long)req->seq,
                            is_recv ? "MPI_Irecv" : "MPI_Isend", len, is_recv ? "from" : "to", peer,
                            text);
        }
        off += len;
    }
}

void ctxpar_mpi_post_send(struct ctxpar_request *req, const void *buf, size_t bytes, int peer,
                          int tag) {
    // From the comm's own copy, so that a send MPI cannot cancel never reads the caller's memory
    // after the request is retired (see mpi_internal.h).
    void *copy = NULL;
    if (bytes > 0 && req->status == CTXPAR_OK) {
        copy = malloc(bytes);
        if (!copy) {
            ctxpar_mpi_fail(req, CTXPAR_ERR_OUT_OF_MEMORY, "rank %d: cannot copy a send of %zu bytes",
                            req->c->rank, bytes);
            return;
        }
        memcpy(copy, buf, bytes);
        req->stash[req->n_stash++] = copy;
    }
    post(req, copy, bytes, peer, tag, 0);
}

void ctxpar_mpi_post_recv(struct ctxpar_request *req, void *buf, size_t bytes, int peer, int tag) {
    post(req, buf, bytes, peer, tag, 1);
}

ctxpar_status ctxpar_mpi_start(struct ctxpar_request *req) {
    mpi_comm_impl *c = req->c;
    if (req->status != CTXPAR_OK) {
        ctxpar_status st = req->status;
        char msg[CTXPAR_MPI_MSG_LEN];
        snprintf(msg, sizeof msg, "%s", req->msg);
        ctxpar_mpi_retire(c, req);
        return CTXPAR_ERROR(st, "%s", msg);
    }
    req->next = c->live;
    if (c->live)
        c->live->prev = req;
    c->live = req;
    return CTXPAR_OK;
}

/* ---------------------------------------------------------------- background */

void ctxpar_mpi_add_orphan(mpi_comm_impl *c, MPI_Request r) {
    if (c->n_orphans == c->cap_orphans) {
        size_t cap = c->cap_orphans ? 2 * c->cap_orphans : 16;
        MPI_Request *grown = realloc(c->orphans, cap * sizeof *grown);
        if (!grown) { // cannot track it: let MPI finish it on its own
            MPI_Request_free(&r);
            return;
        }
        c->orphans = grown;
        c->cap_orphans = cap;
    }
    c->orphans[c->n_orphans++] = r;
}

// Keeps a send copy alive while orphans may read it; NULL-safe. Without memory to track it, the
// copy is leaked rather than freed under a pending send.
static void adopt_stash(mpi_comm_impl *c, void *p) {
    if (!p)
        return;
    if (c->n_stashes == c->cap_stashes) {
        size_t cap = c->cap_stashes ? 2 * c->cap_stashes : 16;
        void **grown = realloc(c->stashes, cap * sizeof *grown);
        if (!grown)
            return;
        c->stashes = grown;
        c->cap_stashes = cap;
    }
    c->stashes[c->n_stashes++] = p;
}

static void free_stashes(mpi_comm_impl *c) {
    for (size_t i = 0; i < c->n_stashes; i++)
        free(c->stashes[i]);
    c->n_stashes = 0;
}

static void poll_orphans(mpi_comm_impl *c) {
    for (size_t i = 0; i < c->n_orphans;) {
        int flag = 0;
        int rc = MPI_Test(&c->orphans[i], &flag, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS || flag) // done (or dead): forget it
            c->orphans[i] = c->orphans[--c->n_orphans];
        else
            i++;
    }
    if (c->n_orphans == 0) // nothing can read the copies any more
        free_stashes(c);
}

// Frees the send copies handed to it, at MPI_Finalize (when MPI_COMM_SELF's attributes go).
static int free_at_finalize(MPI_Comm comm, int key, void *value, void *extra) {
    (void)comm;
    (void)extra;
    void **list = value;
    for (size_t i = 0; list[i]; i++)
        free(list[i]);
    free(list);
    MPI_Comm_free_keyval(&key);
    return MPI_SUCCESS;
}

// Orphans outlive the comm: their copies stay until MPI_Finalize.
static void stashes_to_finalize(mpi_comm_impl *c) {
    if (c->n_stashes == 0)
        return;
    void **list = malloc((c->n_stashes + 1) * sizeof *list);
    int key = MPI_KEYVAL_INVALID;
    if (!list || MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, free_at_finalize, &key, NULL) !=
                     MPI_SUCCESS) {
        free(list); // cannot hand them on: leak them rather than free memory MPI may read
        c->n_stashes = 0;
        return;
    }
    memcpy(list, c->stashes, c->n_stashes * sizeof *list);
    list[c->n_stashes] = NULL;
    MPI_Comm_set_attr(MPI_COMM_SELF, key, list);
    c->n_stashes = 0;
}

void ctxpar_mpi_release_orphans(mpi_comm_impl *c, double grace_s) {
    double end = ctxpar_now() + grace_s;
    for (;;) {
        poll_orphans(c);
        if (c->n_orphans == 0 || ctxpar_now() > end)
            break;
        sched_yield();
    }
    for (size_t i = 0; i < c->n_orphans; i++)
        MPI_Request_free(&c->orphans[i]);
    if (c->n_orphans > 0) // freed requests may still read their copies
        stashes_to_finalize(c);
    else
        free_stashes(c);
    c->n_orphans = 0;
}

void ctxpar_mpi_poll_background(mpi_comm_impl *c) {
    poll_orphans(c);
    while (c->abort_req != MPI_REQUEST_NULL) {
        int flag = 0;
        MPI_Status st;
        if (MPI_Test(&c->abort_req, &flag, &st) != MPI_SUCCESS || !flag)
            break;
        if (st.MPI_SOURCE >= 0 && st.MPI_SOURCE < c->size)
            c->dead[st.MPI_SOURCE] = 1;
        c->abandoned = 1;
        if (MPI_Irecv(&c->abort_from, 1, MPI_INT, MPI_ANY_SOURCE, ctxpar_mpi_tag(c, KIND_ABORT, 0),
                      c->comm, &c->abort_req) != MPI_SUCCESS)
            c->abort_req = MPI_REQUEST_NULL;
    }
}

/* ---------------------------------------------------------------- completion */

static void sum_reduce_scatter(struct ctxpar_request *req) {
    const mpi_comm_impl *c = req->c;
    size_t count = req->count;
    const float *scratch = (const float *)req->scratch;
    float tile[CTXPAR_MPI_SUM_TILE];
    for (size_t off = 0; off < count; off += CTXPAR_MPI_SUM_TILE) {
        size_t n = count - off < CTXPAR_MPI_SUM_TILE ? count - off : CTXPAR_MPI_SUM_TILE;
        for (int s = 0; s < c->size; s++) {
            const float *src = (s == c->rank ? req->rs_own : scratch + (size_t)s * count) + off;
            if (s == 0)
                memcpy(tile, src, n * sizeof(float));
            else
                for (size_t i = 0; i < n; i++)
                    tile[i] += src[i];
        }
        memcpy(req->rs_out + off, tile, n * sizeof(float));
    }
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

static void reduce_allreduce(struct ctxpar_request *req) {
    const int64_t *all = (const int64_t *)req->scratch;
    for (size_t i = 0; i < req->count; i++) {
        int64_t v = all[i];
        for (int r = 1; r < req->c->size; r++)
            v = combine(v, all[(size_t)r * req->count + i], req->ar_op);
        req->ar_buf[i] = v;
    }
}

// Tests every outstanding message once; finishes the op when all have landed.
static void step(mpi_comm_impl *c, struct ctxpar_request *req) {
    if (req->complete || req->status != CTXPAR_OK)
        return;
    ctxpar_mpi_poll_background(c);
    const char *op = ctxpar_mpi_kind_name(req->kind);
    unsigned long long seq = (unsigned long long)req->seq;
    if (c->aborted) {
        ctxpar_mpi_fail(req, CTXPAR_ERR_REMOTE, "rank %d: %s #%llu: this rank aborted its comm",
                        c->rank, op, seq);
        return;
    }
    int pending = 0;
    for (int i = 0; i < req->n; i++) {
        if (req->req[i] == MPI_REQUEST_NULL)
            continue;
        int flag = 0;
        MPI_Status st;
        int rc = MPI_Test(&req->req[i], &flag, &st);
        if (rc != MPI_SUCCESS) {
            char text[CTXPAR_MPI_MSG_LEN];
            ctxpar_status s = ctxpar_mpi_translate(rc, text, sizeof text);
            ctxpar_mpi_fail(req, s, "rank %d: %s #%llu: the %s with rank %d failed: %s", c->rank,
                            op, seq, req->expect[i] >= 0 ? "receive" : "send", req->peer[i], text);
            return;
        }
        if (!flag) {
            pending = 1;
            continue;
        }
        int got = 0;
        if (req->expect[i] >= 0 && MPI_Get_count(&st, MPI_BYTE, &got) == MPI_SUCCESS &&
            got != req->expect[i]) {
            ctxpar_mpi_fail(req, CTXPAR_ERR_INVALID_USAGE,
                            "rank %d: %s #%llu: rank %d sent a message of %d bytes where %d were "
                            "expected (the ranks disagree on the size)",
                            c->rank, op, seq, req->peer[i], got, req->expect[i]);
            return;
        }
    }
    if (!pending) {
        if (req->kind == KIND_REDUCE_SCATTER)
            sum_reduce_scatter(req);
        else if (req->kind == KIND_ALLREDUCE)
            reduce_allreduce(req);
        req->complete = 1;
        return;
    }
    for (int i = 0; i < req->n; i++) {
        if (req->req[i] != MPI_REQUEST_NULL && c->dead[req->peer[i]]) {
            ctxpar_mpi_fail(req, CTXPAR_ERR_REMOTE, "rank %d: %s #%llu: peer rank %d aborted",
                            c->rank, op, seq, req->peer[i]);
            return;
        }
    }
}

// The message that best names whom we wait for: a receive (its peer has not sent), else a send.
static int first_pending(const struct ctxpar_request *req) {
    int send = -1;
    for (int i = 0; i < req->n; i++) {
        if (req->req[i] == MPI_REQUEST_NULL)
            continue;
        if (req->expect[i] >= 0)
            return i;
        if (send < 0)
            send = i;
    }
    return send;
}

// Ranks whose message of a collective never came (a collective receives from every peer): they
// have not made the call.
static int missing_peers(const struct ctxpar_request *req) {
    int missing = 0;
    for (int i = 0; i < req->n; i++)
        missing += req->req[i] != MPI_REQUEST_NULL && req->expect[i] >= 0;
    return missing;
}

// Yields the core first (ranks are often oversubscribed), then sleeps briefly.
static void backoff(int *spins) {
    if ((*spins)++ < 100) {
        sched_yield();
        return;
    }
    struct timespec ts = {0, 50 * 1000};
    nanosleep(&ts, NULL);
}

ctxpar_status ctxpar_mpi_wait(mpi_comm_impl *c, struct ctxpar_request *req) {
    double timeout_s = c->base->timeout_s;
    double deadline = ctxpar_now() + timeout_s;
    int spins = 0;
    for (;;) {
        step(c, req);
        if (req->complete || req->status != CTXPAR_OK)
            break;
        if (ctxpar_now() > deadline) {
            int i = first_pending(req); // >= 0: the request is not complete
            char hint[160] = "";
            if (req->kind != KIND_SENDRECV)
                snprintf(hint, sizeof hint,
                         "; %d of %d ranks made this call: every rank of the comm must make the "
                         "same calls in the same order",
                         c->size - missing_peers(req), c->size);
            ctxpar_mpi_fail(req, CTXPAR_ERR_TIMEOUT,
                            "%s #%llu timed out after %g s: rank %d waited for rank %d to %s%s",
                            ctxpar_mpi_kind_name(req->kind), (unsigned long long)req->seq,
                            timeout_s, c->rank, i >= 0 ? req->peer[i] : -1,
                            i >= 0 && req->expect[i] < 0 ? "receive" : "send", hint);
            break;
        }
        backoff(&spins);
    }
    ctxpar_status st = req->status;
    char msg[CTXPAR_MPI_MSG_LEN];
    snprintf(msg, sizeof msg, "%s", req->msg);
    ctxpar_mpi_retire(c, req);
    if (st != CTXPAR_OK)
        return CTXPAR_ERROR(st, "%s", msg);
    return CTXPAR_OK;
}

ctxpar_status ctxpar_mpi_test(mpi_comm_impl *c, struct ctxpar_request *req, int *done_out) {
    step(c, req);
    *done_out = req->complete || req->status != CTXPAR_OK;
    return CTXPAR_OK;
}

void ctxpar_mpi_retire(mpi_comm_impl *c, struct ctxpar_request *req) {
    int outstanding = 0;
    for (int i = 0; i < req->used; i++) {
        if (req->req[i] != MPI_REQUEST_NULL) {
            MPI_Cancel(&req->req[i]);
            outstanding = 1;
        }
    }
    if (outstanding || req->status != CTXPAR_OK)
        c->abandoned = 1;
    // Receives report their cancellation at once; sends Open MPI cannot cancel, so do not wait
    // for them beyond what the receives take.
    double end = ctxpar_now() + CTXPAR_MPI_CANCEL_GRACE_S;
    while (outstanding) {
        int recv_pending = 0;
        for (int i = 0; i < req->used; i++) {
            if (req->req[i] == MPI_REQUEST_NULL)
                continue;
            int flag = 0;
            if (MPI_Test(&req->req[i], &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS &&
                MPI_Request_free(&req->req[i]) != MPI_SUCCESS) // completed with an error
                req->req[i] = MPI_REQUEST_NULL;
            else if (!flag && req->expect[i] >= 0)
                recv_pending = 1;
        }
        if (!recv_pending || ctxpar_now() > end)
            break;
        sched_yield();
    }
    int orphaned = 0;
    for (int i = 0; i < req->used; i++)
        if (req->req[i] != MPI_REQUEST_NULL) {
            ctxpar_mpi_add_orphan(c, req->req[i]);
            orphaned = 1;
        }
    // The copies of this request's sends: the comm keeps them while an orphan may read them.
    for (int i = 0; i < req->n_stash; i++) {
        if (orphaned)
            adopt_stash(c, req->stash[i]);
        else
            free(req->stash[i]);
    }
    if (req->prev || c->live == req) { // registered by ctxpar_mpi_start
        if (req->prev)
            req->prev->next = req->next;
        else
            c->live = req->next;
        if (req->next)
            req->next->prev = req->prev;
    }
    free(req);
}
