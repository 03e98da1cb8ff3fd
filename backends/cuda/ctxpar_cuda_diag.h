/*
 * ctxpar_cuda_diag.h - what a CUDA device decided at creation and on its latest forward block:
 * for tests, `ctxpar bench` and the GPU script, so that a path not taken says why instead of
 * silently running another one. (A candidate for api/ctxpar_cuda.h once it has settled.)
 */
#ifndef CTXPAR_CUDA_DIAG_H
#define CTXPAR_CUDA_DIAG_H

#include <stddef.h>

#include "ctxpar.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ctxpar_cuda_diag {
    /* Memory: 1 = a stream-ordered pool (frees never block the host), 0 = cudaMalloc (the GPU
     * or driver has no pool support, or CTXPAR_CUDA_POOL=0). peers_granted: other GPUs given
     * read/write access to the pool (those cudaDeviceCanAccessPeer allows). */
    int uses_pool;
    int peers_granted;
    /* Dynamic shared memory of the SIMT kernels, in bytes: what creation set (the need at the
     * largest head_dim, or the GPU's opt-in limit when smaller), what the kernels report as
     * allowed now (the smallest over dtypes and kernels), the need at the largest head_dim,
     * and the GPU's opt-in limit. */
    size_t smem_fwd_set, smem_bwd_set;
    size_t smem_fwd_allowed, smem_bwd_allowed;
    size_t smem_fwd_need_max, smem_bwd_need_max;
    size_t smem_optin;
    /* cuDNN: the runtime version (0 when off or unavailable); the graph form of the latest plan
     * used ("sdpa operation", "decomposed", or "" before one ran); why the latest forward block
     * did not run on cuDNN ("" when it did; with cuDNN off or unavailable, why). */
    int cudnn_version;
    char cudnn_graph[32];
    char cudnn_reason[320];
} ctxpar_cuda_diag;

/* Fills *out for a device made by ctxpar_device_create_cuda; INVALID_ARG for any other. */
ctxpar_status ctxpar_cuda_device_diag(const ctxpar_device *device, ctxpar_cuda_diag *out);

#ifdef __cplusplus
}
#endif

#endif /* CTXPAR_CUDA_DIAG_H */
