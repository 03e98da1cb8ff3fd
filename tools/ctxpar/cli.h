/*
 * cli.h - command-line parsing shared by the subcommands of the `ctxpar` tool.
 */
#ifndef CPT_TOOL_CLI_H
#define CPT_TOOL_CLI_H

#include <stdint.h>
#include <stdio.h>

#include "reference/runner.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The subcommands, as bits: each option says which ones take it. */
enum { CPT_CMD_CHECK = 1, CPT_CMD_AUDIT = 2, CPT_CMD_BENCH = 4, CPT_CMD_PLAN = 8 };

/* Most values one list option (--seq, --ranks with bench --sweep) may hold. */
#define CPT_CLI_MAX_LIST 16
/* Most sink logits --sinks takes (one per query head). */
#define CPT_CLI_MAX_SINKS 1024

typedef struct cpt_cli {
    int cmd;                /* CPT_CMD_* */
    cpt_run_config cfg;
    int json;               /* --json */
    const char *trace_path; /* --trace FILE */
    const char *report_path; /* --report FILE.html */
    const char *cudnn;       /* --cudnn auto|on|off (--backend cuda), or NULL */
    int comm;               /* --comm: 0 auto (MPI when launched by mpirun), 1 local, 2 mpi */
    int ranks_set;          /* --ranks was given */
    int dtype_set;          /* --dtype was given (audit: else the files' dtype) */
    /* audit: the input files and where to save the results */
    const char *q_path, *k_path, *v_path, *dout_path, *cu_seqlens_path, *save_dir;
    /* --assign: the file and its length (cfg.params.assignment points at its values) */
    const char *assign_path;
    int64_t assign_len;
    /* audit: --inputs, --against, --shards; the files' tensor_format.h conventions; the
     * verdict's --max-ratio */
    const char *inputs_path, *against_path, *shards_pattern;
    int format, lse_layout, lse_base2;
    double max_ratio;
    /* bench */
    int sweep;              /* --sweep: every --seq x --ranks value, one table */
    int peak;               /* --peak: only the FMA peak probe */
    int n_seqs, n_ranks;    /* values given to --seq and --ranks (at least 1 each) */
    int64_t seqs[CPT_CLI_MAX_LIST];
    int ranks[CPT_CLI_MAX_LIST];
    /* --sinks FILE.npy: float32 [heads], read at parse time; cfg.params.sinks points here */
    const char *sinks_path;
    int64_t n_sinks;
    float sinks[CPT_CLI_MAX_SINKS];
    /* plan: the hardware model, the generated documents' lengths, the link classes, output */
    const char *model;    /* --model h200|cpu|FILE */
    const char *doc_dist; /* --doc-dist uniform|lognormal */
    double doc_sigma;     /* --doc-sigma */
    int group_size;       /* --group-size; 0: the model's */
    int no_coverage, explain, per_rank, share_members;
} cpt_cli;

/* Exit codes of the tool. */
enum { CPT_EXIT_OK = 0, CPT_EXIT_FAIL = 1, CPT_EXIT_USAGE = 2 };

/* Parses the flags of subcommand `cmd` ("check", "audit", "bench", "plan") from argv[0..argc) into
 * cli (the command's defaults first). Returns -1 when parsing succeeded, or the exit code to leave
 * with: CPT_EXIT_OK after --help (printed to out), CPT_EXIT_USAGE after a one-line error
 * on err. */
int cpt_cli_parse(const char *cmd, int argc, char **argv, cpt_cli *cli, FILE *out,
                     FILE *err);

/* Reads --sinks (cli->sinks_path): float32 [heads] into cli->sinks, cfg.params.sinks pointing
 * there; 1, or 0 with a one-line msg. Parsing does it for check and bench; audit once q gives
 * the heads. */
int cpt_cli_load_sinks(cpt_cli *cli, int64_t heads, char *msg, size_t n);

/* Reads an assignment file (--assign): int32 or int64 [seq], the rank of each token, as int32
 * (a value outside int32: -1, which the library refuses as no rank). Returns it malloc'ed with
 * *count_out its length, or NULL with a one-line msg. */
int32_t *cpt_cli_read_assignment(const char *path, int64_t *count_out, char *msg, size_t n);

/* Prints the usage of `cmd`: its options with their defaults, and its notes. */
void cpt_cli_usage(const char *cmd, FILE *out);

/* `ctxpar --list-backends`: one line per backend compiled in, "available" or "unavailable"
 * with the reason (the device could not be created here). */
void cpt_cli_list_backends(FILE *out);

/* A library or harness message without its "file.c:123: " source prefix, for users. */
const char *cpt_cli_message(const char *msg);

#ifdef __cplusplus
}
#endif

#endif /* CPT_TOOL_CLI_H */
