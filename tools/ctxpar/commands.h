/*
 * commands.h - the subcommands of the `ctxpar` tool and what they share: the session that runs a
 * configuration in-process or under MPI (with trace and progress), the correctness report of
 * check and audit, JSON output and the Chrome trace file.
 */
#ifndef CPT_TOOL_COMMANDS_H
#define CPT_TOOL_COMMANDS_H

#include <stdio.h>

#include "cli.h"
#include "ctxpar.h"
#include "ctxpar_cpu.h"
#include "progress.h"
#include "reference/runner.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Each returns the process exit code (cli.h): 0 ok, 1 out of tolerance or failed, 2 usage. */
int cpt_cmd_check(int argc, char **argv);
int cpt_cmd_audit(int argc, char **argv);
int cpt_cmd_bench(int argc, char **argv);
int cpt_cmd_plan(int argc, char **argv);

/* ---------------------------------------------------------------- JSON */

/* Writes s as a JSON string literal (quoted, escaped). */
void cpt_json_string(FILE *f, const char *s);
/* Writes x with 12 significant digits, or null when it is not finite. */
void cpt_json_num(FILE *f, double x);
/* The members (no braces) every command's "config" echoes: ranks, batch, seq, heads, kv_heads,
 * dim, v_dim, dtype, mask, window, window_right, softcap, scale (the one used), sinks, ulysses,
 * docs, docs_per_row, algo, algo_resolved (`resolved`: what AUTO chose), layout, backward,
 * seed, reproducible. */
void cpt_json_config_members(FILE *f, const cpt_run_config *c, ctxpar_algo resolved);

/* ---------------------------------------------------------------- Chrome trace */

/* A Chrome trace-event file: events from every rank, written at the end. */
typedef struct cpt_trace_file cpt_trace_file;
int cpt_trace_open(cpt_trace_file **trace_out, int ranks);
/* Records one event of `rank` (thread safe); the signature of cpt_run_config.trace. */
void cpt_trace_record(void *trace, int rank, const ctxpar_trace_event *event);
/* The recorded events as bytes (to send to another process; *bytes_out malloc'ed) and back:
 * import appends events exported by a trace of any process. 0 on success. */
int cpt_trace_export(const cpt_trace_file *trace, void **bytes_out, size_t *size_out);
int cpt_trace_import(cpt_trace_file *trace, const void *bytes, size_t size);
/* Writes the file (path NULL: just frees) and frees the trace; 0 on success. */
int cpt_trace_close(cpt_trace_file *trace, const char *path);

/* ---------------------------------------------------------------- session */

/* One invocation of a subcommand: in-process ranks, or this process as one rank of an MPI job
 * (MPI initialised in cpt_session_begin, finalised in cpt_session_end). */
typedef struct cpt_session {
    const char *cmd;          /* "check", ... for messages */
    int mpi;                  /* this process is one rank of MPI_COMM_WORLD */
    int rank, size;           /* MPI rank and world size; 0 and 1 in-process */
    cpt_progress progress;    /* on stderr from rank 0; the others' is silent */
    cpt_trace_file *trace; /* --trace: every rank's events of the traced runs */
    const char *trace_path;
} cpt_session;

/* Starts the session for cli (MPI with --comm mpi or under mpirun; then cli->cfg.ranks becomes
 * the world size, and a different --ranks is an error). Returns -1 on success, or the exit code
 * after one line on stderr. */
int cpt_session_begin(cpt_session *s, const char *cmd, cpt_cli *cli);

/* Runs cfg over the session's ranks (with its trace when `traced`, and progress). Rank 0 gets the
 * whole result; under MPI the others get status, message and ok. On a harness failure (bad
 * config) prints the message (rank 0) and returns its status; result is then not to be freed. */
ctxpar_status cpt_session_run(cpt_session *s, const cpt_run_config *cfg, int traced,
                                 cpt_run_result *result);

