// The dispatch of the binned-accumulator ops (reproducible mode, ctxpar_bins.h): their argument
// checks, and NOT_SUPPORTED for a device without them.
#include "dispatch.h"

#define BAD(...) CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, __VA_ARGS__)

int ctxpar_dev_has_bins(const ctxpar_device *dev) {
    return CTXPAR_OPS_HAS(dev->ops, struct ctxpar_device_ops, bins_clear);
}

static ctxpar_status need_bins(const ctxpar_device *dev, const char *op) {
    if (ctxpar_dev_has_bins(dev))
        return CTXPAR_OK;
    return CTXPAR_ERROR(CTXPAR_ERR_NOT_SUPPORTED,
                        "%s: device '%s' has no binned accumulators (reproducible mode)", op,
                        dev->ops->name ? dev->ops->name : "(unnamed)");
}

static ctxpar_status check_rows(const char *op, const void *bins, int64_t rows, int64_t width) {
    if (rows < 0 || width < 1)
        return BAD("%s: %lld rows of width %lld", op, (long long)rows, (long long)width);
    if (rows > 0 && !bins)
        return BAD("%s: bins is NULL", op);
    return CTXPAR_OK;
}

static ctxpar_status check_shape(const char *op, const void *bins, const ctxpar_bins_shape *sh) {
    if (!sh)
        return BAD("%s: shape is NULL", op);
    if (sh->batch < 0 || sh->seq < 0 || sh->heads < 0 || sh->width < 1 || sh->off < 0 ||
        sh->len < 0 || sh->off + sh->len > sh->seq)
        return BAD("%s: rows [%lld, %lld) of %lld (batch %lld, heads %lld, width %lld)", op,
                   (long long)sh->off, (long long)(sh->off + sh->len), (long long)sh->seq,
                   (long long)sh->batch, (long long)sh->heads, (long long)sh->width);
    return check_rows(op, bins, sh->batch * sh->seq * sh->heads, sh->width);
}

static int64_t shape_rows(const ctxpar_bins_shape *sh) {
    return sh->batch * sh->len * sh->heads;
}

ctxpar_status ctxpar_dev_bins_clear(ctxpar_device *dev, void *bins, int64_t rows, int64_t width,
                                    ctxpar_stream *stream) {
    CTXPAR_CHECK(need_bins(dev, "bins_clear"));
    CTXPAR_CHECK(check_rows("bins_clear", bins, rows, width));
    return rows ? dev->ops->bins_clear(dev, bins, rows, width, stream) : CTXPAR_OK;
}

ctxpar_status ctxpar_dev_bins_add(ctxpar_device *dev, void *bins, const float *src,
                                  const ctxpar_bins_shape *shape, ctxpar_stream *stream) {
    CTXPAR_CHECK(need_bins(dev, "bins_add"));
    CTXPAR_CHECK(check_shape("bins_add", bins, shape));
    if (shape_rows(shape) == 0)
        return CTXPAR_OK;
    if (!src)
        return BAD("bins_add: src is NULL");
    return dev->ops->bins_add(dev, bins, src, shape, stream);
}

ctxpar_status ctxpar_dev_bins_add_attn(ctxpar_device *dev, void *bins, const float *out_b,
                                       const float *lse_b, const float *lse_lo_b,
                                       const ctxpar_bins_shape *shape, ctxpar_stream *stream) {
    CTXPAR_CHECK(need_bins(dev, "bins_add_attn"));
    CTXPAR_CHECK(check_shape("bins_add_attn", bins, shape));
    if (shape_rows(shape) == 0)
        return CTXPAR_OK;
    if (!out_b || !lse_b)
        return BAD("bins_add_attn: NULL buffer (out_b %p, lse_b %p)", (const void *)out_b,
                   (const void *)lse_b);
    return dev->ops->bins_add_attn(dev, bins, out_b, lse_b, lse_lo_b, shape, stream);
}

ctxpar_status ctxpar_dev_bins_merge(ctxpar_device *dev, void *dst, const void *src, int64_t rows,
                                    int64_t width, ctxpar_stream *stream) {
    CTXPAR_CHECK(need_bins(dev, "bins_merge"));
    CTXPAR_CHECK(check_rows("bins_merge", dst, rows, width));
    CTXPAR_CHECK(check_rows("bins_merge", src, rows, width));
    if (rows == 0 || dst == src) // merging a block into itself would double it: never asked
        return dst == src && rows ? BAD("bins_merge: dst and src are the same block") : CTXPAR_OK;
    return dev->ops->bins_merge(dev, dst, src, rows, width, stream);
}

ctxpar_status ctxpar_dev_bins_finish(ctxpar_device *dev, const void *bins, int64_t rows,
                                     int64_t width, float *dst, ctxpar_stream *stream) {
    CTXPAR_CHECK(need_bins(dev, "bins_finish"));
    CTXPAR_CHECK(check_rows("bins_finish", bins, rows, width));
    if (rows == 0)
        return CTXPAR_OK;
    if (!dst)
        return BAD("bins_finish: dst is NULL");
    return dev->ops->bins_finish(dev, bins, rows, width, dst, stream);
}

ctxpar_status ctxpar_dev_bins_finish_attn(ctxpar_device *dev, const void *bins,
                                          const ctxpar_bins_shape *shape, float *out, float *lse,
                                          float *lse_lo, ctxpar_stream *stream) {
    CTXPAR_CHECK(need_bins(dev, "bins_finish_attn"));
    CTXPAR_CHECK(check_shape("bins_finish_attn", bins, shape));
    if (shape->off != 0 || shape->len != shape->seq)
        return BAD("bins_finish_attn: finishes whole blocks (off 0, len = seq)");
    if (shape_rows(shape) == 0)
        return CTXPAR_OK;
    if (!out || !lse)
        return BAD("bins_finish_attn: NULL buffer (out %p, lse %p)", (void *)out, (void *)lse);
    return dev->ops->bins_finish_attn(dev, bins, shape, out, lse, lse_lo, stream);
}
