// The NCCL comm: construction, destruction, the ops table, and the failure handling shared by
// its operations (errors, settling non-blocking calls, polling with the timeout, abort).
#define _POSIX_C_SOURCE 200809L
#include <stdlib.h>
#include <time.h>

#include "backends/cuda/cuda_stream.h"
#include "ctxpar_cuda.h"
#include "nccl_internal.h"

static const struct ctxpar_comm_ops nccl_ops;

ctxpar_status ctxpar_nccl_fail(nccl_impl *im, ncclResult_t r, const char *file, int line,
                               const char *what) {
    const char *detail = im && im->nccl && !im->aborted ? ncclGetLastError(im->nccl) : NULL;
    ctxpar_status st = r == ncclRemoteError ? CTXPAR_ERR_REMOTE : CTXPAR_ERR_COMM;
    return ctxpar_set_error(st, file, line, "%s failed: %s%s%s", what, ncclGetErrorString(r),
                            detail && detail[0] ? ": " : "", detail ? detail : "");
}

ctxpar_status ctxpar_nccl_cuda_fail(cudaError_t e, const char *file, int line, const char *what) {
    return ctxpar_set_error(CTXPAR_ERR_DEVICE, file, line, "%s failed: %s (%s)", what,
                            cudaGetErrorString(e), cudaGetErrorName(e));
}

void ctxpar_nccl_abort_now(nccl_impl *im) {
    if (im->aborted)
        return;
    (void)ncclCommAbort(im->nccl);
    im->aborted = 1;
}

static void nap(void) {
    struct timespec ts = {0, 50 * 1000}; // 50 us: far below any timeout, cheap on the host
    nanosleep(&ts, NULL);
}

ctxpar_status ctxpar_nccl_ready(struct ctxpar_comm *comm) {
    nccl_impl *im = ctxpar_nccl_impl_of(comm);
    if (im->aborted)
        return CTXPAR_ERROR(CTXPAR_ERR_COMM,
                            "rank %d: the NCCL communicator was aborted after an "
                            "earlier failure; make a new one",
                            comm->rank);
    CTXPAR_NCCL_CUDA_CHECK(cudaSetDevice(im->ordinal));
    ncclResult_t async = ncclSuccess;
    ncclResult_t r = ncclCommGetAsyncError(im->nccl, &async);
    if (r != ncclSuccess)
        return ctxpar_nccl_fail(im, r, __FILE__, __LINE__, "ncclCommGetAsyncError");
    if (async != ncclSuccess && async != ncclInProgress) {
        ctxpar_status st = ctxpar_nccl_fail(im, async, __FILE__, __LINE__, "an earlier transfer");
        ctxpar_nccl_abort_now(im);
        return st;
    }
    return CTXPAR_OK;
}

ctxpar_status ctxpar_nccl_settle(struct ctxpar_comm *comm, ncclResult_t r, const char *what) {
    nccl_impl *im = ctxpar_nccl_impl_of(comm);
    const double deadline = ctxpar_now() + comm->timeout_s;
    while (r == ncclInProgress) {
        if (ctxpar_now() > deadline) {
            ctxpar_nccl_abort_now(im);
            return CTXPAR_ERROR(CTXPAR_ERR_TIMEOUT,
                                "rank %d: %s did not complete within %g s; "
                                "the NCCL communicator was aborted",
                                comm->rank, what, comm->timeout_s);
        }
        nap();
        ncclResult_t q = ncclCommGetAsyncError(im->nccl, &r);
        if (q != ncclSuccess)
            r = q;
    }
    if (r != ncclSuccess) {
        ctxpar_status st = ctxpar_nccl_fail(im, r, __FILE__, __LINE__, what);
        ctxpar_nccl_abort_now(im);
        return st;
    }
    return CTXPAR_OK;
}