/* Runs cfg (whose ranks must be 1) on rank 0 alone, in-process, while the other MPI ranks wait
 * without spinning: the single-rank baseline of bench. Same result rules as cpt_session_run. */
ctxpar_status cpt_session_run_single(cpt_session *s, const cpt_run_config *cfg,
                                        cpt_run_result *result);

/* Every rank's verdict on something each did alone (reading the input files): returns 1 when all
 * succeeded. A failing rank prints `message` (under MPI, only rank 0, or the others when rank 0
 * succeeded, so that a shared failure prints one line). */
int cpt_session_agree(cpt_session *s, int ok, const char *message);

/* Prints "ctxpar CMD: message" on stderr from rank 0 (clearing any progress line first). */
void cpt_session_error(cpt_session *s, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Sets the progress line's prefix, which names what runs next ("ranks 2, seq 8192: "; "" for
 * none). */
void cpt_session_stage(cpt_session *s, const char *prefix);

/* Ends the session: writes the trace (gathered to rank 0 under MPI; failing to write turns rc
 * into CPT_EXIT_FAIL), agrees on rank 0's exit code under MPI and finalises MPI. Returns the
 * exit code for every process. */
int cpt_session_end(cpt_session *s, int rc);

/* The exit code for a result: 0 ok; 2 when the library rejected the call (bad argument or usage,
 * not supported); 1 for a wrong answer or a failed run. */
int cpt_exit_code(const cpt_run_result *result);

/* ---------------------------------------------------------------- bench: the cores' peak */

/* The FP32 FMA peak that bench divides by (ctxpar_cpu_measure_peak). */
typedef struct cpt_peak_info {
    int have;             /* measured (bench on the CPU backend) */
    ctxpar_cpu_peak core; /* one thread */
    int have_all;
    ctxpar_cpu_peak all;  /* one thread per core, side by side */
    int cores;            /* online cores of this machine */
} cpt_peak_info;

/* Rank 0 measures one core's peak, and also every core's at once when `all_cores`, while the
 * other MPI ranks wait without spinning. Returns 0 on rank 0 when measured; -1 on the other
 * ranks, or after a message through the session. */
int cpt_peak_measure(cpt_session *s, int all_cores, cpt_peak_info *peak);

/* The peak FLOP/s of `ranks` x `threads` threads: one core's peak times the cores they can use
 * (at most this machine's); NAN when not measured. */
double cpt_peak_flops(const cpt_peak_info *peak, int ranks, int threads);

/* Prints what `bench --peak` shows: a few lines, or with `json` one object. */
void cpt_peak_print(FILE *f, const cpt_peak_info *peak, int json);

/* The members (no braces) "peak_kernels", "peak_vector_lanes", "peak_flops_per_core", "cores". */
void cpt_peak_json_members(FILE *f, const cpt_peak_info *peak);

/* ---------------------------------------------------------------- correctness report */

/* The table of check and audit: a title, one row per tensor (error vs fp64, tolerance, error at
 * P = 1, ratio, bitwise equality), time, memory, work per rank and the verdict ("result: OK");
 * with `yardstick` (an audit judging other results) the run is named as the yardstick instead,
 * and the verdict is the audit's, printed after it. */
void cpt_report_table(FILE *f, const char *cmd, const cpt_run_config *cfg,
                      const cpt_run_result *result, int yardstick);
/* The rows alone (bench --check). */
void cpt_report_rows(FILE *f, const cpt_run_result *result);
/* The JSON object's members (no braces): ok, status, message, config, errors, error_ratio,
 * tolerance, bitwise_equal_single_rank, times, memory, per_rank. */
void cpt_report_json_members(FILE *f, const cpt_run_config *cfg,
                                const cpt_run_result *result);
/* The correctness maps alone: "errors":{..},"error_ratio":{..},"tolerance":{..},
 * "bitwise_equal_single_rank":{..} (bench --check). */
void cpt_report_json_errors(FILE *f, const cpt_run_result *result);

#ifdef __cplusplus
}
#endif

#endif /* CPT_TOOL_COMMANDS_H */
