/*
 * accuracy_table - ctxpar's F32 error against float64 next to naive float32's, for every input
 * distribution and dO = random / 1 (the table of docs/numerics.md):
 *
 *   bazel run //testing:accuracy_table -- [seq [head_dim [heads [ranks [mask [algo [kv_heads
 *                                          [dist]]]]]]]]
 *
 * defaults 4096 32 2 4 causal ring (kv_heads = heads), every distribution; mask none, causal, or
 * docs (causal, four documents of 1/10, 1/2, 1 token and the rest of the sequence); dist one of
 * uniform01, normal, clamped, sharp (one distribution: the long cases). Each row: max |err| of
 * ctxpar and of naive float32 per tensor, their ratio, both error/bound ratios, and ctxpar's /
 * naive's error by position quartile.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testing/accuracy.h"

int main(int argc, char **argv) {
    cpt_acc_case c;
    cpt_run_config_default(&c.run);
    c.run.seq = argc > 1 ? atoll(argv[1]) : 4096;
    c.run.head_dim = argc > 2 ? atoll(argv[2]) : 32;
    c.run.heads = c.run.kv_heads = argc > 3 ? atoll(argv[3]) : 2;
    c.run.ranks = argc > 4 ? atoi(argv[4]) : 4;
    c.run.params.mask = argc > 5 && strcmp(argv[5], "none") == 0 ? CTXPAR_MASK_NONE
                                                                  : CTXPAR_MASK_CAUSAL;
    int32_t docs[5] = {0, (int32_t)(c.run.seq / 10), (int32_t)(c.run.seq / 10 * 6),
                       (int32_t)(c.run.seq / 10 * 6 + 1), (int32_t)c.run.seq};
    if (argc > 5 && strcmp(argv[5], "docs") == 0) {
        c.run.params.cu_seqlens = docs;
        c.run.params.num_docs = 4;
    }
    if (argc > 7)
        c.run.kv_heads = atoll(argv[7]);
    for (int a = CTXPAR_ALGO_RING; argc > 6 && a <= CTXPAR_ALGO_ALLTOALL; a++)
        if (strcmp(argv[6], ctxpar_algo_name((ctxpar_algo)a)) == 0)
            c.run.params.algo = (ctxpar_algo)a;
    c.run.backward = 1;
    c.run.seed = 42;
    printf("seq %lld, head_dim %lld, heads %lld/%lld, %d ranks, %s, %s; max |x - fp64|\n",
           (long long)c.run.seq, (long long)c.run.head_dim, (long long)c.run.heads,
           (long long)c.run.kv_heads, c.run.ranks,
           c.run.params.num_docs ? "causal documents"
           : c.run.params.mask == CTXPAR_MASK_CAUSAL ? "causal"
                                                     : "no mask",
           ctxpar_algo_name(c.run.params.algo));
    printf("%-10s %-4s %-4s %10s %10s %6s %7s %7s   %-35s %-35s\n", "inputs", "dO", "",
           "ctxpar", "naive f32", "ratio", "c/bound", "n/bound", "ctxpar by quartile",
           "naive by quartile");
    int worse = 0;
    for (int d = 0; d < CPT_DIST_COUNT; d++)
        for (int ones = 0; ones <= 1; ones++) {
            if (argc > 8 && strcmp(argv[8], cpt_acc_dist_name((cpt_acc_dist)d)) != 0)
                continue;
            c.dist = (cpt_acc_dist)d;
            c.dout_ones = ones;
            cpt_acc_result r;
            if (cpt_acc_run(&c, &r) != CTXPAR_OK) {
                fprintf(stderr, "accuracy_table: %s\n", ctxpar_last_error());
                return 1;
            }
            for (int t = 0; t < CPT_RUN_TENSORS; t++) {
                printf("%-10s %-4s %-4s %10.2e %10.2e %6.2f %7.3f %7.3f  ",
                       cpt_acc_dist_name(c.dist), ones ? "1" : "rand",
                       cpt_run_tensor_name((cpt_run_tensor)t), r.err[0][t], r.err[1][t],
                       r.err[0][t] / r.err[1][t], r.bound_ratio[0][t], r.bound_ratio[1][t]);
                for (int s = 0; s < 2; s++) {
                    for (int k = 0; k < CPT_ACC_QUARTILES; k++)
                        printf(" %.2e", r.quart[s][t][k]);
                    printf(" ");
                }
                printf("\n");
                worse += r.err[0][t] > r.err[1][t];
            }
        }
    printf("tensors where ctxpar's error exceeds naive float32's: %d\n", worse);
    return 0;
}
