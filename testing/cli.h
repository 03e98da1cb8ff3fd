/*
 * cli.h - command-line parsing shared by the subcommands of the `ctxpar` tool.
 */
#ifndef CTXPAR_TESTING_CLI_H
#define CTXPAR_TESTING_CLI_H

#include <stdio.h>

#include "runner.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ctxpar_cli {
    ctxpar_run_config cfg;
    int json;               /* --json */
    const char *trace_path; /* --trace FILE */
    int comm;               /* --comm: 0 auto (MPI when launched by mpirun), 1 local, 2 mpi */
} ctxpar_cli;

/* Exit codes of the tool. */
enum { CTXPAR_EXIT_OK = 0, CTXPAR_EXIT_FAIL = 1, CTXPAR_EXIT_USAGE = 2 };

/* Parses the attention flags of `cmd` from argv[0..argc) into cli (defaults first). Returns
 * -1 when parsing succeeded, or the exit code to leave with: CTXPAR_EXIT_OK after --help (printed
 * to out), CTXPAR_EXIT_USAGE after a one-line error on err. */
int ctxpar_cli_parse(const char *cmd, int argc, char **argv, ctxpar_cli *cli, FILE *out,
                     FILE *err);

/* Prints the flags for --help. */
void ctxpar_cli_usage(const char *cmd, FILE *out);

#ifdef __cplusplus
}
#endif

#endif /* CTXPAR_TESTING_CLI_H */
