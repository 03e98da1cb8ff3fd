/*
 * runner.h - runs one context-parallel attention problem end to end and measures it against the
 * float64 oracle and against the same backend on one rank. Shared by the `ctxpar` tool and the
 * end-to-end test suites, so that what the tests assert is what users run.
 *
 * Inputs come from the counter-based generator (data.h): each rank makes its own shard, the
 * oracle the whole sequence; or from global arrays the caller supplies (cpt_run_inputs: the
 * tensors of `ctxpar audit`), which each rank shards by the layout. Results are gathered into
 * global (unsharded) order on the host.
 */
#ifndef CPT_TESTING_RUNNER_H
#define CPT_TESTING_RUNNER_H

#include <stdint.h>

#include "ctxpar.h"

#ifdef __cplusplus
extern "C" {
#endif

#define CPT_RUN_TENSORS 5 /* out, lse, dq, dk, dv */
#define CPT_RUN_DEVICE_LEN 256 /* cpt_run_result.device */

typedef enum cpt_run_tensor {
    CPT_T_OUT = 0,
    CPT_T_LSE = 1,
    CPT_T_DQ = 2,
    CPT_T_DK = 3,
    CPT_T_DV = 4,
} cpt_run_tensor;

/* "out", "lse", "dq", "dk", "dv". */
const char *cpt_run_tensor_name(cpt_run_tensor t);

/* Global inputs given by the caller instead of the generator: densely packed BSHD host arrays in
 * the run's dtype, q [batch, seq, heads, head_dim], k and v [batch, seq, kv_heads, head_dim],
 * dout like q (required with backward, ignored without). Borrowed for the whole run. */
typedef struct cpt_run_inputs {
    const void *q, *k, *v, *dout;
} cpt_run_inputs;

/* The device every rank runs on: an index into the library's registry of devices by name
 * (ctxpar_device_names: what `--backend` accepts and `ctxpar --list-backends` prints); the CPU
 * is always 0. */
typedef enum cpt_run_backend {
    CPT_RUN_CPU = 0,
} cpt_run_backend;

/* How many devices the registry holds. */
int cpt_run_backend_count(void);

/* The index of the backend called `name`, or -1. */
int cpt_run_backend_find(const char *name);

/* The backend's name ("cpu", "cuda"), or "?" for an index not in the registry; its one line. */
const char *cpt_run_backend_name(cpt_run_backend backend);
const char *cpt_run_backend_about(cpt_run_backend backend);

/* Whether `backend` is in the registry (built into or loaded by this binary). */
int cpt_run_backend_available(cpt_run_backend backend);

/* OK when the backend's device can be created here now (one is created and destroyed); else
 * the creation's status, with the reason in ctxpar_last_error() (CUDA: no device). */
ctxpar_status cpt_run_backend_probe(cpt_run_backend backend);

typedef struct cpt_run_config {
    int ranks;
    int64_t batch, seq, heads, kv_heads, head_dim; /* seq: global */
    ctxpar_dtype dtype;
    /* algo, layout, mask, window, docs, scale, softcap; params.sinks: HOST memory [heads] here
     * (each rank stages it in its device's memory; with backward every rank gets dsinks);
     * params.dsinks is not read. */
    ctxpar_attn_params params;
    int64_t head_dim_v; /* of v, out, dout, dv (MLA); 0 = head_dim */
    int backward;
    uint64_t seed;
    int threads;            /* OpenMP threads per rank's device; 0 = cores / ranks (at least 1) */
    int compare_single;     /* also run P = 1 and compare (error ratio, bitwise) */
    int compare_oracle;     /* compute the fp64 oracle and the errors */
    int keep_oracle;        /* with compare_oracle: keep its tensors in the result (audit) */
    /* Optional: the result of a run of the same problem (inputs, shape, mask, features, dtype,
     * rows, seed, layout and ranks: the algorithm may differ) made with keep_oracle. Its fp64
     * reference is judged against instead of computing it again; this run then keeps none. */
    const struct cpt_run_result *reference_from;
    int verify_transfers;   /* context option */
    int repeat;             /* timed repetitions of the call (median reported); 0 = 1 */
    int warmup;             /* untimed calls before the timed ones (not traced, not counted) */
    cpt_run_backend backend;
    const cpt_run_inputs *inputs; /* NULL: the counter-based generator with `seed` */
    /* > 0 with params.cu_seqlens NULL: pack that many documents of generated lengths
     * (cpt_run_docs) into the sequence. */
    int64_t docs;
    /* > 0 and < seq: judge only this many query rows, and the same key rows for dk and dv
     * (cpt_run_sample_rows); 0: every row. */
    int64_t rows;
    /* Optional: every trace event of the timed calls, on the rank's own thread. */
    void (*trace)(void *user, int rank, const ctxpar_trace_event *event);
    void *trace_user;
    /* Optional: what the run is doing, for a progress line: `stage` ("4 ranks", "1 rank",
     * "fp64 oracle"), `done` of `total` calls (total 0: not counted). Called on the thread that
     * runs the stage (rank 0's for the calls), one at a time. */
    void (*progress)(void *user, const char *stage, int done, int total);
    void *progress_user;
} cpt_run_config;

/* Defaults: 4 ranks, batch 1, seq 4096, 4 heads, dim 64, f32, causal zigzag ring, forward only,
 * CPU backend, generated inputs, oracle and single-rank comparison on, 1 call, no warm-up. */
void cpt_run_config_default(cpt_run_config *cfg);

/* Global results of one run (host, BSHD / [B, H, S] for lse), in the run's dtype. */
typedef struct cpt_run_outputs {
    void *t[CPT_RUN_TENSORS]; /* NULL where not computed; lse is float */
    float *dsinks;            /* [heads] with sinks and backward: rank 0's, all NaN when another
                                 rank's differs from it in any bit; else NULL */
} cpt_run_outputs;

typedef struct cpt_run_rank_stats {
    size_t peak_bytes;
    uint64_t allocations; /* device allocations per timed call (after the warm-up) */
    uint64_t bytes_sent;
    ctxpar_work_stats work;
    /* Seconds per timed call, from the library's trace events: kernels (COMPUTE), transfers in
     * flight (TRANSFER, post to completion) and the rank blocked on them (WAIT). */
    double compute_s, transfer_s, wait_s;
} cpt_run_rank_stats;

/* One element of a global tensor: where it is and which rank held its row under the layout. */
typedef struct cpt_run_where {
    int64_t batch, position, head, dim; /* dim 0 for lse */
    int rank;
    double got, ref, bound; /* the element, the oracle's value, its per-element bound */
} cpt_run_where;

/* The rows a sampled run judges (cfg->rows): the first and last row of every rank's shard and
 * of every run of consecutive positions in it (a layout chunk), then uniform random rows from
 * cfg->seed; sorted positions. More boundaries than cfg->rows: an even spread of them. */
typedef struct cpt_run_sample {
    int64_t *rows;      /* NULL: every row is judged */
    int64_t n;          /* rows judged */
    int64_t boundaries; /* how many of them are boundaries */
} cpt_run_sample;

ctxpar_status cpt_run_sample_rows(const cpt_run_config *cfg, cpt_run_sample *out);
void cpt_run_sample_free(cpt_run_sample *s);

typedef struct cpt_run_result {
    ctxpar_status status;   /* first failing rank's status, or OK */
    char message[600];      /* its message, "rank R: ..." */
    ctxpar_algo algo;       /* what AUTO resolved to */
    int has[CPT_RUN_TENSORS];
    double error[CPT_RUN_TENSORS];    /* rel error vs oracle (NAN when not compared) */
    /* The per-row measure beside it (cpt_rel_error_rows over rows of head_dim values: one
     * position and head): an error confined to rows much smaller than the tensor's largest (a
     * causal dk's late keys) shows here. Reported, not judged. NAN for lse and when not
     * compared. */
    double row_error[CPT_RUN_TENSORS];
    double error_1[CPT_RUN_TENSORS];  /* the same at P = 1 */
    double ratio[CPT_RUN_TENSORS];    /* error / error_1 */
    int ratio_ok[CPT_RUN_TENSORS];
    double tolerance[CPT_RUN_TENSORS]; /* the old table's bound on error (information only) */
    /* The verdict: the per-element bound (tolerance.h, docs/numerics.md). bound_ratio is the
     * largest |got - oracle| / bound over the tensor (<= 1 passes; INFINITY for NaN or an
     * unmatched infinity), bound_worst where it occurs; within_tol is bound_ratio <= 1. */
    double bound_ratio[CPT_RUN_TENSORS];
    cpt_run_where bound_worst[CPT_RUN_TENSORS];
    int within_tol[CPT_RUN_TENSORS];
    int bitwise_single[CPT_RUN_TENSORS]; /* bitwise equal to P = 1 */
    int ok;                 /* status OK, every error within tolerance and ratio */
    double time_s;          /* median wall time of the P-rank call (fwd, or fwd + bwd), slowest
                               rank */
    double time_fwd_s;      /* the same for the forward alone */
    /* The fastest and the slowest of those timed calls, and of their forward part (each rank's;
     * the largest over ranks): the spread of time_s and time_fwd_s over the repeats. */
    double time_min_s, time_max_s, time_fwd_min_s, time_fwd_max_s;
    /* What rank 0's device computed with, after the timed calls (its describe op): kernels or
     * library, and how many forward blocks went which way. */
    char device[CPT_RUN_DEVICE_LEN];
    double time_single_s;   /* time_s at P = 1 */
    double reference_time_s; /* wall time of the fp64 reference and its bound (0: not run) */
    size_t peak_bytes_per_rank;     /* max over ranks */
    size_t single_rank_peak_bytes;
    cpt_run_rank_stats rank[64]; /* first min(ranks, 64) */
    cpt_run_outputs outputs;     /* owned; freed by cpt_run_result_free */
    /* With cfg->rows: the rows judged. Errors, ratios, bounds and the kept oracle below then
     * cover those rows only, the oracle's tensors compact ([B, n, H, D], lse [B, H, n]). */
    cpt_run_sample sample;
    /* With keep_oracle: the fp64 oracle's global tensors (the layout of outputs), else NULL;
     * owned, freed by cpt_run_result_free. */
    double *oracle[CPT_RUN_TENSORS];
    /* With keep_oracle: the bound's magnitudes M of every element (tolerance.h), same layout. */
    double *oracle_mag[CPT_RUN_TENSORS];
    double *oracle_mag16[CPT_RUN_TENSORS]; /* its 16-bit magnitudes M16 */
    /* With keep_oracle and sinks: the oracle's dsinks [heads], its M and M16 (else NULL). */
    double *oracle_dsinks[3];
    /* dsinks (outputs.dsinks): judged by its per-element bound like the tensors (and counted
     * in ok); the bits of P = 1 are not asked of it (each rank's part is rounded before the
     * ranks' sum), the P = 1 error ratio is. */
    int has_dsinks;
    double dsinks_bound_ratio, dsinks_error, dsinks_error_1;
    int dsinks_ratio_ok;
} cpt_run_result;

/* The same problem on one rank (the P = 1 comparison and baselines): a custom layout becomes
 * contiguous there (one rank holds every token in order), the hybrid a group of one. */
cpt_run_config cpt_run_config_one_rank(const cpt_run_config *cfg);

/* Runs cfg with cfg->ranks in-process ranks (threads, the local comm, cfg->backend's device).
 * Returns the status of the harness itself (bad config: INVALID_ARG); the library's status is in
 * result. Every element is held to its per-element bound (cpt_bound_elem with the magnitudes of
 * cpt_bound_magnitudes_masked), the P-rank error to the P = 1 error (cpt_error_ratio_ok). */
ctxpar_status cpt_run(const cpt_run_config *cfg, cpt_run_result *result);

void cpt_run_result_free(cpt_run_result *result);

/* Boundaries of `docs` documents packed into seq tokens, lengths drawn from seed (each between
 * about a quarter and twice the mean, at least 1): cu_out[0] = 0 < ... < cu_out[docs] = seq
 * (docs + 1 entries). INVALID_ARG when docs is not in [1, seq] or seq exceeds INT32_MAX. */
ctxpar_status cpt_run_docs(uint64_t seed, int64_t seq, int64_t docs, int32_t *cu_out);
/* The same for documents of lengths proportional to weight(seed, i, user) (> 0) for i < docs,
 * each at least 1 token. */
ctxpar_status cpt_run_docs_with(uint64_t seed, int64_t seq, int64_t docs,
                                double (*weight)(uint64_t seed, int64_t i, void *user),
                                void *user, int32_t *cu_out);

/* The head_dim of v, out, dout and dv (cfg->head_dim_v, or head_dim when 0). */
int64_t cpt_run_dim_v(const cpt_run_config *cfg);

/* OpenMP threads each of `ranks` ranks gets: cfg->threads, or when 0 the online cores divided
 * by ranks (at least 1). */
int cpt_run_threads_per_rank(const cpt_run_config *cfg, int ranks);

#ifdef __cplusplus
}
#endif

#endif /* CPT_TESTING_RUNNER_H */
