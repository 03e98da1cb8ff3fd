// `ctxpar plan`: what a run would do on every rank, without computing attention (plan_run.h),
// with the predicted time of a hardware model (plan_model.h) and AUTO's reasons (--explain).
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "plan_docs.h"
#include "plan_model.h"
#include "plan_run.h"
#include "registry.h"
#include "report.h"
#include "units.h"

typedef struct plan_args {
    cpt_plan_config cfg;
    cpt_cli cli; // the options as given (cli.c: one table for every command)
    int json, explain, per_rank;
} plan_args;

// The options of every command (cli.c), then the plan's configuration from them. -1 after
// --help, 0 ok, or the exit code.
static int parse(int argc, char **argv, plan_args *a) {
    memset(a, 0, sizeof *a);
    cpt_cli *cli = &a->cli;
    int rc = cpt_cli_parse("plan", argc, argv, cli, stdout, stderr);
    if (rc != -1)
        return rc == CPT_EXIT_OK ? -1 : rc;
    const cpt_run_config *r = &cli->cfg;
    cpt_plan_config *c = &a->cfg;
    c->ranks = r->ranks;
    c->batch = r->batch;
    c->seq = r->seq;
    c->heads = r->heads;
    c->kv_heads = r->kv_heads;
    c->head_dim = r->head_dim;
    c->head_dim_v = r->head_dim_v;
    c->dtype = r->dtype;
    c->params = r->params; // documents, sinks and assignment held by cli.c until the next parse
    c->backward = r->backward;
    c->group_size = cli->group_size;
    c->coverage = !cli->no_coverage;
    c->share_members = cli->share_members;
    a->json = cli->json;
    a->explain = cli->explain;
    a->per_rank = cli->per_rank;
    return 0;
}

static void json_array(FILE *f, const char *key, const cpt_plan_result *r,
                       double (*get)(const cpt_plan_rank *, const cpt_plan_model *, int),
                       const cpt_plan_model *m) {
    fprintf(f, ",\"%s\":[", key);
    for (int i = 0; i < r->nranks; i++) {
        if (i)
            fputc(',', f);
        cpt_json_num(f, get(&r->rank[i], m, r->nranks));
    }
    fputc(']', f);
}

static double get_flops(const cpt_plan_rank *r, const cpt_plan_model *m, int ranks) {
    (void)m, (void)ranks;
    return r->flops_fwd + r->flops_bwd;
}
static double get_pairs(const cpt_plan_rank *r, const cpt_plan_model *m, int ranks) {
    (void)m, (void)ranks;
    return r->pairs;
}
static double get_bytes(const cpt_plan_rank *r, const cpt_plan_model *m, int ranks) {
    (void)m, (void)ranks;
    return (double)r->bytes_sent;
}
static double get_group(const cpt_plan_rank *r, const cpt_plan_model *m, int ranks) {
    (void)m, (void)ranks;
    return (double)(r->traffic.p2p_bytes[CPT_LINK_GROUP] + r->traffic.coll_bytes[CPT_LINK_GROUP]);
}
static double get_across(const cpt_plan_rank *r, const cpt_plan_model *m, int ranks) {
    (void)m, (void)ranks;
    return (double)(r->traffic.p2p_bytes[CPT_LINK_ACROSS] + r->traffic.coll_bytes[CPT_LINK_ACROSS]);
}
static double get_received(const cpt_plan_rank *r, const cpt_plan_model *m, int ranks) {
    (void)m, (void)ranks;
    return (double)r->bytes_received;
}
static double get_group_received(const cpt_plan_rank *r, const cpt_plan_model *m, int ranks) {
    (void)m, (void)ranks;
    return (double)(r->traffic.p2p_recv_bytes[CPT_LINK_GROUP] +
                    r->traffic.coll_recv_bytes[CPT_LINK_GROUP]);
}
static double get_across_received(const cpt_plan_rank *r, const cpt_plan_model *m, int ranks) {
    (void)m, (void)ranks;
    return (double)(r->traffic.p2p_recv_bytes[CPT_LINK_ACROSS] +
                    r->traffic.coll_recv_bytes[CPT_LINK_ACROSS]);
}
static double get_workspace(const cpt_plan_rank *r, const cpt_plan_model *m, int ranks) {
    (void)m, (void)ranks;
    return (double)r->workspace_bytes;
}
static double get_time(const cpt_plan_rank *r, const cpt_plan_model *m, int ranks) {
    return cpt_plan_rank_time(m, r, ranks);
}

