/*
 * data.h - counter-based test data and tensor helpers.
 *
 * Every value is a pure function of (seed, tensor id, global element index), so each rank makes
 * its own shard and the oracle the whole sequence, with no data exchanged.
 */
#ifndef CPT_TESTING_DATA_H
#define CPT_TESTING_DATA_H

#include <stdint.h>

#include "ctxpar.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Uniform in [-1, 1), from a counter-based hash of (seed, tensor_id, index). */
double cpt_test_value(uint64_t seed, uint64_t tensor_id, uint64_t index);

/* Fills t ([B, S_local, H, D], host, any dtype/strides) so that local row s holds the values of
 * global row pos[s] of a [B, seq_global, H, D] tensor, rounded to t's dtype. pos NULL = identity. */
void cpt_test_fill(ctxpar_tensor *t, uint64_t seed, uint64_t tensor_id, int64_t seq_global,
                      const int64_t *pos);

/* The same global tensor as doubles, each value first rounded through `dtype` so the oracle sees
 * exactly what the library stores: dense [B, seq_global, H, D]. */
void cpt_test_fill_global_f64(double *dst, ctxpar_dtype dtype, uint64_t seed,
                                 uint64_t tensor_id, int64_t batch, int64_t seq_global,
                                 int64_t heads, int64_t head_dim);

/* Element (b, s, h, d) of a host tensor as double. */
double cpt_test_get(const ctxpar_tensor *t, int64_t b, int64_t s, int64_t h, int64_t d);

/* x as the library would store it in `dtype`: rounded to float, then to F16/BF16 (round to
 * nearest even, the ctxpar_half.h conversions). cpt_test_fill and cpt_test_fill_global_f64
 * both round this way. */
double cpt_test_round(ctxpar_dtype dtype, double x);

/* Stores x (rounded as cpt_test_round does) at element (b, s, h, d) of a host tensor. */
void cpt_test_set(ctxpar_tensor *t, int64_t b, int64_t s, int64_t h, int64_t d, double x);

/* Copies a host tensor of any dtype/strides into dst, densely packed [B, S, H, D] doubles. */
void cpt_test_to_f64(const ctxpar_tensor *t, double *dst);

#ifdef __cplusplus
}
#endif

#endif /* CPT_TESTING_DATA_H */
