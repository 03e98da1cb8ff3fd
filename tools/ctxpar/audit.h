/*
 * audit.h - the pieces of `ctxpar audit` (cmd_audit.c loads and runs, audit_report.c judges,
 * prints and saves).
 */
#ifndef CPT_TOOL_AUDIT_H
#define CPT_TOOL_AUDIT_H

#include <stdio.h>

#include "audit_io.h"
#include "audit_judge.h"
#include "cli.h"
#include "reference/runner.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cpt_audit_state {
    cpt_audit_src files[5]; /* --q, --k, --v, --dout, --cu-seqlens */
    cpt_audit_src inputs_src, shards, against;
    const cpt_audit_src *like; /* where q came from: --save stores results the same way */
    cpt_audit_layout lay;
    cpt_audit_tensor in[4];                   /* q, k, v, dout in global form */
    cpt_audit_tensor res[CPT_RUN_TENSORS]; /* the results to judge (data NULL: absent) */
    int has_against;
    cpt_npy_dtype result_dtype; /* of out, dq, dk, dv (lse may differ) */
    int result_dtype_set;
    ctxpar_dtype file_dtype; /* the inputs' */
    void *converted[4];
    int32_t *cu_seqlens;
    int64_t num_docs, cu_seqlens_rows;
    cpt_run_inputs inputs;
    float *dsinks; /* the results' dsinks.npy (float32 [heads]), or NULL */
    char dsinks_where[4096];
} cpt_audit_state;

/* Reads every file and fills cli->cfg; 0 and a one-line msg naming the file on failure. */
int cpt_audit_load(cpt_cli *cli, cpt_audit_state *a, char *msg, size_t n);
void cpt_audit_state_free(cpt_audit_state *a);

typedef struct cpt_audit_report {
    int judged;
    int consistent;
    int64_t failing_elements; /* over every tensor judged */
    cpt_audit_verdict v[CPT_RUN_TENSORS]; /* ranks 0: not given */
    /* dsinks, when the results hold it: its error and error/bound against the oracle's, next to
     * ctxpar's own error; the worst head. */
    int has_dsinks, dsinks_consistent;
    double dsinks_error, dsinks_reference_error, dsinks_bound_ratio;
    int64_t dsinks_worst_head;
    /* out fails at its first row and at half its rows or more: what a result computed under
     * another mask looks like (a non-causal one judged as causal, or the reverse). */
    int mask_hint;
} cpt_audit_report;

/* The hint printed with such a verdict. */
#define CPT_AUDIT_MASK_HINT "is the mask right? (--mask none for non-causal results)"

/* The layout the options declare (format, lse conventions, ranks, layout, --assign); no
 * documents. */
cpt_audit_layout cpt_audit_layout_of(const cpt_cli *cli);

/* Judges every result given against the run's oracle and ctxpar's own errors; heat_cols > 0:
 * with each verdict's heat map in at most that many columns (--report). */
ctxpar_status cpt_audit_judge_all(const cpt_cli *cli, const cpt_audit_state *a,
                                  const cpt_run_result *r, int heat_cols, cpt_audit_report *rep);
/* ctxpar's own outputs judged the same way (r made with keep_oracle), owners by lay: what
 * --report draws for check, and for an audit with no results of its own to judge. */
ctxpar_status cpt_audit_judge_own(const cpt_cli *cli, const cpt_audit_layout *lay,
                                  const cpt_run_result *r, int heat_cols, cpt_audit_report *rep);
void cpt_audit_report_free(cpt_audit_report *rep);

/* --save: ctxpar's results in the inputs' dtype, stored like the inputs. */
ctxpar_status cpt_audit_save(const cpt_cli *cli, const cpt_audit_state *a,
                                const cpt_run_result *r);

/* The table (or with --json one object): ctxpar's report, then the verdict on the results. */
void cpt_audit_print(FILE *f, const cpt_cli *cli, const cpt_audit_state *a,
                        const cpt_run_result *r, const cpt_audit_report *rep,
                        const char *saved);

#ifdef __cplusplus
}
#endif

#endif /* CPT_TOOL_AUDIT_H */