typedef double (*rank_getter)(const cpt_plan_rank *, const cpt_plan_model *, int);

// The largest and the mean of one per-rank value.
static void max_mean(const cpt_plan_result *r, rank_getter get, const cpt_plan_model *m,
                     double *max, double *mean) {
    double hi = 0, sum = 0;
    for (int i = 0; i < r->nranks; i++) {
        const double v = get(&r->rank[i], m, r->nranks);
        sum += v;
        hi = v > hi ? v : hi;
    }
    *max = hi;
    *mean = sum / r->nranks;
}

enum { COUNT, BYTES, SECONDS }; // how the text table shows a column

// The per-rank arrays, JSON key and getter (the text table prints the same columns).
static const struct {
    const char *key, *column;
    rank_getter get;
    int unit;
} columns[] = {
    {"pairs_per_rank", "pairs", get_pairs, COUNT},
    {"flops_per_rank", "FLOPs", get_flops, COUNT},
    {"bytes_per_rank", "sent", get_bytes, BYTES},
    {"bytes_group_per_rank", "sent grp", get_group, BYTES},
    {"bytes_across_per_rank", "sent acr", get_across, BYTES},
    {"bytes_received_per_rank", "recv", get_received, BYTES},
    {"bytes_group_received_per_rank", "recv grp", get_group_received, BYTES},
    {"bytes_across_received_per_rank", "recv acr", get_across_received, BYTES},
    {"workspace_per_rank", "workspace", get_workspace, BYTES},
    {"time_per_rank_s", "time", get_time, SECONDS},
};
#define COLUMNS (sizeof columns / sizeof columns[0])

// A value of column c for people (JSON has the exact number).
static const char *cell(size_t c, double v, char *buf, size_t n) {
    if (columns[c].unit == BYTES)
        return cpt_bytes_text(v, buf, n);
    if (columns[c].unit == SECONDS)
        return cpt_seconds_text(v, buf, n);
    snprintf(buf, n, "%.4g", v);
    return buf;
}

// AUTO's reasons: each algorithm's check (with the device's limits left out) and its cost.
static void explain(FILE *f, const plan_args *a, int json) {
    ctxpar_problem pb;
    if (cpt_plan_problem(&a->cfg, &pb) != CTXPAR_OK)
        return;
    const cpt_plan_config *c = &a->cfg;
    int n = 0;
    const ctxpar_algorithm *const *table = ctxpar_algorithms(&n);
    const ctxpar_algorithm *choice =
        ctxpar_algorithm_choose(CTXPAR_ALGO_AUTO, &pb, NULL, c->backward);
    fprintf(f, json ? ",\"explain\":{\"auto\":\"%s\",\"candidates\":[" : "AUTO chooses %s:\n",
            choice->name);
    for (int i = 0; i < n; i++) {
        ctxpar_clear_error();
        ctxpar_status ok = table[i]->check(&pb);
        const char *why = ok == CTXPAR_OK ? "" : ctxpar_last_error();
        const double cost = ok == CTXPAR_OK ? table[i]->cost(&pb) : 0.0;
        if (json) {
            fprintf(f, "%s{\"algo\":\"%s\",\"accepted\":%s,\"cost\":", i ? "," : "", table[i]->name,
                    ok == CTXPAR_OK ? "true" : "false");
            cpt_json_num(f, ok == CTXPAR_OK ? cost : NAN);
            fprintf(f, ",\"reason\":");
            cpt_json_string(f, why);
            const int u = ok == CTXPAR_OK ? cpt_plan_group_size(table[i], &pb) : 0;
            if (u > 0) // the algorithms that split their comm into all-to-all groups
                fprintf(f, ",\"ulysses\":%d", u);
            fputc('}', f);
        } else if (ok == CTXPAR_OK) {
            fprintf(f, "  %-9s cost %10.2f%s\n", table[i]->name, cost,
                    table[i] == choice ? "   <- lowest" : "");
        } else {
            fprintf(f, "  %-9s refused: %s\n", table[i]->name, why);
        }
    }
    ctxpar_clear_error();
    if (json)
        fputs("]}", f);
    else
        fputs("  (cost: values moved per rank, in units of D*(S/P)*(P-1)/P, weighted for what\n"
              "   cannot overlap compute; docs/algorithms.md, AUTO)\n",
              f);
}

