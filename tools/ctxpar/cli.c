// Flag parsing for the `ctxpar` tool: one table of options (which subcommands take each), strict
// values, one-line errors, and --help generated from the same table.
#define _POSIX_C_SOURCE 200809L // setenv
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "params_table.h"
#include "reference/npy.h"
#include "reference/tensor_format.h"
#include "tools/ctxpar/audit_io.h"

// clang-format off
typedef enum opt_id {
    O_RANKS, O_BATCH, O_SEQ, O_HEADS, O_KV_HEADS, O_DIM, O_DTYPE,
    O_DOCS, O_BACKWARD, O_SEED, O_Q, O_K, O_V, O_DOUT, O_SAVE, O_THREADS,
    O_WARMUP, O_REPEAT, O_CHECK, O_NO_CHECK, O_SWEEP, O_PEAK, O_VERIFY, O_COMM, O_BACKEND, O_JSON,
    O_TRACE, O_INPUTS, O_AGAINST, O_SHARDS, O_FORMAT, O_LSE_BASE, O_LSE_LAYOUT, O_MAX_RATIO,
    O_V_DIM, O_ROWS, O_NO_SINGLE,
    O_DOC_DIST, O_DOC_SIGMA, O_MODEL, O_GROUP_SIZE, O_NO_COVERAGE, O_EXPLAIN, O_PER_RANK,
    O_SHARE_MEMBERS, O_REPORT, O_CUDNN,
    O_PARAM, // O_PARAM + i: attention parameter i's option (params_table.h)
} opt_id;
// clang-format on

enum { C = CPT_CMD_CHECK, A = CPT_CMD_AUDIT, B = CPT_CMD_BENCH, P = CPT_CMD_PLAN };

typedef struct opt {
    const char *name; // NULL: an attention parameter the tool has no option for
    opt_id id;
    int cmds;      // which subcommands take it
    int flag;      // takes no value
    const char *value; // what the value looks like, for --help
    const char *help;
} opt;

