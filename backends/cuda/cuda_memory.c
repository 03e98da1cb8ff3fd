// Memory ops of the CUDA device: allocation, copies and memset.
#include "cuda_internal.h"

// Device memory comes from the device's pool on alloc_stream, which is then synchronised so
// that any stream may use the buffer (alloc_stream carries nothing else: the wait is only for
// the allocation, or for earlier work on memory the pool hands out again).
// Freeing never blocks the host: the op has no stream, and work on any stream may still use the
// buffer, so the release is enqueued on util_stream after a fence on every stream of the device
// and on the legacy stream (ctxpar_cuda_fence_util); the pool reuses the memory once that work
// is done. Without a pool, cudaMalloc and cudaFree (which waits for the device itself).
ctxpar_status ctxpar_cuda_alloc(struct ctxpar_device *dev, size_t bytes, ctxpar_mem_kind kind,
                                void **ptr_out) {
    ctxpar_cuda_impl *impl = ctxpar_cuda_impl_of(dev);
    CTXPAR_CHECK(ctxpar_cuda_enter(dev));
    void *p = NULL;
    if (kind == CTXPAR_MEM_HOST) {
        CTXPAR_CUDA_CHECK(cudaMallocHost(&p, bytes));
    } else if (kind == CTXPAR_MEM_DEVICE) {
        CTXPAR_CHECK(ctxpar_cuda_scratch_alloc(dev, bytes, impl->alloc_stream, &p));
        cudaError_t e = impl->pool ? cudaStreamSynchronize(impl->alloc_stream) : cudaSuccess;
        if (e != cudaSuccess) {
            (void)ctxpar_cuda_scratch_free(dev, p, impl->alloc_stream); // the sync's error wins
            return ctxpar_cuda_fail(e, __FILE__, __LINE__, "cudaStreamSynchronize(alloc)");
        }
    } else {
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "kind (%d) is not a ctxpar_mem_kind",
                            (int)kind);
    }
    *ptr_out = p;
    return CTXPAR_OK;
}

ctxpar_status ctxpar_cuda_free(struct ctxpar_device *dev, void *ptr, ctxpar_mem_kind kind) {
    if (!ptr)
        return CTXPAR_OK;
    CTXPAR_CHECK(ctxpar_cuda_enter(dev));
    if (kind == CTXPAR_MEM_HOST) {
        CTXPAR_CUDA_CHECK(cudaFreeHost(ptr)); // pinned host memory: waits for the device itself
        return CTXPAR_OK;
    }
    ctxpar_cuda_impl *impl = ctxpar_cuda_impl_of(dev);
    ctxpar_status fence = impl->pool ? ctxpar_cuda_fence_util(dev) : CTXPAR_OK;
    if (fence != CTXPAR_OK) {
        // The fence could not be enqueued (a broken context): wait for the device's streams
        // here, the one case where a free blocks, rather than release memory still in use. The
        // fence's failure is the result (the release's own would say less).
        ctxpar_cuda_drain(impl);
        (void)ctxpar_cuda_scratch_free(dev, ptr, impl->util_stream);
        return fence;
    }
    return ctxpar_cuda_scratch_free(dev, ptr, impl->util_stream);
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
