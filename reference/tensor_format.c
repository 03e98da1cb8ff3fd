// Tensor orders and LSE conventions of other implementations (see tensor_format.h).
#include "reference/tensor_format.h"

#include <math.h>
#include <string.h>

#include "ctxpar_half.h"
#include "reference/data.h"

const char *const cpt_tformat_names[4] = {"bshd", "bhsd", "sbhd", "thd"};
const char *const cpt_lse_layout_names[3] = {"bhs", "bsh", "ht"};

int cpt_tformat_shape(cpt_tformat fmt, const int64_t dims[4], int64_t shape_out[4]) {
    const int64_t B = dims[0], S = dims[1], H = dims[2], D = dims[3];
    switch (fmt) {
    case CPT_TFORMAT_BHSD:
        shape_out[0] = B, shape_out[1] = H, shape_out[2] = S, shape_out[3] = D;
        return 4;
    case CPT_TFORMAT_SBHD:
        shape_out[0] = S, shape_out[1] = B, shape_out[2] = H, shape_out[3] = D;
        return 4;
    case CPT_TFORMAT_THD:
        shape_out[0] = S, shape_out[1] = H, shape_out[2] = D;
        return 3;
    case CPT_TFORMAT_BSHD:
        break;
    }
    shape_out[0] = B, shape_out[1] = S, shape_out[2] = H, shape_out[3] = D;
    return 4;
}

int cpt_tformat_dims(cpt_tformat fmt, int ndim, const int64_t *shape, int64_t dims_out[4]) {
    if (fmt == CPT_TFORMAT_THD) {
        if (ndim != 3)
            return 0;
        dims_out[0] = 1, dims_out[1] = shape[0], dims_out[2] = shape[1], dims_out[3] = shape[2];
        return 1;
    }
    if (ndim != 4)
        return 0;
    // The shape of a tensor is its own inverse permutation for these three orders.
    int64_t d[4] = {shape[0], shape[1], shape[2], shape[3]};
    int64_t s[4];
    cpt_tformat_shape(fmt, d, s);
    if (fmt == CPT_TFORMAT_BHSD || fmt == CPT_TFORMAT_SBHD) // swaps of two axes
        memcpy(dims_out, s, sizeof s);
    else
        memcpy(dims_out, d, sizeof d);
    return 1;
}

ctxpar_tensor cpt_tformat_view(cpt_tformat fmt, void *data, ctxpar_dtype dtype,
                                  const int64_t dims[4]) {
    const int64_t B = dims[0], S = dims[1], H = dims[2], D = dims[3];
    ctxpar_tensor t = ctxpar_tensor_bshd(data, dtype, B, S, H, D);
    switch (fmt) {
    case CPT_TFORMAT_BHSD: // [B, H, S, D]
        t.stride[0] = H * S * D, t.stride[1] = D, t.stride[2] = S * D, t.stride[3] = 1;
        break;
    case CPT_TFORMAT_SBHD: // [S, B, H, D]
        t.stride[0] = H * D, t.stride[1] = B * H * D, t.stride[2] = D, t.stride[3] = 1;
        break;
    case CPT_TFORMAT_BSHD:
    case CPT_TFORMAT_THD: // [T, H, D] is [1, T, H, D]
        break;
    }
    return t;
}

void cpt_tensor_copy(const ctxpar_tensor *src, ctxpar_tensor *dst) {
    const int64_t *n = src->shape;
    size_t es = ctxpar_dtype_size(src->dtype);
    int raw = src->dtype == dst->dtype;
    for (int64_t b = 0; b < n[0]; b++)
        for (int64_t s = 0; s < n[1]; s++)
            for (int64_t h = 0; h < n[2]; h++)
                for (int64_t d = 0; d < n[3]; d++) {
                    if (!raw) {
                        cpt_test_set(dst, b, s, h, d, cpt_test_get(src, b, s, h, d));
                        continue;
                    }
                    int64_t i = b * src->stride[0] + s * src->stride[1] + h * src->stride[2] +
                                d * src->stride[3];
                    int64_t o = b * dst->stride[0] + s * dst->stride[1] + h * dst->stride[2] +
                                d * dst->stride[3];
                    memcpy((char *)dst->data + o * (int64_t)es,
                           (const char *)src->data + i * (int64_t)es, es);
                }
}