static const opt options[] = {
    {"--ranks", O_RANKS, C | A | B | P, 0, "P",
     "ranks (threads, or under mpirun the processes; plan: up to 65536)"},
    {"--batch", O_BATCH, C | B | P, 0, "N", "batch size"},
    {"--seq", O_SEQ, C | B | P, 0, "S", "global sequence length"},
    {"--heads", O_HEADS, C | B | P, 0, "N", "query heads"},
    {"--kv-heads", O_KV_HEADS, C | B | P, 0, "N", "key/value heads (divides --heads)"},
    {"--dim", O_DIM, C | B | P, 0, "D", "head dimension"},
    {"--v-dim", O_V_DIM, C | B | P, 0, "DV",
     "head dimension of v, out, dout, dv (MLA: e.g. 128 with --dim 192)"},
    {"--q", O_Q, A, 0, "Q.npy", "queries in --format order (or q in --inputs, --shards)"},
    {"--k", O_K, A, 0, "K.npy", "keys, kv_heads heads (or k in --inputs, --shards)"},
    {"--v", O_V, A, 0, "V.npy", "values, the shape of k (or v in --inputs, --shards)"},
    {"--dout", O_DOUT, A, 0, "DO.npy", "gradient of the output, the shape of q: runs backward"},
    {"--inputs", O_INPUTS, A, 0, "SRC",
     "q, k, v (dout, cu_seqlens): .safetensors or a folder of NAME.npy"},
    {"--against", O_AGAINST, A, 0, "SRC",
     "judge results made elsewhere: out, lse, dq, dk, dv (like --inputs)"},
    {"--shards", O_SHARDS, A, 0, "PATTERN",
     "per-rank files (dump/{name}.rank{rank}.npy) of tensors given no other way"},
    {"--format", O_FORMAT, A, 0, "bshd|bhsd|sbhd|thd", "order of every tensor's dimensions"},
    {"--lse-layout", O_LSE_LAYOUT, A, 0, "bhs|bsh|ht", "order of the lse's dimensions"},
    {"--lse-base", O_LSE_BASE, A, 0, "e|2", "logarithm base of the lse"},
    {"--max-ratio", O_MAX_RATIO, A, 0, "R",
     "also require each error at most R x ctxpar's own at that dtype"},
    {"--save", O_SAVE, A, 0, "DIR", "write ctxpar's results to DIR, stored like the inputs"},
    {"--dtype", O_DTYPE, C | A | B | P, 0, "f32|f16|bf16", "storage dtype of q, k, v, out"},
// The attention parameters' options, in the struct's order, from the library's table.
#define PARAM_OPTION(name, type, kind, def, names, lo, unset, agree, agreed, flag, value, help)    \
    {flag, (opt_id)(O_PARAM + CTXPAR_PARAM_##name), C | A | B | P, 0, value, help},
    CTXPAR_PARAMS_TABLE(PARAM_OPTION)
#undef PARAM_OPTION
    {"--docs", O_DOCS, C | B | P, 0, "N",
     "pack N documents of varied lengths; attention stays inside each"},
    {"--backward", O_BACKWARD, C | B | P, 1, NULL, "also run the backward pass (dq, dk, dv)"},
    {"--seed", O_SEED, C | A | B | P, 0, "N",
     "seed of the generated inputs (plan: documents) and of --rows' random rows"},
    {"--doc-dist", O_DOC_DIST, P, 0, "uniform|lognormal", "lengths of the --docs documents"},
    {"--doc-sigma", O_DOC_SIGMA, P, 0, "X", "with --doc-dist lognormal: the spread of log length"},
    {"--rows", O_ROWS, C | A, 0, "N",
     "judge N query rows (and key rows): each rank's and layout chunk's first and last, then "
     "random ones; the reference then costs O(N S)"},
    {"--threads", O_THREADS, C | A | B, 0, "N", "OpenMP threads per rank (0: cores / ranks)"},
    {"--warmup", O_WARMUP, C | A | B, 0, "N", "untimed calls before the timed ones"},
    {"--repeat", O_REPEAT, C | A | B, 0, "N", "timed calls; the median is reported"},
    {"--check", O_CHECK, B, 1, NULL, "also compare with the fp64 oracle (O(S^2) in fp64: slow)"},
    {"--no-check", O_NO_CHECK, B, 1, NULL, "no oracle (the default for bench)"},
    {"--no-single", O_NO_SINGLE, C | A, 1, NULL,
     "skip the run on one rank (its error ratio and bits): halves a long audit's own runs"},
    {"--sweep", O_SWEEP, B, 1, NULL,
     "run every --seq x --ranks value (comma lists) into one markdown table"},
    {"--peak", O_PEAK, B, 1, NULL, "only measure and print the cores' FP32 FMA peak"},
    {"--verify-transfers", O_VERIFY, C | A | B, 1, NULL, "checksum every block sent between ranks"},
    {"--comm", O_COMM, C | A | B, 0, "local|mpi", "ranks as threads, or MPI processes"},
    {"--backend", O_BACKEND, C | A | B, 0, "NAME",
     "the device every rank computes on (ctxpar --list-backends)"},
    {"--cudnn", O_CUDNN, C | A | B, 0, "auto|on|off",
     "with --backend cuda: cuDNN's fused attention for the forward blocks where it applies "
     "(auto), required (on), or never: ctxpar's own kernels (off); sets CTXPAR_CUDNN"},
    {"--json", O_JSON, C | A | B | P, 1, NULL, "print one JSON object instead of the table"},
    {"--model", O_MODEL, P, 0, "h200|cpu|FILE", "hardware model (docs/performance.md)"},
    {"--group-size", O_GROUP_SIZE, P, 0, "N", "ranks per node, for the link classes"},
    {"--no-coverage", O_NO_COVERAGE, P, 1, NULL,
     "skip the coverage proof (it keeps three uint64 per token: 24 bytes)"},
    {"--explain", O_EXPLAIN, P, 1, NULL, "every algorithm's check and cost, and AUTO's choice"},
    {"--per-rank", O_PER_RANK, P, 1, NULL,
     "the per-rank table in the text output (shown up to 16 ranks without it)"},
    {"--share-members", O_SHARE_MEMBERS, P, 1, NULL,
     "the hybrid: the first member of a group stands for the others (the same plan, u times "
     "faster; by default every member is dry-run)"},
    {"--trace", O_TRACE, C | A | B, 0, "FILE",
     "write a Chrome trace (per rank: compute, transfers, waits)"},
    {"--report", O_REPORT, C | A | B | P, 0, "FILE.html",
     "also write a self-contained HTML report with pictures (docs/auditing.md)"},
};
#define N_OPTIONS (sizeof options / sizeof options[0])

// Whether an option is a switch: a flag, or an integer parameter whose table line gives no value
// form (params_table.h: on when given, 1).
static int is_switch(const opt *o) {
    return o->flag || (o->id >= O_PARAM && !o->value &&
                       ctxpar_param_fields[o->id - O_PARAM].kind == CTXPAR_KIND_INT);
}

static const char *const dtype_names[] = {"f32", "f16", "bf16"};
static const char *const comm_names[] = {"local", "mpi"};

// The registry's names, "cpu, cuda".
static void print_backend_names(FILE *f) {
    for (int i = 0; i < cpt_run_backend_count(); i++)
        fprintf(f, "%s%s", i ? ", " : "", cpt_run_backend_name((cpt_run_backend)i));
}

void cpt_cli_list_backends(FILE *out) {
    for (int i = 0; i < cpt_run_backend_count(); i++) {
        const cpt_run_backend b = (cpt_run_backend)i;
        const ctxpar_status st = cpt_run_backend_probe(b);
        if (st == CTXPAR_OK)
            fprintf(out, "%-6s available    %s\n", cpt_run_backend_name(b), cpt_run_backend_about(b));
        else
            fprintf(out, "%-6s unavailable  %s: %s\n", cpt_run_backend_name(b),
                    cpt_run_backend_about(b), cpt_cli_message(ctxpar_last_error()));
    }
}

static int cmd_bit(const char *cmd) {
    return !strcmp(cmd, "check")   ? C
           : !strcmp(cmd, "audit") ? A
           : !strcmp(cmd, "bench") ? B
           : !strcmp(cmd, "plan")  ? P
                                   : 0;
}

static void defaults(int cmd, cpt_cli *cli) {
    memset(cli, 0, sizeof *cli);
    cli->cmd = cmd;
    cpt_run_config_default(&cli->cfg);
    cli->max_ratio = 0.0; // off: the verdict is the per-element bound
    if (cmd == B) {
        // Timing wants a warm cache and several samples; the oracle is opt-in (--check), and the
        // bench runs its single-rank baseline itself.
        cli->cfg.warmup = 1;
        cli->cfg.repeat = 5;
        cli->cfg.compare_oracle = 0;
        cli->cfg.compare_single = 0;
    }
    if (cmd == P) { // the library's own choice, at the dtype a training run would use
        cli->cfg.params.algo = CTXPAR_ALGO_AUTO;
        cli->cfg.dtype = CTXPAR_DTYPE_BF16;
        cli->model = "h200";
        cli->doc_dist = "uniform";
        cli->doc_sigma = 1.0;
    }
}

// The default of an option for --help, or "" when it has none worth printing.
static void default_text(const opt *o, const cpt_cli *d, char *buf, size_t n) {
    const cpt_run_config *c = &d->cfg;
    buf[0] = '\0';
    if (o->id >= O_PARAM) { // an enum's name; what a number's 0 means (floats refuse 0)
        const ctxpar_param_field *f = &ctxpar_param_fields[o->id - O_PARAM];
        if (f->kind == CTXPAR_KIND_ENUM)
            snprintf(buf, n, "%s", f->names((int)ctxpar_param_int(&c->params, f)));
        else if (f->unset)
            snprintf(buf, n, "%s%s", f->kind == CTXPAR_KIND_INT ? "0 = " : "", f->unset);
        return;
    }
    switch (o->id) {
    case O_RANKS: snprintf(buf, n, "%d", c->ranks); break;
    case O_BATCH: snprintf(buf, n, "%lld", (long long)c->batch); break;
    case O_SEQ: snprintf(buf, n, "%lld", (long long)c->seq); break;
    case O_HEADS: snprintf(buf, n, "%lld", (long long)c->heads); break;
    case O_KV_HEADS: snprintf(buf, n, "= heads"); break;
    case O_DIM: snprintf(buf, n, "%lld", (long long)c->head_dim); break;
    case O_DTYPE:
        snprintf(buf, n, "%s", d->cmd == A ? "the files'" : dtype_names[c->dtype]);
        break;
    case O_V_DIM: snprintf(buf, n, "= dim"); break;
    case O_DOCS: snprintf(buf, n, "0 = one"); break;
    case O_SEED: snprintf(buf, n, "%llu", (unsigned long long)c->seed); break;
    case O_ROWS: snprintf(buf, n, "0 = every row"); break;
    case O_THREADS: snprintf(buf, n, "0"); break;
    case O_WARMUP: snprintf(buf, n, "%d", c->warmup); break;
    case O_REPEAT: snprintf(buf, n, "%d", c->repeat > 0 ? c->repeat : 1); break;
    case O_COMM: snprintf(buf, n, "mpi under mpirun, else local"); break;
    case O_BACKEND: snprintf(buf, n, "cpu"); break;
    case O_CUDNN: snprintf(buf, n, "auto"); break;
    case O_FORMAT: snprintf(buf, n, "bshd"); break;
    case O_LSE_LAYOUT: snprintf(buf, n, "bhs"); break;
    case O_LSE_BASE: snprintf(buf, n, "e"); break;
    case O_MAX_RATIO: snprintf(buf, n, "off"); break;
    case O_MODEL:
        snprintf(buf, n, "%s", d->model);
        break;
    case O_DOC_DIST:
        snprintf(buf, n, "%s", d->doc_dist);
        break;
    case O_DOC_SIGMA:
        snprintf(buf, n, "%g", d->doc_sigma);
        break;
    case O_GROUP_SIZE:
        snprintf(buf, n, "the model's");
        break;
    default: break;
    }
}

static const char *const notes_check =
    "Runs context-parallel attention on generated inputs (a counter-based hash of seed, tensor\n"
    "and position) and compares the gathered global result with full attention in float64 and\n"
    "with the same backend on one rank (error ratio, bitwise equality).\n"
    "--algo all: every algorithm that accepts the problem (decode with --q-len), one after\n"
    "another on the same inputs (the fp64 reference computed once), then whether their results\n"
    "agree bit for bit (the first pair and tensor that differ); the others are listed as\n"
    "refused. With --reproducible they must agree (exit status 1 if not).\n"
    "Exit status: 0 every element within its per-element bound (docs/numerics.md) and the\n"
    "P-rank error within 2x the P = 1 error, 1 outside or a failed run, 2 bad usage.\n";

static const char *const notes_audit =
    "Runs context-parallel attention on your own global tensors and compares the gathered\n"
    "result with float64 attention and with one rank, as `ctxpar check` does; with --against,\n"
    "also judges results computed elsewhere (PyTorch, TransformerEngine, your own kernels).\n"
    "Files: .npy (format 1.0/2.0, C order; float32, float16, bfloat16 as ml_dtypes saves it\n"
    "('<V2'), int32/int64 for cu_seqlens) or .safetensors (F32, F16, BF16, I32, I64); --inputs\n"
    "takes q, k, v and optional dout (runs backward) and cu_seqlens (packed documents). Every\n"
    "tensor is in --format order (thd: [tokens, heads, dim], batch 1); K and V may have fewer\n"
    "heads (GQA). --shards assembles per-rank files into global order by --layout/--ranks.\n"
    "--against: for each of out, lse, dq, dk, dv (and dsinks, with --sinks) given, its error vs\n"
    "float64, ctxpar's own error at the same dtype (the results' dtype unless --dtype), their\n"
    "ratio, and the worst rows (position, head, and the rank holding it under --layout/--ranks).\n"
    "Consistent when every element is within its per-element bound (docs/numerics.md: the\n"
    "error a correct float computation of it may carry at the results' dtype); --max-ratio R\n"
    "also requires each error at most R x ctxpar's own.\n"
    "--save DIR writes ctxpar's out, lse (float32) and with dout dq, dk, dv stored like the\n"
    "inputs: NAME.npy, one cpt_results.safetensors, or shards named as --shards names them;\n"
    "with --sinks and dout also dsinks.npy (float32 [Hq]).\n"
    "Exit status: 0 within tolerance (and consistent), 1 out of tolerance, not consistent or a\n"
    "failed run, 2 bad usage or a bad input file (one line names the file and the problem).\n";

static const char *const notes_bench =
    "Times context-parallel attention (median of --repeat calls after --warmup, with the fastest\n"
    "and slowest call beside it, and the speedup's range from them) and, in the same run, the\n"
    "baseline: full-sequence attention on one rank with the same backend and the same number of\n"
    "threads in all (threads x ranks; by default every core). More ranks x threads than cores\n"
    "is warned about: the ranks then take turns on the cores.\n"
    "FLOPs: forward 2 * (head_dim + v-dim) * heads * (visible query-key pairs over the batch;\n"
    "4 * head_dim without --v-dim), the pairs being seq^2 a row without a mask and seq^2 / 2 with\n"
    "a causal one (the usual convention), counted exactly with --window, --window-right, --docs\n"
    "or --cu-seqlens; backward 2.5 x forward, so forward + backward is 3.5 x forward.\n"
    "tokens/s: batch * seq / time. Memory: the library's peak per rank (the caller's tensors not\n"
    "counted). Compute, transfer and wait times come from the library's trace events; the\n"
    "hidden fraction of transfers is 1 - wait / transfer. Backward time: the fwd+bwd median\n"
    "minus the forward median.\n"
    "% of peak (CPU backend): FLOP/s over the measured FP32 FMA peak of one core (`--peak`\n"
    "prints it; measured at the start of every bench) times the cores in use, that is\n"
    "ranks x threads per rank, at most the cores of this machine (ranks are assumed to share it).\n"
    "--reproducible: the default mode is also run on the same ranks, and its times, memory and\n"
    "bytes sent are shown beside, with the ratios reproducible/default.\n"
    "--sweep: --seq and --ranks take comma lists (e.g. --seq 2048,4096 --ranks 1,2,4); one\n"
    "markdown table row per pair. Exit status: 0 ok, 1 a failed run (or out of tolerance with\n"
    "--check), 2 bad usage.\n";

// What an option's value looks like: its table's form, or an enum's names ("ring|allgather|...",
// from the library's names function, so that a new value needs no change here).
static const char *value_text(const opt *o, char *buf, size_t n) {
    const ctxpar_param_field *f = o->id >= O_PARAM ? &ctxpar_param_fields[o->id - O_PARAM] : NULL;
    if (!f || f->kind != CTXPAR_KIND_ENUM)
        return o->value;
    size_t used = 0;
    buf[0] = '\0';
    for (int e = 0; e < 64 && strcmp(f->names(e), "?") != 0 && used < n; e++) {
        int w = snprintf(buf + used, n - used, "%s%s", e ? "|" : "", f->names(e));
        used += w > 0 ? (size_t)w : 0;
    }
    return buf;
}

static const char *const notes_plan =
    "What one attention call does on every rank, without computing it: the library's own\n"
    "algorithms run rank by rank on a device and comm that hold no data. Per rank: visible\n"
    "(query, key) pairs and FLOPs, bytes sent and received inside the all-to-all group / node\n"
    "and across, the peak workspace; the imbalance (max/mean - 1 of per-rank FLOPs); a coverage\n"
    "proof (every visible pair computed exactly once: per query position, the count, sum and\n"
    "sum of squares of the keys computed against the mask's); the predicted time of a hardware\n"
    "model. --sinks needs only the file's count (one per query head); with --backward their\n"
    "gradient's all-gather is counted. Exit status: 0 ok, 1 the coverage proof failed, 2 bad\n"
    "usage or a problem the library refuses.\n";

void cpt_cli_usage(const char *cmd, FILE *out) {
    int bit = cmd_bit(cmd);
    cpt_cli d;
    defaults(bit, &d);
    fprintf(out, "usage: ctxpar %s [options]\n\n%s\noptions:\n", cmd,
            bit == A   ? notes_audit
            : bit == B ? notes_bench
            : bit == P ? notes_plan
                       : notes_check);
    for (size_t i = 0; i < N_OPTIONS; i++) {
        const opt *o = &options[i];
        if (!o->name || !(o->cmds & bit))
            continue;
        char lhs[96], def[48], forms[80];
        const char *value = is_switch(o) ? NULL : value_text(o, forms, sizeof forms);
        snprintf(lhs, sizeof lhs, "%s%s%s", o->name, value ? " " : "", value ? value : "");
        default_text(o, &d, def, sizeof def);
        fprintf(out, "  %-36s %s%s%s%s\n", lhs, o->help, def[0] ? " [" : "", def,
                def[0] ? "]" : "");
    }
    fprintf(out, "  %-36s %s\n", "--help", "show this help");
}

const char *cpt_cli_message(const char *msg) {
    // "reference/npy.c:95: Q.npy: ..." -> "Q.npy: ..."
    const char *p = strstr(msg, ".c:"), *space = strchr(msg, ' ');
    if (!p || (space && space < p))
        return msg;
    p += 3;
    if (!isdigit((unsigned char)*p))
        return msg;
    while (isdigit((unsigned char)*p))
        p++;
    return p[0] == ':' && p[1] == ' ' ? p + 2 : msg;
}

static int parse_i64(const char *s, long long lo, long long hi, long long *out) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi || isspace((unsigned char)*s))
        return 0;
    *out = v;
    return 1;
}

