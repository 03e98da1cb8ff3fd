// The attention graph for cuDNN's fused flash-attention engine, in one of two forms:
//  - decomposed, as its pattern matcher recognises it (the graph cudnn-frontend's sdpa node
//    expands to on cuDNN 9 before 9.21):
//      S = Q K^T (F32)   S *= scale   [causal: S = row >= col ? S : -inf]
//      M = rowmax(S)   E = exp(S - M)   Z = rowsum(E)   Stats = M + log Z   P = E / Z (16-bit)
//      O = P V
//  - one SDPA operation (cuDNN 9.13+): Q, K (not transposed), V, O, Stats, scale.
// Tensors are 4-D [b, h, s, d] views of ctxpar's [B, S, H, D] memory through strides.
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "ctxpar_backend.h"
#include "cudnn_graph.h"

#define MAX_DESCS 96 // tensors, ops and plan pieces of one graph (81 at most today)
#define MAX_ENGINE_CFGS CTXPAR_CUDNN_MAX_ENGINE_CFGS

// Collects descriptors and the first failure: every step after a failure does nothing, so the
// graph reads as a straight list and is checked once at the end.
typedef struct builder {
    cudnnBackendDescriptor_t desc[MAX_DESCS];
    int n;
    cudnnStatus_t status;
    const char *step;
} builder;

static int ok(const builder *b) {
    return b->status == CUDNN_STATUS_SUCCESS;
}

static void check(builder *b, cudnnStatus_t st, const char *step) {
    if (ok(b) && st != CUDNN_STATUS_SUCCESS) {
        b->status = st;
        b->step = step;
    }
}

static cudnnBackendDescriptor_t make(builder *b, cudnnBackendDescriptorType_t type,
                                     const char *step) {
    cudnnBackendDescriptor_t d = NULL;
    if (!ok(b))
        return NULL;
    if (b->n == MAX_DESCS) {
        check(b, CUDNN_STATUS_INTERNAL_ERROR, step);
        return NULL;
    }
    check(b, cudnnBackendCreateDescriptor(type, &d), step);
    if (ok(b))
        b->desc[b->n++] = d;
    return d;
}

static void set(builder *b, cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
                cudnnBackendAttributeType_t type, int64_t count, const void *value,
                const char *step) {
    if (ok(b))
        check(b, cudnnBackendSetAttribute(d, name, type, count, value), step);
}

static void finalize(builder *b, cudnnBackendDescriptor_t d, const char *step) {
    if (ok(b))
        check(b, cudnnBackendFinalize(d), step);
}

static void set_desc(builder *b, cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
                     cudnnBackendDescriptor_t value, const char *step) {
    set(b, d, name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &value, step);
}

static cudnnBackendDescriptor_t tensor(builder *b, int64_t uid, cudnnDataType_t dt,
                                       const int64_t dims[4], const int64_t strides[4],
                                       bool is_virtual, bool by_value) {
    const int64_t align = 16;
    cudnnBackendDescriptor_t t = make(b, CUDNN_BACKEND_TENSOR_DESCRIPTOR, "tensor");
    set(b, t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt, "tensor data type");
    set(b, t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims, "tensor dims");
    set(b, t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides, "tensor strides");
    set(b, t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid, "tensor uid");
    set(b, t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align, "tensor alignment");
    set(b, t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual, "tensor virtual");
    if (by_value)
        set(b, t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value,
            "tensor by value");
    finalize(b, t, "tensor finalize");
    return t;
}

// y = mode(x[, bb][, t]) computed in `prec`; axis >= 0 for GEN_INDEX.
static cudnnBackendDescriptor_t pointwise(builder *b, cudnnPointwiseMode_t mode,
                                          cudnnDataType_t prec, int64_t axis,
                                          cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t bb,
                                          cudnnBackendDescriptor_t t, cudnnBackendDescriptor_t y) {
    cudnnBackendDescriptor_t pw = make(b, CUDNN_BACKEND_POINTWISE_DESCRIPTOR, "pointwise");
    set(b, pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode, "pointwise mode");
    set(b, pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec,
        "pointwise precision");
    if (axis >= 0)
        set(b, pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis, "pointwise axis");
    finalize(b, pw, "pointwise finalize");
    cudnnBackendDescriptor_t op =
        make(b, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, "pointwise op");
    set_desc(b, op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw, "pointwise op desc");
    set_desc(b, op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x, "pointwise op x");
    if (bb)
        set_desc(b, op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, bb, "pointwise op b");
    if (t)
        set_desc(b, op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, t, "pointwise op t");
    set_desc(b, op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y, "pointwise op y");
    finalize(b, op, "pointwise op finalize");
    return op;
}

