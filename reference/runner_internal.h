// The pieces of the runner that the launchers (threads, MPI) share.
#ifndef CPT_TESTING_RUNNER_INTERNAL_H
#define CPT_TESTING_RUNNER_INTERNAL_H

#include "runner.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Tensor ids of the data generator: the same on every rank and in the oracle. */
enum { CPT_RUN_ID_Q = 1, CPT_RUN_ID_K = 2, CPT_RUN_ID_V = 3, CPT_RUN_ID_DOUT = 4 };

/* head_dim of input `id`: v and dout have cpt_run_dim_v (MLA), q and k head_dim. */
int64_t cpt_run_input_dim(const cpt_run_config *cfg, int id);

/* Fills `local` ([B, S/P, H, D], host, the run's dtype) with the rows of global input `id`
 * (CPT_RUN_ID_*) that `rank` of `nranks` holds: from cfg->inputs when given (sharded by the
 * layout), else from the generator at the global positions pos. */
/* Rows of global tensor `tensor` (cpt_run_tensor): params.q_len for the queries' (out, lse, dq)
 * when it is set, else cfg->seq. */
int64_t cpt_run_rows(const cpt_run_config *cfg, int tensor);

/* Tokens rank holds of cfg->seq under the layout (and CUSTOM's assignment); -1 if invalid. */
int64_t cpt_run_local_seq(const cpt_run_config *cfg, int rank, int nranks);

ctxpar_status cpt_run_fill_local(const cpt_run_config *cfg, int id, int rank, int nranks,
                                    const int64_t *pos, ctxpar_tensor *local);

/* The whole global input `id` as densely packed doubles [B, S, H, D], exactly the values the
 * library is given (so the oracle sees what the ranks see). */
void cpt_run_fill_global_f64(const cpt_run_config *cfg, int id, double *dst);

/* When cfg asks for generated documents: *copy_out is cfg with params.cu_seqlens set to
 * *cu_out (malloc'ed: the caller frees it after the run); else a plain copy and NULL. */
ctxpar_status cpt_run_resolve_docs(const cpt_run_config *cfg, cpt_run_config *copy_out,
                                      int32_t **cu_out);

/* The device of one rank for cfg->backend, with `threads` OpenMP threads (CPU). */
ctxpar_status cpt_run_device_create(const cpt_run_config *cfg, int threads,
                                       ctxpar_device **dev_out);

/* One rank's local results: host buffers in the run's dtype (lse float), NULL when absent. */
typedef struct cpt_rank_outputs {
    void *t[CPT_RUN_TENSORS];
    size_t bytes[CPT_RUN_TENSORS];
    float *dsinks; /* [heads] with sinks and backward */
} cpt_rank_outputs;

/* One rank's status, outputs and statistics. */
typedef struct cpt_rank_report {
    ctxpar_status status;
    char message[512];
    ctxpar_algo algo;
    double time_s;     /* median of the timed calls */
    double time_fwd_s; /* median of their forward part */
    /* the fastest and slowest timed call, and forward part */
    double time_min_s, time_max_s, time_fwd_min_s, time_fwd_max_s;
    char device[CPT_RUN_DEVICE_LEN]; /* what the device computed with (ctxpar_dev_describe) */
    cpt_run_rank_stats stats;
    cpt_rank_outputs out;
} cpt_rank_report;

/* Runs the configured call(s) on one rank with the given device and comm (already created; the
 * comm's size is the number of ranks). Fills the report; never fails on its own. */
void cpt_run_rank(const cpt_run_config *cfg, ctxpar_device *dev, ctxpar_comm *comm,
                     cpt_rank_report *report);

void cpt_rank_outputs_free(cpt_rank_outputs *out);

/* Tells cfg->progress, if set. */
void cpt_run_progress(const cpt_run_config *cfg, const char *stage, int done, int total);

/* Allocates global outputs for cfg (ranks ignored). */
ctxpar_status cpt_run_outputs_alloc(const cpt_run_config *cfg, cpt_run_outputs *out);
void cpt_run_outputs_free(cpt_run_outputs *out);

/* Writes one rank's local outputs into their global rows. */
ctxpar_status cpt_run_outputs_place(const cpt_run_config *cfg, int rank, int nranks,
                                       const cpt_rank_outputs *local,
                                       cpt_run_outputs *global);

/* The sampled rows of each global output, compact: out as for a run of seq = smp->n. */
ctxpar_status cpt_run_outputs_compact(const cpt_run_config *cfg, const cpt_run_sample *smp,
                                      const cpt_run_outputs *full, cpt_run_outputs *out);

/* Runs cfg on `ranks` threads of this process and collects the global outputs and reports. */
ctxpar_status cpt_run_threads(const cpt_run_config *cfg, int ranks,
                                 cpt_run_outputs *global, cpt_rank_report *reports);

/* Fills the comparison part of result from the P-rank outputs (result->outputs), the P = 1
 * outputs (may be NULL) and the oracle. */
ctxpar_status cpt_run_evaluate(const cpt_run_config *cfg, const cpt_run_outputs *single,
                                  cpt_run_result *result);

/* Runs cfg on `ranks` threads into g and folds the reports into res (first failure, algorithm,
 * per-rank stats when ranks == cfg->ranks); slowest rank's times (total and forward) and
 * largest peak out. */
ctxpar_status cpt_run_collect(const cpt_run_config *cfg, int ranks, cpt_run_outputs *g,
                                 cpt_run_result *res, double *time_out, double *time_fwd_out,
                                 size_t *peak_out);

/* After res->outputs hold the P-rank results: runs P = 1 (if asked) and evaluates. */
ctxpar_status cpt_run_finish(const cpt_run_config *cfg, cpt_run_result *res);

/* INVALID_ARG for a config the harness cannot run. */
ctxpar_status cpt_run_check_config(const cpt_run_config *cfg);

#ifdef __cplusplus
}
#endif

#endif // CPT_TESTING_RUNNER_INTERNAL_H
