// The CUDA device's capability check (attn_supported): the limits its kernels have, asked before
// the ranks agree so that a problem it cannot run fails with the comm still usable.
#include "cuda_internal.h"
#include "cuda_kernels.h"

// CUDA's limit on gridDim.y and gridDim.z, where the kernels put batch and heads.
#define GRID_YZ_LIMIT 65535

ctxpar_status ctxpar_cuda_attn_supported(const struct ctxpar_device *dev,
                                         const ctxpar_attn_query *q) {
    const ctxpar_cuda_impl *impl = (const ctxpar_cuda_impl *)dev->impl;
    if (q->dtype != CTXPAR_DTYPE_F32 && q->dtype != CTXPAR_DTYPE_F16 &&
        q->dtype != CTXPAR_DTYPE_BF16)
        return CTXPAR_ERROR(CTXPAR_ERR_NOT_SUPPORTED,
                            "the cuda device computes f32, f16 and bf16, not dtype %d",
                            (int)q->dtype);
    // Features the CUDA kernels do not implement yet (README.md): refused, never ignored.
    if (q->head_dim_v != 0 && q->head_dim_v != q->head_dim)
        return CTXPAR_ERROR(CTXPAR_ERR_NOT_SUPPORTED,
                            "the cuda device needs v's head_dim (%lld) to equal q's (%lld): MLA "
                            "is not implemented in its kernels",
                            (long long)q->head_dim_v, (long long)q->head_dim);
    if (q->softcap != 0.0f)
        return CTXPAR_ERROR(CTXPAR_ERR_NOT_SUPPORTED,
                            "the cuda device does not implement soft-capping (softcap %g)",
                            (double)q->softcap);
    if (q->sinks)
        return CTXPAR_ERROR(CTXPAR_ERR_NOT_SUPPORTED,
                            "the cuda device does not run attention sinks (not yet verified on a "
                            "GPU)");
    if (q->head_dim > CTXPAR_CUDA_MAX_HEAD_DIM)
        return CTXPAR_ERROR(CTXPAR_ERR_NOT_SUPPORTED,
                            "head_dim %lld is above the CUDA backend's limit of %d",
                            (long long)q->head_dim, CTXPAR_CUDA_MAX_HEAD_DIM);
    if (q->batch > GRID_YZ_LIMIT || q->heads_q > GRID_YZ_LIMIT)
        return CTXPAR_ERROR(CTXPAR_ERR_NOT_SUPPORTED,
                            "batch (%lld) and query heads (%lld) must be <= %d on the CUDA device",
                            (long long)q->batch, (long long)q->heads_q, GRID_YZ_LIMIT);
    // The SIMT kernels keep whole tiles in shared memory: the forward's for F32 and head_dims
    // the tensor cores do not take (not a multiple of 8), the backward's always.
    const int simt_fwd = q->dtype == CTXPAR_DTYPE_F32 || q->head_dim % 8 != 0;
    size_t need = simt_fwd ? ctxpar_cuda_simt_fwd_smem(q->head_dim) : 0;
    if (q->backward && ctxpar_cuda_simt_bwd_smem(q->head_dim) > need)
        need = ctxpar_cuda_simt_bwd_smem(q->head_dim);
    if (need > impl->smem_optin)
        return CTXPAR_ERROR(CTXPAR_ERR_NOT_SUPPORTED,
                            "head_dim %lld needs %zu bytes of shared memory per block; CUDA "
                            "device %d allows %zu",
                            (long long)q->head_dim, need, impl->ordinal, impl->smem_optin);
    return CTXPAR_OK;
}
