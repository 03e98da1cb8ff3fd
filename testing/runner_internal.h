// The pieces of the runner that the launchers (threads, MPI) share.
#ifndef CTXPAR_TESTING_RUNNER_INTERNAL_H
#define CTXPAR_TESTING_RUNNER_INTERNAL_H

#include "runner.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Tensor ids of the data generator: the same on every rank and in the oracle. */
enum { CTXPAR_RUN_ID_Q = 1, CTXPAR_RUN_ID_K = 2, CTXPAR_RUN_ID_V = 3, CTXPAR_RUN_ID_DOUT = 4 };

/* Fills `local` ([B, S/P, H, D], host, the run's dtype) with the rows of global input `id`
 * (CTXPAR_RUN_ID_*) that `rank` of `nranks` holds: from cfg->inputs when given (sharded by the
 * layout), else from the generator at the global positions pos. */
ctxpar_status ctxpar_run_fill_local(const ctxpar_run_config *cfg, int id, int rank, int nranks,
                                    const int64_t *pos, ctxpar_tensor *local);

/* The whole global input `id` as densely packed doubles [B, S, H, D], exactly the values the
 * library is given (so the oracle sees what the ranks see). */
void ctxpar_run_fill_global_f64(const ctxpar_run_config *cfg, int id, double *dst);

/* When cfg asks for generated documents: *copy_out is cfg with params.cu_seqlens set to
 * *cu_out (malloc'ed: the caller frees it after the run); else a plain copy and NULL. */
ctxpar_status ctxpar_run_resolve_docs(const ctxpar_run_config *cfg, ctxpar_run_config *copy_out,
                                      int32_t **cu_out);

/* The device of one rank for cfg->backend, with `threads` OpenMP threads (CPU). */
ctxpar_status ctxpar_run_device_create(const ctxpar_run_config *cfg, int threads,
                                       ctxpar_device **dev_out);

/* One rank's local results: host buffers in the run's dtype (lse float), NULL when absent. */
typedef struct ctxpar_rank_outputs {
    void *t[CTXPAR_RUN_TENSORS];
    size_t bytes[CTXPAR_RUN_TENSORS];
} ctxpar_rank_outputs;

/* One rank's status, outputs and statistics. */
typedef struct ctxpar_rank_report {
    ctxpar_status status;
    char message[512];
    ctxpar_algo algo;
    double time_s;     /* median of the timed calls */
    double time_fwd_s; /* median of their forward part */
    ctxpar_run_rank_stats stats;
    ctxpar_rank_outputs out;
} ctxpar_rank_report;

/* Runs the configured call(s) on one rank with the given device and comm (already created; the
 * comm's size is the number of ranks). Fills the report; never fails on its own. */
void ctxpar_run_rank(const ctxpar_run_config *cfg, ctxpar_device *dev, ctxpar_comm *comm,
                     ctxpar_rank_report *report);

void ctxpar_rank_outputs_free(ctxpar_rank_outputs *out);

/* Tells cfg->progress, if set. */
void ctxpar_run_progress(const ctxpar_run_config *cfg, const char *stage, int done, int total);

/* Allocates global outputs for cfg (ranks ignored). */
ctxpar_status ctxpar_run_outputs_alloc(const ctxpar_run_config *cfg, ctxpar_run_outputs *out);
void ctxpar_run_outputs_free(ctxpar_run_outputs *out);

/* Writes one rank's local outputs into their global rows. */
ctxpar_status ctxpar_run_outputs_place(const ctxpar_run_config *cfg, int rank, int nranks,
                                       const ctxpar_rank_outputs *local,
                                       ctxpar_run_outputs *global);

/* Runs cfg on `ranks` threads of this process and collects the global outputs and reports. */
ctxpar_status ctxpar_run_threads(const ctxpar_run_config *cfg, int ranks,
                                 ctxpar_run_outputs *global, ctxpar_rank_report *reports);

/* Fills the comparison part of result from the P-rank outputs (result->outputs), the P = 1
 * outputs (may be NULL) and the oracle. */
ctxpar_status ctxpar_run_evaluate(const ctxpar_run_config *cfg, const ctxpar_run_outputs *single,
                                  ctxpar_run_result *result);

/* Runs cfg on `ranks` threads into g and folds the reports into res (first failure, algorithm,
 * per-rank stats when ranks == cfg->ranks); slowest rank's times (total and forward) and
 * largest peak out. */
ctxpar_status ctxpar_run_collect(const ctxpar_run_config *cfg, int ranks, ctxpar_run_outputs *g,
                                 ctxpar_run_result *res, double *time_out, double *time_fwd_out,
                                 size_t *peak_out);

/* After res->outputs hold the P-rank results: runs P = 1 (if asked) and evaluates. */
ctxpar_status ctxpar_run_finish(const ctxpar_run_config *cfg, ctxpar_run_result *res);

/* INVALID_ARG for a config the harness cannot run. */
ctxpar_status ctxpar_run_check_config(const ctxpar_run_config *cfg);

#ifdef __cplusplus
}
#endif

#endif // CTXPAR_TESTING_RUNNER_INTERNAL_H