static int pick(const char *s, const char *const *names, int n, int *out) {
    for (int i = 0; i < n; i++)
        if (strcmp(s, names[i]) == 0) {
            *out = i;
            return 1;
        }
    return 0;
}

// A comma list of integers in [lo, hi] into out (at most CPT_CLI_MAX_LIST); its length, or 0.
static int parse_list(const char *s, long long lo, long long hi, long long *out) {
    int n = 0;
    char buf[32];
    while (*s) {
        const char *comma = strchr(s, ',');
        size_t len = comma ? (size_t)(comma - s) : strlen(s);
        if (len == 0 || len >= sizeof buf || n == CPT_CLI_MAX_LIST)
            return 0;
        memcpy(buf, s, len);
        buf[len] = '\0';
        if (!parse_i64(buf, lo, hi, &out[n++]))
            return 0;
        s += len + (comma ? 1 : 0);
        if (comma && !*s)
            return 0; // a trailing comma
    }
    return n;
}

// An attention parameter's option, by its field's kind and range (params_table.h): an enum's
// name (the library's, so a new algorithm needs no change here), an integer from lo to INT32_MAX,
// a finite float from lo that is not 0 (0 is "unset": leave the option out), or a file, read
// after parsing. 0 when the value is not valid for it.
static int set_param(int i, const char *val, cpt_cli *cli) {
    const ctxpar_param_field *f = &ctxpar_param_fields[i];
    ctxpar_attn_params *p = &cli->cfg.params;
    switch (f->kind) {
    case CTXPAR_KIND_ENUM:
        for (int e = 0; e < 64 && strcmp(f->names(e), "?") != 0; e++)
            if (strcmp(val, f->names(e)) == 0) {
                ctxpar_param_set_int(p, f, e);
                return 1;
            }
        return 0;
    case CTXPAR_KIND_INT: {
        long long v;
        if (!parse_i64(val, f->lo > INT32_MIN ? (long long)f->lo : INT32_MIN, INT32_MAX, &v))
            return 0;
        ctxpar_param_set_int(p, f, v);
        return 1;
    }
    case CTXPAR_KIND_FLOAT: {
        char *end;
        errno = 0;
        const float x = (float)strtod(val, &end);
        if (errno || end == val || *end || !isfinite(x) || !(x >= f->lo) || x == 0.0f)
            return 0;
        ctxpar_param_set_float(p, f, x);
        return 1;
    }
    default: break;
    }
    switch (i) {
    case CTXPAR_PARAM_cu_seqlens: cli->cu_seqlens_path = val; return 1;
    case CTXPAR_PARAM_sinks: cli->sinks_path = val; return 1; // read once --heads is known
    case CTXPAR_PARAM_assignment: cli->assign_path = val; return 1;
    default: return 0; // a new pointer parameter's option needs its file read here
    }
}

