/*
 * cli.h - command-line parsing shared by the subcommands of the `ctxpar` tool.
 */
#ifndef CTXPAR_TESTING_CLI_H
#define CTXPAR_TESTING_CLI_H

#include <stdint.h>
#include <stdio.h>

#include "runner.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The subcommands, as bits: each option says which ones take it. */
enum { CTXPAR_CMD_CHECK = 1, CTXPAR_CMD_AUDIT = 2, CTXPAR_CMD_BENCH = 4 };

/* Most values one list option (--seq, --ranks with bench --sweep) may hold. */
#define CTXPAR_CLI_MAX_LIST 16

typedef struct ctxpar_cli {
    int cmd;                /* CTXPAR_CMD_* */
    ctxpar_run_config cfg;
    int json;               /* --json */
    const char *trace_path; /* --trace FILE */
    int comm;               /* --comm: 0 auto (MPI when launched by mpirun), 1 local, 2 mpi */
    int ranks_set;          /* --ranks was given */
    int dtype_set;          /* --dtype was given (audit: else the files' dtype) */
    /* audit: the input files and where to save the results */
    const char *q_path, *k_path, *v_path, *dout_path, *cu_seqlens_path, *save_dir;
    /* audit: --inputs, --against, --shards; the files' tensor_format.h conventions; the
     * verdict's --max-ratio */
    const char *inputs_path, *against_path, *shards_pattern;
    int format, lse_layout, lse_base2;
    double max_ratio;
    /* bench */
    int sweep;              /* --sweep: every --seq x --ranks value, one table */
    int peak;               /* --peak: only the FMA peak probe */
    int n_seqs, n_ranks;    /* values given to --seq and --ranks (at least 1 each) */
    int64_t seqs[CTXPAR_CLI_MAX_LIST];
    int ranks[CTXPAR_CLI_MAX_LIST];
} ctxpar_cli;

/* Exit codes of the tool. */
enum { CTXPAR_EXIT_OK = 0, CTXPAR_EXIT_FAIL = 1, CTXPAR_EXIT_USAGE = 2 };

/* Parses the flags of subcommand `cmd` ("check", "audit", "bench") from argv[0..argc) into cli
 * (the command's defaults first). Returns -1 when parsing succeeded, or the exit code to leave
 * with: CTXPAR_EXIT_OK after --help (printed to out), CTXPAR_EXIT_USAGE after a one-line error
 * on err. */
int ctxpar_cli_parse(const char *cmd, int argc, char **argv, ctxpar_cli *cli, FILE *out,
                     FILE *err);

/* Prints the usage of `cmd`: its options with their defaults, and its notes. */
void ctxpar_cli_usage(const char *cmd, FILE *out);

/* `ctxpar --list-backends`: one line per backend compiled in, "available" or "unavailable"
 * with the reason (the device could not be created here). */
void ctxpar_cli_list_backends(FILE *out);

/* A library or harness message without its "file.c:123: " source prefix, for users. */
const char *ctxpar_cli_message(const char *msg);

#ifdef __cplusplus
}
#endif

#endif /* CTXPAR_TESTING_CLI_H */
