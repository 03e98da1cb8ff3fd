// `ctxpar check`: context-parallel attention on random inputs against the fp64 oracle and P = 1.
#include <math.h>
#include <stdio.h>

#include <mpi.h>

#include "cli.h"
#include "commands.h"
#include "runner_mpi.h"

static void json_num(FILE *f, double x) {
    if (isfinite(x))
        fprintf(f, "%.6g", x);
    else
        fprintf(f, "null"); // JSON has no NaN or infinity
}

static void json_map(FILE *f, const char *key, const ctxpar_run_result *r, int what) {
    fprintf(f, "\"%s\":{", key);
    int first = 1;
    for (int i = 0; i < CTXPAR_RUN_TENSORS; i++) {
        if (!r->has[i])
            continue;
        fprintf(f, "%s\"%s\":", first ? "" : ",", ctxpar_run_tensor_name((ctxpar_run_tensor)i));
        first = 0;
        if (what == 0)
            json_num(f, r->error[i]);
        else if (what == 1)
            json_num(f, r->ratio[i]);
        else if (what == 2)
            json_num(f, r->tolerance[i]);
        else
            fprintf(f, "%s", r->bitwise_single[i] ? "true" : "false");
    }
    fprintf(f, "}");
}

static void print_json(FILE *f, const ctxpar_run_config *c, const ctxpar_run_result *r) {
    fprintf(f, "{\"ok\":%s,\"status\":\"%s\",", r->ok ? "true" : "false",
            ctxpar_status_string(r->status));
    if (r->status != CTXPAR_OK) {
        fputs("\"message\":", f);
        ctxpar_json_string(f, r->message);
        fputc(',', f);
    }
    fprintf(f,
            "\"config\":{\"ranks\":%d,\"batch\":%lld,\"seq\":%lld,\"heads\":%lld,"
            "\"kv_heads\":%lld,\"dim\":%lld,\"dtype\":\"%s\",\"mask\":\"%s\",\"window\":%lld,"
            "\"algo\":\"%s\",\"algo_resolved\":\"%s\",\"layout\":\"%s\",\"backward\":%s,"
            "\"seed\":%llu},",
            c->ranks, (long long)c->batch, (long long)c->seq, (long long)c->heads,
            (long long)c->kv_heads, (long long)c->head_dim, ctxpar_dtype_name(c->dtype),
            ctxpar_mask_name(c->params.mask), (long long)c->params.window_left,
            ctxpar_algo_name(c->params.algo), ctxpar_algo_name(r->algo),
            ctxpar_layout_name(c->params.layout), c->backward ? "true" : "false",
            (unsigned long long)c->seed);
    json_map(f, "errors", r, 0);
    fputc(',', f);
    json_map(f, "error_ratio", r, 1);
    fputc(',', f);
    json_map(f, "tolerance", r, 2);
    fputc(',', f);
    json_map(f, "bitwise_equal_single_rank", r, 3);
    fprintf(f, ",\"time_s\":");
    json_num(f, r->time_s);
    fprintf(f, ",\"single_rank_time_s\":");
    json_num(f, r->time_single_s);
    fprintf(f, ",\"peak_bytes_per_rank\":%zu,\"single_rank_peak_bytes\":%zu,",
            r->peak_bytes_per_rank, r->single_rank_peak_bytes);
    fprintf(f, "\"per_rank\":[");
    for (int i = 0; i < c->ranks && i < 64; i++) {
        const ctxpar_run_rank_stats *s = &r->rank[i];
        fprintf(f,
                "%s{\"rank\":%d,\"peak_bytes\":%zu,\"bytes_sent\":%llu,\"blocks_computed\":%llu,"
                "\"blocks_skipped\":%llu,\"flops\":%.6g}",
                i ? "," : "", i, s->peak_bytes, (unsigned long long)s->bytes_sent,
                (unsigned long long)s->work.blocks_computed,
                (unsigned long long)s->work.blocks_skipped, s->work.flops);
    }
    fprintf(f, "]}\n");
}

