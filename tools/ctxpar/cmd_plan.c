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

typedef struct plan_args {
    cpt_plan_config cfg;
    int64_t docs;
    const char *dist, *cu_path, *model, *assign_path, *report_path;
    double sigma;
    uint64_t seed;
    int json, explain, per_rank, group_size_set;
} plan_args;

static const char *const usage_text =
    "usage: ctxpar plan [options]\n"
    "What one attention call does on every rank, without computing it: the library's own\n"
    "algorithms run rank by rank on a device and comm that hold no data. Per rank: visible\n"
    "(query, key) pairs and FLOPs, bytes sent and received inside the all-to-all group / node\n"
    "and across, the peak workspace; the imbalance (max/mean - 1 of per-rank FLOPs); a coverage\n"
    "proof (every visible pair computed exactly once: per query position, the count, sum and\n"
    "sum of squares of the keys computed against the mask's); the predicted time of a hardware\n"
    "model.\n"
    "  --ranks P  --seq S  --batch B  --heads H  --kv-heads K  --dim D  --dtype f32|f16|bf16\n"
    "  --v-dim DV          v's head_dim (MLA; default D)\n"
    "  --sinks             attention sinks (with --backward: their gradient's all-gather)\n"
    "  --mask none|causal  --window W  --window-right R\n"
    "  --layout contiguous|zigzag|striped|custom\n"
    "  --assign FILE.npy   with --layout custom: int32/int64 [seq], the rank holding each token\n"
    "  --algo auto|ring|allgather|alltoall|hybrid  --ulysses U  --backward\n"
    "  --docs N [--doc-dist uniform|lognormal] [--doc-sigma X] [--seed N]\n"
    "  --cu-seqlens FILE   document boundaries, whitespace-separated, 0 ... seq\n"
    "  --model h200|cpu|FILE  hardware model (docs/performance.md); default h200\n"
    "  --group-size N      ranks per node for the link classes (default: the model's)\n"
    "  --no-coverage       skip the coverage proof (it keeps three uint64 per token: 24 bytes)\n"
    "  --explain           every algorithm's check and cost, and AUTO's choice\n"
    "  --per-rank          the per-rank table in the text output (shown up to 16 ranks)\n"
    "  --share-members     the hybrid: the first member of a group stands for the others (the\n"
    "                      same plan, u times faster; by default every member is dry-run)\n"
    "  --json              one JSON object\n"
    "  --report FILE.html  also write a self-contained HTML report: per-rank bars\n";

static int bad(const char *what, const char *val) {
    fprintf(stderr, "ctxpar plan: bad value for %s: '%s' (ctxpar plan --help)\n", what, val);
    return CPT_EXIT_USAGE;
}

static int pick_name(const char *val, const char *(*name)(int), int n, int *out) {
    for (int i = 0; i < n; i++)
        if (!strcmp(val, name(i))) {
            *out = i;
            return 1;
        }
    return 0;
}
static const char *algo_n(int i) {
    return ctxpar_algo_name((ctxpar_algo)i);
}
static const char *layout_n(int i) {
    return ctxpar_layout_name((ctxpar_layout)i);
}
static const char *mask_n(int i) {
    return ctxpar_mask_name((ctxpar_mask)i);
}
static const char *dtype_n(int i) {
    return ctxpar_dtype_name((ctxpar_dtype)i);
}

