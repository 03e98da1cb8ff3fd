/*
 * reference_tile.h - the fast reference's parts (reference.c drives them): the problem and its
 * mask (reference_problem.c), and the float64 math of one tile of query rows against one tile of
 * key rows (reference_tile.c). Internal to the reference.
 */
#ifndef CPT_TESTING_REFERENCE_TILE_H
#define CPT_TESTING_REFERENCE_TILE_H

#include <stdint.h>

#include "reference/reference.h"

/* The element-wise loops over a tile's pairs are compiled for AVX-512 and AVX2 beside the
 * baseline and chosen at run time (GCC/clang function multi-versioning); none of them enables
 * FMA, so every version rounds alike and the results do not depend on the machine. */
#define CPT_REF_VECTOR __attribute__((target_clones("default", "avx2", "avx512f")))

/* Rows of a tile: 64 keeps a workspace's dozen pair matrices (32 KiB each) in L2. Measured on
 * `ctxpar check --ranks 1 --backward` (seq 4096, D 64): 64 rows 1.65 s, 128 1.75 s, 256 1.73 s. */
#define CPT_REF_TILE 64

/* A list of rows: rows[slot] (sorted, distinct), or slot itself when rows is NULL. */
typedef struct ref_rowset {
    const int64_t *rows;
    int64_t n;
} ref_rowset;

typedef struct ref_problem {
    cpt_oracle_shape sh;
    const double *q, *k, *v, *dout; /* dout NULL: forward only */
    const int64_t *q_pos, *k_pos;   /* NULL: row i is at position i */
    int causal;
    int64_t window, window_right;
    int64_t *q_doc, *k_doc; /* [doc_rows, S] document of each row; NULL without documents */
    int64_t doc_rows;       /* B with documents per batch row, else 1 */
    double scale, softcap;
    const double *sinks; /* [Hq] or NULL */
    int64_t dv, group;   /* head_dim of v; query heads per K/V head */
    int want16;          /* the 16-bit magnitudes M16 are wanted (else they are not summed) */
} ref_problem;

/* Positions and documents of the rows of one tile, and their ranges (for skipping tiles). */
typedef struct ref_geo {
    int64_t pos[CPT_REF_TILE], doc[CPT_REF_TILE];
    int64_t pos_min, pos_max, doc_min, doc_max;
    int64_t n;
} ref_geo;

/* One thread's tile buffers: rows [T, dim], pairs [T, T] (row-major, query rows first), row
 * values [T]. */
typedef struct ref_ws {
    double *qt, *qa, *dot, *doa, *ot; /* query side: q, |q|, dO, |dO|, out */
    double *kt, *ka, *vt, *va;        /* key side */
    double *s, *a, *tc, *pm, *wt, *pw, *dp, *bm, *ds, *mu, *mu16, *pd; /* pairs */
    double *m, *l, *lse, *ml, *delta, *mdelta, *mdelta16;             /* rows */
    double *acc;                                /* forward: unnormalised out [T, Dv] */
    double *u, *mo, *mo16, *dqa, *mdqa, *mdqa16, *x; /* rows pass accumulators */
    double *dka, *dva, *mdka, *mdva, *mdka16, *mdva16; /* keys pass accumulators */
    double *vis;  /* [T, T]: 1 where the mask lets the pair through, else 0 */
    double *ones; /* [T, T] all 1: vis of a whole tile */
    ref_geo qg, kg;
} ref_ws;

/* reference_problem.c */
ctxpar_status ref_problem_init(ref_problem *p, const cpt_oracle_shape *shape, const double *q,
                               const double *k, const double *v, const double *dout,
                               const int64_t *q_pos, const int64_t *k_pos,
                               const ctxpar_mask_desc *mask, const cpt_oracle_features *f,
                               double scale, const cpt_ref_select *sel);
void ref_problem_free(ref_problem *p);
int ref_ws_alloc(const ref_problem *p, ref_ws *w); /* 0, or -1 (w still safe to free) */
void ref_ws_free(ref_ws *w);
int64_t ref_tile_len(int64_t n, int64_t t);
void ref_geometry(const ref_problem *p, int64_t b, const ref_rowset *R, int64_t s0, int64_t n,
                  int is_query, ref_geo *g);