// Polls `event` within the timeout; on failure returns the status class and the NCCL or CUDA
// code behind it, recording no message.
static ctxpar_status wait_event(struct ctxpar_comm *comm, cudaEvent_t event, ncclResult_t *nccl_r,
                                cudaError_t *cuda_e) {
    nccl_impl *im = ctxpar_nccl_impl_of(comm);
    const double deadline = ctxpar_now() + comm->timeout_s;
    for (;;) {
        cudaError_t e = cudaEventQuery(event);
        if (e == cudaSuccess)
            return CTXPAR_OK;
        if (e != cudaErrorNotReady) {
            *cuda_e = e;
            return CTXPAR_ERR_DEVICE;
        }
        ncclResult_t async = ncclSuccess;
        ncclResult_t r = ncclCommGetAsyncError(im->nccl, &async);
        if (r == ncclSuccess)
            r = async;
        if (r != ncclSuccess && r != ncclInProgress) {
            *nccl_r = r;
            return r == ncclRemoteError ? CTXPAR_ERR_REMOTE : CTXPAR_ERR_COMM;
        }
        if (ctxpar_now() > deadline)
            return CTXPAR_ERR_TIMEOUT;
        nap();
    }
}

ctxpar_status ctxpar_nccl_poll(struct ctxpar_comm *comm, cudaEvent_t event, const char *what) {
    nccl_impl *im = ctxpar_nccl_impl_of(comm);
    ncclResult_t r = ncclSuccess;
    cudaError_t e = cudaSuccess;
    ctxpar_status st = wait_event(comm, event, &r, &e);
    if (st == CTXPAR_OK)
        return CTXPAR_OK;
    if (st == CTXPAR_ERR_DEVICE)
        return ctxpar_nccl_cuda_fail(e, __FILE__, __LINE__, "cudaEventQuery");
    if (st == CTXPAR_ERR_TIMEOUT)
        st = CTXPAR_ERROR(CTXPAR_ERR_TIMEOUT,
                          "rank %d: %s: no peer arrived within %g s; the NCCL "
                          "communicator was aborted",
                          comm->rank, what, comm->timeout_s);
    else
        st = ctxpar_nccl_fail(im, r, __FILE__, __LINE__, what);
    ctxpar_nccl_abort_now(im);
    return st;
}

void ctxpar_nccl_drain(struct ctxpar_comm *comm, cudaEvent_t event) {
    nccl_impl *im = ctxpar_nccl_impl_of(comm);
    ncclResult_t r = ncclSuccess;
    cudaError_t e = cudaSuccess;
    if (im->aborted || cudaSetDevice(im->ordinal) != cudaSuccess)
        return;
    ctxpar_status st = wait_event(comm, event, &r, &e);
    if (st == CTXPAR_ERR_TIMEOUT || st == CTXPAR_ERR_REMOTE || st == CTXPAR_ERR_COMM)
        ctxpar_nccl_abort_now(im);
}

static void release(nccl_impl *im) {
    if (!im)
        return;
    (void)cudaSetDevice(im->ordinal);
    if (im->owns_nccl && !im->aborted) // an aborted communicator is already freed
        (void)ncclCommDestroy(im->nccl);
    if (im->small_dev)
        (void)cudaFree(im->small_dev);
    if (im->small_host)
        (void)cudaFreeHost(im->small_host);
    if (im->after)
        (void)cudaEventDestroy(im->after);
    if (im->blocking_done)
        (void)cudaEventDestroy(im->blocking_done);
    ctxpar_dev_stream_destroy(im->dev, im->stream);
    free(im);
}

static void nccl_destroy(struct ctxpar_comm *comm) {
    nccl_impl *im = ctxpar_nccl_impl_of(comm);
    // Transfers still in flight read and write the caller's buffers: let them finish (or abort
    // the communicator when peers never come) before the stream goes.
    if (!im->aborted && cudaSetDevice(im->ordinal) == cudaSuccess &&
        cudaEventRecord(im->blocking_done, im->cs) == cudaSuccess)
        ctxpar_nccl_drain(comm, im->blocking_done);
    release(im);
}