// y = reduce(x) over the last axis (y has size 1 there), in F32.
static cudnnBackendDescriptor_t reduction(builder *b, cudnnReduceTensorOp_t kind,
                                          cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
    cudnnBackendDescriptor_t rd = make(b, CUDNN_BACKEND_REDUCTION_DESCRIPTOR, "reduction");
    set(b, rd, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &kind,
        "reduction operator");
    set(b, rd, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f32, "reduction type");
    finalize(b, rd, "reduction finalize");
    cudnnBackendDescriptor_t op =
        make(b, CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, "reduction op");
    set_desc(b, op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x, "reduction op x");
    set_desc(b, op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y, "reduction op y");
    set_desc(b, op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, rd, "reduction op desc");
    finalize(b, op, "reduction op finalize");
    return op;
}

// c = a b (batched over the first two axes), accumulated in F32.
static cudnnBackendDescriptor_t matmul(builder *b, cudnnBackendDescriptor_t a,
                                       cudnnBackendDescriptor_t bm, cudnnBackendDescriptor_t c) {
    const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
    cudnnBackendDescriptor_t md = make(b, CUDNN_BACKEND_MATMUL_DESCRIPTOR, "matmul");
    set(b, md, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f32, "matmul type");
    finalize(b, md, "matmul finalize");
    cudnnBackendDescriptor_t op = make(b, CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, "matmul op");
    set_desc(b, op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, a, "matmul op a");
    set_desc(b, op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, bm, "matmul op b");
    set_desc(b, op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, c, "matmul op c");
    set_desc(b, op, CUDNN_ATTR_OPERATION_MATMUL_DESC, md, "matmul op desc");
    finalize(b, op, "matmul op finalize");
    return op;
}

