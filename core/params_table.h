// The attention parameters, one line each: every field of ctxpar_attn_params (ctxpar.h) in
// declaration order, with what the front door, the ranks' agreement, the tool and the tests need
// to know of it. A new field is a line here plus its meaning where it is used; attn_params.c
// fails to compile unless the lines are exactly the struct's fields, in order, of their types.
//
// Made from it: the field descriptors below (the simple range checks in validate.c, the tool's
// options in tools/ctxpar/cli.c, the layout query ctxpar_attn_params_field that python/ checks its
// ctypes mirror with, the fuzz test that every parameter is drawn) and the agreement's fields
// (agree.c). Internal: not installed.
//
// Columns of X(name, type, kind, def, names, lo, unset, agree, agreed, flag, value, help):
//   name, type  the field and its C type
//   kind        SIZE (struct_size), ENUM, INT (int64_t), FLOAT (float) or POINTER
//   def         its default; testing/api_test.cc holds CTXPAR_ATTN_PARAMS_INIT to these
//   names       ENUM: the function naming a value, "?" for a value that is none (attn_params.c)
//   lo          INT, FLOAT: the least valid value (FLOAT: finite too); -INFINITY: no range of its
//               own (validate.c checks it against other fields)
//   unset       what the default 0 means, for messages and --help; NULL: nothing to say
//   agree       the agreement's name for it; NULL: ranks may differ (agreed is then 0)
//   agreed      the value every rank must share: an expression of p (the normalized params),
//               pb (the resolved problem) and algo (the resolved algorithm), in agree.c
//   flag, value, help  the tool's option (check, audit, bench, plan) and its value's form; NULL:
//               none (ENUM: NULL, the tool lists the names function's values)
#ifndef CTXPAR_PARAMS_TABLE_H
#define CTXPAR_PARAMS_TABLE_H

#include <math.h>
#include <stddef.h>

#include "ctxpar.h"

// clang-format off
#define CTXPAR_PARAMS_TABLE(X)                                                                    \
    X(struct_size, size_t, SIZE, sizeof(ctxpar_attn_params), NULL, 0, NULL,                      \
      NULL, 0,                                                                                    \
      NULL, NULL, NULL)                                                                           \
    X(algo, ctxpar_algo, ENUM, CTXPAR_ALGO_AUTO, param_algo_name, 0, NULL,                        \
      "algorithm", algo,                                                                          \
      "--algo", NULL, "algorithm")                               \
    X(layout, ctxpar_layout, ENUM, CTXPAR_LAYOUT_CONTIGUOUS, param_layout_name, 0, NULL,          \
      "layout", p->layout,                                                                        \
      "--layout", NULL,                                                                           \
      "how tokens are sharded (any length: uneven shards differ by at most one token)")           \
    X(mask, ctxpar_mask, ENUM, CTXPAR_MASK_NONE, param_mask_name, 0, NULL,                        \
      "mask", p->mask,                                                                            \
      "--mask", NULL, "attention mask")                                                           \
    X(window_left, int64_t, INT, 0, NULL, 0, "no window",                                         \
      "window_left", p->window_left,                                                              \
      "--window", "W", "sliding window: query i sees keys k, i-k < W")                            \
    X(cu_seqlens, const int32_t *, POINTER, NULL, NULL, 0, NULL,                                  \
      "cu_seqlens contents", docs_hash(p),                                                        \
      "--cu-seqlens", "FILE",                                                                     \
      "packed documents: .npy int32/int64 or text, [docs + 1] or [batch, docs + 1] (text: a row " \
      "a line), 0 ... seq")                                                                       \
    X(num_docs, int64_t, INT, 0, NULL, -INFINITY, NULL,                                           \
      "num_docs", p->num_docs,                                                                    \
      NULL, NULL, NULL)                                                                           \
    X(softmax_scale, float, FLOAT, 0.0f, NULL, -INFINITY, "1/sqrt(head_dim)",                     \
      "softmax_scale", f32_bits(pb->scale),                                                       \
      "--scale", "X", "softmax scale of q.k (finite, non-zero)")                                  \
    X(seq_len_global, int64_t, INT, 0, NULL, 0, NULL,                                             \
      "global sequence length", pb->seq_global,                                                   \
      NULL, NULL, NULL)                                                                           \
    X(window_right, int64_t, INT, 0, NULL, 0, "no limit",                                         \
      "window_right", p->window_right,                                                            \
      "--window-right", "R",                                                                      \
      "two-sided window (with --mask none): query i sees keys k, k-i <= R")                       \
    X(sinks, const float *, POINTER, NULL, NULL, 0, NULL,                                         \
      "sinks contents", p->sinks ? pb->sinks_hash | 1 : 0, /* never 0 with sinks */               \
      "--sinks", "SINKS.npy",                                                                     \
      "attention sinks: float32 [heads] logits, once in every row's denominator")                 \
    X(dsinks, float *, POINTER, NULL, NULL, 0, NULL,                                              \
      "dsinks wanted", p->dsinks != NULL,                                                         \
      NULL, NULL, NULL)                                                                           \
    X(softcap, float, FLOAT, 0.0f, NULL, 0, "no soft-capping",                                    \
      "softcap", f32_bits(p->softcap),                                                            \
      "--softcap", "C", "logit soft-capping: the score is C tanh(scale q.k / C) (C > 0)")         \
    X(assignment, const int32_t *, POINTER, NULL, NULL, 0, NULL,                                  \
      "assignment contents", hash_i32(p->assignment, p->assignment ? pb->seq_global : 0),         \
      "--assign", "ASSIGN.npy",                                                                   \
      "with --layout custom: int32/int64 [seq], the rank holding each token")                     \
    X(ulysses, int64_t, INT, 0, NULL, 0, "chosen by the library",                                 \
      "ulysses", p->ulysses,                                                                      \
      "--ulysses", "U",                                                                           \
      "with --algo hybrid (or auto): ranks per all-to-all group, consecutive; rings across "      \
      "groups")                                                                                   \
    X(cu_seqlens_rows, int64_t, INT, 0, NULL, 0, NULL,                                            \
      "cu_seqlens_rows", p->cu_seqlens_rows,                                                      \
      NULL, NULL, NULL)                                                                           \
    X(lse_lo, float *, POINTER, NULL, NULL, 0, NULL,                                              \
      NULL, 0, /* each rank's own output */                                                       \
      NULL, NULL, NULL)                                                                           \
    X(q_len, int64_t, INT, 0, NULL, 0, "q is the local shard",                                    \
      "q_len", p->q_len,                                                                          \
      "--q-len", "N",                                                                             \
      "queries at the last N positions of the seq keys, the same on every rank (decode, a "      \
      "prefill chunk over a cache)")                                                             \
    X(reproducible, int64_t, INT, 0, NULL, 0, "off",                                              \
      "reproducible", p->reproducible,                                                            \
      "--reproducible", NULL,                                                                     \
      "the same bits for any number of ranks, layout and algorithm (binned sums)")