// Sets one option's value; 0 when the value is not valid for it.
static int set_value(const opt *o, const char *val, cpt_cli *cli) {
    cpt_run_config *c = &cli->cfg;
    long long v, list[CPT_CLI_MAX_LIST];
    int e, n;
    if (o->id >= O_PARAM)
        return set_param(o->id - O_PARAM, val, cli);
    switch (o->id) {
    case O_DTYPE:
        if (!pick(val, dtype_names, 3, &e))
            return 0;
        c->dtype = (ctxpar_dtype)e;
        cli->dtype_set = 1;
        return 1;
    case O_COMM:
        if (!pick(val, comm_names, 2, &e))
            return 0;
        cli->comm = e + 1;
        return 1;
    case O_BACKEND:
        if ((e = cpt_run_backend_find(val)) < 0)
            return 0;
        c->backend = (cpt_run_backend)e;
        return 1;
    case O_SEED:
        if (!parse_i64(val, 0, LLONG_MAX, &v))
            return 0;
        c->seed = (uint64_t)v;
        return 1;
    case O_SEQ:
        if (!(n = parse_list(val, 1, INT32_MAX, list)))
            return 0;
        cli->n_seqs = n;
        for (int i = 0; i < n; i++)
            cli->seqs[i] = list[i];
        c->seq = list[0];
        return 1;
    case O_RANKS:
        // A plan holds no data: it models the largest jobs.
        if (!(n = parse_list(val, 1, cli->cmd == P ? 65536 : 1024, list)))
            return 0;
        cli->n_ranks = n;
        for (int i = 0; i < n; i++)
            cli->ranks[i] = (int)list[i];
        c->ranks = (int)list[0];
        cli->ranks_set = 1;
        return 1;
    case O_Q: cli->q_path = val; return 1;
    case O_K: cli->k_path = val; return 1;
    case O_V: cli->v_path = val; return 1;
    case O_DOUT: cli->dout_path = val; return 1;
    case O_SAVE: cli->save_dir = val; return 1;
    case O_INPUTS: cli->inputs_path = val; return 1;
    case O_AGAINST: cli->against_path = val; return 1;
    case O_SHARDS: cli->shards_pattern = val; return 1;
    case O_FORMAT: return pick(val, cpt_tformat_names, 4, &cli->format);
    case O_LSE_LAYOUT: return pick(val, cpt_lse_layout_names, 3, &cli->lse_layout);
    case O_LSE_BASE:
        if (strcmp(val, "e") && strcmp(val, "2"))
            return 0;
        cli->lse_base2 = val[0] == '2';
        return 1;
    case O_MAX_RATIO: {
        char *end;
        errno = 0;
        double r = strtod(val, &end);
        if (errno || end == val || *end || !(r >= 1.0) || !isfinite(r))
            return 0;
        cli->max_ratio = r;
        return 1;
    }
    case O_TRACE: cli->trace_path = val; return 1;
    case O_REPORT:
        cli->report_path = val;
        return 1;
    case O_CUDNN:
        if (strcmp(val, "auto") && strcmp(val, "on") && strcmp(val, "off"))
            return 0;
        cli->cudnn = val;
        return 1;
    case O_MODEL:
        cli->model = val;
        return 1;
    case O_DOC_DIST:
        if (strcmp(val, "uniform") && strcmp(val, "lognormal"))
            return 0;
        cli->doc_dist = val;
        return 1;
    case O_DOC_SIGMA: {
        char *end;
        errno = 0;
        double x = strtod(val, &end);
        if (errno || end == val || *end || !(x > 0) || !isfinite(x))
            return 0;
        cli->doc_sigma = x;
        return 1;
    }
    default: break;
    }
    if (!parse_i64(val, 0, INT32_MAX, &v))
        return 0;
    switch (o->id) {
    case O_BATCH: c->batch = v; break;
    case O_HEADS: c->heads = v; break;
    case O_KV_HEADS: c->kv_heads = v; break;
    case O_DIM: c->head_dim = v; break;
    case O_V_DIM: c->head_dim_v = v; break;
    case O_DOCS: c->docs = v; break;
    case O_ROWS: c->rows = v; break;
    case O_THREADS: c->threads = (int)v; break;
    case O_WARMUP: c->warmup = (int)v; break;
    case O_REPEAT:
        if (v < 1)
            return 0;
        c->repeat = (int)v;
        break;
    case O_GROUP_SIZE:
        if (v < 1)
            return 0;
        cli->group_size = (int)v;
        break;
    default: return 0;
    }
    return 1;
}

