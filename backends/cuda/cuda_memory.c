// Memory ops of the CUDA device: allocation, copies and memset.
#include "cuda_internal.h"

// Device memory comes from the device's pool on its own stream, then that stream is synchronised
// so that any stream may use the buffer. Freeing first waits for the whole device: the op has
// no stream, and work on any stream may still read the buffer (cudaFree would wait the same
// way); the memory then returns to the pool, not to the driver, so the next alloc is cheap.
ctxpar_status ctxpar_cuda_alloc(struct ctxpar_device *dev, size_t bytes, ctxpar_mem_kind kind,
                                void **ptr_out) {
    ctxpar_cuda_impl *impl = ctxpar_cuda_impl_of(dev);
    CTXPAR_CHECK(ctxpar_cuda_enter(dev));
    void *p = NULL;
    if (kind == CTXPAR_MEM_HOST) {
        CTXPAR_CUDA_CHECK(cudaMallocHost(&p, bytes));
    } else if (kind == CTXPAR_MEM_DEVICE) {
        CTXPAR_CHECK(ctxpar_cuda_scratch_alloc(dev, bytes, impl->util_stream, &p));
        cudaError_t e = cudaStreamSynchronize(impl->util_stream);
        if (e != cudaSuccess) {
            ctxpar_cuda_scratch_free(dev, p, impl->util_stream);
            return ctxpar_cuda_fail(e, __FILE__, __LINE__, "cudaStreamSynchronize(alloc)");
        }
    } else {
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "kind (%d) is not a ctxpar_mem_kind",
                            (int)kind);
    }
    *ptr_out = p;
    return CTXPAR_OK;
}

void ctxpar_cuda_free(struct ctxpar_device *dev, void *ptr, ctxpar_mem_kind kind) {
    if (!ptr || ctxpar_cuda_enter(dev) != CTXPAR_OK)
        return;
    if (kind == CTXPAR_MEM_HOST) {
        (void)cudaFreeHost(ptr); // waits for the device itself
        return;
    }
    ctxpar_cuda_impl *impl = ctxpar_cuda_impl_of(dev);
    (void)cudaDeviceSynchronize();
    ctxpar_cuda_scratch_free(dev, ptr, impl->util_stream);
}

ctxpar_status ctxpar_cuda_copy(struct ctxpar_device *dev, void *dst, const void *src, size_t bytes,
                               ctxpar_copy_kind kind, ctxpar_stream *stream) {
    enum cudaMemcpyKind k;
    switch (kind) {
    case CTXPAR_COPY_D2D:
        k = cudaMemcpyDeviceToDevice;
        break;
    case CTXPAR_COPY_H2D:
        k = cudaMemcpyHostToDevice;
        break;
    case CTXPAR_COPY_D2H:
        k = cudaMemcpyDeviceToHost;
        break;
    case CTXPAR_COPY_H2H:
        k = cudaMemcpyHostToHost;
        break;
    default:
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "kind (%d) is not a ctxpar_copy_kind",
                            (int)kind);
    }
    if (bytes && (!dst || !src))
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG,
                            "copy of %zu bytes: dst (%p) and src (%p) "
                            "must be set",
                            bytes, dst, src);
    CTXPAR_CHECK(ctxpar_cuda_enter(dev));
    CTXPAR_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, k, ctxpar_cuda_stream_of(stream)));
    return CTXPAR_OK;
}

ctxpar_status ctxpar_cuda_memset(struct ctxpar_device *dev, void *dst, int value, size_t bytes,
                                 ctxpar_stream *stream) {
    if (bytes && !dst)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "memset of %zu bytes: dst is NULL", bytes);
    CTXPAR_CHECK(ctxpar_cuda_enter(dev));
    CTXPAR_CUDA_CHECK(cudaMemsetAsync(dst, value, bytes, ctxpar_cuda_stream_of(stream)));
    return CTXPAR_OK;
}