// The operations of the graph, in order, into ops (returns how many).
static int build_ops(builder *b, const ctxpar_cudnn_shape *s, cudnnBackendDescriptor_t *ops) {
    const cudnnDataType_t io =
        s->dtype == CTXPAR_DTYPE_BF16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF;
    const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
    const int64_t B = s->batch, Hq = s->heads_q, Hk = s->heads_kv, Sq = s->seq_q, Sk = s->seq_k;
    const int64_t D = s->head_dim;
    const int64_t q_dim[4] = {B, Hq, Sq, D};
    const int64_t q_str[4] = {s->q_stride[0], s->q_stride[2], s->q_stride[1], 1};
    const int64_t kt_dim[4] = {B, Hk, D, Sk}; // K^T through its strides
    const int64_t kt_str[4] = {s->k_stride[0], s->k_stride[2], 1, s->k_stride[1]};
    const int64_t v_dim[4] = {B, Hk, Sk, D};
    const int64_t v_str[4] = {s->v_stride[0], s->v_stride[2], s->v_stride[1], 1};
    const int64_t o_str[4] = {Sq * Hq * D, D, Hq * D, 1}; // dense [B, Sq, Hq, D]
    const int64_t s_dim[4] = {B, Hq, Sq, Sk};
    const int64_t s_str[4] = {Hq * Sq * Sk, Sq * Sk, Sk, 1};
    const int64_t r_dim[4] = {B, Hq, Sq, 1};
    const int64_t r_str[4] = {Hq * Sq, Sq, 1, 1}; // = ctxpar's LSE layout [B, Hq, Sq]
    const int64_t one[4] = {1, 1, 1, 1};
    int64_t uid = 100; // virtual tensors
    int n = 0;

    cudnnBackendDescriptor_t q = tensor(b, CTXPAR_CUDNN_UID_Q, io, q_dim, q_str, false, false);
    cudnnBackendDescriptor_t k = tensor(b, CTXPAR_CUDNN_UID_K, io, kt_dim, kt_str, false, false);
    cudnnBackendDescriptor_t v = tensor(b, CTXPAR_CUDNN_UID_V, io, v_dim, v_str, false, false);
    cudnnBackendDescriptor_t o = tensor(b, CTXPAR_CUDNN_UID_O, io, q_dim, o_str, false, false);
    cudnnBackendDescriptor_t stats =
        tensor(b, CTXPAR_CUDNN_UID_STATS, f32, r_dim, r_str, false, false);
    cudnnBackendDescriptor_t scale = tensor(b, CTXPAR_CUDNN_UID_SCALE, f32, one, one, false, true);

    cudnnBackendDescriptor_t s1 = tensor(b, uid++, f32, s_dim, s_str, true, false);
    ops[n++] = matmul(b, q, k, s1);
    cudnnBackendDescriptor_t s2 = tensor(b, uid++, f32, s_dim, s_str, true, false);
    ops[n++] = pointwise(b, CUDNN_POINTWISE_MUL, f32, -1, s1, scale, NULL, s2);
    cudnnBackendDescriptor_t scores = s2;
    if (s->causal) {
        const cudnnDataType_t i32 = CUDNN_DATA_INT32, bln = CUDNN_DATA_BOOLEAN;
        cudnnBackendDescriptor_t row = tensor(b, uid++, i32, s_dim, s_str, true, false);
        ops[n++] = pointwise(b, CUDNN_POINTWISE_GEN_INDEX, f32, 2, scores, NULL, NULL, row);
        cudnnBackendDescriptor_t col = tensor(b, uid++, i32, s_dim, s_str, true, false);
        ops[n++] = pointwise(b, CUDNN_POINTWISE_GEN_INDEX, f32, 3, scores, NULL, NULL, col);
        cudnnBackendDescriptor_t keep = tensor(b, uid++, bln, s_dim, s_str, true, false);
        ops[n++] = pointwise(b, CUDNN_POINTWISE_CMP_GE, bln, -1, row, col, NULL, keep);
        cudnnBackendDescriptor_t neg_inf =
            tensor(b, CTXPAR_CUDNN_UID_NEG_INF, f32, one, one, false, true);
        cudnnBackendDescriptor_t s3 = tensor(b, uid++, f32, s_dim, s_str, true, false);
        ops[n++] = pointwise(b, CUDNN_POINTWISE_BINARY_SELECT, f32, -1, scores, neg_inf, keep, s3);
        scores = s3;
    }
    cudnnBackendDescriptor_t mx = tensor(b, uid++, f32, r_dim, r_str, true, false);
    ops[n++] = reduction(b, CUDNN_REDUCE_TENSOR_MAX, scores, mx);
    cudnnBackendDescriptor_t sub = tensor(b, uid++, f32, s_dim, s_str, true, false);
    ops[n++] = pointwise(b, CUDNN_POINTWISE_SUB, f32, -1, scores, mx, NULL, sub);
    cudnnBackendDescriptor_t ex = tensor(b, uid++, f32, s_dim, s_str, true, false);
    ops[n++] = pointwise(b, CUDNN_POINTWISE_EXP, f32, -1, sub, NULL, NULL, ex);
    cudnnBackendDescriptor_t sum = tensor(b, uid++, f32, r_dim, r_str, true, false);
    ops[n++] = reduction(b, CUDNN_REDUCE_TENSOR_ADD, ex, sum);
    cudnnBackendDescriptor_t lg = tensor(b, uid++, f32, r_dim, r_str, true, false);
    ops[n++] = pointwise(b, CUDNN_POINTWISE_LOG, f32, -1, sum, NULL, NULL, lg);
    ops[n++] = pointwise(b, CUDNN_POINTWISE_ADD, f32, -1, mx, lg, NULL, stats);
    // P in the I/O type: the engine takes the second matmul's A operand in it.
    cudnnBackendDescriptor_t p = tensor(b, uid++, io, s_dim, s_str, true, false);
    ops[n++] = pointwise(b, CUDNN_POINTWISE_DIV, f32, -1, ex, sum, NULL, p);
    ops[n++] = matmul(b, p, v, o);
    return n;
}