static void set_flag(const opt *o, cpt_cli *cli) {
    switch (o->id) {
    case O_BACKWARD: cli->cfg.backward = 1; break;
    case O_VERIFY: cli->cfg.verify_transfers = 1; break;
    case O_JSON: cli->json = 1; break;
    case O_CHECK: cli->cfg.compare_oracle = cli->cfg.compare_single = 1; break;
    case O_NO_CHECK: cli->cfg.compare_oracle = cli->cfg.compare_single = 0; break;
    case O_NO_SINGLE: cli->cfg.compare_single = 0; break;
    case O_SWEEP: cli->sweep = 1; break;
    case O_PEAK: cli->peak = 1; break;
    // clang-format off
    case O_NO_COVERAGE: cli->no_coverage = 1; break;
    case O_EXPLAIN: cli->explain = 1; break;
    case O_PER_RANK: cli->per_rank = 1; break;
    case O_SHARE_MEMBERS: cli->share_members = 1; break;
    // clang-format on
    default: break;
    }
}

static const opt *find_option(const char *a, size_t len) {
    for (size_t j = 0; j < N_OPTIONS; j++)
        if (options[j].name && strlen(options[j].name) == len && !strncmp(a, options[j].name, len))
            return &options[j];
    return NULL;
}

// --sinks: a float32 file of one logit per query head.
int cpt_cli_load_sinks(cpt_cli *cli, int64_t heads, char *msg, size_t n) {
    cpt_npy_array a;
    if (cpt_npy_read(cli->sinks_path, &a) != CTXPAR_OK) {
        snprintf(msg, n, "--sinks: %s", cpt_cli_message(ctxpar_last_error()));
        return 0;
    }
    int ok = a.dtype == CPT_NPY_F32 && a.ndim == 1 && (int64_t)a.count == heads &&
             a.count <= CPT_CLI_MAX_SINKS;
    if (!ok) {
        char sh[160];
        snprintf(msg, n, "--sinks %s: %s %s; want float32 [%lld] (one logit per query head)",
                 cli->sinks_path, cpt_npy_dtype_text(a.dtype),
                 cpt_audit_shape_text(a.ndim, a.shape, sh, sizeof sh), (long long)heads);
    } else {
        memcpy(cli->sinks, a.data, a.count * sizeof(float));
        cli->n_sinks = (int64_t)a.count;
        cli->cfg.params.sinks = cli->sinks;
    }
    cpt_npy_free(&a);
    return ok;
}