static void print_table(FILE *f, const ctxpar_run_config *c, const ctxpar_run_result *r) {
    fprintf(f,
            "ctxpar check: %s (%s), %s layout, %s mask, %s, %d ranks x %lld tokens\n"
            "              batch %lld, heads %lld/%lld, dim %lld, %s\n\n",
            ctxpar_algo_name(r->algo), ctxpar_algo_name(c->params.algo),
            ctxpar_layout_name(c->params.layout), ctxpar_mask_name(c->params.mask),
            ctxpar_dtype_name(c->dtype), c->ranks, (long long)(c->seq / c->ranks),
            (long long)c->batch, (long long)c->heads, (long long)c->kv_heads,
            (long long)c->head_dim, c->backward ? "forward + backward" : "forward");
    fprintf(f, "  %-6s %-13s %-11s %-13s %-8s %s\n", "tensor", "error vs fp64", "tolerance",
            "error at P=1", "ratio", "bits == P=1");
    for (int i = 0; i < CTXPAR_RUN_TENSORS; i++) {
        if (!r->has[i])
            continue;
        fprintf(f, "  %-6s %-13.3e %-11.1e %-13.3e %-8.3g %s%s\n",
                ctxpar_run_tensor_name((ctxpar_run_tensor)i), r->error[i], r->tolerance[i],
                r->error_1[i], r->ratio[i], r->bitwise_single[i] ? "yes" : "no",
                r->within_tol[i] && r->ratio_ok[i] ? "" : "   <-- out of tolerance");
    }
    fprintf(f, "\n  time %.3f s (P=1: %.3f s)   peak memory per rank %.2f MiB (P=1: %.2f MiB)\n",
            r->time_s, r->time_single_s, r->peak_bytes_per_rank / 1048576.0,
            r->single_rank_peak_bytes / 1048576.0);
    fprintf(f, "  work per rank (blocks computed/skipped):");
    for (int i = 0; i < c->ranks && i < 64; i++)
        fprintf(f, " %llu/%llu", (unsigned long long)r->rank[i].work.blocks_computed,
                (unsigned long long)r->rank[i].work.blocks_skipped);
    fprintf(f, "\n\n  result: %s\n", r->ok ? "OK" : "FAILED");
}

// A call the library rejected is a usage problem; a wrong answer or a failed run is a failure.
static int exit_code(const ctxpar_run_result *r) {
    if (r->ok)
        return CTXPAR_EXIT_OK;
    if (r->status == CTXPAR_ERR_INVALID_ARG || r->status == CTXPAR_ERR_NOT_SUPPORTED ||
        r->status == CTXPAR_ERR_INVALID_USAGE)
        return CTXPAR_EXIT_USAGE;
    return CTXPAR_EXIT_FAIL;
}

// Under MPI every process runs its rank; rank 0 reports. MPI is initialised only then, so that
// the in-process default needs no launcher.
static int run_mpi_mode(ctxpar_cli *cli, ctxpar_run_result *r, ctxpar_status *st, int *rank) {
    int provided = 0, size = 1;
    if (MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS)
        return -1;
    MPI_Comm_rank(MPI_COMM_WORLD, rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    cli->cfg.ranks = size;
    *st = ctxpar_run_mpi(&cli->cfg, r);
    return 0;
}

int ctxpar_cmd_check(int argc, char **argv) {
    ctxpar_cli cli;
    int rc = ctxpar_cli_parse("check", argc, argv, &cli, stdout, stderr);
    if (rc >= 0)
        return rc;
    int mpi = cli.comm == 2 || (cli.comm == 0 && ctxpar_run_mpi_launched());
    if (mpi) {
        ctxpar_run_result r;
        ctxpar_status st = CTXPAR_OK;
        int rank = 0;
        if (run_mpi_mode(&cli, &r, &st, &rank) != 0) {
            fprintf(stderr, "ctxpar check: MPI_Init_thread failed\n");
            return CTXPAR_EXIT_FAIL;
        }
        if (st != CTXPAR_OK) {
            fprintf(stderr, "ctxpar check: rank %d: %s\n", rank, ctxpar_last_error());
            rc = CTXPAR_EXIT_USAGE;
        } else {
            if (rank == 0 && cli.json)
                print_json(stdout, &cli.cfg, &r);
            else if (rank == 0)
                print_table(stdout, &cli.cfg, &r);
            if (r.status != CTXPAR_OK && (rank == 0 || !cli.json))
                fprintf(stderr, "ctxpar check: rank %d: %s\n", rank, r.message);
            rc = exit_code(&r);
            ctxpar_run_result_free(&r);
        }
        MPI_Finalize();
        return rc;
    }
    ctxpar_trace_file *trace = NULL;
    if (cli.trace_path && ctxpar_trace_open(&trace, cli.cfg.ranks) != 0) {
        fprintf(stderr, "ctxpar check: cannot allocate the trace\n");
        return CTXPAR_EXIT_FAIL;
    }
    if (trace) {
        cli.cfg.trace = ctxpar_trace_record;
        cli.cfg.trace_user = trace;
    }
    ctxpar_run_result r;
    ctxpar_status st = ctxpar_run(&cli.cfg, &r);
    if (st != CTXPAR_OK) {
        fprintf(stderr, "ctxpar check: %s\n", ctxpar_last_error());
        ctxpar_trace_close(trace, NULL);
        return CTXPAR_EXIT_USAGE;
    }
    if (trace && ctxpar_trace_close(trace, cli.trace_path) != 0) {
        fprintf(stderr, "ctxpar check: cannot write the trace to '%s'\n", cli.trace_path);
        r.ok = 0;
    }
    if (cli.json)
        print_json(stdout, &cli.cfg, &r);
    else
        print_table(stdout, &cli.cfg, &r);
    if (r.status != CTXPAR_OK && !cli.json)
        fprintf(stderr, "ctxpar check: %s\n", r.message);
    rc = exit_code(&r);
    ctxpar_run_result_free(&r);
    return rc;
}
