// Argument validation for the front door: every public attention argument is checked here, and
// the resolved shape of the call (ctxpar_problem) comes out.
#ifndef CTXPAR_VALIDATE_H
#define CTXPAR_VALIDATE_H

#include "algorithms.h"

// One tensor argument: not NULL, data set, known dtype, positive shape, innermost stride 1,
// strides that do not make elements overlap.
ctxpar_status ctxpar_validate_tensor(const char *name, const ctxpar_tensor *t);

// Copies the caller's params (struct_size bytes of it, at least through `algo`) over the
// defaults: the front door works on the copy, whose struct_size is sizeof(ctxpar_attn_params).
ctxpar_status ctxpar_params_normalize(const ctxpar_attn_params *p, ctxpar_attn_params *out);

// The params struct on its own (enums, window, scale), normalized; seq_global and batch for
// cu_seqlens.
ctxpar_status ctxpar_validate_params(const ctxpar_attn_params *p, int64_t seq_global,
                                     int64_t batch);

// A rank's shard: as ctxpar_validate_tensor, but seq (shape[1]) may be 0 (data set, unread).
ctxpar_status ctxpar_validate_shard_tensor(const char *name, const ctxpar_tensor *t);

// CUSTOM's assignment (named `name` in messages): set, every token on a rank in [0, nranks);
// for the other layouts: not set.
ctxpar_status ctxpar_validate_assignment(const char *name, ctxpar_layout layout,
                                         const int32_t *assignment, int64_t seq_global,
                                         int nranks);

// q, k, v (and out) against each other and the params; fills the problem on success.
ctxpar_status ctxpar_validate_problem(const ctxpar_attn_params *p, const ctxpar_comm *comm,
                                      const ctxpar_tensor *q, const ctxpar_tensor *k,
                                      const ctxpar_tensor *v, ctxpar_problem *pb_out);

// `t` (named) has the same dtype and shape as `like` (named).
ctxpar_status ctxpar_validate_same(const char *name, const ctxpar_tensor *t, const char *like_name,
                                   const ctxpar_tensor *like);

// `t` (named) has like's dtype, batch, seq and heads, and head_dim (named dim_name): out and dout
// follow v's head_dim (MLA), not q's.
ctxpar_status ctxpar_validate_like(const char *name, const ctxpar_tensor *t, const char *like_name,
                                   const ctxpar_tensor *like, const char *dim_name,
                                   int64_t head_dim);

// params.sinks (device memory) holds heads_q finite values; their hash for the agreement.
ctxpar_status ctxpar_validate_sinks(ctxpar_device *dev, const ctxpar_attn_params *p,
                                    int64_t heads_q, int64_t *hash_out);

#endif // CTXPAR_VALIDATE_H