static void print_json(const plan_args *a, const cpt_plan_result *r, const cpt_plan_model *m) {
    FILE *f = stdout;
    double fmax, fmean, bmax, bmean;
    max_mean(r, get_flops, m, &fmax, &fmean);
    max_mean(r, get_bytes, m, &bmax, &bmean);
    fprintf(f, "{\"algo\":\"%s\",\"ulysses\":%d,\"ranks\":%d,\"seq\":%lld,\"backward\":%s,",
            ctxpar_algo_name(r->algo), r->ulysses, r->nranks, (long long)a->cfg.seq,
            a->cfg.backward ? "true" : "false");
    // What was planned, as every command echoes it, and the plan's own settings.
    fputs("\"config\":{", f);
    cpt_json_config_members(f, &a->cli.cfg, r->algo);
    fputs(",\"model\":", f);
    cpt_json_string(f, m->name);
    fprintf(f, ",\"group_size\":%d,\"coverage\":%s,\"share_members\":%s},", a->cfg.group_size,
            a->cfg.coverage ? "true" : "false", a->cfg.share_members ? "true" : "false");
    fprintf(f, "\"coverage_ok\":%s,\"coverage_checked\":%s,\"pairs_visible\":",
            r->coverage_ok ? "true" : "false", r->coverage_checked ? "true" : "false");
    cpt_json_num(f, r->pairs_visible);
    fprintf(f, ",\"pairs_computed\":");
    cpt_json_num(f, r->pairs_computed);
    fprintf(f, ",\"imbalance\":");
    cpt_json_num(f, r->imbalance);
    fprintf(f, ",\"flops_max\":");
    cpt_json_num(f, fmax);
    fprintf(f, ",\"flops_mean\":");
    cpt_json_num(f, fmean);
    fprintf(f, ",\"bytes_max\":");
    cpt_json_num(f, bmax);
    fprintf(f, ",\"bytes_mean\":");
    cpt_json_num(f, bmean);
    fprintf(f, ",\"workspace_bytes\":%zu,\"predicted_time_s\":", r->workspace_bytes);
    cpt_json_num(f, cpt_plan_time(m, r));
    fprintf(f, ",\"model\":");
    cpt_json_string(f, m->name);
    fprintf(f, ",\"plan_seconds\":");
    cpt_json_num(f, r->seconds);
    for (size_t c = 0; c < COLUMNS; c++)
        json_array(f, columns[c].key, r, columns[c].get, m);
    if (a->explain)
        explain(f, a, 1);
    fputs("}\n", f);
}

