/*
 * data.c - counter-based test data: every value is a hash of (seed, tensor id, global index).
 */
#include "reference/data.h"

#include <math.h>

#include "ctxpar_half.h"

// splitmix64's output function: a bijection on 64 bits that scrambles a counter well enough
// for test data (splitmix64 itself is this function applied to a Weyl sequence).
static uint64_t mix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

double cpt_test_value(uint64_t seed, uint64_t tensor_id, uint64_t index) {
    // Chaining the three words through the mixer keeps (s, t, i) and (s, i, t) apart.
    uint64_t h = mix64(mix64(mix64(seed) ^ tensor_id) ^ index);
    // 53 random bits k: k * 2^-52 - 1 lies in [-1, 1) and is exact in double.
    return (double)(h >> 11) * 0x1p-52 - 1.0;
}

// The value as the library stores it: through float, then the 16-bit format if any.
double cpt_test_round(ctxpar_dtype dtype, double x) {
    float f = (float)x;
    switch (dtype) {
    case CTXPAR_DTYPE_F16:
        return ctxpar_f16_to_f32(ctxpar_f32_to_f16(f));
    case CTXPAR_DTYPE_BF16:
        return ctxpar_bf16_to_f32(ctxpar_f32_to_bf16(f));
    default:
        return f;
    }
}

static int64_t elem_offset(const ctxpar_tensor *t, int64_t b, int64_t s, int64_t h, int64_t d) {
    return b * t->stride[0] + s * t->stride[1] + h * t->stride[2] + d * t->stride[3];
}

static void store(ctxpar_tensor *t, int64_t off, double x) {
    float f = (float)x;
    switch (t->dtype) {
    case CTXPAR_DTYPE_F32:
        ((float *)t->data)[off] = f;
        break;
    case CTXPAR_DTYPE_F16:
        ((uint16_t *)t->data)[off] = ctxpar_f32_to_f16(f);
        break;
    case CTXPAR_DTYPE_BF16:
        ((uint16_t *)t->data)[off] = ctxpar_f32_to_bf16(f);
        break;
    }
}

static int dtype_known(ctxpar_dtype dtype) {
    return dtype == CTXPAR_DTYPE_F32 || dtype == CTXPAR_DTYPE_F16 || dtype == CTXPAR_DTYPE_BF16;
}

void cpt_test_fill(ctxpar_tensor *t, uint64_t seed, uint64_t tensor_id, int64_t seq_global,
                      const int64_t *pos) {
    if (!t || !t->data || !dtype_known(t->dtype))
        return;
    const int64_t B = t->shape[0], S = t->shape[1], H = t->shape[2], D = t->shape[3];
    for (int64_t b = 0; b < B; b++)
        for (int64_t s = 0; s < S; s++) {
            int64_t g = pos ? pos[s] : s;
            for (int64_t h = 0; h < H; h++)
                for (int64_t d = 0; d < D; d++) {
                    uint64_t idx = (uint64_t)(((b * seq_global + g) * H + h) * D + d);
                    store(t, elem_offset(t, b, s, h, d), cpt_test_value(seed, tensor_id, idx));
                }
        }
}

void cpt_test_fill_global_f64(double *dst, ctxpar_dtype dtype, uint64_t seed, uint64_t tensor_id,
                                 int64_t batch, int64_t seq_global, int64_t heads,
                                 int64_t head_dim) {
    if (!dst)
        return;
    const int64_t n = batch * seq_global * heads * head_dim;
    for (int64_t i = 0; i < n; i++)
        dst[i] = cpt_test_round(dtype, cpt_test_value(seed, tensor_id, (uint64_t)i));
}

double cpt_test_get(const ctxpar_tensor *t, int64_t b, int64_t s, int64_t h, int64_t d) {
    int64_t off = elem_offset(t, b, s, h, d);
    switch (t->dtype) {
    case CTXPAR_DTYPE_F32:
        return ((const float *)t->data)[off];
    case CTXPAR_DTYPE_F16:
        return ctxpar_f16_to_f32(((const uint16_t *)t->data)[off]);
    case CTXPAR_DTYPE_BF16:
        return ctxpar_bf16_to_f32(((const uint16_t *)t->data)[off]);
    }
    return NAN;
}

void cpt_test_set(ctxpar_tensor *t, int64_t b, int64_t s, int64_t h, int64_t d, double x) {
    store(t, elem_offset(t, b, s, h, d), x);
}

void cpt_test_to_f64(const ctxpar_tensor *t, double *dst) {
    const int64_t B = t->shape[0], S = t->shape[1], H = t->shape[2], D = t->shape[3];
    int64_t i = 0;
    for (int64_t b = 0; b < B; b++)
        for (int64_t s = 0; s < S; s++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t d = 0; d < D; d++)
                    dst[i++] = cpt_test_get(t, b, s, h, d);
}
