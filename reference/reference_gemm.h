/*
 * reference_gemm.h - the matrix product the fast reference uses where OpenBLAS is not built in
 * (--define=reference_blas=off: valgrind's run), declared here so that reference_test checks it
 * in every build against a product written out in the test.
 */
#ifndef CTXPAR_REFERENCE_GEMM_H
#define CTXPAR_REFERENCE_GEMM_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* C [m, n] = alpha op(A) op(B) + beta C, row-major, op(X) = X or its transpose; beta 0: C is not
 * read (as BLAS). */
void ref_dgemm_plain(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, double alpha,
                     const double *A, int64_t lda, const double *B, int64_t ldb, double beta,
                     double *C, int64_t ldc);

#ifdef __cplusplus
}
#endif

#endif