#if CUDNN_VERSION >= CTXPAR_CUDNN_SDPA_OP_VERSION
// The single SDPA operation: O = softmax(scale Q K^T) V with Stats, unmasked.
static int build_sdpa_op(builder *b, const ctxpar_cudnn_shape *s, cudnnBackendDescriptor_t *ops) {
    const cudnnDataType_t io =
        s->dtype == CTXPAR_DTYPE_BF16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF;
    const int64_t B = s->batch, Hq = s->heads_q, Hk = s->heads_kv, Sq = s->seq_q, Sk = s->seq_k;
    const int64_t D = s->head_dim;
    const int64_t q_dim[4] = {B, Hq, Sq, D};
    const int64_t q_str[4] = {s->q_stride[0], s->q_stride[2], s->q_stride[1], 1};
    const int64_t kv_dim[4] = {B, Hk, Sk, D}; // the literal K, not K^T
    const int64_t k_str[4] = {s->k_stride[0], s->k_stride[2], s->k_stride[1], 1};
    const int64_t v_str[4] = {s->v_stride[0], s->v_stride[2], s->v_stride[1], 1};
    const int64_t o_str[4] = {Sq * Hq * D, D, Hq * D, 1};
    const int64_t r_dim[4] = {B, Hq, Sq, 1};
    const int64_t r_str[4] = {Hq * Sq, Sq, 1, 1};
    const int64_t one[4] = {1, 1, 1, 1};
    cudnnBackendDescriptor_t q = tensor(b, CTXPAR_CUDNN_UID_Q, io, q_dim, q_str, false, false);
    cudnnBackendDescriptor_t k = tensor(b, CTXPAR_CUDNN_UID_K, io, kv_dim, k_str, false, false);
    cudnnBackendDescriptor_t v = tensor(b, CTXPAR_CUDNN_UID_V, io, kv_dim, v_str, false, false);
    cudnnBackendDescriptor_t o = tensor(b, CTXPAR_CUDNN_UID_O, io, q_dim, o_str, false, false);
    cudnnBackendDescriptor_t stats =
        tensor(b, CTXPAR_CUDNN_UID_STATS, CUDNN_DATA_FLOAT, r_dim, r_str, false, false);
    cudnnBackendDescriptor_t scale =
        tensor(b, CTXPAR_CUDNN_UID_SCALE, CUDNN_DATA_FLOAT, one, one, false, true);
    cudnnBackendDescriptor_t op = make(b, CUDNN_BACKEND_OPERATION_SDPA_FWD_DESCRIPTOR, "sdpa op");
    set_desc(b, op, CUDNN_ATTR_OPERATION_SDPA_FWD_QDESC, q, "sdpa op q");
    set_desc(b, op, CUDNN_ATTR_OPERATION_SDPA_FWD_KDESC, k, "sdpa op k");
    set_desc(b, op, CUDNN_ATTR_OPERATION_SDPA_FWD_VDESC, v, "sdpa op v");
    set_desc(b, op, CUDNN_ATTR_OPERATION_SDPA_FWD_ODESC, o, "sdpa op o");
    set_desc(b, op, CUDNN_ATTR_OPERATION_SDPA_FWD_STATSDESC, stats, "sdpa op stats");
    set_desc(b, op, CUDNN_ATTR_OPERATION_SDPA_FWD_SCALEDESC, scale, "sdpa op scale");
    finalize(b, op, "sdpa op finalize");
    ops[0] = op;
    return 1;
}
#endif

const char *ctxpar_cudnn_form_name(ctxpar_cudnn_form form) {
    return form == CTXPAR_CUDNN_SDPA_OP ? "sdpa operation" : "decomposed";
}

int ctxpar_cudnn_forms(size_t runtime_version, int causal, ctxpar_cudnn_form order[2]) {
    const int op = CUDNN_VERSION >= CTXPAR_CUDNN_SDPA_OP_VERSION && !causal &&
                   runtime_version >= CTXPAR_CUDNN_SDPA_OP_VERSION;
    if (!op) {
        order[0] = CTXPAR_CUDNN_DECOMPOSED;
        return 1;
    }
    const int op_first = runtime_version >= CTXPAR_CUDNN_PREFER_SDPA_OP_VERSION;
    order[0] = op_first ? CTXPAR_CUDNN_SDPA_OP : CTXPAR_CUDNN_DECOMPOSED;
    order[1] = op_first ? CTXPAR_CUDNN_DECOMPOSED : CTXPAR_CUDNN_SDPA_OP;
    return 2;
}

int64_t ctxpar_cudnn_configs_to_try(int64_t reported) {
    if (reported < 0)
        return 0;
    return reported < MAX_ENGINE_CFGS ? reported : MAX_ENGINE_CFGS;
}

static ctxpar_status not_supported(const builder *b) {
    char detail[256] = "";
    cudnnGetLastErrorString(detail, sizeof detail);
    return CTXPAR_ERROR(CTXPAR_ERR_NOT_SUPPORTED, "cuDNN attention graph: %s: %s%s%s",
                        b->step ? b->step : "?", cudnnGetErrorString(b->status),
                        detail[0] ? ": " : "", detail);
}

static void destroy_all(builder *b) {
    for (int i = 0; i < b->n; i++)
        cudnnBackendDestroyDescriptor(b->desc[i]);
    b->n = 0;
}