int32_t *cpt_cli_read_assignment(const char *path, int64_t *count_out, char *msg, size_t n) {
    cpt_npy_array a;
    if (cpt_npy_read(path, &a) != CTXPAR_OK) {
        snprintf(msg, n, "%s", ctxpar_last_error());
        return NULL;
    }
    const int ok = (a.dtype == CPT_NPY_I32 || a.dtype == CPT_NPY_I64) && a.ndim == 1 && a.count > 0;
    int32_t *assign = ok ? malloc(a.count * sizeof *assign) : NULL;
    if (!ok)
        snprintf(msg, n, "%s: want a 1-D int32 or int64 array (the rank of each token)", path);
    else if (!assign)
        snprintf(msg, n, "%s: no memory for %zu ranks", path, a.count);
    for (size_t i = 0; assign && i < a.count; i++) {
        int64_t v =
            a.dtype == CPT_NPY_I32 ? ((const int32_t *)a.data)[i] : ((const int64_t *)a.data)[i];
        assign[i] = v < INT32_MIN || v > INT32_MAX ? -1 : (int32_t)v; // the library refuses -1
    }
    *count_out = (int64_t)a.count;
    cpt_npy_free(&a);
    return assign;
}

// What no single flag can check: lists only with --sweep, required files, and so on.
// --assign FILE.npy, read once (the tool holds it until the next parse; the library checks each
// value is a rank).
static int32_t *loaded_assignment;

