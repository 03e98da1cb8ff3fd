// The small blocking operations of the NCCL comm: they run on the comm stream and the host polls
// for them with the comm's timeout, so that a missing peer cannot hang the caller.
#include "nccl_internal.h"

// Room for count values in the small buffers (they only grow; counts are tiny in practice).
static ctxpar_status reserve(nccl_impl *im, size_t count) {
    if (count <= im->small_cap)
        return CTXPAR_OK;
    // Nothing of ours is in flight on these buffers: every blocking op completed before it
    // returned.
    (void)cudaFree(im->small_dev);
    (void)cudaFreeHost(im->small_host);
    im->small_dev = NULL;
    im->small_host = NULL;
    im->small_cap = 0;
    CTXPAR_NCCL_CUDA_CHECK(cudaMalloc((void **)&im->small_dev, count * sizeof(int64_t)));
    CTXPAR_NCCL_CUDA_CHECK(cudaMallocHost((void **)&im->small_host, count * sizeof(int64_t)));
    im->small_cap = count;
    return CTXPAR_OK;
}

static ctxpar_status to_nccl_op(ctxpar_reduce_op op, ncclRedOp_t *out) {
    switch (op) {
    case CTXPAR_REDUCE_SUM:
        *out = ncclSum;
        return CTXPAR_OK;
    case CTXPAR_REDUCE_MIN:
        *out = ncclMin;
        return CTXPAR_OK;
    case CTXPAR_REDUCE_MAX:
        *out = ncclMax;
        return CTXPAR_OK;
    }
    return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "op (%d) is not a ctxpar_reduce_op", (int)op);
}

ctxpar_status ctxpar_nccl_allreduce_i64(struct ctxpar_comm *comm, int64_t *buf, size_t count,
                                        ctxpar_reduce_op op) {
    nccl_impl *im = ctxpar_nccl_impl_of(comm);
    ncclRedOp_t nop = ncclSum;
    CTXPAR_CHECK(to_nccl_op(op, &nop));
    if (count == 0) // buf and op were checked by the dispatch
        return CTXPAR_OK;
    CTXPAR_CHECK(ctxpar_nccl_ready(comm));
    CTXPAR_CHECK(reserve(im, count));
    const size_t bytes = count * sizeof(int64_t);
    for (size_t i = 0; i < count; i++)
        im->small_host[i] = buf[i];
    CTXPAR_NCCL_CUDA_CHECK(
        cudaMemcpyAsync(im->small_dev, im->small_host, bytes, cudaMemcpyHostToDevice, im->cs));
    CTXPAR_CHECK(ctxpar_nccl_settle(
        comm, ncclAllReduce(im->small_dev, im->small_dev, count, ncclInt64, nop, im->nccl, im->cs),
        "ncclAllReduce"));
    CTXPAR_NCCL_CUDA_CHECK(
        cudaMemcpyAsync(im->small_host, im->small_dev, bytes, cudaMemcpyDeviceToHost, im->cs));
    CTXPAR_NCCL_CUDA_CHECK(cudaEventRecord(im->blocking_done, im->cs));
    CTXPAR_CHECK(ctxpar_nccl_poll(comm, im->blocking_done, "allreduce_i64"));
    for (size_t i = 0; i < count; i++)
        buf[i] = im->small_host[i];
    return CTXPAR_OK;
}

// NCCL has no barrier: an all-reduce of one value stands in for it.
ctxpar_status ctxpar_nccl_barrier(struct ctxpar_comm *comm) {
    int64_t token = 0;
    return ctxpar_nccl_allreduce_i64(comm, &token, 1, CTXPAR_REDUCE_SUM);
}

void ctxpar_nccl_abort(struct ctxpar_comm *comm) {
    ctxpar_nccl_abort_now(ctxpar_nccl_impl_of(comm));
}