static int parse(int argc, char **argv, plan_args *a) {
    memset(a, 0, sizeof *a);
    cpt_plan_config *c = &a->cfg;
    c->ranks = 4;
    c->batch = 1;
    c->seq = 4096;
    c->heads = 4;
    c->head_dim = 64;
    c->dtype = CTXPAR_DTYPE_BF16;
    c->coverage = 1;
    ctxpar_attn_params init = CTXPAR_ATTN_PARAMS_INIT;
    c->params = init;
    c->params.mask = CTXPAR_MASK_CAUSAL;
    c->params.layout = CTXPAR_LAYOUT_ZIGZAG;
    a->dist = "uniform";
    a->sigma = 1.0;
    a->seed = 42;
    a->model = "h200";
    for (int i = 0; i < argc; i++) {
        const char *o = argv[i];
        if (!strcmp(o, "--help") || !strcmp(o, "-h")) {
            fputs(usage_text, stdout);
            return -1;
        }
        if (!strcmp(o, "--backward")) {
            c->backward = 1;
            continue;
        }
        if (!strcmp(o, "--json")) {
            a->json = 1;
            continue;
        }
        if (!strcmp(o, "--explain")) {
            a->explain = 1;
            continue;
        }
        if (!strcmp(o, "--per-rank")) {
            a->per_rank = 1;
            continue;
        }
        if (!strcmp(o, "--share-members")) {
            c->share_members = 1;
            continue;
        }
        if (!strcmp(o, "--sinks")) { // never read: only whether there are sinks matters
            static const float none;
            c->params.sinks = &none;
            continue;
        }
        if (!strcmp(o, "--no-coverage")) {
            c->coverage = 0;
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "ctxpar plan: unknown option or missing value: %s\n", o);
            return CPT_EXIT_USAGE;
        }
        const char *v = argv[++i];
        char *end = NULL;
        long long n = strtoll(v, &end, 10);
        const int num = end != v && *end == '\0' && n >= 0;
        int e;
        if (!strcmp(o, "--ranks") && num && n >= 1 && n <= 65536)
            c->ranks = (int)n;
        else if (!strcmp(o, "--seq") && num && n >= 1 && n <= INT32_MAX)
            c->seq = n;
        else if (!strcmp(o, "--batch") && num && n >= 1)
            c->batch = n;
        else if (!strcmp(o, "--heads") && num && n >= 1)
            c->heads = n;
        else if (!strcmp(o, "--kv-heads") && num && n >= 1)
            c->kv_heads = n;
        else if (!strcmp(o, "--dim") && num && n >= 1)
            c->head_dim = n;
        else if (!strcmp(o, "--v-dim") && num && n >= 1)
            c->head_dim_v = n;
        else if (!strcmp(o, "--window") && num)
            c->params.window_left = n;
        else if (!strcmp(o, "--window-right") && num)
            c->params.window_right = n;
        else if (!strcmp(o, "--ulysses") && num)
            c->params.ulysses = n;
        else if (!strcmp(o, "--docs") && num && n >= 1)
            a->docs = n;
        else if (!strcmp(o, "--seed") && num)
            a->seed = (uint64_t)n;
        else if (!strcmp(o, "--group-size") && num && n >= 1) {
            c->group_size = (int)n;
            a->group_size_set = 1;
        } else if (!strcmp(o, "--doc-sigma") && (a->sigma = strtod(v, &end)) > 0 && *end == '\0') {
        } else if (!strcmp(o, "--doc-dist"))
            a->dist = v;
        else if (!strcmp(o, "--cu-seqlens"))
            a->cu_path = v;
        else if (!strcmp(o, "--model"))
            a->model = v;
        else if (!strcmp(o, "--assign"))
            a->assign_path = v;
        else if (!strcmp(o, "--report"))
            a->report_path = v;
        else if (!strcmp(o, "--algo") && pick_name(v, algo_n, 16, &e))
            c->params.algo = (ctxpar_algo)e;
        else if (!strcmp(o, "--layout") && pick_name(v, layout_n, 4, &e))
            c->params.layout = (ctxpar_layout)e;
        else if (!strcmp(o, "--mask") && pick_name(v, mask_n, 2, &e))
            c->params.mask = (ctxpar_mask)e;
        else if (!strcmp(o, "--dtype") && pick_name(v, dtype_n, 3, &e))
            c->dtype = (ctxpar_dtype)e;
        else
            return bad(o, v);
    }
    if (c->kv_heads == 0)
        c->kv_heads = c->heads;
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

// The per-rank arrays, JSON key and getter (the text table prints the same columns).
static const struct {
    const char *key, *column;
    rank_getter get;
} columns[] = {
    {"pairs_per_rank", "pairs", get_pairs},
    {"flops_per_rank", "FLOPs", get_flops},
    {"bytes_per_rank", "sent", get_bytes},
    {"bytes_group_per_rank", "sent grp", get_group},
    {"bytes_across_per_rank", "sent acr", get_across},
    {"bytes_received_per_rank", "recv", get_received},
    {"bytes_group_received_per_rank", "recv grp", get_group_received},
    {"bytes_across_received_per_rank", "recv acr", get_across_received},
    {"workspace_per_rank", "workspace", get_workspace},
    {"time_per_rank_s", "time s", get_time},
};
#define COLUMNS (sizeof columns / sizeof columns[0])

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
    printf("plan: %s on %d ranks, seq %lld, %s (dry run %.2f s)\n", ctxpar_algo_name(r->algo),
           r->nranks, (long long)a->cfg.seq, a->cfg.backward ? "forward + backward" : "forward",
           r->seconds);
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
    printf("  sent per rank      max %.4g (group %.4g, across %.4g)\n", v[2][0], v[3][0], v[4][0]);
    printf("  received per rank  max %.4g (group %.4g, across %.4g)\n", v[5][0], v[6][0], v[7][0]);
    printf("  workspace per rank max %zu bytes\n", r->workspace_bytes);
    printf("  predicted time     %.4g s (model %s)\n", cpt_plan_time(m, r), m->name);
    if (a->per_rank || r->nranks <= 16) {
        printf("  %6s", "rank");
        for (size_t c = 0; c < COLUMNS; c++)
            printf(" %10s", columns[c].column);
        printf("\n");
        for (int i = 0; i < r->nranks; i++) {
            printf("  %6d", i);
            for (size_t c = 0; c < COLUMNS; c++)
                printf(" %10.4g", columns[c].get(&r->rank[i], m, r->nranks));
            printf("\n");
        }
    }
    if (a->explain)
        explain(stdout, a, 0);
}

