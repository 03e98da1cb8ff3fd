/*
 * reference_gemm.c - the fast reference's matrix products: OpenBLAS dgemm, single-threaded inside
 * the reference's own threads; or, built with CPT_REF_NO_BLAS (--define=reference_blas=off), a
 * plain loop, so that the reference builds where OpenBLAS is missing and runs under valgrind,
 * where OpenBLAS's kernels are about 100 times slower than plain code (2000 dgemm calls of 64^3:
 * 0.05 s, under `valgrind --tool=none` 6.9 s).
 */
#include "reference/reference_tile.h"

#ifndef CPT_REF_NO_BLAS
#include <cblas.h>
#endif

void ref_dgemm(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, double alpha,
               const double *A, int64_t lda, const double *B, int64_t ldb, double beta, double *C,
               int64_t ldc) {
#ifndef CPT_REF_NO_BLAS
    cblas_dgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, (int)m, (int)n, (int)k, alpha, A, (int)lda, B,
                (int)ldb, beta, C, (int)ldc);
#else
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            double s = 0.0;
            for (int64_t l = 0; l < k; l++)
                s += (trans_a ? A[l * lda + i] : A[i * lda + l]) *
                     (trans_b ? B[j * ldb + l] : B[l * ldb + j]);
            // beta 0 never reads C, as BLAS does not.
            C[i * ldc + j] = beta == 0.0 ? alpha * s : alpha * s + beta * C[i * ldc + j];
        }
#endif
}

int ref_blas_single(void) {
#ifndef CPT_REF_NO_BLAS
    const int threads = openblas_get_num_threads();
    openblas_set_num_threads(1);
    return threads;
#else
    return 1;
#endif
}

void ref_blas_restore(int threads) {
#ifndef CPT_REF_NO_BLAS
    openblas_set_num_threads(threads);
#else
    (void)threads;
#endif
}
