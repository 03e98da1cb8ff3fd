/*
 * naive_f32.h - attention as plain float32 math computes it: the accuracy baseline the library's
 * F32 reference must not lose to (issue: "no worse than naive float32 on every tensor").
 *
 * Written for the test harness, sharing no code with the library: the full softmax row in
 * float32 (scores q.k times scale, row max, expf, row sum, P = p / sum, out = P V) and the
 * textbook backward (dV = P^T dO, dP = dO V^T, delta = rowsum(dO * O), dS = P (dP - delta),
 * dQ = scale dS K, dK = scale dS^T Q). Every product is a float32 multiply-add; the long sums
 * (over keys, or over query rows) are taken as a BLAS GEMM takes them: in blocks of
 * CPT_NAIVE_KC terms, each block summed from zero and then added to the total. Sums over
 * head_dim (<= 256) are one block. This is what users compare against (float32 BLAS products,
 * PyTorch's math attention); a plain running sum over all keys would be a weaker baseline.
 *
 * Shapes and layouts are the oracle's (oracle.h): dense BSHD floats, lse [B, Hq, Sq] (natural
 * log; -inf and out = 0 for a row that sees no key). The mask is given as the oracle's visibility
 * matrix (cpt_oracle_visibility), vis [Sq, Sk], NULL for no mask.
 */
#ifndef CPT_TESTING_NAIVE_F32_H
#define CPT_TESTING_NAIVE_F32_H

#include <stdint.h>

#include "reference/oracle.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Terms per block of a long sum (the k-blocking of a float32 GEMM). */
#define CPT_NAIVE_KC 256

void cpt_naive_f32_fwd(const cpt_oracle_shape *sh, const float *q, const float *k,
                          const float *v, const uint8_t *vis, float scale, float *out,
                          float *lse);

/* out is the naive forward's own output (delta = rowsum(dout * out) from it, as autograd does);
 * dq, dk, dv are overwritten. */
void cpt_naive_f32_bwd(const cpt_oracle_shape *sh, const float *q, const float *k,
                          const float *v, const uint8_t *vis, float scale, const float *out,
                          const float *dout, float *dq, float *dk, float *dv);

#ifdef __cplusplus
}
#endif

#endif /* CPT_TESTING_NAIVE_F32_H */
