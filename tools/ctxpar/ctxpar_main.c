// The `ctxpar` command-line tool: check, audit, bench, plan.
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "commands.h"

typedef struct command {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *help;
} command;

static const command commands[] = {
    {"check", cpt_cmd_check,
     "run context-parallel attention on generated inputs; compare with fp64 and P = 1"},
    {"audit", cpt_cmd_audit,
     "the same on your own Q, K, V (dO): .npy, .safetensors or per-rank shards; --against judges "
     "results made elsewhere"},
    {"bench", cpt_cmd_bench,
     "throughput, memory, compute vs transfer, next to one rank; --sweep for a table"},
    {"plan", cpt_cmd_plan,
     "what a run does on every rank (work, bytes, balance, coverage, time), without running it"},
};

static void usage(FILE *f) {
    fprintf(f, "usage: ctxpar <command> [options]   (ctxpar <command> --help for its options)\n\n"
               "commands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-8s %s\n", commands[i].name, commands[i].help);
    fprintf(f, "\n  --version        print the version\n"
               "  --list-backends  the devices --backend accepts, and whether each can run here\n");
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return CPT_EXIT_USAGE;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return CPT_EXIT_OK;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("ctxpar %s\n", ctxpar_version());
        return CPT_EXIT_OK;
    }
    if (!strcmp(argv[1], "--list-backends")) {
        cpt_cli_list_backends(stdout);
        return CPT_EXIT_OK;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name))
            return commands[i].run(argc - 2, argv + 2);
    fprintf(stderr, "ctxpar: unknown command '%s' (see ctxpar --help)\n", argv[1]);
    return CPT_EXIT_USAGE;
}
