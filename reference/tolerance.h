/*
 * tolerance.h - the one table of accepted errors against the float64 oracle.
 *
 * Errors are cpt_error_stats.rel: max |got - oracle| / max |oracle| over a whole tensor
 * (metrics.h). How each bound was chosen is written next to it in tolerance.c.
 */
#ifndef CPT_TESTING_TOLERANCE_H
#define CPT_TESTING_TOLERANCE_H

#include <stdint.h>

#include "ctxpar.h"
#include "reference/oracle.h" /* cpt_oracle_shape */

#ifdef __cplusplus
extern "C" {
#endif

/* Bound on the relative error of tensor `tensor_name` ("out", "lse", "dq", "dk", "dv") computed
 * with inputs and outputs of `dtype` (lse is always F32; its bound still depends on the input
 * dtype). NAN for an unknown dtype or name, so that any check against it fails. */
double cpt_tolerance(ctxpar_dtype dtype, const char *tensor_name);

/* The bound for a global sequence length `seq`: the table was measured at seq 4096, and F32
 * accumulation errors grow about as sqrt(seq), so F32 bounds scale by sqrt(seq / 4096) above
 * 4096. 16-bit bounds are set by the storage rounding and do not scale. */
double cpt_tolerance_for_seq(ctxpar_dtype dtype, const char *tensor_name, int64_t seq);

/* Context parallelism must add no meaningful error: err(P ranks) / err(P = 1) <= this. */
#define CPT_TOL_ERROR_RATIO 2.0

/* Below this relative error, 4 F32 ulps of the tensor's scale (4 x 2^-23), the P = 1 error is
 * rounding noise and the ratio of two such numbers means nothing. */
#define CPT_TOL_RATIO_FLOOR 4.8e-7

/* Whether err_p (P ranks) is acceptable next to err_1 (the same problem on P = 1):
 * err_p <= CPT_TOL_ERROR_RATIO * max(err_1, CPT_TOL_RATIO_FLOOR). So the ratio is checked
 * when err_1 is above the floor, and below it err_p is held to the floor's absolute bound. NaN
 * in either gives 0. */
int cpt_error_ratio_ok(double err_p, double err_1);

/* ------------------------------------------------------------------ the per-element bound
 *
 * What a correct float computation of each element may be off by, from the magnitudes the fp64
 * computation goes through (docs/numerics.md, "A bound per element"):
 *   |got - ref| <= CPT_BOUND_C * 2^-24 * M + 2 u_store |ref|
 * with M per element: out_id = sum_j p_ij (|v_jd| + w_ij |v_jd - out_id|),
 * lse_i = |lse_i| + 1 + sum_j p_ij w_ij, dv_jd = sum_i p_ij w_ij |dO_id|,
 * dq_id = |scale| sum_j mu_ij |k_jd|, dk_jd = |scale| sum_i mu_ij |q_id|,
 * mu_ij = p_ij (|dP_ij - delta_i| w_ij + sum_d |dO_id v_jd| + sum_d |dO_id| (|out_id| + M(out_id))),
 * w_ij = 1 + |scale| sum_d |q_id k_jd| + |lse_i| (the float exponent's error in units of u).
 * u_store: the result dtype's unit roundoff (2^-24 F32 and lse, 2^-11 F16, 2^-8 BF16); every
 * bound also adds the dtype's smallest subnormal (2^-149 F32, 2^-24 F16, 2^-133 BF16): storing a
 * value below the normal range rounds it by up to half of that.
 * 16-bit results add CPT_BOUND_C16 * u_store * M16 (not for lse): a correct 16-bit computation
 * reads stored, rounded operands (the forward's out in the backward's delta; P in 16 bits in
 * tensor-core kernels): M16 is M with w_ij = 1 and the stored out's own error in u_store. */

/* The constant, measured: ctxpar (F32 parts of at most 128 terms, then F64) and naive float32
 * (blocks of 256, like a float32 GEMM) stay below 14 u M in every case of docs/numerics.md
 * (error/bound <= 0.21 at C = 64); 64 leaves about 5x. */
#define CPT_BOUND_C 64.0

/* The 16-bit term's constant: each stored operand rounds once (relative u_store). ctxpar's CPU
 * backend stays below 0.17 of the whole bound in BF16 and F16 runs (`ctxpar check --backward`,
 * seq 64 to 1024, causal and no mask, P 2 and 4), where without this term the cancelling dq of
 * the same runs was up to 18x the F32 part; 4 leaves room for P rounded to 16 bits. */
#define CPT_BOUND_C16 4.0

/* The magnitudes M of every element: t[0] out [B, Sq, Hq, D], t[1] lse [B, Hq, Sq], and with
 * dout (else NULL, t[2..4] unused) t[2] dq, t[3] dk, t[4] dv; float64 inputs, dense BSHD, vis the
 * oracle's visibility matrix [Sq, Sk] (NULL: no mask). t16: the same for M16 (16-bit results),
 * or all NULL when not wanted. */
typedef struct cpt_magnitudes {
    double *t[5];
    double *t16[5];
} cpt_magnitudes;

ctxpar_status cpt_bound_magnitudes(const cpt_oracle_shape *sh, const double *q,
                                      const double *k, const double *v, const double *dout,
                                      const uint8_t *vis, double scale, cpt_magnitudes *m);

/* The same with the oracle's mask (oracle.h: positions q_pos/k_pos, NULL for 0..S-1; mask NULL:
 * none) instead of a visibility matrix: no [Sq, Sk] matrix is held, so any seq the oracle runs. */
ctxpar_status cpt_bound_magnitudes_masked(const cpt_oracle_shape *sh, const double *q,
                                             const double *k, const double *v,
                                             const double *dout, const int64_t *q_pos,
                                             const int64_t *k_pos, const ctxpar_mask_desc *mask,
                                             double scale, cpt_magnitudes *m);

/* The same with the oracle's features (oracle.h: head_dim_v, softcap, sinks; NULL: none; the
 * per-row documents are not supported here): v, out, dout and dv have head_dim_v. With softcap
 * C the score's error gains the cap's rounding (|s'| u in w) and dS its derivative 1 - t^2 (t =
 * tanh(scale q.k / C)) with that derivative's own error (2 |t| w / C, in mu); with sinks p_ij is
 * normalised with the sink in the denominator, and with dout and mdsinks (mdsinks16 for M16,
 * may be NULL) each head's dsinks_h = -sum_i p_sink,i delta_i gets
 * M = sum_i p_sink,i (|delta_i| (1 + |lse_i|) + M(delta_i)), M(delta) = sum_d |dO| (|out| + M(out)). */
ctxpar_status cpt_bound_magnitudes_ex(const cpt_oracle_shape *sh, const double *q,
                                      const double *k, const double *v, const double *dout,
                                      const int64_t *q_pos, const int64_t *k_pos,
                                      const ctxpar_mask_desc *mask,
                                      const cpt_oracle_features *features, double scale,
                                      cpt_magnitudes *m, double *mdsinks, double *mdsinks16);

/* The bound of one element of dtype (is_lse: an lse element, always F32) from its magnitudes
 * (magnitude16 is used for 16-bit dtypes only). */
double cpt_bound_elem(ctxpar_dtype dtype, int is_lse, double magnitude, double magnitude16,
                         double ref);

typedef struct cpt_bound_stats {
    double max_ratio; /* max |got - ref| / bound (INFINITY for a non-finite mismatch) */
    int64_t worst;    /* flat index where it occurs; -1 when n == 0 */
    int64_t failing;  /* elements out of their bound (ratio > 1, or NaN) */
} cpt_bound_stats;

/* |got - ref| / bound of one element: 0 when equal, INFINITY for NaN or an unmatched infinity
 * (an infinity matches only itself) or an error where the bound is 0. */
double cpt_bound_ratio(double got, double ref, double magnitude, double magnitude16,
                          ctxpar_dtype dtype, int is_lse);

/* The largest error-to-bound ratio over n elements (<= 1: within the bound everywhere); mag16
 * may be NULL (F32 results). */
cpt_bound_stats cpt_bound_check(const float *got, const double *ref, const double *mag,
                                      const double *mag16, size_t n, ctxpar_dtype dtype,
                                      int is_lse);

/* The same for a host tensor of any dtype (its own: the storage rounding of the bound), ref and
 * mag dense [B, S, H, D] of its shape; worst is the flat BSHD index. */
cpt_bound_stats cpt_bound_check_tensor(const ctxpar_tensor *got, const double *ref,
                                             const double *mag, const double *mag16);

#ifdef __cplusplus
}
#endif

#endif /* CPT_TESTING_TOLERANCE_H */
