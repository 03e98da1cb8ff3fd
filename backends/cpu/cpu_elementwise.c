/*
 * Elementwise ops of the CPU device.
 *   cast: dst[b, s, h, d] = src[b, s, h, d] converted (F32, F16, BF16 either side; equal shapes,
 *         any strides with innermost stride 1); same dtype copies bits, F32 -> 16-bit rounds to
 *         nearest even (ctxpar_half.h), 16-bit -> F32 is exact.
 *   add:  dst[i] += src[i], F32;   fill: dst[i] = value, F32.
 */
#include <omp.h>
#include <string.h>

#include "backends/cpu/cpu_internal.h"
#include "ctxpar_half.h"

#define CHUNK 256              // elements converted at a time, on the stack
#define PARALLEL_MIN (1 << 15) // below this many elements a thread team costs more than it saves

static void from_f32(void *dst, const float *src, ctxpar_dtype dtype, int64_t n) {
    uint16_t *h = (uint16_t *)dst;
    switch (dtype) {
    case CTXPAR_DTYPE_F32:
        memcpy(dst, src, (size_t)n * sizeof(float));
        break;
    case CTXPAR_DTYPE_F16:
        for (int64_t i = 0; i < n; i++)
            h[i] = ctxpar_f32_to_f16(src[i]);
        break;
    case CTXPAR_DTYPE_BF16:
        for (int64_t i = 0; i < n; i++)
            h[i] = ctxpar_f32_to_bf16(src[i]);
        break;
    }
}

static void cast_row(const ctxpar_cpu_kernels *kern, const ctxpar_tensor *src,
                     const ctxpar_tensor *dst, int64_t b, int64_t s, int64_t h) {
    const int64_t dim = src->shape[3];
    const char *in = ctxpar_cpu_row(src, b, s, h);
    char *out = (char *)ctxpar_cpu_row(dst, b, s, h);
    const size_t is = ctxpar_dtype_size(src->dtype), os = ctxpar_dtype_size(dst->dtype);
    if (src->dtype == dst->dtype) { // the bits as they are (NaN payloads included)
        memmove(out, in, (size_t)dim * is);
        return;
    }
    float tmp[CHUNK];
    for (int64_t d0 = 0; d0 < dim; d0 += CHUNK) {
        int64_t n = dim - d0 < CHUNK ? dim - d0 : CHUNK;
        kern->to_f32(tmp, in + (size_t)d0 * is, src->dtype, n);
        from_f32(out + (size_t)d0 * os, tmp, dst->dtype, n);
    }
}

ctxpar_status ctxpar_cpu_cast(ctxpar_device *dev, const ctxpar_tensor *src, ctxpar_tensor *dst,
                              ctxpar_stream *stream) {
    (void)stream;
    const ctxpar_cpu_device *cpu = dev->impl;
    // Tensors and shapes were checked by the dispatch.
    const int64_t B = src->shape[0], S = src->shape[1], H = src->shape[2];
    const int64_t rows = B * S * H;
    const int nt = ctxpar_cpu_threads(cpu);
#pragma omp parallel for num_threads(nt) schedule(static) if (rows * src->shape[3] > PARALLEL_MIN)
    for (int64_t r = 0; r < rows; r++)
        cast_row(cpu->kern, src, dst, r / (S * H), (r / H) % S, r % H);
    return CTXPAR_OK;
}

ctxpar_status ctxpar_cpu_add(ctxpar_device *dev, float *dst, const float *src, size_t n,
                             ctxpar_stream *stream) {
    (void)stream;
    const int nt = ctxpar_cpu_threads(dev->impl);
#pragma omp parallel for simd num_threads(nt) schedule(static) if (n > PARALLEL_MIN)
    for (size_t i = 0; i < n; i++)
        dst[i] += src[i];
    return CTXPAR_OK;
}

ctxpar_status ctxpar_cpu_fill(ctxpar_device *dev, float *dst, float value, size_t n,
                              ctxpar_stream *stream) {
    (void)stream;
    const int nt = ctxpar_cpu_threads(dev->impl);
#pragma omp parallel for simd num_threads(nt) schedule(static) if (n > PARALLEL_MIN)
    for (size_t i = 0; i < n; i++)
        dst[i] = value;
    return CTXPAR_OK;
}
