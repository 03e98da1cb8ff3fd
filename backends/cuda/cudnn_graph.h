// The cuDNN operation graph of scaled dot-product attention with softmax statistics, built with
// the backend API into an execution plan for one shape.
#ifndef CTXPAR_CUDNN_GRAPH_H
#define CTXPAR_CUDNN_GRAPH_H

#include <cudnn.h>
#include <stddef.h>
#include <stdint.h>

#include "ctxpar.h"

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

// Builds the plan (the first engine config cuDNN's heuristics offer that finalises). Returns
// CTXPAR_ERR_NOT_SUPPORTED, naming the step and cuDNN's message, when there is none.
ctxpar_status ctxpar_cudnn_plan_build(const ctxpar_cudnn_shape *shape, ctxpar_cudnn_plan *out);
void ctxpar_cudnn_plan_free(ctxpar_cudnn_plan *p);

#endif // CTXPAR_CUDNN_GRAPH_H