static int load_assignment(const char *cmd, cpt_cli *cli, FILE *err) {
    if ((cli->cfg.params.layout == CTXPAR_LAYOUT_CUSTOM) != (cli->assign_path != NULL)) {
        fprintf(err, "ctxpar %s: --layout custom and --assign FILE.npy go together\n", cmd);
        return 0;
    }
    if (!cli->assign_path)
        return 1;
    if (cli->sweep) { // a sweep varies --seq, an assignment fits one length
        fprintf(err, "ctxpar %s: --layout custom does not combine with --sweep\n", cmd);
        return 0;
    }
    char msg[4200];
    free(loaded_assignment);
    loaded_assignment =
        cpt_cli_read_assignment(cli->assign_path, &cli->assign_len, msg, sizeof msg);
    int ok = loaded_assignment != NULL;
    if (!ok)
        fprintf(err, "ctxpar %s: %s\n", cmd, msg);
    if (ok && cli->cmd != A && cli->assign_len != cli->cfg.seq) {
        fprintf(err, "ctxpar %s: %s holds %lld ranks but --seq is %lld\n", cmd, cli->assign_path,
                (long long)cli->assign_len, (long long)cli->cfg.seq);
        ok = 0;
    }
    cli->cfg.params.assignment = ok ? loaded_assignment : NULL;
    return ok;
}

// check and bench --cu-seqlens FILE.npy: [docs + 1] or [batch, docs + 1] (audit reads its own
// with the inputs, where the sequence comes from q). Held like the assignment.
static int32_t *loaded_cu_seqlens;

static int load_cu_seqlens(const char *cmd, cpt_cli *cli, FILE *err) {
    free(loaded_cu_seqlens);
    loaded_cu_seqlens = NULL;
    if (cli->cmd == A || !cli->cu_seqlens_path)
        return 1;
    if (cli->cfg.docs > 0 || cli->sweep) {
        fprintf(err, "ctxpar %s: --cu-seqlens does not combine with %s\n", cmd,
                cli->sweep ? "--sweep" : "--docs");
        return 0;
    }
    cpt_audit_src src;
    char where[4096];
    int64_t docs = 0, rows = 0;
    ctxpar_status st = cpt_audit_src_open(&src, cli->cu_seqlens_path);
    if (st == CTXPAR_OK)
        st = cpt_audit_read_cu_seqlens(&src, where, sizeof where, &loaded_cu_seqlens, &docs, &rows);
    cpt_audit_src_close(&src);
    if (st != CTXPAR_OK) {
        fprintf(err, "ctxpar %s: --cu-seqlens: %s\n", cmd, cpt_cli_message(ctxpar_last_error()));
        return 0;
    }
    const cpt_run_config *c = &cli->cfg;
    int ok = rows == 0 || rows == c->batch;
    if (!ok)
        fprintf(err, "ctxpar %s: %s has %lld rows of documents, but --batch is %lld\n", cmd,
                cli->cu_seqlens_path, (long long)rows, (long long)c->batch);
    for (int64_t r = 0; ok && r < (rows ? rows : 1); r++)
        if (loaded_cu_seqlens[r * (docs + 1) + docs] != c->seq) {
            fprintf(err, "ctxpar %s: %s%s ends at %d, but --seq is %lld\n", cmd,
                    cli->cu_seqlens_path, rows ? " (a row)" : "",
                    loaded_cu_seqlens[r * (docs + 1) + docs], (long long)c->seq);
            ok = 0;
        }
    cli->cfg.params.cu_seqlens = ok ? loaded_cu_seqlens : NULL;
    cli->cfg.params.num_docs = ok ? docs : 0;
    cli->cfg.params.cu_seqlens_rows = ok ? rows : 0;
    return ok;
}

