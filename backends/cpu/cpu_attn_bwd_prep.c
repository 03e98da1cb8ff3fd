/*
 * Backward preparation: delta[b, h, s] = sum_d dout[b, s, h, d] * out[b, s, h, d].
 *
 *   out, dout [B, S, H, D]  F32, F16 or BF16 (each its own), any row strides
 *   delta     [B, H, S]     F32, dense
 *
 * F32 products summed into 8 partial sums (d mod 8), then added in order: a fixed order per row,
 * whatever the thread count, and one the compiler can vectorise without reassociating.
 */
#include <omp.h>

#include "backends/cpu/cpu_internal.h"

#define CHUNK 256 // elements converted to F32 at a time, on the stack

static float row_dot(const ctxpar_cpu_kernels *kern, const ctxpar_tensor *x, const ctxpar_tensor *y,
                     int64_t b, int64_t s, int64_t h) {
    const int64_t dim = x->shape[3];
    const char *xr = ctxpar_cpu_row(x, b, s, h), *yr = ctxpar_cpu_row(y, b, s, h);
    const size_t xs = ctxpar_dtype_size(x->dtype), ys = ctxpar_dtype_size(y->dtype);
    float part[8] = {0};
    float xa[CHUNK], ya[CHUNK];
    for (int64_t d0 = 0; d0 < dim; d0 += CHUNK) {
        int64_t n = dim - d0 < CHUNK ? dim - d0 : CHUNK;
        kern->to_f32(xa, xr + (size_t)d0 * xs, x->dtype, n);
        kern->to_f32(ya, yr + (size_t)d0 * ys, y->dtype, n);
        for (int64_t d = 0; d < n; d++) // CHUNK is a multiple of 8: lane d % 8 stays d's lane
            part[d % 8] += xa[d] * ya[d];
    }
    float sum = 0.0f;
    for (int j = 0; j < 8; j++)
        sum += part[j];
    return sum;
}

ctxpar_status ctxpar_cpu_attn_bwd_prep(ctxpar_device *dev, const ctxpar_tensor *out,
                                       const ctxpar_tensor *dout, float *delta,
                                       ctxpar_stream *stream) {
    (void)stream;
    const ctxpar_cpu_device *cpu = dev->impl;
    // out, dout and delta were checked by the dispatch.
    const int64_t B = out->shape[0], S = out->shape[1], H = out->shape[2];
    const int64_t rows = B * S * H;
    if (rows == 0)
        return CTXPAR_OK;
    const int nt = ctxpar_cpu_threads(cpu);
#pragma omp parallel for num_threads(nt) schedule(static) if (rows * out->shape[3] > 16384)
    for (int64_t r = 0; r < rows; r++) {
        int64_t h = r % H, s = (r / H) % S, b = r / (H * S);
        delta[(b * H + h) * S + s] = row_dot(cpu->kern, out, dout, b, s, h);
    }
    return CTXPAR_OK;
}
