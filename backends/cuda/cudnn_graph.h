// The cuDNN operation graph of scaled dot-product attention with softmax statistics, built with
// the backend API into an execution plan for one shape.
#ifndef CTXPAR_CUDNN_GRAPH_H
#define CTXPAR_CUDNN_GRAPH_H

#include <cudnn.h>
#include <stddef.h>
#include <stdint.h>

#include "ctxpar.h"

#ifdef __cplusplus
extern "C" {
#endif

// Unique ids of the tensors the caller binds in the variant pack.
enum {
    CTXPAR_CUDNN_UID_Q = 1,
    CTXPAR_CUDNN_UID_K = 2,
    CTXPAR_CUDNN_UID_V = 3,
    CTXPAR_CUDNN_UID_O = 4,       // [B, Sq, Hq, D] dense, dtype of q
    CTXPAR_CUDNN_UID_STATS = 5,   // [B, Hq, Sq] F32: the natural-log LSE of each row
    CTXPAR_CUDNN_UID_SCALE = 6,   // by value, F32
    CTXPAR_CUDNN_UID_NEG_INF = 7, // by value, F32, -inf (causal only)
};

// Everything a plan depends on. Strides are in elements (b, s, h; d is 1).
typedef struct ctxpar_cudnn_shape {
    ctxpar_dtype dtype;
    int64_t batch, heads_q, heads_kv, seq_q, seq_k, head_dim;
    int64_t q_stride[3], k_stride[3], v_stride[3];
    int causal;
} ctxpar_cudnn_shape;

typedef struct ctxpar_cudnn_plan {
    cudnnBackendDescriptor_t plan;
    int64_t workspace_bytes;
    cudnnBackendDescriptor_t *descs; // the graph's descriptors, kept alive with the plan
    int n_descs;
} ctxpar_cudnn_plan;

// The two forms of the same computation cuDNN accepts:
//  - DECOMPOSED: matmul, pointwise and reduction nodes that cuDNN's fused flash-attention
//    engine recognises by pattern (what cudnn-frontend expanded its sdpa node to before 9.21);
//  - SDPA_OP: the single CUDNN_BACKEND_OPERATION_SDPA_FWD_DESCRIPTOR (cuDNN 9.13 and newer),
//    unmasked only here: a causal mask on it needs the mask subgraph of cuDNN 9.21, not built.
typedef enum ctxpar_cudnn_form {
    CTXPAR_CUDNN_DECOMPOSED = 0,
    CTXPAR_CUDNN_SDPA_OP = 1,
} ctxpar_cudnn_form;

// First cuDNN versions (cudnnGetVersion() numbering) with the SDPA operation, and from which
// its pattern matcher may no longer take the decomposed graph (so the operation goes first).
#define CTXPAR_CUDNN_SDPA_OP_VERSION 91300
#define CTXPAR_CUDNN_PREFER_SDPA_OP_VERSION 92100

// Most engine configs tried per graph, in the heuristics' order.
#define CTXPAR_CUDNN_MAX_ENGINE_CFGS 8

const char *ctxpar_cudnn_form_name(ctxpar_cudnn_form form);

// The forms to try for a shape, in order, given the cuDNN version running and whether the block
// is causal; the SDPA operation only when both this build's headers and the running cuDNN have
// it. Returns how many (1 or 2).
int ctxpar_cudnn_forms(size_t runtime_version, int causal, ctxpar_cudnn_form order[2]);

// How many of the `reported` engine configs the heuristics return are read: never more than
// the CTXPAR_CUDNN_MAX_ENGINE_CFGS descriptors made for them (cuDNN reports the total it has).
int64_t ctxpar_cudnn_configs_to_try(int64_t reported);

// Builds the plan of `form` on `handle` (set on the graph, the device properties given to the
// heuristics and the plan): the first engine config the heuristics offer that finalises.
// Returns CTXPAR_ERR_NOT_SUPPORTED, naming the step and cuDNN's message, when there is none.
ctxpar_status ctxpar_cudnn_plan_build(cudnnHandle_t handle, ctxpar_cudnn_form form,
                                      const ctxpar_cudnn_shape *shape, ctxpar_cudnn_plan *out);
void ctxpar_cudnn_plan_free(ctxpar_cudnn_plan *p);

#ifdef __cplusplus
}
#endif

#endif // CTXPAR_CUDNN_GRAPH_H
