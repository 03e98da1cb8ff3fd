// `ctxpar check`: context-parallel attention on generated inputs against the fp64 oracle and
// P = 1. `--algo all`: every algorithm that accepts the problem, one after another on the same
// inputs (the fp64 reference computed once), and whether their results agree bit for bit.
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "reference/metrics.h"
#include "report.h"

// The algorithms `--algo all` tries, in this order (decode only with --q-len).
static const ctxpar_algo all_algos[] = {CTXPAR_ALGO_RING, CTXPAR_ALGO_ALLGATHER,
                                        CTXPAR_ALGO_ALLTOALL, CTXPAR_ALGO_HYBRID,
                                        CTXPAR_ALGO_DECODE};
#define N_ALL (sizeof all_algos / sizeof all_algos[0])

// Copies argv into args with "--algo all" (or --algo=all) made "--algo auto", which the parser
// takes; returns whether it was there.
static int take_algo_all(int argc, char **argv, char **args) {
    static char auto_eq[] = "--algo=auto", auto_name[] = "auto";
    int all = 0;
    for (int i = 0; i < argc; i++) {
        args[i] = argv[i];
        if (!strcmp(argv[i], "--algo=all")) {
            args[i] = auto_eq;
            all = 1;
        } else if (!strcmp(argv[i], "--algo") && i + 1 < argc && !strcmp(argv[i + 1], "all")) {
            args[i] = argv[i];
            args[++i] = auto_name;
            all = 1;
        } else if (!strncmp(argv[i], "--algo", 6) && (!argv[i][6] || argv[i][6] == '=')) {
            all = 0; // a later --algo NAME wins, as it does for the parser
        }
    }
    args[argc] = NULL;
    return all;
}

// A library message for one line: without "rank R: ", the status name and the source prefix.
static const char *short_message(const char *msg) {
    if (!strncmp(msg, "rank ", 5)) {
        const char *p = strstr(msg, ": ");
        if (p)
            msg = p + 2;
    }
    if (!strncmp(msg, "CTXPAR_", 7)) {
        const char *p = strstr(msg, ": ");
        if (p)
            msg = p + 2;
    }
    return cpt_cli_message(msg);
}

// Element count and size of output tensor i (the runner's global layout).
static size_t tensor_count(const cpt_run_config *c, int i, size_t *elem_size) {
    const int queries = i == CPT_T_OUT || i == CPT_T_LSE || i == CPT_T_DQ;
    const int64_t rows = queries && c->params.q_len > 0 ? c->params.q_len : c->seq;
    const int64_t heads = i == CPT_T_DK || i == CPT_T_DV ? c->kv_heads : c->heads;
    const int64_t dim = i == CPT_T_OUT || i == CPT_T_DV ? cpt_run_dim_v(c) : c->head_dim;
    *elem_size = i == CPT_T_LSE ? sizeof(float) : ctxpar_dtype_size(c->dtype);
    if (i == CPT_T_LSE)
        return (size_t)(c->batch * c->heads * rows);
    return (size_t)(c->batch * rows * heads * dim);
}

// The first difference between two results of the same problem: the tensor ("out" .. "dv",
// "dsinks"), the index of its first differing element and how many differ; name NULL when
// every bit agrees.
typedef struct difference {
    const char *name;
    int64_t first;
    size_t count, total;
} difference;

