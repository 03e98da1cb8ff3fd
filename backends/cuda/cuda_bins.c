// The binned-accumulator ops of the CUDA device (reproducible mode, api/ctxpar_bins.h): each
// enqueues one kernel of bins.cu on the caller's stream. Sizes, shapes and buffers are checked by
// the dispatch (dispatch_bins.c), which calls an op only with at least one row.
#include "cuda_bins.h"
#include "cuda_args.h"

ctxpar_status ctxpar_cuda_bins_clear(struct ctxpar_device *dev, void *bins, int64_t rows,
                                     int64_t width, ctxpar_stream *stream) {
    CTXPAR_CHECK(ctxpar_cuda_enter(dev));
    CTXPAR_CUDA_CHECK(
        ctxpar_cuda_launch_bins_clear(bins, rows, width, ctxpar_cuda_stream_of(stream)));
    return CTXPAR_OK;
}

ctxpar_status ctxpar_cuda_bins_add(struct ctxpar_device *dev, void *bins, const float *src,
                                   const ctxpar_bins_shape *shape, ctxpar_stream *stream) {
    CTXPAR_CHECK(ctxpar_cuda_enter(dev));
    CTXPAR_CUDA_CHECK(
        ctxpar_cuda_launch_bins_add(bins, src, *shape, ctxpar_cuda_stream_of(stream)));
    return CTXPAR_OK;
}

ctxpar_status ctxpar_cuda_bins_add_attn(struct ctxpar_device *dev, void *bins, const float *out_b,
                                        const float *lse_b, const float *lse_lo_b,
                                        const ctxpar_bins_shape *shape, ctxpar_stream *stream) {
    CTXPAR_CHECK(ctxpar_cuda_enter(dev));
    CTXPAR_CUDA_CHECK(ctxpar_cuda_launch_bins_add_attn(bins, out_b, lse_b, lse_lo_b, *shape,
                                                       ctxpar_cuda_stream_of(stream)));
    return CTXPAR_OK;
}

ctxpar_status ctxpar_cuda_bins_merge(struct ctxpar_device *dev, void *dst, const void *src,
                                     int64_t rows, int64_t width, ctxpar_stream *stream) {
    CTXPAR_CHECK(ctxpar_cuda_enter(dev));
    CTXPAR_CUDA_CHECK(
        ctxpar_cuda_launch_bins_merge(dst, src, rows, width, ctxpar_cuda_stream_of(stream)));
    return CTXPAR_OK;
}

ctxpar_status ctxpar_cuda_bins_finish(struct ctxpar_device *dev, const void *bins, int64_t rows,
                                      int64_t width, float *dst, ctxpar_stream *stream) {
    CTXPAR_CHECK(ctxpar_cuda_enter(dev));
    CTXPAR_CUDA_CHECK(
        ctxpar_cuda_launch_bins_finish(bins, rows, width, dst, ctxpar_cuda_stream_of(stream)));
    return CTXPAR_OK;
}

ctxpar_status ctxpar_cuda_bins_finish_attn(struct ctxpar_device *dev, const void *bins,
                                           const ctxpar_bins_shape *shape, float *out, float *lse,
                                           float *lse_lo, ctxpar_stream *stream) {
    CTXPAR_CHECK(ctxpar_cuda_enter(dev));
    CTXPAR_CUDA_CHECK(ctxpar_cuda_launch_bins_finish_attn(bins, *shape, out, lse, lse_lo,
                                                          ctxpar_cuda_stream_of(stream)));
    return CTXPAR_OK;
}