// --layout custom's --assign FILE.npy (the two go together; one rank per token of --seq).
static int load_assign(const plan_args *a, int32_t **assign_out) {
    *assign_out = NULL;
    if ((a->cfg.params.layout == CTXPAR_LAYOUT_CUSTOM) != (a->assign_path != NULL)) {
        fprintf(stderr, "ctxpar plan: --layout custom and --assign FILE.npy go together\n");
        return CPT_EXIT_USAGE;
    }
    if (!a->assign_path)
        return CPT_EXIT_OK;
    char msg[4200];
    int64_t n = 0;
    int32_t *assign = cpt_cli_read_assignment(a->assign_path, &n, msg, sizeof msg);
    if (assign && n != a->cfg.seq)
        snprintf(msg, sizeof msg, "%s holds %lld ranks but --seq is %lld", a->assign_path,
                 (long long)n, (long long)a->cfg.seq);
    if (!assign || n != a->cfg.seq) {
        fprintf(stderr, "ctxpar plan: %s\n", msg);
        free(assign);
        return CPT_EXIT_USAGE;
    }
    *assign_out = assign;
    return CPT_EXIT_OK;
}

int cpt_cmd_plan(int argc, char **argv) {
    plan_args a;
    int rc = parse(argc, argv, &a);
    if (rc != 0)
        return rc < 0 ? CPT_EXIT_OK : rc;
    cpt_plan_model m;
    if (!cpt_plan_model_builtin(a.model, &m) && cpt_plan_model_load(a.model, &m) != CTXPAR_OK) {
        fprintf(stderr, "ctxpar plan: %s\n", ctxpar_last_error());
        return CPT_EXIT_USAGE;
    }
    if (!a.group_size_set)
        a.cfg.group_size = m.group_size;
    int32_t *assign = NULL;
    if ((rc = load_assign(&a, &assign)) != CPT_EXIT_OK)
        return rc;
    a.cfg.params.assignment = assign;
    int32_t *cu = NULL;
    ctxpar_status st = CTXPAR_OK;
    if (a.cu_path) {
        st = cpt_plan_read_cu_seqlens(a.cu_path, &cu, &a.cfg.params.num_docs);
    } else if (a.docs > 0) {
        cu = malloc((size_t)(a.docs + 1) * sizeof *cu);
        st = cu ? cpt_plan_docs(a.dist, a.sigma, a.seed, a.cfg.seq, a.docs, cu)
                : CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "no memory for the documents");
        a.cfg.params.num_docs = a.docs;
    }
    a.cfg.params.cu_seqlens = cu;
    cpt_plan_result r;
    cpt_progress progress;
    cpt_progress_init(&progress, "plan", stderr, NULL);
    a.cfg.progress = cpt_progress_update;
    a.cfg.progress_user = &progress;
    if (st == CTXPAR_OK)
        st = cpt_plan_run(&a.cfg, &r);
    cpt_progress_clear(&progress);
    if (st != CTXPAR_OK) {
        fprintf(stderr, "ctxpar plan: %s: %s\n", ctxpar_status_string(st), ctxpar_last_error());
        free(cu);
        free(assign);
        return st == CTXPAR_ERR_INVALID_ARG || st == CTXPAR_ERR_NOT_SUPPORTED ? CPT_EXIT_USAGE
                                                                              : CPT_EXIT_FAIL;
    }
    if (a.json)
        print_json(&a, &r, &m);
    else
        print_table(&a, &r, &m);
    rc = r.coverage_checked && !r.coverage_ok ? CPT_EXIT_FAIL : CPT_EXIT_OK;
    rc = cpt_report_plan(a.report_path, &a.cfg, &r, &m, rc);
    cpt_plan_result_free(&r);
    free(cu);
    free(assign);
    return rc;
}
