/*
 * reference_gemm.c - the fast reference's matrix products: OpenBLAS dgemm, single-threaded inside
 * the reference's own threads; or, built with CPT_REF_NO_BLAS (--define=reference_blas=off),
 * blocked plain loops, so that the reference builds where OpenBLAS is missing and runs under
 * valgrind, where OpenBLAS's kernels are about 100 times slower than plain code (2000 dgemm calls
 * of 64^3: 0.05 s, under `valgrind --tool=none` 6.9 s).
 */
#include "reference/reference_gemm.h"
#include "reference/reference_tile.h"

#ifndef CPT_REF_NO_BLAS
#include <cblas.h>
#endif

enum { PANEL = 64, MR = 4, NR = 8 };

// C[i..i+mr)[j..j+nr) += alpha op(A)[i..)[0..kb) P[0..kb)[j..): P's rows contiguous (ldp apart),
// the corner's sums held in registers, so that each term reads memory once and no addition waits
// on the one before (natively 4.5x faster than a dot product per element; under valgrind, which
// checks every access, a fifth fewer instructions for a whole e2e case). Whole corners get
// constant bounds the compiler unrolls and vectorises; the edges, plain loops.
static inline void corner(int64_t mr, int64_t nr, int64_t kb, double alpha, const double *A,
                          int64_t lda, int64_t stride_l, const double *P, int64_t ldp, double *C,
                          int64_t ldc) {
    double acc[MR][NR] = {{0.0}};
    if (mr == MR && nr == NR) {
        for (int64_t l = 0; l < kb; l++) {
#pragma GCC unroll 4
            for (int r = 0; r < MR; r++) {
                const double a = A[r * lda + l * stride_l];
#pragma omp simd
                for (int c = 0; c < NR; c++)
                    acc[r][c] += a * P[l * ldp + c];
            }
        }
    } else {
        for (int64_t l = 0; l < kb; l++)
            for (int64_t r = 0; r < mr; r++)
                for (int64_t c = 0; c < nr; c++)
                    acc[r][c] += A[r * lda + l * stride_l] * P[l * ldp + c];
    }
    for (int64_t r = 0; r < mr; r++)
        for (int64_t c = 0; c < nr; c++)
            C[r * ldc + c] += alpha * acc[r][c];
}

// C = alpha op(A) op(B) + beta C in PANEL x PANEL blocks of op(B) whose rows are contiguous
// (B's own, or a transposed block copied out), MR x NR corners of C at a time.
CPT_REF_VECTOR void ref_dgemm_plain(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k,
                                    double alpha, const double *A, int64_t lda, const double *B,
                                    int64_t ldb, double beta, double *C, int64_t ldc) {
    double block[PANEL * PANEL];
    // op(A)[i][l] = A[i * a_row + l * a_col]
    const int64_t a_row = trans_a ? 1 : lda, a_col = trans_a ? lda : 1;
    for (int64_t j0 = 0; j0 < n; j0 += PANEL) {
        const int64_t nb = n - j0 < PANEL ? n - j0 : PANEL;
        for (int64_t i = 0; i < m; i++) // beta 0 never reads C, as BLAS does not
            for (int64_t j = 0; j < nb; j++)
                C[i * ldc + j0 + j] = beta == 0.0 ? 0.0 : beta * C[i * ldc + j0 + j];
        for (int64_t l0 = 0; l0 < k; l0 += PANEL) {
            const int64_t kb = k - l0 < PANEL ? k - l0 : PANEL;
            const double *bp = B + l0 * ldb + j0;
            int64_t ldp = ldb;
            if (trans_b) {
                for (int64_t l = 0; l < kb; l++)
                    for (int64_t j = 0; j < nb; j++)
                        block[l * PANEL + j] = B[(j0 + j) * ldb + l0 + l];
                bp = block;
                ldp = PANEL;
            }
            for (int64_t i = 0; i < m; i += MR)
                for (int64_t j = 0; j < nb; j += NR)
                    corner(m - i < MR ? m - i : MR, nb - j < NR ? nb - j : NR, kb, alpha,
                           A + i * a_row + l0 * a_col, a_row, a_col, bp + j, ldp,
                           C + i * ldc + j0 + j, ldc);
        }
    }
}

void ref_dgemm(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, double alpha,
               const double *A, int64_t lda, const double *B, int64_t ldb, double beta, double *C,
               int64_t ldc) {
#ifndef CPT_REF_NO_BLAS
    cblas_dgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, (int)m, (int)n, (int)k, alpha, A, (int)lda, B,
                (int)ldb, beta, C, (int)ldc);
#else
    ref_dgemm_plain(trans_a, trans_b, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
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
