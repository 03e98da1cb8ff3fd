/*
 * accuracy.h - ctxpar's F32 error against the fp64 oracle next to naive float32 attention's
 * (naive_f32.h), on the input distributions that other projects' tests draw. Shared by
 * accuracy_test (which asserts "no worse than naive float32") and accuracy_table (which prints
 * the table of docs/numerics.md).
 */
#ifndef CPT_TESTING_ACCURACY_H
#define CPT_TESTING_ACCURACY_H

#include "reference/runner.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum cpt_acc_dist {
    CPT_DIST_UNIFORM01 = 0, /* q, k, v, dO uniform in [0, 1): PyTorch's CP tests (torch.rand) */
    CPT_DIST_NORMAL = 1,    /* standard normal */
    CPT_DIST_CLAMPED = 2,   /* clamp(randn, -1, 1): TransformerEngine's tests */
    CPT_DIST_SHARP = 3,     /* q, k = 3 randn (scores of tens: a sharp softmax), v, dO randn */
    CPT_DIST_COUNT = 4,
} cpt_acc_dist;

/* "uniform01", "normal", "clamped", "sharp"; NULL past the end. */
const char *cpt_acc_dist_name(cpt_acc_dist dist);

/* Element i of input id (1 q, 2 k, 3 v, 4 dO) of a distribution, as the float the library is
 * given: a pure function of (dist, seed, id, i), like data.h's values. */
float cpt_acc_input(cpt_acc_dist dist, int dout_ones, uint64_t seed, int id, uint64_t i);

typedef struct cpt_acc_case {
    cpt_run_config run; /* shape, mask, algorithm, layout, ranks, seed; dtype must be F32 */
    cpt_acc_dist dist;
    int dout_ones;         /* dO = 1 (loss = out.sum()); else dO from the distribution */
} cpt_acc_case;

#define CPT_ACC_QUARTILES 4

typedef struct cpt_acc_result {
    int has[CPT_RUN_TENSORS];
    /* max |x - fp64 oracle| over the tensor: [0] ctxpar, [1] naive float32 */
    double err[2][CPT_RUN_TENSORS];
    /* the same by quartile of the sequence position (query rows for out, lse, dq; key rows for
     * dk, dv): growth with the number of keys a row sees shows here */
    double quart[2][CPT_RUN_TENSORS][CPT_ACC_QUARTILES];
    double max_ref[CPT_RUN_TENSORS]; /* max |oracle| */
    /* the largest |err| / per-element bound (tolerance.h), [0] ctxpar, [1] naive, and where:
     * the flat index into the tensor (BSHD, lse [B, H, S]) */
    double bound_ratio[2][CPT_RUN_TENSORS];
    int64_t bound_worst[2][CPT_RUN_TENSORS];
} cpt_acc_result;

/* Runs the case with the library (cfg->ranks in-process ranks), the fp64 oracle and naive
 * float32, and measures both errors. Returns the harness's or the library's failure. */
ctxpar_status cpt_acc_run(const cpt_acc_case *c, cpt_acc_result *r);

#ifdef __cplusplus
}
#endif

#endif /* CPT_TESTING_ACCURACY_H */