static int check_combination(const char *cmd, cpt_cli *cli, FILE *err) {
    if (!load_assignment(cmd, cli, err) || !load_cu_seqlens(cmd, cli, err))
        return CPT_EXIT_USAGE;
    if (!cli->sweep && (cli->n_seqs > 1 || cli->n_ranks > 1)) {
        fprintf(err, "ctxpar %s: a list of values for --seq or --ranks needs --sweep\n", cmd);
        return CPT_EXIT_USAGE;
    }
    if (cli->sweep && cli->trace_path) {
        fprintf(err, "ctxpar %s: --trace records one run: leave out --sweep\n", cmd);
        return CPT_EXIT_USAGE;
    }
    int some_qkv = cli->q_path || cli->k_path || cli->v_path;
    if (cli->cmd == A && (some_qkv || (!cli->inputs_path && !cli->shards_pattern)) &&
        (!cli->q_path || !cli->k_path || !cli->v_path)) {
        fprintf(err,
                "ctxpar %s: --q, --k and --v are required, or --inputs or --shards (see ctxpar "
                "%s --help)\n",
                cmd, cmd);
        return CPT_EXIT_USAGE;
    }
    if (cli->cmd == A && some_qkv && cli->inputs_path) {
        fprintf(err, "ctxpar %s: give the inputs by --inputs or by --q, --k, --v, not both\n",
                cmd);
        return CPT_EXIT_USAGE;
    }
    if (cli->cudnn && strcmp(cpt_run_backend_name(cli->cfg.backend), "cuda") != 0) {
        fprintf(err, "ctxpar %s: --cudnn chooses the CUDA device's path: it needs --backend cuda\n",
                cmd);
        return CPT_EXIT_USAGE;
    }
    // The registry makes the devices by name: the CUDA device reads its cuDNN choice here.
    if (cli->cudnn && setenv("CTXPAR_CUDNN", cli->cudnn, 1) != 0) {
        fprintf(err, "ctxpar %s: --cudnn: cannot set CTXPAR_CUDNN\n", cmd);
        return CPT_EXIT_USAGE;
    }
    if (cli->peak && cli->cfg.backend != CPT_RUN_CPU) {
        fprintf(err, "ctxpar %s: --peak measures the CPU cores: leave out --backend\n", cmd);
        return CPT_EXIT_USAGE;
    }
    if (!cpt_run_backend_available(cli->cfg.backend)) {
        fprintf(err, "ctxpar %s: backend '%s' is not built into this binary\n", cmd,
                cpt_run_backend_name(cli->cfg.backend));
        return CPT_EXIT_USAGE;
    }
    return -1;
}

int cpt_cli_parse(const char *cmd, int argc, char **argv, cpt_cli *cli, FILE *out,
                     FILE *err) {
    int bit = cmd_bit(cmd);
    defaults(bit, cli);
    cli->n_seqs = cli->n_ranks = 1;
    cli->seqs[0] = cli->cfg.seq;
    cli->ranks[0] = cli->cfg.ranks;
    int kv_heads_set = 0;
    char forms[80];
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            cpt_cli_usage(cmd, out);
            return CPT_EXIT_OK;
        }
        // Accept both "--name value" and "--name=value".
        const char *eq = strncmp(a, "--", 2) == 0 ? strchr(a, '=') : NULL;
        const opt *o = find_option(a, eq ? (size_t)(eq - a) : strlen(a));
        if (!o) {
            fprintf(err, "ctxpar %s: unknown option '%s' (see ctxpar %s --help)\n", cmd, a, cmd);
            return CPT_EXIT_USAGE;
        }
        if (!(o->cmds & bit)) {
            fprintf(err, "ctxpar %s: %s does not apply to %s%s\n", cmd, o->name, cmd,
                    bit == A && (o->cmds & C) ? " (the shapes come from the input files)" : "");
            return CPT_EXIT_USAGE;
        }
        if (is_switch(o)) {
            if (eq) {
                fprintf(err, "ctxpar %s: %s takes no value\n", cmd, o->name);
                return CPT_EXIT_USAGE;
            }
            if (o->flag)
                set_flag(o, cli);
            else
                (void)set_param(o->id - O_PARAM, "1", cli);
            continue;
        }
        const char *val = eq ? eq + 1 : (i + 1 < argc ? argv[++i] : NULL);
        if (!val) {
            fprintf(err, "ctxpar %s: %s needs a value (%s)\n", cmd, o->name,
                    value_text(o, forms, sizeof forms));
            return CPT_EXIT_USAGE;
        }
        if (!set_value(o, val, cli) && o->id == O_BACKEND) {
            fprintf(err, "ctxpar %s: unknown backend '%s' (built into this binary: ", cmd, val);
            print_backend_names(err);
            fprintf(err, "; see ctxpar --list-backends)\n");
            return CPT_EXIT_USAGE;
        }
        if (!set_value(o, val, cli)) {
            fprintf(err, "ctxpar %s: bad value '%s' for %s (want %s: %s)\n", cmd, val, o->name,
                    value_text(o, forms, sizeof forms), o->help);
            return CPT_EXIT_USAGE;
        }
        kv_heads_set |= o->id == O_KV_HEADS && cli->cfg.kv_heads != 0;
    }
    if (!kv_heads_set)
        cli->cfg.kv_heads = cli->cfg.heads;
    char msg[1024];
    if (cli->sinks_path && bit != A && // audit: once q gives the heads (cmd_audit.c)
        !cpt_cli_load_sinks(cli, cli->cfg.heads, msg, sizeof msg)) {
        fprintf(err, "ctxpar %s: %s\n", cmd, msg);
        return CPT_EXIT_USAGE;
    }
    return check_combination(cmd, cli, err);
}
