// cuDNN on a CUDA device: the handle, a small cache of execution plans per shape, and running a
// forward block through it into ctxpar's F32 accumulators.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_cudnn.h"
#include "cudnn_graph.h"

// Device-property descriptors (given to the heuristics and the plan) need cuDNN 9.8.
#define MIN_CUDNN_VERSION 90800
#define PLAN_CACHE 16 // shapes remembered per device; a ring uses two or three

typedef struct cache_entry {
    int used;
    int supported; // 0: cuDNN has no plan for this shape; do not ask again
    ctxpar_cudnn_shape shape;
    ctxpar_cudnn_form form; // of the plan, when supported
    ctxpar_cudnn_plan plan;
    char reason[256]; // when not supported: why, for every form tried (fits the device reason)
} cache_entry;

struct ctxpar_cudnn {
    cudnnHandle_t handle;
    size_t version; // cudnnGetVersion(): the library running, not the headers built against
    cache_entry cache[PLAN_CACHE];
    int next; // slot replaced next when the cache is full
};

static ctxpar_status cudnn_fail(cudnnStatus_t st, const char *file, int line, const char *what) {
    char detail[256] = "";
    cudnnGetLastErrorString(detail, sizeof detail);
    return ctxpar_set_error(CTXPAR_ERR_DEVICE, file, line, "%s failed: %s%s%s", what,
                            cudnnGetErrorString(st), detail[0] ? ": " : "", detail);
}

#define CUDNN_CHECK(call)                                                                          \
    do {                                                                                           \
        cudnnStatus_t cudnn_st_ = (call);                                                          \
        if (cudnn_st_ != CUDNN_STATUS_SUCCESS)                                                     \
            return cudnn_fail(cudnn_st_, __FILE__, __LINE__, #call);                               \
    } while (0)

ctxpar_status ctxpar_cudnn_create(int ordinal, ctxpar_cudnn **cudnn_out) {
    size_t version = cudnnGetVersion();
    if (version < MIN_CUDNN_VERSION)
        return CTXPAR_ERROR(CTXPAR_ERR_NOT_SUPPORTED,
                            "cuDNN %zu is too old: ctxpar needs %d or "
                            "newer",
                            version, MIN_CUDNN_VERSION);
    cudaError_t e = cudaSetDevice(ordinal);
    if (e != cudaSuccess)
        return ctxpar_cuda_fail(e, __FILE__, __LINE__, "cudaSetDevice");
    ctxpar_cudnn *c = calloc(1, sizeof *c);
    if (!c)
        return CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "cannot allocate the cuDNN state");
    cudnnStatus_t st = cudnnCreate(&c->handle);
    if (st != CUDNN_STATUS_SUCCESS) {
        free(c);
        return CTXPAR_ERROR(CTXPAR_ERR_NOT_SUPPORTED, "cuDNN cannot start on CUDA device %d: %s",
                            ordinal, cudnnGetErrorString(st));
    }
    c->version = version;
    *cudnn_out = c;
    return CTXPAR_OK;
}

int ctxpar_cudnn_runtime_version(const ctxpar_cudnn *c) {
    return c ? (int)c->version : 0;
}

void ctxpar_cudnn_destroy(ctxpar_cudnn *c) {
    if (!c)
        return;
    for (int i = 0; i < PLAN_CACHE; i++)
        ctxpar_cudnn_plan_free(&c->cache[i].plan);
    cudnnDestroy(c->handle);
    free(c);
}

static int same_shape(const ctxpar_cudnn_shape *a, const ctxpar_cudnn_shape *b) {
    return memcmp(a, b, sizeof *a) == 0;
}

static ctxpar_cudnn_shape shape_of(const ctxpar_cuda_attn_args *a, int causal) {
    ctxpar_cudnn_shape s;
    memset(&s, 0, sizeof s); // padding too: shapes are compared with memcmp
    s.dtype = a->dtype;
    s.batch = a->batch;
    s.heads_q = a->heads_q;
    s.heads_kv = a->heads_kv;
    s.seq_q = a->seq_q;
    s.seq_k = a->seq_k;
    s.head_dim = a->head_dim;
    memcpy(s.q_stride, a->q.stride, sizeof s.q_stride);
    memcpy(s.k_stride, a->k.stride, sizeof s.k_stride);
    memcpy(s.v_stride, a->v.stride, sizeof s.v_stride);
    s.causal = causal != 0;
    return s;
}

