// How a subcommand runs its configurations: in-process ranks, or this process as one rank of an
// MPI job; the trace of the traced runs (gathered to rank 0 under MPI); progress on rank 0's
// stderr; one exit code for every process.
#include <mpi.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "ctxpar_backend.h"
#include "reference/runner_mpi.h"

void cpt_session_stage(cpt_session *s, const char *prefix) {
    cpt_progress_prefix(&s->progress, prefix);
}

void cpt_session_error(cpt_session *s, const char *fmt, ...) {
    if (s->rank != 0)
        return;
    cpt_progress_clear(&s->progress);
    fprintf(stderr, "ctxpar %s: ", s->cmd);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

int cpt_session_begin(cpt_session *s, const char *cmd, cpt_cli *cli) {
    memset(s, 0, sizeof *s);
    s->cmd = cmd;
    s->size = 1;
    s->mpi = cli->comm == 2 || (cli->comm == 0 && cpt_run_mpi_launched());
    if (s->mpi) {
        // MPI is initialised only here, so that the in-process default needs no launcher.
        int provided = 0;
        if (MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS) {
            fprintf(stderr, "ctxpar %s: MPI_Init_thread failed\n", cmd);
            return CPT_EXIT_FAIL;
        }
        MPI_Comm_rank(MPI_COMM_WORLD, &s->rank);
        MPI_Comm_size(MPI_COMM_WORLD, &s->size);
        if (cli->ranks_set && (cli->n_ranks > 1 || cli->cfg.ranks != s->size)) {
            cpt_session_error(s, "--ranks (%s%d) must be the number of MPI processes (%d)",
                                 cli->n_ranks > 1 ? "a list from " : "", cli->cfg.ranks,
                                 s->size);
            MPI_Finalize();
            return CPT_EXIT_USAGE;
        }
        cli->cfg.ranks = cli->ranks[0] = s->size;
        cli->n_ranks = 1;
    }
    cpt_progress_init(&s->progress, cmd, s->rank == 0 ? stderr : NULL, NULL);
    // Queries shorter than the keys: check judges them; bench's model, audit's files and the
    // report's pages per position do not know them yet.
    if (cli->cfg.params.q_len && (strcmp(cmd, "check") != 0 || cli->report_path)) {
        cpt_session_error(s, "--q-len is taken by check (without --report) only, for now");
        return cpt_session_end(s, CPT_EXIT_USAGE);
    }
    if (cli->trace_path) {
        if (cpt_trace_open(&s->trace, cli->cfg.ranks) != 0) {
            cpt_session_error(s, "cannot allocate the trace");
            return cpt_session_end(s, CPT_EXIT_FAIL);
        }
        s->trace_path = cli->trace_path;
    }
    return -1;
}

ctxpar_status cpt_session_run(cpt_session *s, const cpt_run_config *cfg, int traced,
                                 cpt_run_result *result) {
    cpt_run_config c = *cfg;
    c.progress = cpt_progress_update;
    c.progress_user = &s->progress;
    if (traced && s->trace) {
        c.trace = cpt_trace_record;
        c.trace_user = s->trace;
    }
    ctxpar_status st = s->mpi ? cpt_run_mpi(&c, result) : cpt_run(&c, result);
    cpt_progress_clear(&s->progress);
    if (st != CTXPAR_OK)
        cpt_session_error(s, "%s", cpt_cli_message(ctxpar_last_error()));
    return st;
}

ctxpar_status cpt_session_run_single(cpt_session *s, const cpt_run_config *cfg,
                                        cpt_run_result *result) {
    ctxpar_status st = CTXPAR_OK;
    memset(result, 0, sizeof *result);
    if (s->rank == 0) {
        cpt_run_config c = *cfg;
        c.progress = cpt_progress_update;
        c.progress_user = &s->progress;
        c.trace = NULL;
        st = cpt_run(&c, result);
        cpt_progress_clear(&s->progress);
        if (st != CTXPAR_OK) {
            cpt_session_error(s, "%s", cpt_cli_message(ctxpar_last_error()));
            memset(result, 0, sizeof *result);
        }
    }
    if (s->mpi) {
        if (cpt_run_mpi_quiet_barrier() != 0 && st == CTXPAR_OK)
            st = CTXPAR_ERROR(CTXPAR_ERR_COMM, "MPI_Ibarrier failed");
        int v[3] = {st, result->status, result->ok};
        MPI_Bcast(v, 3, MPI_INT, 0, MPI_COMM_WORLD);
        st = (ctxpar_status)v[0];
        result->status = (ctxpar_status)v[1];
        result->ok = v[2];
    }
    return st;
}

int cpt_session_agree(cpt_session *s, int ok, const char *message) {
    cpt_progress_clear(&s->progress);
    if (!s->mpi) {
        if (!ok)
            fprintf(stderr, "ctxpar %s: %s\n", s->cmd, message);
        return ok;
    }
    int root_ok = ok, all_ok = 0;
    MPI_Bcast(&root_ok, 1, MPI_INT, 0, MPI_COMM_WORLD);
    MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (!ok && (s->rank == 0 || root_ok))
        fprintf(stderr, "ctxpar %s: rank %d: %s\n", s->cmd, s->rank, message);
    return all_ok;
}

// Under MPI every rank sends its events to rank 0, which writes them all. 0 on success.
static int write_trace(cpt_session *s) {
    if (!s->mpi)
        return cpt_trace_close(s->trace, s->trace_path);
    void *mine = NULL, *all = NULL;
    size_t n = 0, total = 0;
    int ok = cpt_trace_export(s->trace, &mine, &n) == 0;
    if (!ok)
        n = 0; // still take part in the gather
    ok = cpt_run_mpi_gather_bytes(mine, n, &all, &total) == 0 && ok;
    free(mine);
    // Rank 0's own events come first in the gathered bytes and are already in its trace.
    if (s->rank == 0 && ok)
        ok = cpt_trace_import(s->trace, (char *)all + n, total - n) == 0;
    free(all);
    ok = cpt_trace_close(s->trace, s->rank == 0 && ok ? s->trace_path : NULL) == 0 && ok;
    return ok ? 0 : -1;
}

int cpt_session_end(cpt_session *s, int rc) {
    cpt_progress_clear(&s->progress);
    if (s->trace) {
        if (write_trace(s) != 0) {
            cpt_session_error(s, "cannot write the trace to '%s'", s->trace_path);
            if (rc == CPT_EXIT_OK)
                rc = CPT_EXIT_FAIL;
        }
        s->trace = NULL;
    }
    if (s->mpi) {
        // Rank 0 decides (it alone evaluated); the others wait for it without spinning.
        cpt_run_mpi_quiet_barrier();
        MPI_Bcast(&rc, 1, MPI_INT, 0, MPI_COMM_WORLD);
        MPI_Finalize();
        s->mpi = 0;
    }
    return rc;
}

int cpt_exit_code(const cpt_run_result *r) {
    if (r->ok)
        return CPT_EXIT_OK;
    // A call the library rejected is a usage problem; a wrong answer or a failed run a failure.
    if (r->status == CTXPAR_ERR_INVALID_ARG || r->status == CTXPAR_ERR_NOT_SUPPORTED ||
        r->status == CTXPAR_ERR_INVALID_USAGE)
        return CPT_EXIT_USAGE;
    return CPT_EXIT_FAIL;
}