static difference compare(const cpt_run_config *c, const cpt_run_result *a,
                          const cpt_run_result *b) {
    difference d = {NULL, -1, 0, 0};
    for (int i = 0; i < CPT_RUN_TENSORS; i++) {
        const void *x = a->outputs.t[i], *y = b->outputs.t[i];
        if (!x && !y)
            continue;
        size_t es;
        const size_t n = tensor_count(c, i, &es);
        if (!x || !y) { // one computed it and the other not: differ everywhere
            d = (difference){cpt_run_tensor_name((cpt_run_tensor)i), 0, n, n};
            return d;
        }
        int64_t first = -1;
        const size_t k = cpt_bitwise_diff(x, y, n, es, &first);
        if (k) {
            d = (difference){cpt_run_tensor_name((cpt_run_tensor)i), first, k, n};
            return d;
        }
    }
    if (a->outputs.dsinks || b->outputs.dsinks) {
        const size_t n = (size_t)c->heads;
        int64_t first = 0;
        const size_t k =
            a->outputs.dsinks && b->outputs.dsinks
                ? cpt_bitwise_diff(a->outputs.dsinks, b->outputs.dsinks, n, sizeof(float), &first)
                : n;
        if (k)
            d = (difference){"dsinks", first, k, n};
    }
    return d;
}

// One algorithm's run in `--algo all`.
typedef struct algo_run {
    ctxpar_algo algo;
    int ran;     // the harness gave a result (to free)
    int refused; // the library rejected the problem for this algorithm (exit code 2)
    cpt_run_result r;
} algo_run;

// The element at flat index `at` of tensor `name` as "(batch, position, head, dim)" (lse: no dim;
// dsinks: the head).
static void where_text(const cpt_run_config *c, const char *name, int64_t at, char *buf, size_t n) {
    int i = 0;
    while (i < CPT_RUN_TENSORS && strcmp(cpt_run_tensor_name((cpt_run_tensor)i), name))
        i++;
    if (i == CPT_RUN_TENSORS) {
        snprintf(buf, n, "head %lld", (long long)at);
        return;
    }
    const int queries = i == CPT_T_OUT || i == CPT_T_LSE || i == CPT_T_DQ;
    const int64_t rows = queries && c->params.q_len > 0 ? c->params.q_len : c->seq;
    if (i == CPT_T_LSE) { // [B, H, S]
        snprintf(buf, n, "batch %lld, position %lld, head %lld",
                 (long long)(at / (c->heads * rows)), (long long)(at % rows),
                 (long long)(at / rows % c->heads));
        return;
    }
    const int64_t heads = i == CPT_T_DK || i == CPT_T_DV ? c->kv_heads : c->heads;
    const int64_t dim = i == CPT_T_OUT || i == CPT_T_DV ? cpt_run_dim_v(c) : c->head_dim;
    snprintf(buf, n, "batch %lld, position %lld, head %lld, dim %lld",
             (long long)(at / (dim * heads * rows)), (long long)(at / (dim * heads) % rows),
             (long long)(at / dim % heads), (long long)(at % dim));
}

static void print_json_all(const cpt_cli *cli, const algo_run *runs, int n, int compared, int first,
                           int other, const difference *d, int ok) {
    fputs("{\"algorithms\":[", stdout);
    for (int i = 0; i < n; i++) {
        cpt_run_config c = cli->cfg;
        c.params.algo = runs[i].algo;
        fprintf(stdout, "%s{\"algo\":\"%s\",\"refused\":%s,", i ? "," : "",
                ctxpar_algo_name(runs[i].algo), runs[i].refused ? "true" : "false");
        cpt_report_json_members(stdout, &c, &runs[i].r);
        fputc('}', stdout);
    }
    fputs("],\"compared\":[", stdout);
    for (int i = 0, k = 0; i < n; i++)
        if (!runs[i].refused)
            fprintf(stdout, "%s\"%s\"", k++ ? "," : "", ctxpar_algo_name(runs[i].algo));
    fputs("],\"refused\":{", stdout);
    for (int i = 0, k = 0; i < n; i++)
        if (runs[i].refused) {
            fprintf(stdout, "%s\"%s\":", k++ ? "," : "", ctxpar_algo_name(runs[i].algo));
            cpt_json_string(stdout, short_message(runs[i].r.message));
        }
    fprintf(stdout, "},\"reproducible\":%s,\"bitwise_agree\":",
            cli->cfg.params.reproducible ? "true" : "false");
    if (compared == 0)
        fputs("null", stdout);
    else
        fputs(d->name ? "false" : "true", stdout);
    fputs(",\"first_difference\":", stdout);
    if (d->name)
        fprintf(stdout,
                "{\"a\":\"%s\",\"b\":\"%s\",\"tensor\":\"%s\",\"index\":%lld,"
                "\"elements_differing\":%zu,\"elements\":%zu}",
                ctxpar_algo_name(runs[first].algo), ctxpar_algo_name(runs[other].algo), d->name,
                (long long)d->first, d->count, d->total);
    else
        fputs("null", stdout);
    fprintf(stdout, ",\"ok\":%s}\n", ok ? "true" : "false");
}

