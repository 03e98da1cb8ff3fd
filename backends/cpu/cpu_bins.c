/*
 * The binned accumulators of reproducible mode (ctxpar_bins.h), on the CPU device: the SDK's
 * functions value by value (rows of terms through the kernel table's bins_add_row, the same
 * function vectorised for the CPU's instruction set), rows in parallel. Every value is summed on
 * its own, so the bits are those of the SDK's functions whatever the number of threads.
 *
 *   bins_add:         src [B, len, H, width]                   into rows (b*seq + off + s)*H + h
 *   bins_add_attn:    out_b [B, len, H, width - 1], lse_b, lse_lo_b [B, H, len]   (same rows)
 *   bins_finish_attn: out [B, seq, H, width - 1], lse, lse_lo [B, H, seq]
 */
#include <math.h>
#include <omp.h>
#include <stdlib.h>

#include "backends/cpu/cpu_internal.h"

#define PARALLEL_MIN 16384 // values below which a thread team costs more than it saves

static const ctxpar_cpu_kernels *kernels(const ctxpar_device *dev) {
    return ((const ctxpar_cpu_device *)dev->impl)->kern;
}

// Where source row r ([B, len, H]) of a bins op lands: its first value in the block's rows
// [B, seq, H] of `width`, and (li) its index in a [B, H, len] array such as an LSE.
static int64_t land(const ctxpar_bins_shape *sh, int64_t r, int64_t *li) {
    const int64_t h = r % sh->heads, s = (r / sh->heads) % sh->len, b = r / (sh->heads * sh->len);
    *li = (b * sh->heads + h) * sh->len + s;
    return ((b * sh->seq + sh->off + s) * sh->heads + h) * sh->width;
}

ctxpar_status ctxpar_cpu_bins_clear(ctxpar_device *dev, void *bins, int64_t rows, int64_t width,
                                    ctxpar_stream *stream) {
    (void)stream;
    const ctxpar_bins_view v = ctxpar_bins_at(bins, rows, width);
    const int64_t n = rows * width; // sizes and buffers checked by the dispatch
    const int nt = ctxpar_cpu_threads(dev->impl);
#pragma omp parallel for num_threads(nt) schedule(static) if (n > PARALLEL_MIN)
    for (int64_t i = 0; i < n; i++)
        ctxpar_bins_clear_value(v, i);
    return CTXPAR_OK;
}

ctxpar_status ctxpar_cpu_bins_add(ctxpar_device *dev, void *bins, const float *src,
                                  const ctxpar_bins_shape *shape, ctxpar_stream *stream) {
    (void)stream;
    const int64_t heads = shape->heads, len = shape->len, width = shape->width;
    const ctxpar_bins_view v = ctxpar_bins_at(bins, shape->batch * shape->seq * heads, width);
    const int64_t rows = shape->batch * len * heads; // source rows
    const ctxpar_cpu_kernels *kern = kernels(dev);
    const int nt = ctxpar_cpu_threads(dev->impl);
#pragma omp parallel for num_threads(nt) schedule(static) if (rows * width > PARALLEL_MIN)
    for (int64_t r = 0; r < rows; r++) {
        int64_t li;
        kern->bins_add_row(v, land(shape, r, &li), src + r * width, width, 0);
    }
    return CTXPAR_OK;
}

ctxpar_status ctxpar_cpu_bins_add_attn(ctxpar_device *dev, void *bins, const float *out_b,
                                       const float *lse_b, const float *lse_lo_b,
                                       const ctxpar_bins_shape *shape, ctxpar_stream *stream) {
    (void)stream;
    const int64_t heads = shape->heads, len = shape->len, width = shape->width;
    const ctxpar_bins_view v = ctxpar_bins_at(bins, shape->batch * shape->seq * heads, width);
    const int64_t rows = shape->batch * len * heads; // source rows
    const ctxpar_cpu_kernels *kern = kernels(dev);
    const int nt = ctxpar_cpu_threads(dev->impl);
    float *tmp = malloc((size_t)nt * 3 * (size_t)width * sizeof *tmp); // a row's terms per thread
    if (!tmp)
        return CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "bins_add_attn: no memory for %d rows", nt);
