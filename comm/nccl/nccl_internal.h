// State of an NCCL comm and the helpers its files share.
#ifndef CTXPAR_NCCL_INTERNAL_H
#define CTXPAR_NCCL_INTERNAL_H

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "ctxpar_backend.h"
#include "ctxpar_nccl.h"

typedef struct nccl_impl {
    ncclComm_t nccl;       // borrowed; invalid once aborted
    ctxpar_device *dev;    // the CUDA device of the buffers (borrowed)
    int ordinal;           // its GPU
    ctxpar_stream *stream; // the comm's stream (a stream of dev)
    cudaStream_t cs;       // ... as a cudaStream_t
    cudaEvent_t after;     // recorded on the caller's stream before each transfer
    cudaEvent_t blocking_done;
    int64_t *small_dev; // device and pinned host buffers of the blocking ops
    int64_t *small_host;
    size_t small_cap; // in int64 values
    int rank_order_reduce;
    int host_wait;
    int aborted;
    int owns_nccl; // made by split: destroyed with the comm
} nccl_impl;

struct ctxpar_request {
    cudaEvent_t done; // recorded on the comm stream after the transfer
};

static inline nccl_impl *ctxpar_nccl_impl_of(struct ctxpar_comm *comm) {
    return (nccl_impl *)comm->impl;
}

// CTXPAR_ERR_COMM (CTXPAR_ERR_REMOTE for ncclRemoteError) naming the call and NCCL's message.
ctxpar_status ctxpar_nccl_fail(nccl_impl *im, ncclResult_t r, const char *file, int line,
                               const char *what);
ctxpar_status ctxpar_nccl_cuda_fail(cudaError_t e, const char *file, int line, const char *what);

#define CTXPAR_NCCL_CUDA_CHECK(call)                                                               \
    do {                                                                                           \
        cudaError_t ctxpar_nccl_ce_ = (call);                                                      \
        if (ctxpar_nccl_ce_ != cudaSuccess)                                                        \
            return ctxpar_nccl_cuda_fail(ctxpar_nccl_ce_, __FILE__, __LINE__, #call);              \
    } while (0)

// Makes the comm's GPU current and fails fast when the communicator is gone or NCCL has
// recorded an asynchronous error.
ctxpar_status ctxpar_nccl_ready(struct ctxpar_comm *comm);

// Completes an NCCL call on a non-blocking communicator (ncclInProgress) within the timeout.
ctxpar_status ctxpar_nccl_settle(struct ctxpar_comm *comm, ncclResult_t r, const char *what);

// Polls `event` until it completes, NCCL reports an error (the communicator is then aborted) or
// comm->timeout_s passes (aborted too: CTXPAR_ERR_TIMEOUT).
ctxpar_status ctxpar_nccl_poll(struct ctxpar_comm *comm, cudaEvent_t event, const char *what);

// Waits for `event` like ctxpar_nccl_poll but records no error (for cleanup paths, which must
// keep the caller's error): whatever stops the wait also aborts the communicator.
void ctxpar_nccl_drain(struct ctxpar_comm *comm, cudaEvent_t event);

// Aborts the communicator once (it no longer runs or touches any buffer afterwards).
void ctxpar_nccl_abort_now(nccl_impl *im);

// The ops, gathered into the table by nccl_comm.c.
ctxpar_status ctxpar_nccl_sendrecv(struct ctxpar_comm *comm, const void *sendbuf, size_t send_bytes,
                                   int dst, void *recvbuf, size_t recv_bytes, int src, int tag,
                                   ctxpar_stream *stream, ctxpar_request **req_out);
ctxpar_status ctxpar_nccl_allgather(struct ctxpar_comm *comm, const void *sendbuf, void *recvbuf,
                                    size_t bytes, ctxpar_stream *stream, ctxpar_request **req_out);
ctxpar_status ctxpar_nccl_reduce_scatter(struct ctxpar_comm *comm, const float *sendbuf,
                                         float *recvbuf, size_t count, ctxpar_stream *stream,
                                         ctxpar_request **req_out);
ctxpar_status ctxpar_nccl_alltoall(struct ctxpar_comm *comm, const void *sendbuf, void *recvbuf,
                                   size_t bytes, ctxpar_stream *stream, ctxpar_request **req_out);
ctxpar_status ctxpar_nccl_wait(struct ctxpar_comm *comm, ctxpar_request *req,
                               ctxpar_stream *stream);
void ctxpar_nccl_cancel(struct ctxpar_comm *comm, ctxpar_request *req);
ctxpar_status ctxpar_nccl_test(struct ctxpar_comm *comm, ctxpar_request *req, int *done_out);
ctxpar_status ctxpar_nccl_allreduce_i64(struct ctxpar_comm *comm, int64_t *buf, size_t count,
                                        ctxpar_reduce_op op);
ctxpar_status ctxpar_nccl_barrier(struct ctxpar_comm *comm);
void ctxpar_nccl_abort(struct ctxpar_comm *comm);
ctxpar_status ctxpar_nccl_split(struct ctxpar_comm *comm, int color, int key,
                                struct ctxpar_comm **comm_out);

#endif // CTXPAR_NCCL_INTERNAL_H
