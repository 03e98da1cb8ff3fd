// The nonblocking transfers of the NCCL comm. Each one: the comm stream waits for the work
// already on the caller's stream, the NCCL calls go on the comm stream as one group, an event
// marks their end; wait makes the caller's stream wait for that event. Arguments (buffers,
// overlap, peers, size overflow, req_out) were checked by the dispatch (dispatch/dispatch_comm.c).
#include <stdlib.h>

#include "backends/cuda/cuda_stream.h"
#include "nccl_internal.h"

// Orders the comm stream after `stream` and makes the request that the transfer will complete.
static ctxpar_status begin(struct ctxpar_comm *comm, ctxpar_stream *stream,
                           ctxpar_request **req_out) {
    nccl_impl *im = ctxpar_nccl_impl_of(comm);
    CTXPAR_CHECK(ctxpar_nccl_ready(comm));
    // One event serves every transfer: a wait captures the record made just before it.
    CTXPAR_NCCL_CUDA_CHECK(cudaEventRecord(im->after, ctxpar_cuda_stream_of(stream)));
    CTXPAR_NCCL_CUDA_CHECK(cudaStreamWaitEvent(im->cs, im->after, 0));
    ctxpar_request *req = calloc(1, sizeof *req);
    if (!req)
        return CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "cannot allocate a request");
    cudaError_t e = cudaEventCreateWithFlags(&req->done, cudaEventDisableTiming);
    if (e != cudaSuccess) {
        free(req);
        return ctxpar_nccl_cuda_fail(e, __FILE__, __LINE__, "cudaEventCreateWithFlags");
    }
    *req_out = req;
    return CTXPAR_OK;
}

static void free_request(ctxpar_request *req) {
    (void)cudaEventDestroy(req->done); // released by the driver once the event has completed
    free(req);
}

// Marks the end of the transfer, or frees the request when enqueueing it failed.
static ctxpar_status finish(struct ctxpar_comm *comm, ctxpar_status st, ctxpar_request **req) {
    nccl_impl *im = ctxpar_nccl_impl_of(comm);
    if (st == CTXPAR_OK) {
        cudaError_t e = cudaEventRecord((*req)->done, im->cs);
        if (e != cudaSuccess)
            st = ctxpar_nccl_cuda_fail(e, __FILE__, __LINE__, "cudaEventRecord");
    }
    if (st != CTXPAR_OK) {
        free_request(*req);
        *req = NULL;
    }
    return st;
}

// ncclGroupEnd for a group whose members returned r_members (the first failure wins).
static ctxpar_status end_group(struct ctxpar_comm *comm, ncclResult_t r_members, const char *what) {
    ncclResult_t r = ncclGroupEnd(); // always closes the group, even after a failed member
    if (r_members != ncclSuccess && r_members != ncclInProgress)
        r = r_members;
    return ctxpar_nccl_settle(comm, r, what);
}

static ncclResult_t first(ncclResult_t so_far, ncclResult_t r) {
    return so_far != ncclSuccess && so_far != ncclInProgress ? so_far : r;
}

ctxpar_status ctxpar_nccl_sendrecv(struct ctxpar_comm *comm, const void *sendbuf, size_t send_bytes,
                                   int dst, void *recvbuf, size_t recv_bytes, int src, int tag,
                                   ctxpar_stream *stream, ctxpar_request **req_out) {
    (void)tag; // NCCL delivers in order and never drops: tags need no matching here
    nccl_impl *im = ctxpar_nccl_impl_of(comm);
    const int do_send = dst >= 0 && send_bytes > 0, do_recv = src >= 0 && recv_bytes > 0;
    ctxpar_request *req = NULL;
    CTXPAR_CHECK(begin(comm, stream, &req));
    ctxpar_status st = CTXPAR_OK;
    if (do_send || do_recv) {
        ncclResult_t r = ncclGroupStart();
        if (do_send)
            r = first(r, ncclSend(sendbuf, send_bytes, ncclUint8, dst, im->nccl, im->cs));
        if (do_recv)
            r = first(r, ncclRecv(recvbuf, recv_bytes, ncclUint8, src, im->nccl, im->cs));
        st = end_group(comm, r, "ncclSend/ncclRecv");
    }
    CTXPAR_CHECK(finish(comm, st, &req));
    *req_out = req;
    return CTXPAR_OK;
}

ctxpar_status ctxpar_nccl_allgather(struct ctxpar_comm *comm, const void *sendbuf, void *recvbuf,
                                    size_t bytes, ctxpar_stream *stream, ctxpar_request **req_out) {
    nccl_impl *im = ctxpar_nccl_impl_of(comm);
    ctxpar_request *req = NULL;
    CTXPAR_CHECK(begin(comm, stream, &req));
    ctxpar_status st = CTXPAR_OK;
    if (bytes)
        st = ctxpar_nccl_settle(comm,
                                ncclAllGather(sendbuf, recvbuf, bytes, ncclUint8, im->nccl, im->cs),
                                "ncclAllGather");
    CTXPAR_CHECK(finish(comm, st, &req));
    *req_out = req;
    return CTXPAR_OK;
}