static void print_text_all(const cpt_cli *cli, const algo_run *runs, int n, int compared, int first,
                           int other, const difference *d) {
    printf("ctxpar check --algo all: %d ranks, the same inputs for every algorithm%s\n",
           cli->cfg.ranks, cli->cfg.compare_oracle ? "; fp64 reference computed once" : "");
    for (int i = 0; i < n; i++) {
        const algo_run *a = &runs[i];
        if (a->refused)
            printf("  %-10s refused: %s\n", ctxpar_algo_name(a->algo), short_message(a->r.message));
        else if (a->r.status != CTXPAR_OK)
            printf("  %-10s FAILED: %s\n", ctxpar_algo_name(a->algo), short_message(a->r.message));
        else
            printf("  %-10s %-6s time %.3f s, peak memory per rank %.2f MiB\n",
                   ctxpar_algo_name(a->algo),
                   cli->cfg.compare_oracle ? (a->r.ok ? "OK" : "FAILED") : "ran", a->r.time_s,
                   a->r.peak_bytes_per_rank / 1048576.0);
    }
    if (compared == 0) {
        printf("all algorithms agree bit for bit: - (no algorithm accepted the problem)\n");
    } else if (d->name) {
        char where[128];
        where_text(&cli->cfg, d->name, d->first, where, sizeof where);
        printf("all algorithms agree bit for bit: no (%s and %s differ first in %s at %s; %zu "
               "of %zu elements differ)\n",
               ctxpar_algo_name(runs[first].algo), ctxpar_algo_name(runs[other].algo), d->name,
               where, d->count, d->total);
    } else {
        printf("all algorithms agree bit for bit: yes (");
        for (int i = 0, k = 0; i < n; i++)
            if (!runs[i].refused)
                printf("%s%s", k++ ? ", " : "", ctxpar_algo_name(runs[i].algo));
        printf("%s)\n", compared == 1 ? " alone" : "");
    }
}