static ctxpar_status setup(nccl_impl *im) {
    CTXPAR_NCCL_CUDA_CHECK(cudaSetDevice(im->ordinal));
    CTXPAR_CHECK(ctxpar_dev_stream_create(im->dev, &im->stream));
    im->cs = ctxpar_cuda_stream_of(im->stream);
    CTXPAR_NCCL_CUDA_CHECK(cudaEventCreateWithFlags(&im->after, cudaEventDisableTiming));
    CTXPAR_NCCL_CUDA_CHECK(cudaEventCreateWithFlags(&im->blocking_done, cudaEventDisableTiming));
    im->small_cap = 16;
    CTXPAR_NCCL_CUDA_CHECK(cudaMalloc((void **)&im->small_dev, im->small_cap * sizeof(int64_t)));
    CTXPAR_NCCL_CUDA_CHECK(
        cudaMallocHost((void **)&im->small_host, im->small_cap * sizeof(int64_t)));
    return CTXPAR_OK;
}

ctxpar_status ctxpar_comm_create_nccl(ncclComm_t nccl_comm, ctxpar_device *cuda_device,
                                      const ctxpar_nccl_options *options, ctxpar_comm **comm_out) {
    ctxpar_nccl_options opt = CTXPAR_NCCL_OPTIONS_INIT;
    if (!nccl_comm || !comm_out)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "nccl_comm (%p) and comm_out (%p) must be set",
                            (void *)nccl_comm, (void *)comm_out);
    if (options) {
        if (options->struct_size < sizeof(ctxpar_nccl_options))
            return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG,
                                "options->struct_size (%zu) is too small: "
                                "use CTXPAR_NCCL_OPTIONS_INIT",
                                options->struct_size);
        opt.rank_order_reduce = options->rank_order_reduce != 0;
        opt.host_wait = options->host_wait != 0;
    }
    int ordinal = -1, nccl_dev = -1, rank = -1, size = 0;
    CTXPAR_CHECK(ctxpar_cuda_device_ordinal(cuda_device, &ordinal));
    ncclResult_t r = ncclCommCuDevice(nccl_comm, &nccl_dev);
    if (r == ncclSuccess)
        r = ncclCommUserRank(nccl_comm, &rank);
    if (r == ncclSuccess)
        r = ncclCommCount(nccl_comm, &size);
    if (r != ncclSuccess)
        return ctxpar_nccl_fail(NULL, r, __FILE__, __LINE__, "querying the NCCL communicator");
    if (nccl_dev != ordinal)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG,
                            "nccl_comm runs on GPU %d but cuda_device is "
                            "GPU %d",
                            nccl_dev, ordinal);

    nccl_impl *im = calloc(1, sizeof *im);
    if (!im)
        return CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "cannot allocate the NCCL comm state");
    im->nccl = nccl_comm;
    im->dev = cuda_device;
    im->ordinal = ordinal;
    im->rank_order_reduce = opt.rank_order_reduce;
    im->host_wait = opt.host_wait;
    ctxpar_status st = setup(im);
    if (st == CTXPAR_OK)
        st = ctxpar_comm_create(&nccl_ops, im, rank, size, comm_out);
    if (st != CTXPAR_OK)
        release(im);
    return st;
}

ctxpar_status ctxpar_nccl_comm_aborted(const ctxpar_comm *comm, int *aborted_out) {
    if (!comm || comm->ops != &nccl_ops || !aborted_out)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG,
                            "comm (%p) must be an NCCL comm and "
                            "aborted_out (%p) set",
                            (const void *)comm, (void *)aborted_out);
    *aborted_out = ((const nccl_impl *)comm->impl)->aborted;
    return CTXPAR_OK;
}

static const struct ctxpar_comm_ops nccl_ops = {
    .version = CTXPAR_COMM_OPS_VERSION,
    .struct_size = sizeof(struct ctxpar_comm_ops),
    .name = "nccl",
    .destroy = nccl_destroy,
    .sendrecv = ctxpar_nccl_sendrecv,
    .allgather = ctxpar_nccl_allgather,
    .reduce_scatter = ctxpar_nccl_reduce_scatter,
    .alltoall = ctxpar_nccl_alltoall,
    .wait = ctxpar_nccl_wait,
    .cancel = ctxpar_nccl_cancel,
    .allreduce_i64 = ctxpar_nccl_allreduce_i64,
    .barrier = ctxpar_nccl_barrier,
    .test = ctxpar_nccl_test,
    .abort = ctxpar_nccl_abort,
    .split = ctxpar_nccl_split,
};
