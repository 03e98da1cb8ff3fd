// Stand-in for cuda_cudnn.c when the toolkit has no cuDNN: the device runs its own kernels.
#include "cuda_cudnn.h"

ctxpar_status ctxpar_cudnn_create(int ordinal, ctxpar_cudnn **cudnn_out) {
    (void)cudnn_out;
    return CTXPAR_ERROR(CTXPAR_ERR_NOT_SUPPORTED, "ctxpar was built without cuDNN (device %d)",
                        ordinal);
}

void ctxpar_cudnn_destroy(ctxpar_cudnn *c) {
    (void)c;
}

int ctxpar_cudnn_runtime_version(const ctxpar_cudnn *c) {
    (void)c;
    return 0;
}

ctxpar_status ctxpar_cudnn_attn_fwd(struct ctxpar_device *dev, ctxpar_cudnn *c,
                                    const ctxpar_cuda_attn_args *a, int causal, float *out_acc,
                                    float *lse_acc, int merge, cudaStream_t stream, int *ran_out) {
    (void)dev, (void)c, (void)a, (void)causal, (void)out_acc, (void)lse_acc, (void)merge;
    (void)stream;
    *ran_out = 0;
    return CTXPAR_OK;
}