// `check --algo all`. Exit code: the worst of the algorithms that accepted the problem (a
// refusal is not counted); 1 also when reproducible results differ (they must not); 2 when no
// algorithm accepted it.
static int check_all(cpt_session *s, cpt_cli *cli) {
    if (cli->report_path || cli->trace_path) {
        cpt_session_error(s, "--algo all takes no --report or --trace (one algorithm each)");
        return CPT_EXIT_USAGE;
    }
    algo_run runs[N_ALL];
    memset(runs, 0, sizeof runs);
    int n = 0, rc = CPT_EXIT_OK;
    const cpt_run_result *ref = NULL; // the first run that kept the fp64 reference
    for (size_t k = 0; k < N_ALL; k++) {
        const ctxpar_algo a = all_algos[k];
        if (a == CTXPAR_ALGO_DECODE && cli->cfg.params.q_len <= 0)
            continue;
        cpt_run_config c = cli->cfg;
        c.params.algo = a;
        c.keep_oracle = c.compare_oracle && !ref;
        c.reference_from = c.compare_oracle ? ref : NULL;
        char stage[48];
        snprintf(stage, sizeof stage, "%s: ", ctxpar_algo_name(a));
        cpt_session_stage(s, stage);
        algo_run *ar = &runs[n];
        ar->algo = a;
        if (cpt_session_run(s, &c, 0, &ar->r) != CTXPAR_OK) {
            rc = CPT_EXIT_USAGE; // a bad configuration: said already
            break;
        }
        ar->ran = 1;
        n++;
        const int code = cpt_exit_code(&ar->r);
        ar->refused = ar->r.status != CTXPAR_OK && code == CPT_EXIT_USAGE;
        if (!ar->refused && code > rc)
            rc = code;
        if (!ar->refused && ar->r.status == CTXPAR_OK && c.keep_oracle)
            ref = &ar->r;
    }
    cpt_session_stage(s, "");
    if (rc != CPT_EXIT_USAGE) {
        int compared = 0, first = -1, other = -1;
        difference d = {NULL, -1, 0, 0};
        for (int i = 0; i < n; i++) {
            if (runs[i].refused)
                continue;
            compared++;
            if (runs[i].r.status != CTXPAR_OK)
                continue;
            if (first < 0) {
                first = i;
            } else if (!d.name) {
                d = compare(&cli->cfg, &runs[first].r, &runs[i].r);
                if (d.name)
                    other = i;
            }
        }
        if (compared == 0)
            rc = CPT_EXIT_USAGE;
        else if (d.name && cli->cfg.params.reproducible && rc == CPT_EXIT_OK)
            rc = CPT_EXIT_FAIL; // reproducible mode promises the same bits
        if (s->rank == 0) {
            if (cli->json) {
                print_json_all(cli, runs, n, compared, first, other, &d, rc == CPT_EXIT_OK);
            } else {
                for (int i = 0; i < n; i++)
                    if (!runs[i].refused && runs[i].r.status == CTXPAR_OK) {
                        cpt_run_config c = cli->cfg;
                        c.params.algo = runs[i].algo;
                        cpt_report_table(stdout, "check", &c, &runs[i].r, 0);
                        fputc('\n', stdout);
                    }
                print_text_all(cli, runs, n, compared, first, other, &d);
            }
        }
    }
    // The run that lent its reference goes last.
    for (int i = n - 1; i >= 0; i--)
        if (runs[i].ran && &runs[i].r != ref)
            cpt_run_result_free(&runs[i].r);
    if (ref)
        cpt_run_result_free((cpt_run_result *)ref);
    return rc;
}

int cpt_cmd_check(int argc, char **argv) {
    char **args = malloc(sizeof *args * ((size_t)argc + 1));
    if (!args) {
        fputs("ctxpar check: out of memory\n", stderr);
        return CPT_EXIT_FAIL;
    }
    const int all = take_algo_all(argc, argv, args);
    cpt_cli cli;
    int rc = cpt_cli_parse("check", argc, args, &cli, stdout, stderr);
    free(args); // the parsed values point into argv's strings or the static ones above
    if (rc >= 0)
        return rc;
    cpt_session s;
    if ((rc = cpt_session_begin(&s, "check", &cli)) >= 0)
        return rc;
    if (all)
        return cpt_session_end(&s, check_all(&s, &cli));
    cli.cfg.keep_oracle = cli.report_path != NULL; // --report judges the outputs row by row
    cpt_run_result r;
    if (cpt_session_run(&s, &cli.cfg, 1, &r) != CTXPAR_OK)
        return cpt_session_end(&s, CPT_EXIT_USAGE);
    if (s.rank == 0) {
        if (cli.json) {
            fputc('{', stdout);
            cpt_report_json_members(stdout, &cli.cfg, &r);
            fputs("}\n", stdout);
        } else if (r.status == CTXPAR_OK) { // else the one line below says it all
            cpt_report_table(stdout, "check", &cli.cfg, &r, 0);
        }
    }
    if (r.status != CTXPAR_OK && !cli.json)
        cpt_session_error(&s, "%s", r.message);
    rc = cpt_exit_code(&r);
    const cpt_audit_layout lay = cpt_audit_layout_of(&cli);
    rc = cpt_report_judged(&s, &cli, &lay, &r, NULL, rc);
    cpt_run_result_free(&r);
    return cpt_session_end(&s, rc);
}