#pragma omp parallel for num_threads(nt) schedule(static) if (rows * width > PARALLEL_MIN)
    for (int64_t r = 0; r < rows; r++) {
        int64_t li;
        const int64_t i0 = land(shape, r, &li);
        const double L = (double)lse_b[li] + (lse_lo_b ? (double)lse_lo_b[li] : 0.0);
        float *t = tmp + (size_t)omp_get_thread_num() * 3 * (size_t)width, den[2];
        int64_t k = 0;
        const int kind =
            ctxpar_bins_attn_terms(L, out_b + r * (width - 1), 1, width - 1, t, &k, den);
        if (kind < 0)
            ctxpar_bins_attn_special(v, i0, width, L);
        if (kind <= 0)
            continue;
        for (int part = 0; part < 3; part++) // as ctxpar_bins_add_attn_row
            kern->bins_add_row(v, i0, t + part * (width - 1), width - 1, k);
        kern->bins_add_row(v, i0 + width - 1, den, 1, k); // both into the denominator
        kern->bins_add_row(v, i0 + width - 1, den + 1, 1, k);
    }
    free(tmp);
    return CTXPAR_OK;
}

ctxpar_status ctxpar_cpu_bins_merge(ctxpar_device *dev, void *dst, const void *src, int64_t rows,
                                    int64_t width, ctxpar_stream *stream) {
    (void)stream;
    const ctxpar_bins_view to = ctxpar_bins_at(dst, rows, width);
    // The SDK's functions take a view of mutable pointers; src is only read.
    const ctxpar_bins_view from = ctxpar_bins_at((void *)(uintptr_t)src, rows, width);
    const int64_t n = rows * width;
    const int nt = ctxpar_cpu_threads(dev->impl);
#pragma omp parallel for num_threads(nt) schedule(static) if (n > PARALLEL_MIN)
    for (int64_t i = 0; i < n; i++)
        ctxpar_bins_merge_value(to, i, from, i);
    return CTXPAR_OK;
}

ctxpar_status ctxpar_cpu_bins_finish(ctxpar_device *dev, const void *bins, int64_t rows,
                                     int64_t width, float *dst, ctxpar_stream *stream) {
    (void)stream;
    const ctxpar_bins_view v = ctxpar_bins_at((void *)(uintptr_t)bins, rows, width);
    const int64_t n = rows * width;
    const int nt = ctxpar_cpu_threads(dev->impl);
#pragma omp parallel for num_threads(nt) schedule(static) if (n > PARALLEL_MIN)
    for (int64_t i = 0; i < n; i++)
        dst[i] = (float)ctxpar_bins_value(v, i);
    return CTXPAR_OK;
}

ctxpar_status ctxpar_cpu_bins_finish_attn(ctxpar_device *dev, const void *bins,
                                          const ctxpar_bins_shape *shape, float *out, float *lse,
                                          float *lse_lo, ctxpar_stream *stream) {
    (void)stream;
    const int64_t heads = shape->heads, seq = shape->seq, width = shape->width;
    const int64_t rows = shape->batch * seq * heads; // off 0, len = seq (checked by the dispatch)
    const ctxpar_bins_view v = ctxpar_bins_at((void *)(uintptr_t)bins, rows, width);
    const int nt = ctxpar_cpu_threads(dev->impl);
#pragma omp parallel for num_threads(nt) schedule(static) if (rows * width > PARALLEL_MIN)
    for (int64_t r = 0; r < rows; r++) {
        const int64_t h = r % heads, s = (r / heads) % seq, b = r / (heads * seq);
        const int64_t li = (b * heads + h) * seq + s;
        const double L = ctxpar_bins_finish_attn_row(v, r * width, width, out + r * (width - 1), 1);
        ctxpar_cpu_store_lse(lse + li, lse_lo ? lse_lo + li : NULL, L);
    }
    return CTXPAR_OK;
}