ctxpar_status ctxpar_cudnn_plan_build(cudnnHandle_t handle, ctxpar_cudnn_form form,
                                      const ctxpar_cudnn_shape *shape, ctxpar_cudnn_plan *out) {
    builder b;
    memset(&b, 0, sizeof b);
    b.status = CUDNN_STATUS_SUCCESS;
    cudnnBackendDescriptor_t ops[16];
    int n_ops = 0;
    if (form == CTXPAR_CUDNN_DECOMPOSED)
        n_ops = build_ops(&b, shape, ops);
#if CUDNN_VERSION >= CTXPAR_CUDNN_SDPA_OP_VERSION
    else if (form == CTXPAR_CUDNN_SDPA_OP)
        n_ops = build_sdpa_op(&b, shape, ops);
#endif
    else
        check(&b, CUDNN_STATUS_NOT_SUPPORTED, "this build's cuDNN headers have no SDPA operation");

    // The handle (a required attribute of the graph and the plan) and the device properties
    // built from it: without them cuDNN does not know the GPU the heuristics and the plan are
    // for.
    cudnnBackendDescriptor_t graph = make(&b, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, "graph");
    set(&b, graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle,
        "graph handle");
    set(&b, graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, n_ops, ops,
        "graph ops");
    finalize(&b, graph, "graph finalize");
    cudnnBackendDescriptor_t devprop =
        make(&b, CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR, "device properties");
    set(&b, devprop, CUDNN_ATTR_DEVICEPROP_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle,
        "device properties handle");
    finalize(&b, devprop, "device properties finalize");

    const cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
    cudnnBackendDescriptor_t heur = make(&b, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, "heuristics");
    set_desc(&b, heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph, "heuristics graph");
    set(&b, heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode, "heuristics mode");
    set_desc(&b, heur, CUDNN_ATTR_ENGINEHEUR_DEVICEPROP, devprop, "heuristics device properties");
    finalize(&b, heur, "heuristics finalize");

    // The heuristics fill engine configs we create; take them in their order of preference.
    // cuDNN reports how many it has, which may be more than we asked for and made.
    cudnnBackendDescriptor_t cfgs[MAX_ENGINE_CFGS];
    int64_t n_cfgs = 0;
    for (int i = 0; i < MAX_ENGINE_CFGS; i++)
        cfgs[i] = make(&b, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, "engine config");
    if (ok(&b))
        check(&b,
              cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                       CUDNN_TYPE_BACKEND_DESCRIPTOR, MAX_ENGINE_CFGS, &n_cfgs,
                                       cfgs),
              "heuristics results");
    n_cfgs = ctxpar_cudnn_configs_to_try(n_cfgs);
    if (ok(&b) && n_cfgs == 0)
        check(&b, CUDNN_STATUS_NOT_SUPPORTED, "heuristics found no engine");

    cudnnBackendDescriptor_t plan = NULL;
    for (int64_t i = 0; ok(&b) && i < n_cfgs && !plan; i++) {
        cudnnBackendDescriptor_t p = make(&b, CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, "plan");
        set(&b, p, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle,
            "plan handle");
        set_desc(&b, p, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, cfgs[i], "plan engine config");
        set_desc(&b, p, CUDNN_ATTR_EXECUTION_PLAN_DEVICEPROP, devprop, "plan device properties");
        if (!ok(&b))
            break;
        cudnnStatus_t st = cudnnBackendFinalize(p);
        if (st == CUDNN_STATUS_SUCCESS)
            plan = p;
        else if (i == n_cfgs - 1)
            check(&b, st, "plan finalize (every engine config)");
    }
    int64_t ws = 0, got = 0;
    if (ok(&b))
        check(&b,
              cudnnBackendGetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                       CUDNN_TYPE_INT64, 1, &got, &ws),
              "plan workspace size");
    if (!ok(&b)) {
        ctxpar_status st = not_supported(&b);
        destroy_all(&b);
        return st;
    }
    cudnnBackendDescriptor_t *keep = malloc((size_t)b.n * sizeof *keep);
    if (!keep) {
        destroy_all(&b);
        return CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "cannot keep %d cuDNN descriptors", b.n);
    }
    memcpy(keep, b.desc, (size_t)b.n * sizeof *keep);
    out->plan = plan;
    out->workspace_bytes = ws;
    out->descs = keep;
    out->n_descs = b.n;
    return CTXPAR_OK;
}

void ctxpar_cudnn_plan_free(ctxpar_cudnn_plan *p) {
    if (!p || !p->descs)
        return;
    // Destroy in reverse creation order: the plan and the graph before what they refer to.
    for (int i = p->n_descs - 1; i >= 0; i--)
        cudnnBackendDestroyDescriptor(p->descs[i]);
    free(p->descs);
    memset(p, 0, sizeof *p);
}