// Block j of sendbuf to rank j, block i of recvbuf from rank i; this rank's own block is a
// device copy. Enqueued on the comm stream as one group.
static ctxpar_status exchange(struct ctxpar_comm *comm, const void *sendbuf, void *recvbuf,
                              size_t bytes) {
    nccl_impl *im = ctxpar_nccl_impl_of(comm);
    const char *s = sendbuf;
    char *r = recvbuf;
    const size_t me = (size_t)comm->rank;
    CTXPAR_NCCL_CUDA_CHECK(
        cudaMemcpyAsync(r + me * bytes, s + me * bytes, bytes, cudaMemcpyDeviceToDevice, im->cs));
    if (comm->size == 1)
        return CTXPAR_OK;
    ncclResult_t res = ncclGroupStart();
    for (int j = 0; j < comm->size; j++) {
        if (j == comm->rank)
            continue;
        res = first(res, ncclSend(s + (size_t)j * bytes, bytes, ncclUint8, j, im->nccl, im->cs));
        res = first(res, ncclRecv(r + (size_t)j * bytes, bytes, ncclUint8, j, im->nccl, im->cs));
    }
    return end_group(comm, res, "all-to-all ncclSend/ncclRecv");
}

ctxpar_status ctxpar_nccl_alltoall(struct ctxpar_comm *comm, const void *sendbuf, void *recvbuf,
                                   size_t bytes, ctxpar_stream *stream, ctxpar_request **req_out) {
    ctxpar_request *req = NULL;
    CTXPAR_CHECK(begin(comm, stream, &req));
    ctxpar_status st = bytes ? exchange(comm, sendbuf, recvbuf, bytes) : CTXPAR_OK;
    CTXPAR_CHECK(finish(comm, st, &req));
    *req_out = req;
    return CTXPAR_OK;
}

// The contract's deterministic sum: gather every rank's block for this rank (all-to-all into
// scratch), then recvbuf = ((s_0 + s_1) + s_2) + ... on the comm stream, through the device.
static ctxpar_status rank_order_sum(struct ctxpar_comm *comm, const float *sendbuf, float *recvbuf,
                                    size_t count) {
    nccl_impl *im = ctxpar_nccl_impl_of(comm);
    const size_t block = count * sizeof(float);
    float *parts = NULL;
    CTXPAR_NCCL_CUDA_CHECK(cudaMallocAsync((void **)&parts, block * (size_t)comm->size, im->cs));
    ctxpar_status st = exchange(comm, sendbuf, parts, block);
    if (st == CTXPAR_OK)
        st = ctxpar_dev_copy(im->dev, recvbuf, parts, block, CTXPAR_COPY_D2D, im->stream);
    for (int j = 1; j < comm->size && st == CTXPAR_OK; j++)
        st = ctxpar_dev_add(im->dev, recvbuf, parts + (size_t)j * count, count, im->stream);
    (void)cudaFreeAsync(parts, im->cs); // after the adds, in stream order
    return st;
}

ctxpar_status ctxpar_nccl_reduce_scatter(struct ctxpar_comm *comm, const float *sendbuf,
                                         float *recvbuf, size_t count, ctxpar_stream *stream,
                                         ctxpar_request **req_out) {
    nccl_impl *im = ctxpar_nccl_impl_of(comm);
    ctxpar_request *req = NULL;
    CTXPAR_CHECK(begin(comm, stream, &req));
    ctxpar_status st = CTXPAR_OK;
    if (count && im->rank_order_reduce)
        st = rank_order_sum(comm, sendbuf, recvbuf, count);
    else if (count)
        st = ctxpar_nccl_settle(
            comm, ncclReduceScatter(sendbuf, recvbuf, count, ncclFloat, ncclSum, im->nccl, im->cs),
            "ncclReduceScatter");
    CTXPAR_CHECK(finish(comm, st, &req));
    *req_out = req;
    return CTXPAR_OK;
}

ctxpar_status ctxpar_nccl_wait(struct ctxpar_comm *comm, ctxpar_request *req,
                               ctxpar_stream *stream) {
    nccl_impl *im = ctxpar_nccl_impl_of(comm);
    ctxpar_status st = CTXPAR_OK;
    if (im->aborted) {
        st = CTXPAR_ERROR(CTXPAR_ERR_COMM,
                          "rank %d: the NCCL communicator was aborted; the "
                          "transfer did not complete",
                          comm->rank);
    } else {
        cudaError_t e = cudaSetDevice(im->ordinal);
        if (e == cudaSuccess)
            e = cudaStreamWaitEvent(ctxpar_cuda_stream_of(stream), req->done, 0);
        st = e == cudaSuccess ? ctxpar_nccl_ready(comm)
                              : ctxpar_nccl_cuda_fail(e, __FILE__, __LINE__, "cudaStreamWaitEvent");
        // Bounded: a transfer that never completes ends in TIMEOUT (and an aborted
        // communicator), not in a stream that never drains.
        if (st == CTXPAR_OK && im->host_wait)
            st = ctxpar_nccl_poll(comm, req->done, "wait for a transfer");
    }
    free_request(req);
    return st;
}

ctxpar_status ctxpar_nccl_test(struct ctxpar_comm *comm, ctxpar_request *req, int *done_out) {
    CTXPAR_CHECK(ctxpar_nccl_ready(comm));
    cudaError_t e = cudaEventQuery(req->done);
    if (e != cudaSuccess && e != cudaErrorNotReady)
        return ctxpar_nccl_cuda_fail(e, __FILE__, __LINE__, "cudaEventQuery");
    *done_out = e == cudaSuccess;
    return CTXPAR_OK;
}

void ctxpar_nccl_cancel(struct ctxpar_comm *comm, ctxpar_request *req) {
    // NCCL cannot take back an enqueued transfer: wait for it within the timeout, else abort the
    // communicator, which stops it. Either way its buffers are free when this returns.
    ctxpar_nccl_drain(comm, req->done);
    free_request(req);
}
