// Flag parsing for the `ctxpar` tool: one table of options, strict values, one-line errors.
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

typedef enum opt_kind { OPT_INT, OPT_U64, OPT_FLAG, OPT_DTYPE, OPT_MASK, OPT_ALGO, OPT_LAYOUT,
                        OPT_PATH, OPT_COMM } opt_kind;

typedef struct opt {
    const char *name;
    opt_kind kind;
    const char *help;
} opt;

static const opt options[] = {
    {"--ranks", OPT_INT, "number of ranks P (in-process threads)            [4]"},
    {"--batch", OPT_INT, "batch size                                         [1]"},
    {"--seq", OPT_INT, "global sequence length                             [4096]"},
    {"--heads", OPT_INT, "query heads                                        [4]"},
    {"--kv-heads", OPT_INT, "key/value heads (divides heads; 0 = heads)         [heads]"},
    {"--dim", OPT_INT, "head dimension                                     [64]"},
    {"--dtype", OPT_DTYPE, "f32 | bf16 | f16                                   [f32]"},
    {"--mask", OPT_MASK, "none | causal                                      [causal]"},
    {"--window", OPT_INT, "sliding window: query i sees keys k with i-k < W  [0 = none]"},
    {"--algo", OPT_ALGO, "ring | allgather | auto                            [ring]"},
    {"--layout", OPT_LAYOUT, "contiguous | zigzag | striped                      [zigzag]"},
    {"--backward", OPT_FLAG, "also run the backward pass (dq, dk, dv)"},
    {"--seed", OPT_U64, "seed of the input data                             [42]"},
    {"--threads", OPT_INT, "OpenMP threads per rank                  [cores / ranks]"},
    {"--repeat", OPT_INT, "timed repetitions (the median is reported)         [1]"},
    {"--verify-transfers", OPT_FLAG, "checksum every block sent between ranks"},
    {"--comm", OPT_COMM, "local (threads) | mpi     [mpi under mpirun, else local]"},
    {"--json", OPT_FLAG, "print one JSON object instead of the table"},
    {"--trace", OPT_PATH, "write a Chrome trace (per rank: compute, transfer) to FILE"},
};

void ctxpar_cli_usage(const char *cmd, FILE *out) {
    fprintf(out, "usage: ctxpar %s [options]\n\noptions:\n", cmd);
    for (size_t i = 0; i < sizeof options / sizeof options[0]; i++)
        fprintf(out, "  %-20s %s\n", options[i].name, options[i].help);
    fprintf(out, "  %-20s %s\n", "--help", "show this help");
}

static int parse_i64(const char *s, long long lo, long long hi, long long *out) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
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

static int set_value(const opt *o, const char *val, ctxpar_cli *cli) {
    ctxpar_run_config *c = &cli->cfg;
    long long v;
    int e;
    static const char *const dtypes[] = {"f32", "f16", "bf16"};
    static const char *const masks[] = {"none", "causal"};
    static const char *const algos[] = {"auto", "ring", "allgather", "alltoall"};
    static const char *const layouts[] = {"contiguous", "zigzag", "striped"};
    switch (o->kind) {
    case OPT_DTYPE:
        if (!pick(val, dtypes, 3, &e))
            return 0;
        c->dtype = (ctxpar_dtype)e;
        return 1;
    case OPT_MASK:
        if (!pick(val, masks, 2, &e))
            return 0;
        c->params.mask = (ctxpar_mask)e;
        return 1;
    case OPT_ALGO:
        if (!pick(val, algos, 4, &e))
            return 0;
        c->params.algo = (ctxpar_algo)e;
        return 1;
    case OPT_LAYOUT:
        if (!pick(val, layouts, 3, &e))
            return 0;
        c->params.layout = (ctxpar_layout)e;
        return 1;
    case OPT_PATH:
        cli->trace_path = val;
        return 1;
    case OPT_COMM: {
        static const char *const comms[] = {"local", "mpi"};
        if (!pick(val, comms, 2, &e))
            return 0;
        cli->comm = e + 1;
        return 1;
    }
    case OPT_U64:
        if (!parse_i64(val, 0, LLONG_MAX, &v))
            return 0;
        c->seed = (uint64_t)v;
        return 1;
    case OPT_INT:
        break;
    case OPT_FLAG:
        return 0;
    }
    if (!parse_i64(val, 0, INT_MAX, &v))
        return 0;
    const char *n = o->name;
    if (!strcmp(n, "--ranks")) c->ranks = (int)v;
    else if (!strcmp(n, "--batch")) c->batch = v;
    else if (!strcmp(n, "--seq")) c->seq = v;
    else if (!strcmp(n, "--heads")) c->heads = v;
    else if (!strcmp(n, "--kv-heads")) c->kv_heads = v;
    else if (!strcmp(n, "--dim")) c->head_dim = v;
    else if (!strcmp(n, "--window")) c->params.window_left = v;
    else if (!strcmp(n, "--threads")) c->threads = (int)v;
    else if (!strcmp(n, "--repeat")) c->repeat = (int)v;
    return 1;
}

static void set_flag(const opt *o, ctxpar_cli *cli) {
    if (!strcmp(o->name, "--backward"))
        cli->cfg.backward = 1;
    else if (!strcmp(o->name, "--verify-transfers"))
        cli->cfg.verify_transfers = 1;
    else if (!strcmp(o->name, "--json"))
        cli->json = 1;
}

int ctxpar_cli_parse(const char *cmd, int argc, char **argv, ctxpar_cli *cli, FILE *out,
                     FILE *err) {
    memset(cli, 0, sizeof *cli);
    ctxpar_run_config_default(&cli->cfg);
    int kv_heads_set = 0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            ctxpar_cli_usage(cmd, out);
            return CTXPAR_EXIT_OK;
        }
        // Accept both "--name value" and "--name=value".
        const char *eq = strchr(a, '=');
        size_t len = eq ? (size_t)(eq - a) : strlen(a);
        const opt *o = NULL;
        for (size_t j = 0; j < sizeof options / sizeof options[0]; j++)
            if (strlen(options[j].name) == len && !strncmp(a, options[j].name, len))
                o = &options[j];
        if (!o) {
            fprintf(err, "ctxpar %s: unknown option '%s' (see ctxpar %s --help)\n", cmd, a, cmd);
            return CTXPAR_EXIT_USAGE;
        }
        if (o->kind == OPT_FLAG) {
            if (eq) {
                fprintf(err, "ctxpar %s: %s takes no value\n", cmd, o->name);
                return CTXPAR_EXIT_USAGE;
            }
            set_flag(o, cli);
            continue;
        }
        const char *val = eq ? eq + 1 : (i + 1 < argc ? argv[++i] : NULL);
        if (!val) {
            fprintf(err, "ctxpar %s: %s needs a value\n", cmd, o->name);
            return CTXPAR_EXIT_USAGE;
        }
        if (!set_value(o, val, cli)) {
            fprintf(err, "ctxpar %s: bad value '%s' for %s (%s)\n", cmd, val, o->name, o->help);
            return CTXPAR_EXIT_USAGE;
        }
        kv_heads_set |= !strcmp(o->name, "--kv-heads") && cli->cfg.kv_heads != 0;
    }
    if (!kv_heads_set)
        cli->cfg.kv_heads = cli->cfg.heads;
    return -1;
}
