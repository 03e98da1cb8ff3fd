/*
 * tensor_format.h - the tensor orders other implementations store attention tensors in, and
 * their log-sum-exp conventions, mapped onto ctxpar's logical [batch, seq, heads, head_dim].
 *
 *   bshd  [B, S, H, D]   ctxpar, flash-attn, PyTorch's (B, S, H, D) dumps
 *   bhsd  [B, H, S, D]   PyTorch scaled_dot_product_attention
 *   sbhd  [S, B, H, D]   Megatron / TransformerEngine "sbhd"
 *   thd   [T, H, D]      packed tokens of all documents (TransformerEngine, flash-attn varlen):
 *                        batch 1, seq = T, documents from cu_seqlens
 *
 * LSE (one value per query row and head): bhs [B, H, S] (ctxpar, PyTorch), bsh [B, S, H],
 * ht [H, T] (packed, batch 1); natural log (base e) or base 2 (kernels that work in exp2).
 */
#ifndef CPT_TESTING_TENSOR_FORMAT_H
#define CPT_TESTING_TENSOR_FORMAT_H

#include <stdint.h>

#include "ctxpar.h"
#include "reference/npy.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum cpt_tformat {
    CPT_TFORMAT_BSHD = 0,
    CPT_TFORMAT_BHSD = 1,
    CPT_TFORMAT_SBHD = 2,
    CPT_TFORMAT_THD = 3,
} cpt_tformat;

typedef enum cpt_lse_layout {
    CPT_LSE_BHS = 0,
    CPT_LSE_BSH = 1,
    CPT_LSE_HT = 2,
} cpt_lse_layout;

/* The names above ("bshd", ..., "bhs", ...); parse returns 0 for an unknown name. */
extern const char *const cpt_tformat_names[4];
extern const char *const cpt_lse_layout_names[3];

/* The file dimensions of a tensor with logical dims [B, S, H, D] in fmt (thd: B must be 1):
 * writes shape_out and returns the number of dimensions (4, or 3 for thd). */
int cpt_tformat_shape(cpt_tformat fmt, const int64_t dims[4], int64_t shape_out[4]);

/* The inverse: logical dims from a file's shape; 0 when ndim does not fit fmt. */
int cpt_tformat_dims(cpt_tformat fmt, int ndim, const int64_t *shape, int64_t dims_out[4]);

/* A strided view, indexed in logical BSHD order, of densely packed data stored in fmt. */
ctxpar_tensor cpt_tformat_view(cpt_tformat fmt, void *data, ctxpar_dtype dtype,
                                  const int64_t dims[4]);

/* Copies every element of src into dst (same shape, any strides): the bytes as they are when the
 * dtypes match (bit-exact), else converted (round to nearest even). */
void cpt_tensor_copy(const ctxpar_tensor *src, ctxpar_tensor *dst);

/* The .npy/safetensors dtype of a ctxpar dtype and back (0 when it is not F32, F16 or BF16). */
cpt_npy_dtype cpt_npy_of_dtype(ctxpar_dtype dtype);
int cpt_dtype_of_npy(cpt_npy_dtype t, ctxpar_dtype *out);

/* LSE file shape for [B, H, S] in layout (ht: B must be 1); returns the number of dimensions. */
int cpt_lse_shape(cpt_lse_layout layout, int64_t batch, int64_t heads, int64_t seq,
                     int64_t shape_out[3]);
/* The inverse: batch, heads, seq from a file's shape; 0 when it does not fit the layout. */
int cpt_lse_dims(cpt_lse_layout layout, int ndim, const int64_t *shape, int64_t *batch,
                    int64_t *heads, int64_t *seq);

/* File LSE (float dtype t, layout, base 2 when base2) -> dense float [B, H, S], natural log; and
 * back. The base change multiplies or divides by ln 2 in double. */
void cpt_lse_to_bhs(const void *src, cpt_npy_dtype t, cpt_lse_layout layout, int base2,
                       int64_t batch, int64_t heads, int64_t seq, float *dst);
void cpt_lse_from_bhs(const float *src, cpt_lse_layout layout, int base2, int64_t batch,
                         int64_t heads, int64_t seq, float *dst);

#ifdef __cplusplus
}
#endif

#endif /* CPT_TESTING_TENSOR_FORMAT_H */