cpt_npy_dtype cpt_npy_of_dtype(ctxpar_dtype dtype) {
    return dtype == CTXPAR_DTYPE_F16    ? CPT_NPY_F16
           : dtype == CTXPAR_DTYPE_BF16 ? CPT_NPY_BF16
                                        : CPT_NPY_F32;
}

int cpt_dtype_of_npy(cpt_npy_dtype t, ctxpar_dtype *out) {
    switch (t) {
    case CPT_NPY_F32:
        *out = CTXPAR_DTYPE_F32;
        return 1;
    case CPT_NPY_F16:
        *out = CTXPAR_DTYPE_F16;
        return 1;
    case CPT_NPY_BF16:
        *out = CTXPAR_DTYPE_BF16;
        return 1;
    default:
        return 0;
    }
}

int cpt_lse_shape(cpt_lse_layout layout, int64_t batch, int64_t heads, int64_t seq,
                     int64_t shape_out[3]) {
    switch (layout) {
    case CPT_LSE_BSH:
        shape_out[0] = batch, shape_out[1] = seq, shape_out[2] = heads;
        return 3;
    case CPT_LSE_HT:
        shape_out[0] = heads, shape_out[1] = seq;
        return 2;
    case CPT_LSE_BHS:
        break;
    }
    shape_out[0] = batch, shape_out[1] = heads, shape_out[2] = seq;
    return 3;
}

int cpt_lse_dims(cpt_lse_layout layout, int ndim, const int64_t *shape, int64_t *batch,
                    int64_t *heads, int64_t *seq) {
    if (layout == CPT_LSE_HT) {
        if (ndim != 2)
            return 0;
        *batch = 1, *heads = shape[0], *seq = shape[1];
        return 1;
    }
    if (ndim != 3)
        return 0;
    *batch = shape[0];
    *heads = layout == CPT_LSE_BSH ? shape[2] : shape[1];
    *seq = layout == CPT_LSE_BSH ? shape[1] : shape[2];
    return 1;
}

// Flat index of (b, h, s) in a file of the layout.
static int64_t lse_index(cpt_lse_layout layout, int64_t H, int64_t S, int64_t b, int64_t h,
                         int64_t s) {
    return layout == CPT_LSE_BSH ? (b * S + s) * H + h : (b * H + h) * S + s; // ht: b = 0
}

static double load_float(const void *src, cpt_npy_dtype t, int64_t i) {
    switch (t) {
    case CPT_NPY_F16:
        return ctxpar_f16_to_f32(((const uint16_t *)src)[i]);
    case CPT_NPY_BF16:
        return ctxpar_bf16_to_f32(((const uint16_t *)src)[i]);
    default:
        return ((const float *)src)[i];
    }
}

void cpt_lse_to_bhs(const void *src, cpt_npy_dtype t, cpt_lse_layout layout, int base2,
                       int64_t batch, int64_t heads, int64_t seq, float *dst) {
    const double k = base2 ? log(2.0) : 1.0; // log2(x) * ln 2 = ln(x)
    for (int64_t b = 0; b < batch; b++)
        for (int64_t h = 0; h < heads; h++)
            for (int64_t s = 0; s < seq; s++)
                dst[(b * heads + h) * seq + s] =
                    (float)(load_float(src, t, lse_index(layout, heads, seq, b, h, s)) * k);
}

void cpt_lse_from_bhs(const float *src, cpt_lse_layout layout, int base2, int64_t batch,
                         int64_t heads, int64_t seq, float *dst) {
    const double k = base2 ? log(2.0) : 1.0;
    for (int64_t b = 0; b < batch; b++)
        for (int64_t h = 0; h < heads; h++)
            for (int64_t s = 0; s < seq; s++)
                dst[lse_index(layout, heads, seq, b, h, s)] =
                    (float)((double)src[(b * heads + h) * seq + s] / k);
}
