// The kernels of the CUDA backend as C functions: arguments in plain structs passed by value to
// the kernels, launchers that return the launch's cudaError_t. Host code (cuda_*.c) validates
// and fills the structs; the .cu files only launch and compute.
#ifndef CTXPAR_CUDA_KERNELS_H
#define CTXPAR_CUDA_KERNELS_H

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#include "ctxpar_backend.h"

#ifdef __cplusplus
extern "C" {
#endif

// Spans and document boundaries up to these counts travel inside the kernel arguments; longer
// lists are uploaded to device memory for the duration of the call.
#define CTXPAR_CUDA_INLINE_SPANS 8
#define CTXPAR_CUDA_INLINE_BOUNDS 33 // num_docs + 1 boundaries

// Largest head_dim any kernel handles.
#define CTXPAR_CUDA_MAX_HEAD_DIM 256

// Global positions of the rows of a block (see ctxpar_spans).
typedef struct ctxpar_cuda_positions {
    int count;
    const ctxpar_span *list; // device copy when count > CTXPAR_CUDA_INLINE_SPANS, else NULL
    ctxpar_span inline_span[CTXPAR_CUDA_INLINE_SPANS];
} ctxpar_cuda_positions;

// ctxpar_mask_desc for the device.
typedef struct ctxpar_cuda_mask {
    int causal;
    int64_t window_left, window_right;
    int64_t num_docs;       // 0: one document (no cu_seqlens)
    const int32_t *cu_list; // device copy when num_docs + 1 > CTXPAR_CUDA_INLINE_BOUNDS
    int32_t cu_inline[CTXPAR_CUDA_INLINE_BOUNDS];
} ctxpar_cuda_mask;

// A [B, S, H, D] tensor: data and the strides of b, s, h in elements (d has stride 1).
typedef struct ctxpar_cuda_view {
    const void *data;
    int64_t stride[3];
} ctxpar_cuda_view;

// One (Q block, K/V block) pair, resolved from ctxpar_attn_block.
typedef struct ctxpar_cuda_attn_args {
    ctxpar_dtype dtype; // of q, k, v (and dout)
    int64_t batch, seq_q, seq_k, heads_q, heads_kv, head_dim;
    ctxpar_cuda_view q, k, v;
    ctxpar_cuda_positions q_pos, k_pos;
    ctxpar_cuda_mask mask;
    float scale;
    int block_full;   // the host classified the whole block as CTXPAR_BLOCK_FULL: no mask tests
    int aligned16;    // q, k, v rows start on 16-byte boundaries: vector loads are allowed
    int k_increasing; // key positions increase with the row: once a key tile lies wholly after
                      // the query tile under a causal mask, so do all later ones
} ctxpar_cuda_attn_args;

// Backward inputs and F32 accumulators beyond the forward ones.
typedef struct ctxpar_cuda_bwd_args {
    ctxpar_cuda_view dout;    // [B, Sq, Hq, D], dtype of q
    const float *lse, *delta; // [B, Hq, Sq]
    float *dq, *dk, *dv;      // dense; any may be NULL
} ctxpar_cuda_bwd_args;

// Which forward kernel runs a block.
typedef enum ctxpar_cuda_fwd_path {
    CTXPAR_CUDA_FWD_SIMT = 0, // F32 math on CUDA cores; any dtype, head_dim <= 256
    CTXPAR_CUDA_FWD_MMA = 1,  // mma.sync tensor cores; F16/BF16, head_dim % 8 == 0
} ctxpar_cuda_fwd_path;

// Dynamic shared memory the SIMT kernels need for head_dim (the caller checks the device
// allows it).
size_t ctxpar_cuda_simt_fwd_smem(int64_t head_dim);
size_t ctxpar_cuda_simt_bwd_smem(int64_t head_dim);

// Lets the SIMT kernels (every dtype) of the current GPU use min(limit, the need at
// CTXPAR_CUDA_MAX_HEAD_DIM) bytes of dynamic shared memory, and returns that size. The
// attribute belongs to the kernel in the GPU's context, shared by every thread of the process:
// it is set once per device at creation, never before a launch (another thread may be
// launching the same kernel at that moment).
cudaError_t ctxpar_cuda_simt_fwd_configure(size_t limit, size_t *set_out);
cudaError_t ctxpar_cuda_simt_bwd_configure(size_t limit, size_t *set_out);

// The smallest dynamic shared memory the SIMT kernels of the current GPU are allowed now (what
// cudaFuncGetAttributes reports), for the forward and the backward kernels.
cudaError_t ctxpar_cuda_simt_smem_allowed(size_t *fwd_out, size_t *bwd_out);

// out_acc/lse_acc = (merge ? merge with : overwrite by) attention over this block.
cudaError_t ctxpar_cuda_launch_attn_fwd(const ctxpar_cuda_attn_args *a, ctxpar_cuda_fwd_path path,
                                        float *out_acc, float *lse_acc, int merge,
                                        cudaStream_t stream);

// The tensor-core half of ctxpar_cuda_launch_attn_fwd (F16/BF16, head_dim % 8 == 0).
cudaError_t ctxpar_cuda_launch_attn_fwd_mma(const ctxpar_cuda_attn_args *a, float *out_acc,
                                            float *lse_acc, int merge, cudaStream_t stream);

// dq/dk/dv accumulators += the gradients of this block (deterministic).
cudaError_t ctxpar_cuda_launch_attn_bwd(const ctxpar_cuda_attn_args *a,
                                        const ctxpar_cuda_bwd_args *g, cudaStream_t stream);

// out_acc [B, S, H, D] F32, lse_acc [B, H, S] merged with (merge = 1) or overwritten by
// (merge = 0) out_b (dense [B, S, H, D] in dtype_b) and lse_b [B, H, S] F32.
cudaError_t ctxpar_cuda_launch_merge(float *out_acc, float *lse_acc, const void *out_b,
                                     ctxpar_dtype dtype_b, const float *lse_b, int64_t batch,
                                     int64_t seq, int64_t heads, int64_t head_dim, int merge,
                                     cudaStream_t stream);

// delta [B, H, S] = sum over d of out * dout (both [B, S, H, D], each in its own dtype).
cudaError_t ctxpar_cuda_launch_bwd_prep(ctxpar_cuda_view out, ctxpar_dtype out_dtype,
                                        ctxpar_cuda_view dout, ctxpar_dtype dout_dtype,
                                        int64_t batch, int64_t seq, int64_t heads, int64_t head_dim,
                                        float *delta, cudaStream_t stream);

// dst = src converted, over shape[4]; strides in elements, innermost 1.
cudaError_t ctxpar_cuda_launch_cast(const void *src, ctxpar_dtype src_dtype,
                                    const int64_t src_stride[4], void *dst, ctxpar_dtype dst_dtype,
                                    const int64_t dst_stride[4], const int64_t shape[4],
                                    cudaStream_t stream);

cudaError_t ctxpar_cuda_launch_add(float *dst, const float *src, size_t n, cudaStream_t stream);
cudaError_t ctxpar_cuda_launch_fill(float *dst, float value, size_t n, cudaStream_t stream);

// *sum_dev = the 64-bit checksum of bytes at data (device memory); sum_dev is device memory.
cudaError_t ctxpar_cuda_launch_checksum(const void *data, size_t bytes, uint64_t *sum_dev,
                                        cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif // CTXPAR_CUDA_KERNELS_H
