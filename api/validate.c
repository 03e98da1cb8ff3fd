// Validation of every argument of the attention entry points. Messages name the argument and the
// values, so that a user can fix the call from the message alone.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ctxpar_count.h"
#include "registry.h"
#include "validate.h"

#define BAD(...) CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, __VA_ARGS__)

ctxpar_status ctxpar_validate_tensor(const char *name, const ctxpar_tensor *t) {
    if (!t)
        return BAD("%s is NULL", name);
    if (!t->data)
        return BAD("%s.data is NULL", name);
    if (ctxpar_dtype_size(t->dtype) == 0)
        return BAD("%s.dtype (%d) is not a ctxpar_dtype", name, (int)t->dtype);
    for (int d = 0; d < 4; d++)
        if (t->shape[d] <= 0)
            return BAD("%s.shape[%d] (%lld) must be > 0", name, d, (long long)t->shape[d]);
    if (t->stride[3] != 1)
        return BAD("%s.stride[3] (%lld) must be 1: head_dim must be contiguous", name,
                   (long long)t->stride[3]);
    // Sort the dimensions of extent > 1 by stride; each must step over the whole extent of the
    // ones inside it, or two indices would address the same element.
    int order[4], n = 0;
    for (int d = 0; d < 4; d++) {
        if (t->shape[d] == 1)
            continue;
        if (t->stride[d] <= 0)
            return BAD("%s.stride[%d] (%lld) must be > 0", name, d, (long long)t->stride[d]);
        int i = n++;
        while (i > 0 && t->stride[order[i - 1]] > t->stride[d]) {
            order[i] = order[i - 1];
            i--;
        }
        order[i] = d;
    }
    for (int i = 1; i < n; i++) {
        int in = order[i - 1], out = order[i];
        size_t span = ctxpar_count(t->stride[in], t->shape[in], 1, 1);
        if ((size_t)t->stride[out] < span)
            return BAD("%s.stride[%d] (%lld) overlaps dimension %d (stride %lld x shape %lld)",
                       name, out, (long long)t->stride[out], in, (long long)t->stride[in],
                       (long long)t->shape[in]);
    }
    // The bytes the view spans (last element's offset + 1) must be addressable.
    size_t extent = 1, step;
    for (int d = 0; d < 4; d++)
        if (!ctxpar_count_checked(&step, t->shape[d] - 1, t->shape[d] > 1 ? t->stride[d] : 0, 1,
                                  1) ||
            __builtin_add_overflow(extent, step, &extent))
            extent = SIZE_MAX;
    if (ctxpar_count_mul(extent, ctxpar_dtype_size(t->dtype)) > PTRDIFF_MAX)
        return BAD("%s spans more than 2^63 bytes: shape [%lld, %lld, %lld, %lld], strides [%lld, "
                   "%lld, %lld, %lld]",
                   name, (long long)t->shape[0], (long long)t->shape[1], (long long)t->shape[2],
                   (long long)t->shape[3], (long long)t->stride[0], (long long)t->stride[1],
                   (long long)t->stride[2], (long long)t->stride[3]);
    return CTXPAR_OK;
}

ctxpar_status ctxpar_params_normalize(const ctxpar_attn_params *p, ctxpar_attn_params *out) {
    if (!p)
        return BAD("params is NULL");
    const size_t need = offsetof(ctxpar_attn_params, algo) + sizeof p->algo;
    if (p->struct_size < need)
        return BAD("params->struct_size (%zu) is too small: initialise params with "
                   "CTXPAR_ATTN_PARAMS_INIT",
                   p->struct_size);
    // A caller built against an older header knows fewer fields: those past its struct_size keep
    // their defaults, and nothing past it is read.
    ctxpar_attn_params d = CTXPAR_ATTN_PARAMS_INIT;
    memcpy(&d, p, p->struct_size < sizeof d ? p->struct_size : sizeof d);
    d.struct_size = sizeof d;
    *out = d;
    return CTXPAR_OK;
}

