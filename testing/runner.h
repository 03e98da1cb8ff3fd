/*
 * runner.h - runs one context-parallel attention problem end to end and measures it against the
 * float64 oracle and against the same backend on one rank. Shared by the `ctxpar` tool and the
 * end-to-end test suites, so that what the tests assert is what users run.
 *
 * Inputs come from the counter-based generator (data.h): each rank makes its own shard; the
 * oracle the whole sequence. Results are gathered into global (unsharded) order on the host.
 */
#ifndef CTXPAR_TESTING_RUNNER_H
#define CTXPAR_TESTING_RUNNER_H

#include <stdint.h>

#include "ctxpar.h"

#ifdef __cplusplus
extern "C" {
#endif

#define CTXPAR_RUN_TENSORS 5 /* out, lse, dq, dk, dv */

typedef enum ctxpar_run_tensor {
    CTXPAR_T_OUT = 0,
    CTXPAR_T_LSE = 1,
    CTXPAR_T_DQ = 2,
    CTXPAR_T_DK = 3,
    CTXPAR_T_DV = 4,
} ctxpar_run_tensor;

/* "out", "lse", "dq", "dk", "dv". */
const char *ctxpar_run_tensor_name(ctxpar_run_tensor t);

typedef struct ctxpar_run_config {
    int ranks;
    int64_t batch, seq, heads, kv_heads, head_dim; /* seq: global */
    ctxpar_dtype dtype;
    ctxpar_attn_params params; /* algo, layout, mask, window, docs, scale */
    int backward;
    uint64_t seed;
    int threads;            /* OpenMP threads per rank's device; 0 = cores / ranks (at least 1) */
    int compare_single;     /* also run P = 1 and compare (error ratio, bitwise) */
    int compare_oracle;     /* compute the fp64 oracle and the errors */
    int verify_transfers;   /* context option */
    int repeat;             /* timed repetitions of the call (median reported); 0 = 1 */
    /* Optional: every trace event of the timed calls, on the rank's own thread. */
    void (*trace)(void *user, int rank, const ctxpar_trace_event *event);
    void *trace_user;
} ctxpar_run_config;

/* Defaults: 4 ranks, batch 1, seq 4096, 4 heads, dim 64, f32, causal zigzag ring, forward only,
 * oracle and single-rank comparison on. */
void ctxpar_run_config_default(ctxpar_run_config *cfg);

/* Global results of one run (host, BSHD / [B, H, S] for lse), in the run's dtype. */
typedef struct ctxpar_run_outputs {
    void *t[CTXPAR_RUN_TENSORS]; /* NULL where not computed; lse is float */
} ctxpar_run_outputs;

typedef struct ctxpar_run_rank_stats {
    size_t peak_bytes;
    uint64_t bytes_sent;
    ctxpar_work_stats work;
    double compute_s, transfer_s, wait_s; /* from the trace events of the timed call */
} ctxpar_run_rank_stats;

typedef struct ctxpar_run_result {
    ctxpar_status status;   /* first failing rank's status, or OK */
    char message[600];      /* its message, "rank R: ..." */
    ctxpar_algo algo;       /* what AUTO resolved to */
    int has[CTXPAR_RUN_TENSORS];
    double error[CTXPAR_RUN_TENSORS];    /* rel error vs oracle (NAN when not compared) */
    double error_1[CTXPAR_RUN_TENSORS];  /* the same at P = 1 */
    double ratio[CTXPAR_RUN_TENSORS];    /* error / error_1 */
    int ratio_ok[CTXPAR_RUN_TENSORS];
    double tolerance[CTXPAR_RUN_TENSORS];
    int within_tol[CTXPAR_RUN_TENSORS];
    int bitwise_single[CTXPAR_RUN_TENSORS]; /* bitwise equal to P = 1 */
    int ok;                 /* status OK, every error within tolerance and ratio */
    double time_s;          /* median wall time of the P-rank call(s), slowest rank */
    double time_single_s;   /* the same at P = 1 */
    size_t peak_bytes_per_rank;     /* max over ranks */
    size_t single_rank_peak_bytes;
    ctxpar_run_rank_stats rank[64]; /* first min(ranks, 64) */
    ctxpar_run_outputs outputs;     /* owned; freed by ctxpar_run_result_free */
} ctxpar_run_result;

/* Runs cfg with cfg->ranks in-process ranks (the local comm and the CPU backend). Returns the
 * status of the harness itself (bad config: INVALID_ARG); the library's status is in result. */
ctxpar_status ctxpar_run(const ctxpar_run_config *cfg, ctxpar_run_result *result);

void ctxpar_run_result_free(ctxpar_run_result *result);

#ifdef __cplusplus
}
#endif

#endif /* CTXPAR_TESTING_RUNNER_H */
