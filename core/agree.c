// The cross-rank agreement check: one small allreduce per call turns ranks called with different
// settings into an INVALID_USAGE error on every rank, instead of a hang or a wrong answer.
#include <string.h>

#include "context_internal.h"

enum {
    F_VALID,
    F_KIND,
    F_ALGO,
    F_LAYOUT,
    F_MASK,
    F_WINDOW,
    F_WINDOW_RIGHT,
    F_NUM_DOCS,
    F_DOCS_HASH,
    F_DOC_ROWS,
    F_ASSIGN_HASH,
    F_SCALE,
    F_SEQ,
    F_BATCH,
    F_HEADS_Q,
    F_HEADS_KV,
    F_HEAD_DIM,
    F_DTYPE,
    F_VERIFY,
    F_ULYSSES,
    F_HEAD_DIM_V,
    F_SOFTCAP,
    F_SINKS_HASH,
    F_DSINKS,
    F_COUNT
};

static const char *const field_name[F_COUNT] = {
    "valid arguments",       "direction (forward/backward)", "algorithm",
    "layout",                "mask",                         "window_left",
    "window_right",          "num_docs",                     "cu_seqlens contents",
    "cu_seqlens_rows",       "assignment contents",
    "softmax_scale",         "global sequence length",       "batch",
    "q heads",               "k/v heads",                    "head_dim",
    "dtype",                 "verify_transfers option",      "ulysses",
    "v head_dim",            "softcap",                      "sinks contents",
    "dsinks wanted"};

// Order-sensitive hash of n int32 values, kept to 62 bits so that it can be negated.
static int64_t hash_i32(const int32_t *a, int64_t n) {
    uint64_t h = 1469598103934665603ull;
    for (int64_t i = 0; a && i < n; i++)
        h = (h ^ (uint32_t)a[i]) * 1099511628211ull;
    return (int64_t)(h >> 2);
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
        uint32_t scale_bits;
        memcpy(&scale_bits, &pb->scale, sizeof scale_bits);
        f[F_VALID] = 1;
        f[F_KIND] = kind;
        f[F_ALGO] = algo;
        f[F_LAYOUT] = pb->layout;
        f[F_MASK] = params->mask;
        f[F_WINDOW] = pb->mask.window_left;
        f[F_WINDOW_RIGHT] = pb->mask.window_right;
        f[F_NUM_DOCS] = pb->mask.num_docs;
        f[F_DOCS_HASH] = docs_hash(params);
        f[F_DOC_ROWS] = params->cu_seqlens_rows;
        f[F_ASSIGN_HASH] = hash_i32(params->assignment, params->assignment ? pb->seq_global : 0);
        f[F_SCALE] = scale_bits;
        f[F_SEQ] = pb->seq_global;
        f[F_BATCH] = pb->batch;
        f[F_HEADS_Q] = pb->heads_q;
        f[F_HEADS_KV] = pb->heads_kv;
        f[F_HEAD_DIM] = pb->head_dim;
        f[F_DTYPE] = pb->dtype;
        f[F_VERIFY] = ctx->options.verify_transfers != 0;
        f[F_ULYSSES] = pb->ulysses;
        uint32_t cap_bits;
        memcpy(&cap_bits, &pb->softcap, sizeof cap_bits);
        f[F_HEAD_DIM_V] = pb->head_dim_v;
        f[F_SOFTCAP] = cap_bits;
        f[F_SINKS_HASH] = pb->sinks ? pb->sinks_hash | 1 : 0; // never 0 with sinks
        f[F_DSINKS] = pb->dsinks != NULL;
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
