/*
 * tolerance.h - the one table of accepted errors against the float64 oracle.
 *
 * Errors are ctxpar_error_stats.rel: max |got - oracle| / max |oracle| over a whole tensor
 * (metrics.h). How each bound was chosen is written next to it in tolerance.c.
 */
#ifndef CTXPAR_TESTING_TOLERANCE_H
#define CTXPAR_TESTING_TOLERANCE_H

#include <stdint.h>

#include "ctxpar.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Bound on the relative error of tensor `tensor_name` ("out", "lse", "dq", "dk", "dv") computed
 * with inputs and outputs of `dtype` (lse is always F32; its bound still depends on the input
 * dtype). NAN for an unknown dtype or name, so that any check against it fails. */
double ctxpar_tolerance(ctxpar_dtype dtype, const char *tensor_name);

/* The bound for a global sequence length `seq`: the table was measured at seq 4096, and F32
 * accumulation errors grow about as sqrt(seq), so F32 bounds scale by sqrt(seq / 4096) above
 * 4096. 16-bit bounds are set by the storage rounding and do not scale. */
double ctxpar_tolerance_for_seq(ctxpar_dtype dtype, const char *tensor_name, int64_t seq);

/* Context parallelism must add no meaningful error: err(P ranks) / err(P = 1) <= this. */
#define CTXPAR_TOL_ERROR_RATIO 2.0

/* Below this relative error, 4 F32 ulps of the tensor's scale (4 x 2^-23), the P = 1 error is
 * rounding noise and the ratio of two such numbers means nothing. */
#define CTXPAR_TOL_RATIO_FLOOR 4.8e-7

/* Whether err_p (P ranks) is acceptable next to err_1 (the same problem on P = 1):
 * err_p <= CTXPAR_TOL_ERROR_RATIO * max(err_1, CTXPAR_TOL_RATIO_FLOOR). So the ratio is checked
 * when err_1 is above the floor, and below it err_p is held to the floor's absolute bound. NaN
 * in either gives 0. */
int ctxpar_error_ratio_ok(double err_p, double err_1);

#ifdef __cplusplus
}
#endif

#endif /* CTXPAR_TESTING_TOLERANCE_H */
