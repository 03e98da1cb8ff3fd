/*
 * report.h - `--report FILE.html` of check, audit, plan and bench: each command hands over what
 * it computed, and the page (report_html.h) is written once the command has its data. A page that
 * cannot be written is an error of the command (a message, exit status 2), never a crash; the
 * command's stdout (table or --json) is the same with or without --report.
 */
#ifndef CPT_TOOL_REPORT_H
#define CPT_TOOL_REPORT_H

#include "audit.h"
#include "commands.h"
#include "plan_model.h"
#include "plan_run.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The heat map's most columns (positions are bucketed, the worst of each bucket kept) with
 * --report, else 0: what cpt_audit_judge_all's heat_cols takes. */
int cpt_report_heat_cols(const cpt_cli *cli);

/* check and audit: with --report, on rank 0 after a successful run, the page of the results
 * judged: rep (an audit's verdict on --against results, made with heat columns) or, rep NULL,
 * ctxpar's own outputs against the oracle (r made with keep_oracle). Owners and chunks from lay.
 * Returns rc, or CPT_EXIT_USAGE after a message when the page cannot be made. */
int cpt_report_judged(cpt_session *s, const cpt_cli *cli, const cpt_audit_layout *lay,
                      const cpt_run_result *r, const cpt_audit_report *rep, int rc);

/* plan: per-rank FLOPs, bytes and predicted time with the imbalance. Returns rc, or
 * CPT_EXIT_USAGE after a message on stderr. */
int cpt_report_plan(const char *path, const cpt_plan_config *cfg, const cpt_plan_result *r,
                    const cpt_plan_model *m, int rc);

/* bench: one point per configuration measured, then the page. */
typedef struct cpt_bench_point {
    int64_t seq;
    int ranks, threads;
    double t_min, t_med, t_max;          /* the timed call (fwd, or fwd + bwd), seconds */
    double base_min, base_med, base_max; /* the one-rank baseline's */
} cpt_bench_point;

typedef struct cpt_bench_report {
    const char *path; /* NULL: no --report, nothing kept */
    int n;
    cpt_bench_point points[CPT_CLI_MAX_LIST * CPT_CLI_MAX_LIST];
} cpt_bench_report;

/* Keeps one measurement (r: the P-rank result, base: the baseline's). */
void cpt_bench_report_add(cpt_bench_report *b, const cpt_run_config *cfg, const cpt_run_result *r,
                          const cpt_run_result *base, int threads);
/* Writes the page on rank 0 when the bench succeeded (rc 0). Returns rc, or CPT_EXIT_USAGE after
 * a message. */
int cpt_bench_report_write(cpt_session *s, const cpt_bench_report *b, const cpt_run_config *cfg,
                           int rc);

#ifdef __cplusplus
}
#endif

#endif /* CPT_TOOL_REPORT_H */
