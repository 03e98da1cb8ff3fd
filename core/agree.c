// The cross-rank agreement check: one small allreduce per call turns ranks called with different
// settings into an INVALID_USAGE error on every rank, instead of a hang or a wrong answer.
#include <string.h>

#include "context_internal.h"
#include "params_table.h"

// What ranks compare: the call itself, each attention parameter (params_table.h: its agreement
// name and value), then the tensors' shapes and the context's option.
enum {
    F_VALID,
    F_KIND,
#define PARAM_ENUM(name, ...) F_##name,
    CTXPAR_PARAMS_TABLE(PARAM_ENUM)
#undef PARAM_ENUM
    F_BATCH,
    F_HEADS_Q,
    F_HEADS_KV,
    F_HEAD_DIM,
    F_DTYPE,
    F_VERIFY,
    F_HEAD_DIM_V,
    F_COUNT
};

static const char *const field_name[F_COUNT] = {
    [F_VALID] = "valid arguments",
    [F_KIND] = "direction (forward/backward)",
#define PARAM_NAME(name, type, kind, def, names, lo, unset, agree, ...) [F_##name] = agree,
    CTXPAR_PARAMS_TABLE(PARAM_NAME)
#undef PARAM_NAME
    [F_BATCH] = "batch",
    [F_HEADS_Q] = "q heads",
    [F_HEADS_KV] = "k/v heads",
    [F_HEAD_DIM] = "head_dim",
    [F_DTYPE] = "dtype",
    [F_VERIFY] = "verify_transfers option",
    [F_HEAD_DIM_V] = "v head_dim",
};

// Order-sensitive hash of n int32 values, kept to 62 bits so that it can be negated.
static int64_t hash_i32(const int32_t *a, int64_t n) {
    uint64_t h = 1469598103934665603ull;
    for (int64_t i = 0; a && i < n; i++)
        h = (h ^ (uint32_t)a[i]) * 1099511628211ull;
    return (int64_t)(h >> 2);
}

// A float's bits, so that ranks compare exact values (and NaN equals itself).
static int64_t f32_bits(float x) {
    uint32_t bits;
    memcpy(&bits, &x, sizeof bits);
    return bits;
}

// The document boundaries of every row.
static int64_t docs_hash(const ctxpar_attn_params *p) {
    int64_t rows = p->cu_seqlens_rows > 0 ? p->cu_seqlens_rows : 1;
    return hash_i32(p->cu_seqlens, rows * (p->num_docs + 1));
}

ctxpar_status ctxpar_check_agreement(ctxpar_context *ctx, ctxpar_call_kind kind,
                                     const ctxpar_attn_params *params, const ctxpar_problem *pb,
                                     ctxpar_algo algo) {
    int64_t f[F_COUNT] = {0};
    if (pb && params) {
        const ctxpar_attn_params *p = params; // the table's agreed values name them p, pb, algo
        f[F_VALID] = 1;
        f[F_KIND] = kind;
#define PARAM_VALUE(name, type, kind, def, names, lo, unset, agree, agreed, ...)                  \
    f[F_##name] = agreed;
        CTXPAR_PARAMS_TABLE(PARAM_VALUE)
#undef PARAM_VALUE
        f[F_BATCH] = pb->batch;
        f[F_HEADS_Q] = pb->heads_q;
        f[F_HEADS_KV] = pb->heads_kv;
        f[F_HEAD_DIM] = pb->head_dim;
        f[F_DTYPE] = pb->dtype;
        f[F_VERIFY] = ctx->options.verify_transfers != 0;
        f[F_HEAD_DIM_V] = pb->head_dim_v;
    }
    if (ctx->comm->size == 1)
        return CTXPAR_OK;
    // One MIN-reduction over (x, -x) gives every field's minimum and maximum at once.
    int64_t buf[2 * F_COUNT];
    for (int i = 0; i < F_COUNT; i++) {
        buf[i] = f[i];
        buf[F_COUNT + i] = -f[i];
    }
    CTXPAR_CHECK(ctxpar_comm_allreduce_i64(ctx->comm, buf, 2 * F_COUNT, CTXPAR_REDUCE_MIN));
    if (buf[F_VALID] == 0)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_USAGE,
                            "another rank rejected its arguments (see its error); rank %d did "
                            "not run the call",
                            ctx->comm->rank);
    for (int i = 0; i < F_COUNT; i++) {
        int64_t lo = buf[i], hi = -buf[F_COUNT + i];
        if (lo != hi)
            return CTXPAR_ERROR(CTXPAR_ERR_INVALID_USAGE,
                                "ranks disagree on %s: values range from %lld to %lld (rank %d "
                                "has %lld); every rank must call with the same settings",
                                field_name[i], (long long)lo, (long long)hi, ctx->comm->rank,
                                (long long)f[i]);
    }
    return CTXPAR_OK;
}