/* Whether any pair of the two tiles may be visible; *vis: NULL when every pair is, else vis_buf
 * [nI, nJ] filled with the mask predicate (1.0 or 0.0). */
int ref_visibility(const ref_problem *p, const ref_geo *qg, const ref_geo *kg, double *vis_buf,
                   const double **vis);
/* Rows s0.. of R, head h, from a dense [B, seq, heads, dim] tensor into dst [n, dim] (and |.|
 * into dst_abs unless NULL). Returns whether every value is finite. */
int ref_gather(const double *src, int64_t seq, int64_t heads, int64_t dim, int64_t b,
               const ref_rowset *R, int64_t s0, int64_t n, int64_t h, double *dst,
               double *dst_abs);
/* Slots s0..s0+n of a compact [B, slots, heads, dim] array, head h, into / from dst [n, dim]. */
void ref_gather_slots(const double *src, int64_t b, int64_t slots, int64_t s0, int64_t n,
                      int64_t h, int64_t heads, int64_t dim, double *dst);
void ref_scatter_slots(const double *src, double *dst, int64_t b, int64_t slots, int64_t s0,
                       int64_t n, int64_t h, int64_t heads, int64_t dim);
/* The selected rows' out [B, n, Hq, Dv] and lse [B, Hq, n] from every row's. */
void ref_select_rows(const ref_problem *p, const ref_rowset *R, const double *out_all,
                     const double *lse_all, double *out, double *lse);

/* reference_gemm.c: C [m, n] = alpha op(A) op(B) + beta C, row-major (beta 0: C is not read);
 * BLAS single-threaded for the reference's passes, and the thread count to restore after. */
void ref_dgemm(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, double alpha,
               const double *A, int64_t lda, const double *B, int64_t ldb, double beta, double *C,
               int64_t ldc);
int ref_blas_single(void);
void ref_blas_restore(int threads);

/* reference_tile.c */
void ref_scores(const ref_problem *p, ref_ws *w, int64_t nI, int64_t nJ, const double *vis);
void ref_abs_scores(ref_ws *w, int64_t nI, int64_t nJ, int64_t D);
void ref_online_softmax(ref_ws *w, int64_t nI, int64_t nJ, int64_t Dv);
void ref_probabilities(const ref_problem *p, ref_ws *w, int64_t nI, int64_t nJ,
                       const double *vis);
void ref_grad_scores(const ref_problem *p, ref_ws *w, int64_t nI, int64_t nJ,
                     const double *vis, int with_mdelta);
void ref_grad_pairs(const ref_problem *p, ref_ws *w, int64_t nI, int64_t nJ, const double *vis,
                    int with_mdelta);
void ref_spread(const ref_problem *p, ref_ws *w, int64_t nI, int64_t nJ, const double *vis);
/* C [m, n] += alpha op(A) B, A a pair matrix [nI, nJ] (op: transposed when trans, then m = nJ),
 * B data rows [kk, n]. Masked pairs never touch B (0 * NaN would leak a NaN there): BLAS when
 * the data is finite or every pair visible, else a loop over the visible pairs. */
void ref_pair_gemm(int trans, int64_t m, int64_t n, int64_t kk, double alpha, const double *A,
                   const double *B, double *C, const double *vis, int data_finite);
void ref_zero_row_accumulators(ref_ws *w, int64_t nI, int64_t D, int64_t Dv);
void ref_zero_key_accumulators(ref_ws *w, int64_t nJ, int64_t D, int64_t Dv);
/* Writes the rows pass's results of tile rows a0.. (slots of a set of n rows) of head h. */
typedef struct ref_rows_dst {
    double *mout, *mout16, *ml;      /* [B, n, Hq, Dv], NULL 16, [B, Hq, n] */
    double *dq, *mdq, *mdq16;        /* [B, n, Hq, D] or NULL */
    double *delta, *mdelta, *mdelta16; /* [B, Hq, n] */
    double *sink_part[3];            /* [B, Hq, n] or NULL */
} ref_rows_dst;
void ref_finish_rows(const ref_problem *p, const ref_ws *w, int64_t b, int64_t h, int64_t a0,
                     int64_t nI, int64_t n, const ref_rows_dst *dst);

#endif /* CPT_TESTING_REFERENCE_TILE_H */