// Appends "form: message" to a cache entry's reason.
static void add_reason(cache_entry *e, ctxpar_cudnn_form form, const char *msg) {
    size_t n = strlen(e->reason);
    snprintf(e->reason + n, sizeof e->reason - n, "%s%s: %s", n ? "; " : "",
             ctxpar_cudnn_form_name(form), msg);
}

// The cache entry for a shape, building its plan on first sight: each form the running cuDNN
// has, in the order ctxpar_cudnn_forms gives. A shape cuDNN rejects in every form is remembered
// as unsupported, with cuDNN's reasons (falling back is a normal outcome, not an error; the
// reason is shown through ctxpar_cuda_device_diag).
static ctxpar_status lookup(ctxpar_cudnn *c, const ctxpar_cudnn_shape *s, cache_entry **out) {
    for (int i = 0; i < PLAN_CACHE; i++) {
        if (c->cache[i].used && same_shape(&c->cache[i].shape, s)) {
            *out = &c->cache[i];
            return CTXPAR_OK;
        }
    }
    cache_entry *e = &c->cache[c->next];
    c->next = (c->next + 1) % PLAN_CACHE;
    ctxpar_cudnn_plan_free(&e->plan);
    memset(e, 0, sizeof *e);
    ctxpar_cudnn_form forms[2];
    const int n_forms = ctxpar_cudnn_forms(c->version, s->causal, forms);
    for (int f = 0; f < n_forms && !e->supported; f++) {
        ctxpar_cudnn_plan plan;
        memset(&plan, 0, sizeof plan);
        ctxpar_status st = ctxpar_cudnn_plan_build(c->handle, forms[f], s, &plan);
        if (st == CTXPAR_ERR_OUT_OF_MEMORY)
            return st; // the entry stays unused
        if (st == CTXPAR_OK) {
            e->supported = 1;
            e->form = forms[f];
            e->plan = plan;
        } else {
            add_reason(e, forms[f], ctxpar_last_error());
            ctxpar_clear_error();
        }
    }
    e->used = 1;
    e->shape = *s;
    *out = e;
    return CTXPAR_OK;
}

static size_t round_up(size_t n) {
    return (n + 255) & ~(size_t)255;
}

