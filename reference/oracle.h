/*
 * oracle.h - full attention in float64: the independent reference every test compares against.
 *
 * Plain loops, no tiling, no shared code with any backend. Inputs are densely packed doubles.
 *   q    [B, Sq, Hq,  D]      k, v [B, Sk, Hkv, D]      (Hq % Hkv == 0; head h uses h/(Hq/Hkv))
 *   q_pos[Sq], k_pos[Sk]      global positions of the rows (the mask is a function of them)
 *   out  [B, Sq, Hq, D]       lse [B, Hq, Sq]  (natural log; -inf and out = 0 for a row with no
 *                             visible key)
 *
 * q_pos / k_pos NULL mean positions 0..S-1; mask NULL means no mask. The mask predicate is written
 * in oracle.c, not taken from the library. On a bad argument or a failed allocation the outputs
 * are filled with NaN (so every comparison against them fails) and ctxpar_last_error() says why.
 * Rows are spread over OpenMP threads; every output element is computed by one thread, so the
 * results are identical for any thread count. Pass the scale the library resolves (a float).
 */
#ifndef CPT_TESTING_ORACLE_H
#define CPT_TESTING_ORACLE_H

#include <stdint.h>

#include "ctxpar.h"
#include "ctxpar_backend.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cpt_oracle_shape {
    int64_t batch, seq_q, seq_k, heads_q, heads_kv, head_dim;
} cpt_oracle_shape;

/* What attention computes beyond the mask; all zero (or a NULL pointer to it) is plain
 * attention. docs/numerics.md gives the formulas. */
typedef struct cpt_oracle_features {
    int64_t head_dim_v;            /* of v, out, dout, dv (MLA: e.g. 128 with q/k 192); 0: D */
    double softcap;                /* C > 0: the score is C tanh(scale q.k / C); 0: none */
    const double *sinks;           /* [Hq] logits, added once to each row's denominator */
    const int32_t *row_cu_seqlens; /* [B, row_num_docs + 1] documents of each batch row (they
                                    * replace the mask's); NULL: the mask's, or none */
    int64_t row_num_docs;
} cpt_oracle_features;

/* Forward: out and lse (lse may be NULL). scale multiplies QK^T. */
void cpt_oracle_fwd(const cpt_oracle_shape *shape, const double *q, const double *k,
                       const double *v, const int64_t *q_pos, const int64_t *k_pos,
                       const ctxpar_mask_desc *mask, double scale, double *out, double *lse);

/* The same with features (NULL: none); out [B, Sq, Hq, Dv]. With sinks a row that sees no key
 * has lse = its sink and out = 0. */
void cpt_oracle_fwd_ex(const cpt_oracle_shape *shape, const double *q, const double *k,
                       const double *v, const int64_t *q_pos, const int64_t *k_pos,
                       const ctxpar_mask_desc *mask, const cpt_oracle_features *features,
                       double scale, double *out, double *lse);

/* Backward given dout [B, Sq, Hq, D]: dq [B, Sq, Hq, D], dk and dv [B, Sk, Hkv, D] (overwritten).
 * Recomputes the forward internally. */
void cpt_oracle_bwd(const cpt_oracle_shape *shape, const double *q, const double *k,
                       const double *v, const int64_t *q_pos, const int64_t *k_pos,
                       const ctxpar_mask_desc *mask, double scale, const double *dout,
                       double *dq, double *dk, double *dv);

/* The same with features; dout [B, Sq, Hq, Dv], dv [B, Sk, Hkv, Dv]; dsinks [Hq] (may be NULL;
 * zeros without sinks): the gradient of each head's sink logit, summed over batch and rows. */
void cpt_oracle_bwd_ex(const cpt_oracle_shape *shape, const double *q, const double *k,
                       const double *v, const int64_t *q_pos, const int64_t *k_pos,
                       const ctxpar_mask_desc *mask, const cpt_oracle_features *features,
                       double scale, const double *dout, double *dq, double *dk, double *dv,
                       double *dsinks);

/* The mask a call with these params asks for (mask kind, windows, documents). */
ctxpar_mask_desc cpt_oracle_mask(const ctxpar_attn_params *params);

/* The oracle's own mask as a dense [Sq, Sk] byte matrix (1: query row i sees key row j), for
 * harness code that must mask exactly as the oracle does (naive_f32.h). Returns the status of
 * the arguments' check; vis is untouched on error. */
ctxpar_status cpt_oracle_visibility(const cpt_oracle_shape *shape, const int64_t *q_pos,
                                       const int64_t *k_pos, const ctxpar_mask_desc *mask,
                                       uint8_t *vis);

#ifdef __cplusplus
}
#endif

#endif /* CPT_TESTING_ORACLE_H */
