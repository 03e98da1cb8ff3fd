// Validation of every argument of the attention entry points. Messages name the argument and the
// values, so that a user can fix the call from the message alone.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctxpar_count.h"
#include "params_table.h"
#include "validate.h"
#include "dispatch.h"

#define BAD(...) CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, __VA_ARGS__)

// empty_seq: a rank's shard, which may hold no tokens (S < P): seq 0 (data still set).
static ctxpar_status check_tensor(const char *name, const ctxpar_tensor *t, int empty_seq) {
    if (!t)
        return BAD("%s is NULL", name);
    if (ctxpar_dtype_size(t->dtype) == 0)
        return BAD("%s.dtype (%d) is not a ctxpar_dtype", name, (int)t->dtype);
    for (int d = 0; d < 4; d++)
        if (t->shape[d] <= 0 && !(empty_seq && d == 1 && t->shape[d] == 0))
            return BAD("%s.shape[%d] (%lld) must be > 0", name, d, (long long)t->shape[d]);
    if (!t->data)
        return BAD("%s.data is NULL", name);
    if (t->shape[1] == 0)
        return CTXPAR_OK; // no element: nothing is addressed
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

ctxpar_status ctxpar_validate_tensor(const char *name, const ctxpar_tensor *t) {
    return check_tensor(name, t, 0);
}

ctxpar_status ctxpar_validate_shard_tensor(const char *name, const ctxpar_tensor *t) {
    return check_tensor(name, t, 1);
}

ctxpar_status ctxpar_validate_assignment(const char *name, ctxpar_layout layout,
                                         const int32_t *assignment, int64_t seq_global,
                                         int nranks) {
    if (layout != CTXPAR_LAYOUT_CUSTOM) {
        if (assignment)
            return BAD("%s is set but the layout is %s (only custom takes one)", name,
                       ctxpar_layout_name(layout));
        return CTXPAR_OK;
    }
    if (!assignment)
        return BAD("%s is NULL: the custom layout needs the rank of every token", name);
    for (int64_t t = 0; t < seq_global; t++)
        if (assignment[t] < 0 || assignment[t] >= nranks)
            return BAD("%s[%lld] (%d) is not a rank in [0, %d): token %lld is on no rank", name,
                       (long long)t, assignment[t], nranks, (long long)t);
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

ctxpar_status ctxpar_validate_like(const char *name, const ctxpar_tensor *t, const char *like_name,
                                   const ctxpar_tensor *like, const char *dim_name,
                                   int64_t head_dim) {
    CTXPAR_CHECK(ctxpar_validate_shard_tensor(name, t));
    if (t->dtype != like->dtype)
        return BAD("%s.dtype (%s) != %s.dtype (%s)", name, ctxpar_dtype_name(t->dtype), like_name,
                   ctxpar_dtype_name(like->dtype));
    for (int d = 0; d < 3; d++)
        if (t->shape[d] != like->shape[d])
            return BAD("%s.shape[%d] (%lld) != %s.shape[%d] (%lld)", name, d,
                       (long long)t->shape[d], like_name, d, (long long)like->shape[d]);
    if (t->shape[3] != head_dim)
        return BAD("%s.shape[3] (%lld) != %s (%lld)", name, (long long)t->shape[3], dim_name,
                   (long long)head_dim);
    return CTXPAR_OK;
}

ctxpar_status ctxpar_validate_same(const char *name, const ctxpar_tensor *t, const char *like_name,
                                   const ctxpar_tensor *like) {
    char dim_name[64];
    snprintf(dim_name, sizeof dim_name, "%s.shape[3]", like_name);
    return ctxpar_validate_like(name, t, like_name, like, dim_name, like->shape[3]);
}

// rows > 0: cu_seqlens is [rows, num_docs + 1], each row checked (messages name [row][i]).
static ctxpar_status validate_cu_seqlens(const ctxpar_attn_params *p, int64_t seq_global,
                                         int64_t batch) {
    if (!p->cu_seqlens) {
        if (p->num_docs != 0)
            return BAD("params.num_docs (%lld) is set but params.cu_seqlens is NULL",
                       (long long)p->num_docs);
        if (p->cu_seqlens_rows != 0)
            return BAD("params.cu_seqlens_rows (%lld) is set but params.cu_seqlens is NULL",
                       (long long)p->cu_seqlens_rows);
        return CTXPAR_OK;
    }
    if (p->num_docs < 1)
        return BAD("params.num_docs (%lld) must be >= 1 with params.cu_seqlens",
                   (long long)p->num_docs);
    if (p->cu_seqlens_rows != 0 && p->cu_seqlens_rows != batch)
        return BAD("params.cu_seqlens_rows (%lld) must be 0 (one set of documents) or the batch "
                   "(%lld)",
                   (long long)p->cu_seqlens_rows, (long long)batch);
    const int64_t rows = p->cu_seqlens_rows > 0 ? p->cu_seqlens_rows : 1;
    for (int64_t r = 0; r < rows; r++) {
        const int32_t *cu = p->cu_seqlens + r * (p->num_docs + 1);
        char at[48] = "";
        if (p->cu_seqlens_rows > 0)
            snprintf(at, sizeof at, "[%lld]", (long long)r);
        if (cu[0] != 0)
            return BAD("params.cu_seqlens%s[0] (%d) must be 0", at, cu[0]);
        // Equal boundaries are an empty document (data loaders make them): allowed.
        for (int64_t i = 1; i <= p->num_docs; i++)
            if (cu[i] < cu[i - 1])
                return BAD("params.cu_seqlens%s is decreasing: [%lld] = %d < [%lld] = %d", at,
                           (long long)i, cu[i], (long long)(i - 1), cu[i - 1]);
        if (cu[p->num_docs] != seq_global)
            return BAD("params.cu_seqlens%s[%lld] (%d) must equal the global sequence length "
                       "(%lld)",
                       at, (long long)p->num_docs, cu[p->num_docs], (long long)seq_global);
    }
    return CTXPAR_OK;
}

// Each parameter on its own, as params_table.h declares: an enum with a name, a number at least
// its lo (a float finite too). What 0 means follows, as 0 is every such field's default.
static ctxpar_status validate_ranges(const ctxpar_attn_params *p) {
    for (int i = 0; i < CTXPAR_PARAM_COUNT; i++) {
        const ctxpar_param_field *f = &ctxpar_param_fields[i];
        char zero[64] = "";
        if (f->unset)
            snprintf(zero, sizeof zero, " (0 = %s)", f->unset);
        if (f->kind == CTXPAR_KIND_ENUM) {
            const int v = (int)ctxpar_param_int(p, f);
            if (strcmp(f->names(v), "?") == 0)
                return BAD("params.%s (%d) is not a %s", f->name, v, f->type);
        } else if (f->kind == CTXPAR_KIND_INT) {
            const int64_t v = ctxpar_param_int(p, f);
            if ((double)v < f->lo)
                return BAD("params.%s (%lld) must be >= %.0f%s", f->name, (long long)v, f->lo,
                           zero);
        } else if (f->kind == CTXPAR_KIND_FLOAT) {
            const float v = ctxpar_param_float(p, f);
            // NaN fails the comparison too. With 0 unset (lo 0), a value is "> 0".
            if (!(v >= f->lo) || !isfinite(v)) {
                if (f->lo == -INFINITY)
                    return BAD("params.%s (%g) must be finite%s", f->name, (double)v, zero);
                return BAD("params.%s (%g) must be %s %g and finite%s", f->name, (double)v,
                           f->unset && f->lo == 0 ? ">" : ">=", f->lo, zero);
            }
        }
    }
    return CTXPAR_OK;
}

ctxpar_status ctxpar_validate_params(const ctxpar_attn_params *p, int64_t seq_global,
                                     int64_t batch) {
    if (!p)
        return BAD("params is NULL");
    if (p->struct_size != sizeof *p)
        return CTXPAR_ERROR(CTXPAR_ERR_INTERNAL, "params were not normalized (struct_size %zu)",
                            p->struct_size);
    CTXPAR_CHECK(validate_ranges(p));
    // A causal mask already hides every key right of its query: a right limit asked for with it
    // is a look-ahead the caller would silently not get.
    if (p->window_right > 0 && p->mask == CTXPAR_MASK_CAUSAL)
        return BAD("params.window_right (%lld) needs CTXPAR_MASK_NONE: under the causal mask no "
                   "key right of its query is visible",
                   (long long)p->window_right);
    if (p->dsinks && !p->sinks)
        return BAD("params.dsinks is set but params.sinks is NULL: dsinks is the gradient of "
                   "the sinks");
    if (p->ulysses != 0 && p->algo != CTXPAR_ALGO_HYBRID && p->algo != CTXPAR_ALGO_AUTO)
        return BAD("params.ulysses (%lld) applies to the hybrid algorithm only (algo is %s)",
                   (long long)p->ulysses, ctxpar_algo_name(p->algo));
    if (p->reproducible > 1)
        return BAD("params.reproducible (%lld) must be 0 (off) or 1 (on)",
                   (long long)p->reproducible);
    return validate_cu_seqlens(p, seq_global, batch);
}

ctxpar_status ctxpar_validate_problem(const ctxpar_attn_params *p, const ctxpar_comm *comm,
                                      const ctxpar_tensor *q, const ctxpar_tensor *k,
                                      const ctxpar_tensor *v, ctxpar_problem *pb_out) {
    // A rank may hold no tokens (S < P): its shards have seq 0.
    CTXPAR_CHECK(ctxpar_validate_shard_tensor("q", q));
    CTXPAR_CHECK(ctxpar_validate_shard_tensor("k", k));
    if (k->dtype != q->dtype)
        return BAD("k.dtype (%s) != q.dtype (%s)", ctxpar_dtype_name(k->dtype),
                   ctxpar_dtype_name(q->dtype));
    // With params.q_len, q holds the last q_len positions on every rank: its seq is its own.
    const int64_t q_len = p ? p->q_len : 0;
    const char *dim_name[4] = {"batch", "seq", "heads", "head_dim"};
    for (int d = 0; d < 4; d++)
        if (d != 2 && !(d == 1 && q_len != 0) && k->shape[d] != q->shape[d])
            return BAD("k.shape[%d] (%lld) != q.shape[%d] (%lld): %s must match", d,
                       (long long)k->shape[d], d, (long long)q->shape[d], dim_name[d]);
    // v after k is checked against q, so that a message names the tensor that is off. v has
    // its own head_dim (MLA): out, dout and dv follow it.
    CTXPAR_CHECK(ctxpar_validate_shard_tensor("v", v));
    if (v->dtype != k->dtype)
        return BAD("v.dtype (%s) != k.dtype (%s)", ctxpar_dtype_name(v->dtype),
                   ctxpar_dtype_name(k->dtype));
    for (int d = 0; d < 3; d++)
        if (v->shape[d] != k->shape[d])
            return BAD("v.shape[%d] (%lld) != k.shape[%d] (%lld): %s must match", d,
                       (long long)v->shape[d], d, (long long)k->shape[d], dim_name[d]);
    if (q->shape[2] % k->shape[2] != 0)
        return BAD("q heads (%lld) must be a multiple of k heads (%lld)", (long long)q->shape[2],
                   (long long)k->shape[2]);
    int P = comm->size;
    if (P > (1 << 20)) // ring steps travel in 20-bit transfer tags
        return CTXPAR_ERROR(CTXPAR_ERR_NOT_SUPPORTED, "%d ranks: at most 2^20 are supported", P);
    if (!p)
        return BAD("params is NULL");
    // Every buffer an algorithm makes is at most a few F32 copies of the whole sequence's Q, K, V
    // or out: 32 bytes per element of [B, S, Hq, D] bounds them all (Hkv <= Hq).
    size_t elems;
    const int64_t dmax = q->shape[3] > v->shape[3] ? q->shape[3] : v->shape[3];
    int too_large = !ctxpar_count_checked(&elems, q->shape[0], k->shape[1] > 0 ? k->shape[1] : 1, P,
                                          q->shape[2]) ||
                    ctxpar_count_mul(ctxpar_count_mul(elems, (size_t)dmax), 32) > PTRDIFF_MAX;
    // 0 = equal shards (local seq x P); otherwise each rank's local seq is checked against its
    // share, and the agreement step compares the total across ranks.
    int64_t seq_global = p->seq_len_global;
    if (seq_global == 0) {
        if (p->layout == CTXPAR_LAYOUT_CUSTOM)
            return BAD("params.seq_len_global must be set with the custom layout (the length of "
                       "params.assignment)");
        seq_global = too_large ? 0 : k->shape[1] * P;
    }
    too_large = too_large ||
                !ctxpar_count_checked(&elems, q->shape[0], seq_global > 0 ? seq_global : 1,
                                      q->shape[2], dmax) ||
                ctxpar_count_mul(elems, 32) > PTRDIFF_MAX;
    if (too_large)
        return BAD("problem too large: batch %lld x seq %lld (local %lld, %d ranks) x q heads "
                   "%lld x head_dim %lld x 32 bytes does not fit in 2^63",
                   (long long)q->shape[0], (long long)seq_global, (long long)k->shape[1], P,
                   (long long)q->shape[2], (long long)dmax);
    if (seq_global < 1)
        return BAD("params.seq_len_global (%lld) must be >= 1", (long long)seq_global);
    CTXPAR_CHECK(ctxpar_validate_params(p, seq_global, q->shape[0]));
    CTXPAR_CHECK(
        ctxpar_validate_assignment("params.assignment", p->layout, p->assignment, seq_global, P));
    const int64_t mine = ctxpar_layout_count(p->layout, p->assignment, seq_global, comm->rank, P);
    const char *shard = q_len ? "k" : "q"; // the tensor that holds this rank's shard
    if (mine != k->shape[1])
        return BAD("%s.shape[1] (%lld) != %lld, the tokens rank %d holds of the global sequence "
                   "length %lld under the %s layout (%s); see ctxpar_shard_count",
                   shard, (long long)k->shape[1], (long long)mine, comm->rank,
                   (long long)seq_global, ctxpar_layout_name(p->layout),
                   p->seq_len_global ? "params.seq_len_global" : "local seq x ranks");
    if (q_len > seq_global)
        return BAD("params.q_len (%lld) must be <= the global sequence length (%lld): the "
                   "queries are the last q_len of its positions",
                   (long long)q_len, (long long)seq_global);
    if (q_len && q->shape[1] != q_len)
        return BAD("q.shape[1] (%lld) != params.q_len (%lld): with q_len every rank passes the "
                   "same q_len queries",
                   (long long)q->shape[1], (long long)q_len);
    const int64_t seq_max = ctxpar_layout_max_count(p->layout, p->assignment, seq_global, P);
    if (seq_max < 0)
        return CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "cannot count the tokens of %d ranks", P);
    ctxpar_problem pb = {0};
    pb.rank = comm->rank;
    pb.nranks = P;
    pb.layout = p->layout;
    pb.mask.causal = p->mask == CTXPAR_MASK_CAUSAL;
    pb.mask.window_left = p->window_left;
    pb.mask.window_right = p->window_right;
    pb.mask.cu_seqlens = p->cu_seqlens;
    pb.mask.num_docs = p->num_docs;
    pb.mask.doc_rows = p->cu_seqlens_rows;
    pb.seq_max = seq_max;
    pb.assignment = p->assignment;
    pb.scale = p->softmax_scale != 0.0f ? p->softmax_scale : 1.0f / sqrtf((float)q->shape[3]);
    pb.dtype = q->dtype;
    pb.batch = q->shape[0];
    pb.seq_local = k->shape[1];
    pb.q_len = q_len;
    pb.q_span = (ctxpar_span){q_len ? seq_global - q_len : 0, q_len, 1};
    pb.seq_global = seq_global;
    pb.heads_q = q->shape[2];
    pb.heads_kv = k->shape[2];
    pb.head_dim = q->shape[3];
    pb.ulysses = p->ulysses;
    pb.comm_splits = ctxpar_comm_can_split(comm);
    pb.head_dim_v = v->shape[3];
    pb.softcap = p->softcap;
    pb.sinks = p->sinks;
    pb.dsinks = p->dsinks;
    pb.lse_lo = p->lse_lo;
    pb.reproducible = (int)p->reproducible;
    *pb_out = pb;
    return CTXPAR_OK;
}

ctxpar_status ctxpar_validate_sinks(ctxpar_device *dev, const ctxpar_attn_params *p,
                                    int64_t heads_q, int64_t *hash_out) {
    *hash_out = 0;
    if (!p->sinks)
        return CTXPAR_OK;
    float *host = malloc((size_t)heads_q * sizeof *host);
    if (!host)
        return CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "params.sinks: cannot allocate %lld floats",
                            (long long)heads_q);
    ctxpar_status st = ctxpar_sinks_read(dev, p->sinks, 0, heads_q, host);
    uint64_t h = 1469598103934665603ull; // FNV-1a over the values' bits, in head order
    for (int64_t i = 0; st == CTXPAR_OK && i < heads_q; i++) {
        if (!isfinite(host[i]))
            st = BAD("params.sinks[%lld] (%g) must be finite", (long long)i, (double)host[i]);
        uint32_t bits;
        memcpy(&bits, &host[i], sizeof bits);
        h = (h ^ bits) * 1099511628211ull;
    }
    free(host);
    *hash_out = (int64_t)(h >> 2); // 62 bits: the agreement negates it
    return st;
}