// clang-format on

#ifdef __cplusplus
extern "C" {
#endif

// CTXPAR_PARAM_<name>: a field's index in the table.
typedef enum ctxpar_param_index {
#define CTXPAR_PARAM_INDEX_(name, ...) CTXPAR_PARAM_##name,
    CTXPAR_PARAMS_TABLE(CTXPAR_PARAM_INDEX_)
#undef CTXPAR_PARAM_INDEX_
        CTXPAR_PARAM_COUNT
} ctxpar_param_index;

typedef enum ctxpar_param_kind {
    CTXPAR_KIND_SIZE,
    CTXPAR_KIND_ENUM,
    CTXPAR_KIND_INT,
    CTXPAR_KIND_FLOAT,
    CTXPAR_KIND_POINTER,
} ctxpar_param_kind;

// A line of the table as data (the columns above but agree's value).
typedef struct ctxpar_param_field {
    const char *name, *type;
    size_t offset, size;
    ctxpar_param_kind kind;
    const char *(*names)(int value);
    double lo;
    const char *unset, *agree, *flag, *value, *help;
} ctxpar_param_field;

extern const ctxpar_param_field ctxpar_param_fields[CTXPAR_PARAM_COUNT];

// The table's defaults as a struct (what CTXPAR_ATTN_PARAMS_INIT must equal).
extern const ctxpar_attn_params ctxpar_param_defaults;

// An ENUM or INT field's value, and a FLOAT field's.
int64_t ctxpar_param_int(const ctxpar_attn_params *p, const ctxpar_param_field *f);
float ctxpar_param_float(const ctxpar_attn_params *p, const ctxpar_param_field *f);
// Sets an ENUM or INT field (v must fit an ENUM's int), or a FLOAT one.
void ctxpar_param_set_int(ctxpar_attn_params *p, const ctxpar_param_field *f, int64_t v);
void ctxpar_param_set_float(ctxpar_attn_params *p, const ctxpar_param_field *f, float v);

#ifdef __cplusplus
}
#endif

#endif // CTXPAR_PARAMS_TABLE_H
