/*
 * audit_judge.h - the verdict of `ctxpar audit --against` on one tensor computed elsewhere: its
 * error against float64 attention, next to ctxpar's own error on the same inputs at the same
 * dtype, and where it is worst (global position, head, and the rank that held the row under the
 * declared layout: the first thing to know when hunting a ring-step or merge bug).
 *
 * The verdict is the per-element bound of reference/tolerance.h (docs/numerics.md): every element
 * within the error a correct float computation of it may carry at the result's dtype
 * (|got - ref| <= bound, ratio error/bound <= 1). Beside it, errors as metrics.h measures them
 * (max |got - ref| / max |ref|; non-finite values never look good), row by row so that every
 * rank's share is known.
 */
#ifndef CPT_TOOL_AUDIT_JUDGE_H
#define CPT_TOOL_AUDIT_JUDGE_H

#include <stdint.h>

#include "ctxpar.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What a result must meet to be called consistent: every element within its per-element bound,
 * and when max_ratio > 0 (--max-ratio, off by default) also its error at most max_ratio times
 * ctxpar's own error at the same dtype. */
typedef struct cpt_audit_bound {
    double max_ratio; /* 0: not applied */
    /* > 0: also map error/bound by position and head (the verdict's heat, for --report) in at
     * most this many columns over positions [0, heat_seq); heat_seq 0: the tensor's length. */
    int heat_cols;
    int64_t heat_seq;
} cpt_audit_bound;

#define CPT_AUDIT_WORST_ROWS 5
#define CPT_AUDIT_RANGES 8

/* A run of consecutive judged rows that all fail (positions first..last of batch row `batch`;
 * with --rows, every judged row between them failed), and the ranks holding its ends. */
typedef struct cpt_audit_range {
    int64_t batch, first, last;
    int rank_first, rank_last;
    int64_t elements; /* out of their bound in it */
} cpt_audit_range;

/* One row (all heads of one position, or one head's LSE value). */
typedef struct cpt_audit_row {
    int64_t batch, position, head;
    int rank;
    double error;       /* the row's max |got - ref| over the tensor's max |ref| */
    double bound_ratio; /* the row's largest |got - ref| / bound; the rows are ranked by it */
    double got, want;   /* the row's element with that ratio */
} cpt_audit_row;

typedef struct cpt_audit_verdict {
    double error;           /* vs float64 */
    double reference_error; /* ctxpar's own, same inputs and dtype */
    double ratio;           /* error / reference_error (inf when only ctxpar's is 0) */
    double bound_ratio;     /* the largest |got - ref| / bound over the tensor (<= 1: within) */
    int consistent;
    int64_t nonfinite;                               /* elements whose error is infinite */
    cpt_audit_row worst[CPT_AUDIT_WORST_ROWS]; /* the worst rows, worst first (only failing
                                                  * ones when any fails) */
    int n_worst;
    int64_t failing_elements; /* out of their bound */
    int64_t failing_rows;     /* rows (positions; lse: position and head) with such an element */
    cpt_audit_range ranges[CPT_AUDIT_RANGES]; /* the first runs of failing rows, in order */
    int n_ranges;
    int64_t more_ranges; /* runs beyond those */
    int ranks;
    double *rank_error; /* [ranks]: the error over the rows each rank held (malloc'ed) */
    double *rank_bound_ratio; /* [ranks]: the largest error/bound on each rank's rows (same) */
    /* With bound->heat_cols: [heat_heads][heat_cols] the largest error/bound of each head in each
     * bucket of heat_bucket positions (over the batch; -1 where no row was judged). The maximum,
     * not the mean, so that one bad row stays visible however long the sequence. */
    double *heat;
    int heat_cols, heat_heads;
    int64_t heat_bucket;
} cpt_audit_verdict;

/* Judges a global tensor: got is a dense [B, S, H, D] tensor (lse: NULL and got_lse a float
 * [B, H, S] array, dims = {B, H, S, 1}); ref the oracle's doubles and mag, mag16 the bound's
 * magnitudes (cpt_bound_magnitudes: t and t16) in the same order; the bound's storage rounding
 * is got's dtype (lse: F32); owner[s] the rank holding row s; position[s] its global position
 * (NULL: s; the rows a sampled audit judged). OUT_OF_MEMORY is the only failure. */
ctxpar_status cpt_audit_judge(const ctxpar_tensor *got, const float *got_lse,
                                 const int64_t dims[4], const double *ref, const double *mag,
                                 const double *mag16, double reference_error,
                                 const int *owner, const int64_t *position, int ranks,
                                 const cpt_audit_bound *bound, cpt_audit_verdict *v);

/* The verdict's rule, alone (cpt_audit_judge applies it). */
int cpt_audit_within_bound(const cpt_audit_verdict *v, const cpt_audit_bound *bound);

void cpt_audit_verdict_free(cpt_audit_verdict *v);

#ifdef __cplusplus
}
#endif

#endif /* CPT_TOOL_AUDIT_JUDGE_H */
