// Element-wise ops of the CUDA device: cast, add, fill, checksum.
#include "cuda_args.h"

ctxpar_status ctxpar_cuda_cast(struct ctxpar_device *dev, const ctxpar_tensor *src,
                               ctxpar_tensor *dst, ctxpar_stream *stream) {
    CTXPAR_CHECK(ctxpar_cuda_check_tensor("cast", "src", src));
    CTXPAR_CHECK(ctxpar_cuda_check_tensor("cast", "dst", dst)); // shapes: by the dispatch
    if (src->shape[1] == 0)
        return CTXPAR_OK;
    CTXPAR_CHECK(ctxpar_cuda_enter(dev));
    CTXPAR_CUDA_CHECK(ctxpar_cuda_launch_cast(src->data, src->dtype, src->stride, dst->data,
                                              dst->dtype, dst->stride, src->shape,
                                              ctxpar_cuda_stream_of(stream)));
    return CTXPAR_OK;
}

ctxpar_status ctxpar_cuda_add(struct ctxpar_device *dev, float *dst, const float *src, size_t n,
                              ctxpar_stream *stream) {
    (void)n; // n > 0 and the pointers: checked by the dispatch
    CTXPAR_CHECK(ctxpar_cuda_enter(dev));
    CTXPAR_CUDA_CHECK(ctxpar_cuda_launch_add(dst, src, n, ctxpar_cuda_stream_of(stream)));
    return CTXPAR_OK;
}

ctxpar_status ctxpar_cuda_fill(struct ctxpar_device *dev, float *dst, float value, size_t n,
                               ctxpar_stream *stream) {
    CTXPAR_CHECK(ctxpar_cuda_enter(dev));
    CTXPAR_CUDA_CHECK(ctxpar_cuda_launch_fill(dst, value, n, ctxpar_cuda_stream_of(stream)));
    return CTXPAR_OK;
}

// On the device, so a transfer is verified without copying it back. Not the same function as
// the dispatch's host fallback: checksums are only compared between devices of one backend.
ctxpar_status ctxpar_cuda_checksum(struct ctxpar_device *dev, const void *data, size_t bytes,
                                   ctxpar_stream *stream, uint64_t *sum_out) {
    if (!sum_out || (bytes && !data))
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG,
                            "checksum of %zu bytes: data (%p) and "
                            "sum_out (%p) must be set",
                            bytes, data, (void *)sum_out);
    ctxpar_cuda_impl *impl = ctxpar_cuda_impl_of(dev);
    cudaStream_t s = ctxpar_cuda_stream_of(stream);
    CTXPAR_CHECK(ctxpar_cuda_enter(dev));
    CTXPAR_CUDA_CHECK(ctxpar_cuda_launch_checksum(data, bytes, impl->checksum_dev, s));
    CTXPAR_CUDA_CHECK(cudaMemcpyAsync(impl->checksum_host, impl->checksum_dev, sizeof(uint64_t),
                                      cudaMemcpyDeviceToHost, s));
    CTXPAR_CUDA_CHECK(cudaStreamSynchronize(s));
    *sum_out = *impl->checksum_host;
    return CTXPAR_OK;
}
