/*
 * commands.h - the subcommands of the `ctxpar` tool and what they share.
 */
#ifndef CTXPAR_TESTING_COMMANDS_H
#define CTXPAR_TESTING_COMMANDS_H

#include <stdio.h>

#include "ctxpar.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Each returns the process exit code (cli.h): 0 ok, 1 out of tolerance or failed, 2 usage. */
int ctxpar_cmd_check(int argc, char **argv);

/* Writes s as a JSON string literal (quoted, escaped). */
void ctxpar_json_string(FILE *f, const char *s);

/* A Chrome trace-event file: events from every rank, written at the end. */
typedef struct ctxpar_trace_file ctxpar_trace_file;
int ctxpar_trace_open(ctxpar_trace_file **trace_out, int ranks);
/* Records one event of `rank` (thread safe); the signature of ctxpar_run_config.trace. */
void ctxpar_trace_record(void *trace, int rank, const ctxpar_trace_event *event);
/* Writes the file (path NULL: just frees) and frees the trace; 0 on success. */
int ctxpar_trace_close(ctxpar_trace_file *trace, const char *path);

#ifdef __cplusplus
}
#endif

#endif /* CTXPAR_TESTING_COMMANDS_H */
