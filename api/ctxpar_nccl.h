/*
 * ctxpar_nccl.h - a comm over NCCL, for ranks that each drive one GPU (a CUDA device from
 * ctxpar_cuda.h).
 *
 * Transfers run on a stream of the comm's own, ordered after the work already enqueued on the
 * caller's stream; waiting on a request makes the caller's stream wait for the transfer on the
 * GPU. By default wait also polls on the host until the transfer is done, so that a peer that
 * never arrives gives CTXPAR_ERR_TIMEOUT after the comm's timeout (ctxpar_comm_set_timeout) and
 * a peer NCCL reports as failed gives CTXPAR_ERR_REMOTE, instead of a GPU stream that never
 * drains (host_wait = 0 trades that for never blocking the host). The small blocking operations
 * (the consistency check, the barrier) always poll with the timeout. On a timeout or a failure
 * the NCCL communicator is aborted (ncclCommAbort), as NCCL requires to get out of a hung
 * operation: the caller must not use or destroy that ncclComm_t afterwards (see
 * ctxpar_nccl_comm_aborted), only ctxpar_comm_destroy the ctxpar comm.
 * NCCL connects peers on their first transfer; a blocking communicator waits for that on the
 * host inside NCCL, outside any timeout. A non-blocking one (ncclConfig_t.blocking = 0) returns
 * ncclInProgress instead, which this comm polls with the timeout too.
 */
#ifndef CTXPAR_NCCL_H
#define CTXPAR_NCCL_H

#include <nccl.h>

#include "ctxpar.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Options for the NCCL comm. Initialise with CTXPAR_NCCL_OPTIONS_INIT. */
typedef struct ctxpar_nccl_options {
    size_t struct_size;
    /* 1 (default): reduce_scatter sums the contributions in rank order 0..P-1, as the comm
     * contract requires for deterministic results (the blocks travel as all-to-all, then are
     * added on the receiving GPU). 0: ncclReduceScatter, faster, summed in NCCL's own order. */
    int rank_order_reduce;
    /* 1 (default): wait returns once the transfer is done on the GPU, or with TIMEOUT / REMOTE
     * (the host blocks; the GPU loses a kernel launch's latency per wait). 0: wait only orders
     * the caller's stream; a dead peer then hangs the next synchronisation of that stream. */
    int host_wait;
} ctxpar_nccl_options;

#define CTXPAR_NCCL_OPTIONS_INIT                                                                   \
    { sizeof(ctxpar_nccl_options), 1, 1 }

/* A comm for this rank on `nccl_comm` (borrowed: the caller initialised it, keeps it and
 * destroys it after ctxpar_comm_destroy, unless the comm aborted it). cuda_device is the device
 * made by ctxpar_device_create_cuda for the GPU of nccl_comm (borrowed, outlives the comm):
 * every buffer passed to the comm is memory of that GPU. options may be NULL. Not collective.
 * Destroy with ctxpar_comm_destroy. */
CTXPAR_API ctxpar_status ctxpar_comm_create_nccl(ncclComm_t nccl_comm, ctxpar_device *cuda_device,
                                                 const ctxpar_nccl_options *options,
                                                 ctxpar_comm **comm_out);

/* Whether the comm aborted its NCCL communicator after a timeout or a peer failure (then the
 * ncclComm_t given at creation is gone). INVALID_ARG for a comm not made by
 * ctxpar_comm_create_nccl. */
CTXPAR_API ctxpar_status ctxpar_nccl_comm_aborted(const ctxpar_comm *comm, int *aborted_out);

#ifdef __cplusplus
}
#endif

#endif /* CTXPAR_NCCL_H */
