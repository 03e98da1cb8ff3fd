/*
 * audit.h - the pieces of `ctxpar audit` (cmd_audit.c loads and runs, audit_report.c judges,
 * prints and saves).
 */
#ifndef CTXPAR_TESTING_AUDIT_H
#define CTXPAR_TESTING_AUDIT_H

#include <stdio.h>

#include "audit_io.h"
#include "audit_judge.h"
#include "cli.h"
#include "runner.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ctxpar_audit_state {
    ctxpar_audit_src files[5]; /* --q, --k, --v, --dout, --cu-seqlens */
    ctxpar_audit_src inputs_src, shards, against;
    const ctxpar_audit_src *like; /* where q came from: --save stores results the same way */
    ctxpar_audit_layout lay;
    ctxpar_audit_tensor in[4];                   /* q, k, v, dout in global form */
    ctxpar_audit_tensor res[CTXPAR_RUN_TENSORS]; /* the results to judge (data NULL: absent) */
    int has_against;
    ctxpar_npy_dtype result_dtype; /* of out, dq, dk, dv (lse may differ) */
    int result_dtype_set;
    ctxpar_dtype file_dtype; /* the inputs' */
    void *converted[4];
    int32_t *cu_seqlens;
    int64_t num_docs;
    ctxpar_run_inputs inputs;
} ctxpar_audit_state;

/* Reads every file and fills cli->cfg; 0 and a one-line msg naming the file on failure. */
int ctxpar_audit_load(ctxpar_cli *cli, ctxpar_audit_state *a, char *msg, size_t n);
void ctxpar_audit_state_free(ctxpar_audit_state *a);

typedef struct ctxpar_audit_report {
    int judged;
    int consistent;
    ctxpar_audit_verdict v[CTXPAR_RUN_TENSORS]; /* ranks 0: not given */
} ctxpar_audit_report;

/* Judges every result given against the run's oracle and ctxpar's own errors. */
ctxpar_status ctxpar_audit_judge_all(const ctxpar_cli *cli, const ctxpar_audit_state *a,
                                     const ctxpar_run_result *r, ctxpar_audit_report *rep);
void ctxpar_audit_report_free(ctxpar_audit_report *rep);

/* --save: ctxpar's results in the inputs' dtype, stored like the inputs. */
ctxpar_status ctxpar_audit_save(const ctxpar_cli *cli, const ctxpar_audit_state *a,
                                const ctxpar_run_result *r);

/* The table (or with --json one object): ctxpar's report, then the verdict on the results. */
void ctxpar_audit_print(FILE *f, const ctxpar_cli *cli, const ctxpar_audit_state *a,
                        const ctxpar_run_result *r, const ctxpar_audit_report *rep,
                        const char *saved);

#ifdef __cplusplus
}
#endif

#endif /* CTXPAR_TESTING_AUDIT_H */