static void print_table(const plan_args *a, const cpt_plan_result *r, const cpt_plan_model *m) {
    double v[COLUMNS][2]; // max, mean of each column, in the order of columns[]
    for (size_t c = 0; c < COLUMNS; c++)
        max_mean(r, columns[c].get, m, &v[c][0], &v[c][1]);
    printf("plan: %s on %d ranks, seq %lld, batch %lld, heads %lld/%lld, dim %lld, %s, %s, %s "
           "(dry run %.2f s)\n",
           ctxpar_algo_name(r->algo), r->nranks, (long long)a->cfg.seq, (long long)a->cfg.batch,
           (long long)a->cfg.heads, (long long)a->cfg.kv_heads, (long long)a->cfg.head_dim,
           ctxpar_dtype_name(a->cfg.dtype), ctxpar_mask_name(a->cfg.params.mask),
           a->cfg.backward ? "forward + backward" : "forward", r->seconds);
    if (r->ulysses)
        printf("  ulysses            %d ranks per all-to-all group, %d groups in the ring\n",
               r->ulysses, r->nranks / r->ulysses);
    printf("  coverage           %s\n", !r->coverage_checked ? "not checked"
                                        : r->coverage_ok     ? "ok: every visible pair once"
                                                             : "FAILED");
    if (r->coverage_checked && !r->coverage_ok)
        printf("  first bad position %lld\n", (long long)r->coverage_bad_position);
    printf("  pairs per rank     max %.4g, mean %.4g (x heads x batch)\n", v[0][0], v[0][1]);
    printf("  FLOPs per rank     max %.4g, mean %.4g (imbalance %.2f%%)\n", v[1][0], v[1][1],
           100.0 * r->imbalance);
    char b[3][32];
    printf("  sent per rank      max %s (group %s, across %s)\n", cell(2, v[2][0], b[0], 32),
           cell(3, v[3][0], b[1], 32), cell(4, v[4][0], b[2], 32));
    printf("  received per rank  max %s (group %s, across %s)\n", cell(5, v[5][0], b[0], 32),
           cell(6, v[6][0], b[1], 32), cell(7, v[7][0], b[2], 32));
    printf("  workspace per rank max %s\n", cpt_bytes_text((double)r->workspace_bytes, b[0], 32));
    printf("  predicted time     %s (model %s, %s, %s)\n",
           cpt_seconds_text(cpt_plan_time(m, r), b[0], 32), m->name,
           ctxpar_dtype_name(a->cfg.dtype), a->cfg.backward ? "forward + backward" : "forward");
    if (a->per_rank || r->nranks <= 16) {
        printf("  %6s", "rank");
        for (size_t c = 0; c < COLUMNS; c++)
            printf(" %10s", columns[c].column);
        printf("\n");
        for (int i = 0; i < r->nranks; i++) {
            printf("  %6d", i);
            for (size_t c = 0; c < COLUMNS; c++)
                printf(" %10s", cell(c, columns[c].get(&r->rank[i], m, r->nranks), b[0], 32));
            printf("\n");
        }
    }
    if (a->explain)
        explain(stdout, a, 0);
}

int cpt_cmd_plan(int argc, char **argv) {
    plan_args a;
    int rc = parse(argc, argv, &a);
    if (rc != 0)
        return rc < 0 ? CPT_EXIT_OK : rc;
    cpt_plan_model m;
    if (!cpt_plan_model_builtin(a.cli.model, &m) &&
        cpt_plan_model_load(a.cli.model, &m) != CTXPAR_OK) {
        fprintf(stderr, "ctxpar plan: %s\n", ctxpar_last_error());
        return CPT_EXIT_USAGE;
    }
    if (!a.cfg.group_size)
        a.cfg.group_size = m.group_size;
    int32_t *cu = NULL; // --docs' generated documents (--cu-seqlens: read by cli.c)
    ctxpar_status st = CTXPAR_OK;
    const int64_t docs = a.cli.cfg.docs;
    if (docs > 0) {
        cu = malloc((size_t)(docs + 1) * sizeof *cu);
        st =
            cu ? cpt_plan_docs(a.cli.doc_dist, a.cli.doc_sigma, a.cli.cfg.seed, a.cfg.seq, docs, cu)
               : CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "no memory for the documents");
        a.cfg.params.num_docs = docs;
        a.cfg.params.cu_seqlens = cu;
    }
    cpt_plan_result r;
    cpt_progress progress;
    cpt_progress_init(&progress, "plan", stderr, NULL);
    a.cfg.progress = cpt_progress_update;
    a.cfg.progress_user = &progress;
    if (st == CTXPAR_OK)
        st = cpt_plan_run(&a.cfg, &r);
    cpt_progress_clear(&progress);
    if (st != CTXPAR_OK) {
        fprintf(stderr, "ctxpar plan: %s: %s\n", ctxpar_status_string(st),
                cpt_cli_message(ctxpar_last_error()));
        free(cu);
        return st == CTXPAR_ERR_INVALID_ARG || st == CTXPAR_ERR_NOT_SUPPORTED ? CPT_EXIT_USAGE
                                                                              : CPT_EXIT_FAIL;
    }
    if (a.json)
        print_json(&a, &r, &m);
    else
        print_table(&a, &r, &m);
    rc = r.coverage_checked && !r.coverage_ok ? CPT_EXIT_FAIL : CPT_EXIT_OK;
    rc = cpt_report_plan(a.cli.report_path, &a.cfg, &r, &m, rc);
    cpt_plan_result_free(&r);
    free(cu);
    return rc;
}