// One scratch buffer on the stream: O (dense, 16-bit), the statistics, the plan's workspace.
static ctxpar_status execute(struct ctxpar_device *dev, ctxpar_cudnn *c, const cache_entry *e,
                             const ctxpar_cuda_attn_args *a, float *out_acc, float *lse_acc,
                             int merge, cudaStream_t stream) {
    const size_t rows = (size_t)(a->batch * a->seq_q * a->heads_q);
    const size_t o_bytes = round_up(rows * (size_t)a->head_dim * 2);
    const size_t stats_bytes = round_up(rows * sizeof(float));
    const size_t total = o_bytes + stats_bytes + (size_t)e->plan.workspace_bytes;
    unsigned char *scratch = NULL;
    CTXPAR_CHECK(ctxpar_cuda_scratch_alloc(dev, total, stream, (void **)&scratch));
    unsigned char *o = scratch, *stats = scratch + o_bytes;
    void *workspace = e->plan.workspace_bytes ? scratch + o_bytes + stats_bytes : NULL;

    float scale = a->scale, neg_inf = -INFINITY; // by-value operands: read when enqueued
    int64_t uids[7] = {CTXPAR_CUDNN_UID_Q,      CTXPAR_CUDNN_UID_K,     CTXPAR_CUDNN_UID_V,
                       CTXPAR_CUDNN_UID_O,      CTXPAR_CUDNN_UID_STATS, CTXPAR_CUDNN_UID_SCALE,
                       CTXPAR_CUDNN_UID_NEG_INF};
    void *ptrs[7] = {(void *)a->q.data, (void *)a->k.data, (void *)a->v.data, o, stats, &scale,
                     &neg_inf};
    const int64_t n = e->shape.causal ? 7 : 6;

    ctxpar_status st = CTXPAR_OK;
    cudnnBackendDescriptor_t pack = NULL;
    cudnnStatus_t cs = cudnnSetStream(c->handle, stream);
    const char *what = "cudnnSetStream";
    if (cs == CUDNN_STATUS_SUCCESS) {
        what = "cudnnBackendCreateDescriptor(variant pack)";
        cs = cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &pack);
    }
    if (cs == CUDNN_STATUS_SUCCESS) {
        what = "variant pack";
        cs = cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n,
                                      uids);
        if (cs == CUDNN_STATUS_SUCCESS)
            cs = cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS,
                                          CUDNN_TYPE_VOID_PTR, n, ptrs);
        if (cs == CUDNN_STATUS_SUCCESS)
            cs = cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE,
                                          CUDNN_TYPE_VOID_PTR, 1, &workspace);
        if (cs == CUDNN_STATUS_SUCCESS)
            cs = cudnnBackendFinalize(pack);
    }
    if (cs == CUDNN_STATUS_SUCCESS) {
        what = "cudnnBackendExecute";
        cs = cudnnBackendExecute(c->handle, e->plan.plan, pack);
    }
    if (cs != CUDNN_STATUS_SUCCESS)
        st = cudnn_fail(cs, __FILE__, __LINE__, what);
    if (pack)
        cudnnBackendDestroyDescriptor(pack);
    if (st == CTXPAR_OK) {
        cudaError_t ce =
            ctxpar_cuda_launch_merge(out_acc, lse_acc, o, a->dtype, (const float *)stats, a->batch,
                                     a->seq_q, a->heads_q, a->head_dim, merge, stream);
        if (ce != cudaSuccess)
            st = ctxpar_cuda_fail(ce, __FILE__, __LINE__, "ctxpar_cuda_launch_merge(cuDNN)");
    }
    ctxpar_status freed = ctxpar_cuda_scratch_free(dev, scratch, stream);
    return st != CTXPAR_OK ? st : freed;
}

// Records why block `a` does not run on cuDNN (the device shows it through the diag query).
static void not_taken(struct ctxpar_device *dev, const char *fmt, const char *detail) {
    ctxpar_cuda_impl *impl = ctxpar_cuda_impl_of(dev);
    snprintf(impl->cudnn_reason, sizeof impl->cudnn_reason, fmt, detail);
}

ctxpar_status ctxpar_cudnn_attn_fwd(struct ctxpar_device *dev, ctxpar_cudnn *c,
                                    const ctxpar_cuda_attn_args *a, int causal, float *out_acc,
                                    float *lse_acc, int merge, cudaStream_t stream, int *ran_out) {
    *ran_out = 0;
    if (a->dtype == CTXPAR_DTYPE_F32) {
        not_taken(dev, "%s", "F32 inputs (cuDNN's fused attention takes F16/BF16)");
        return CTXPAR_OK;
    }
    if (a->head_dim % 8 != 0) {
        not_taken(dev, "%s", "head_dim is not a multiple of 8");
        return CTXPAR_OK;
    }
    if (!a->aligned16) {
        not_taken(dev, "%s", "q, k or v rows are not 16-byte aligned");
        return CTXPAR_OK;
    }
    ctxpar_cudnn_shape s = shape_of(a, causal);
    cache_entry *e = NULL;
    CTXPAR_CHECK(lookup(c, &s, &e));
    if (!e->supported) {
        not_taken(dev, "no plan for this shape: %s", e->reason);
        return CTXPAR_OK;
    }
    CTXPAR_CHECK(execute(dev, c, e, a, out_acc, lse_acc, merge, stream));
    ctxpar_cuda_impl *impl = ctxpar_cuda_impl_of(dev);
    impl->cudnn_reason[0] = '\0';
    impl->cudnn_graph = ctxpar_cudnn_form_name(e->form);
    *ran_out = 1;
    return CTXPAR_OK;
}
