// Splitting an NCCL comm with ncclCommSplit (NCCL >= 2.18). ncclCommSplit itself has no
// deadline: a barrier through this comm's own ops first honours the timeout, and the new
// communicator (non-blocking when the parent is) is polled within it, so a missing peer gives
// TIMEOUT and a failed one REMOTE or COMM, as for every other op.
#define _POSIX_C_SOURCE 200809L
#include <time.h>

#include "nccl_internal.h"

// Polls a new communicator's initialisation within the parent's timeout; aborts it on failure.
static ctxpar_status settle_new(struct ctxpar_comm *parent, ncclComm_t sub, ncclResult_t r) {
    const double deadline = ctxpar_now() + parent->timeout_s;
    while (r == ncclInProgress) {
        if (ctxpar_now() > deadline) {
            (void)ncclCommAbort(sub);
            return CTXPAR_ERROR(CTXPAR_ERR_TIMEOUT,
                                "rank %d: ncclCommSplit did not complete within %g s", parent->rank,
                                parent->timeout_s);
        }
        struct timespec ts = {0, 50 * 1000};
        nanosleep(&ts, NULL);
        ncclResult_t q = ncclCommGetAsyncError(sub, &r);
        if (q != ncclSuccess)
            r = q;
    }
    if (r != ncclSuccess) {
        ctxpar_status st = ctxpar_nccl_fail(NULL, r, __FILE__, __LINE__, "ncclCommSplit");
        (void)ncclCommAbort(sub);
        return st;
    }
    return CTXPAR_OK;
}

ctxpar_status ctxpar_nccl_split(struct ctxpar_comm *comm, int color, int key,
                                struct ctxpar_comm **comm_out) {
    nccl_impl *im = ctxpar_nccl_impl_of(comm);
    CTXPAR_CHECK(ctxpar_nccl_barrier(comm));
    CTXPAR_CHECK(ctxpar_nccl_ready(comm));
    ncclComm_t sub = NULL;
    ncclResult_t r =
        ncclCommSplit(im->nccl, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &sub, NULL);
    if (r != ncclSuccess && r != ncclInProgress)
        return ctxpar_nccl_fail(im, r, __FILE__, __LINE__, "ncclCommSplit");
    // The parent's part of the split may still be running (non-blocking communicator).
    CTXPAR_CHECK(ctxpar_nccl_settle(comm, r == ncclInProgress ? ncclInProgress : ncclSuccess,
                                    "ncclCommSplit"));
    if (!sub) {
        *comm_out = NULL;
        return CTXPAR_OK;
    }
    CTXPAR_CHECK(settle_new(comm, sub, r == ncclInProgress ? ncclInProgress : ncclSuccess));
    ctxpar_nccl_options opt = CTXPAR_NCCL_OPTIONS_INIT;
    opt.rank_order_reduce = im->rank_order_reduce;
    opt.host_wait = im->host_wait;
    struct ctxpar_comm *out = NULL;
    ctxpar_status st = ctxpar_comm_create_nccl(sub, im->dev, &opt, &out);
    if (st != CTXPAR_OK) {
        (void)ncclCommDestroy(sub);
        return st;
    }
    ctxpar_nccl_impl_of(out)->owns_nccl = 1;
    *comm_out = out;
    return CTXPAR_OK;
}