ctxpar_status ctxpar_validate_same(const char *name, const ctxpar_tensor *t, const char *like_name,
                                   const ctxpar_tensor *like) {
    CTXPAR_CHECK(ctxpar_validate_tensor(name, t));
    if (t->dtype != like->dtype)
        return BAD("%s.dtype (%s) != %s.dtype (%s)", name, ctxpar_dtype_name(t->dtype), like_name,
                   ctxpar_dtype_name(like->dtype));
    for (int d = 0; d < 4; d++)
        if (t->shape[d] != like->shape[d])
            return BAD("%s.shape[%d] (%lld) != %s.shape[%d] (%lld)", name, d,
                       (long long)t->shape[d], like_name, d, (long long)like->shape[d]);
    return CTXPAR_OK;
}

static ctxpar_status validate_cu_seqlens(const ctxpar_attn_params *p, int64_t seq_global) {
    if (!p->cu_seqlens) {
        if (p->num_docs != 0)
            return BAD("params.num_docs (%lld) is set but params.cu_seqlens is NULL",
                       (long long)p->num_docs);
        return CTXPAR_OK;
    }
    if (p->num_docs < 1)
        return BAD("params.num_docs (%lld) must be >= 1 with params.cu_seqlens",
                   (long long)p->num_docs);
    if (p->cu_seqlens[0] != 0)
        return BAD("params.cu_seqlens[0] (%d) must be 0", p->cu_seqlens[0]);
    // Equal boundaries are an empty document (data loaders make them): allowed, it holds nothing.
    for (int64_t i = 1; i <= p->num_docs; i++)
        if (p->cu_seqlens[i] < p->cu_seqlens[i - 1])
            return BAD("params.cu_seqlens is decreasing: [%lld] = %d < [%lld] = %d",
                       (long long)i, p->cu_seqlens[i], (long long)(i - 1), p->cu_seqlens[i - 1]);
    if (p->cu_seqlens[p->num_docs] != seq_global)
        return BAD("params.cu_seqlens[%lld] (%d) must equal the global sequence length (%lld)",
                   (long long)p->num_docs, p->cu_seqlens[p->num_docs], (long long)seq_global);
    return CTXPAR_OK;
}

ctxpar_status ctxpar_validate_params(const ctxpar_attn_params *p, int64_t seq_global) {
    if (!p)
        return BAD("params is NULL");
    if (p->struct_size != sizeof *p)
        return CTXPAR_ERROR(CTXPAR_ERR_INTERNAL, "params were not normalized (struct_size %zu)",
                            p->struct_size);
    if (p->algo != CTXPAR_ALGO_AUTO && !ctxpar_algorithm_find(p->algo))
        return BAD("params.algo (%d) is not a ctxpar_algo", (int)p->algo);
    if ((unsigned)p->layout > CTXPAR_LAYOUT_STRIPED)
        return BAD("params.layout (%d) is not a ctxpar_layout", (int)p->layout);
    if ((unsigned)p->mask > CTXPAR_MASK_CAUSAL)
        return BAD("params.mask (%d) is not a ctxpar_mask", (int)p->mask);
    if (p->window_left < 0)
        return BAD("params.window_left (%lld) must be >= 0 (0 = no window)",
                   (long long)p->window_left);
    if (p->window_right < 0)
        return BAD("params.window_right (%lld) must be >= 0 (0 = no limit)",
                   (long long)p->window_right);
    if (!isfinite(p->softmax_scale))
        return BAD("params.softmax_scale (%g) must be finite (0 = 1/sqrt(head_dim))",
                   (double)p->softmax_scale);
    if (p->seq_len_global < 0)
        return BAD("params.seq_len_global (%lld) must be >= 0", (long long)p->seq_len_global);
    // Reserved fields whose features are not implemented yet: refused, never ignored.
    if (p->sinks || p->dsinks)
        return CTXPAR_ERROR(CTXPAR_ERR_NOT_SUPPORTED, "params.sinks: attention sinks are not "
                                                      "implemented yet");
    if (p->softcap != 0.0f)
        return CTXPAR_ERROR(CTXPAR_ERR_NOT_SUPPORTED,
                            "params.softcap: soft-capping is not implemented yet");
    if (p->assignment)
        return CTXPAR_ERROR(CTXPAR_ERR_NOT_SUPPORTED,
                            "params.assignment: custom layouts are not implemented yet");
    if (p->ulysses != 0)
        return CTXPAR_ERROR(CTXPAR_ERR_NOT_SUPPORTED,
                            "params.ulysses: the hybrid algorithm is not implemented yet");
    return validate_cu_seqlens(p, seq_global);
}

ctxpar_status ctxpar_validate_problem(const ctxpar_attn_params *p, const ctxpar_comm *comm,
                                      const ctxpar_tensor *q, const ctxpar_tensor *k,
                                      const ctxpar_tensor *v, ctxpar_problem *pb_out) {
    CTXPAR_CHECK(ctxpar_validate_tensor("q", q));
    CTXPAR_CHECK(ctxpar_validate_tensor("k", k));
    if (k->dtype != q->dtype)
        return BAD("k.dtype (%s) != q.dtype (%s)", ctxpar_dtype_name(k->dtype),
                   ctxpar_dtype_name(q->dtype));
    const char *dim_name[4] = {"batch", "seq", "heads", "head_dim"};
    for (int d = 0; d < 4; d++)
        if (d != 2 && k->shape[d] != q->shape[d])
            return BAD("k.shape[%d] (%lld) != q.shape[%d] (%lld): %s must match", d,
                       (long long)k->shape[d], d, (long long)q->shape[d], dim_name[d]);
    // v after k is checked against q, so that a message names the tensor that is off.
    CTXPAR_CHECK(ctxpar_validate_same("v", v, "k", k));
    if (q->shape[2] % k->shape[2] != 0)
        return BAD("q heads (%lld) must be a multiple of k heads (%lld)", (long long)q->shape[2],
                   (long long)k->shape[2]);
    int P = comm->size;
    if (P > (1 << 20)) // ring steps travel in 20-bit transfer tags
        return CTXPAR_ERROR(CTXPAR_ERR_NOT_SUPPORTED, "%d ranks: at most 2^20 are supported", P);
    // Every buffer an algorithm makes is at most a few F32 copies of the whole sequence's Q, K, V
    // or out: 32 bytes per element of [B, S, Hq, D] bounds them all (Hkv <= Hq).
    size_t elems;
    if (!ctxpar_count_checked(&elems, q->shape[0], q->shape[1], P, q->shape[2]) ||
        ctxpar_count_mul(ctxpar_count_mul(elems, (size_t)q->shape[3]), 32) > PTRDIFF_MAX)
        return BAD("problem too large: batch %lld x local seq %lld x %d ranks x q heads %lld x "
                   "head_dim %lld x 32 bytes does not fit in 2^63",
                   (long long)q->shape[0], (long long)q->shape[1], P, (long long)q->shape[2],
                   (long long)q->shape[3]);
    int64_t seq_global = q->shape[1] * P;
    if (p && p->seq_len_global != 0 && p->seq_len_global != seq_global)
        return BAD("params.seq_len_global (%lld) != local seq (%lld) x ranks (%d)",
                   (long long)p->seq_len_global, (long long)q->shape[1], P);
    CTXPAR_CHECK(ctxpar_validate_params(p, seq_global));
    CTXPAR_CHECK(ctxpar_layout_check(p->layout, seq_global, P));
    ctxpar_problem pb = {0};
    pb.rank = comm->rank;
    pb.nranks = P;
    pb.layout = p->layout;
    pb.mask.causal = p->mask == CTXPAR_MASK_CAUSAL;
    pb.mask.window_left = p->window_left;
    pb.mask.window_right = p->window_right;
    pb.mask.cu_seqlens = p->cu_seqlens;
    pb.mask.num_docs = p->num_docs;
    pb.scale = p->softmax_scale != 0.0f ? p->softmax_scale : 1.0f / sqrtf((float)q->shape[3]);
    pb.dtype = q->dtype;
    pb.batch = q->shape[0];
    pb.seq_local = q->shape[1];
    pb.seq_global = seq_global;
    pb.heads_q = q->shape[2];
    pb.heads_kv = k->shape[2];
    pb.head_dim = q->shape[3];
    pb.lse_lo = p->lse_lo;
    *pb_out = pb;
    return CTXPAR_OK;
}
