// cpu_bench: GFLOP/s of the CPU block kernels (forward and backward) on F32 inputs, no mask.
//   bazel run -c opt //backends/cpu:cpu_bench -- [seq] [heads] [threads] [reps]
// Forward FLOPs = 4*B*H*Sq*Sk*D (two matrix products); backward = 10*B*H*Sq*Sk*D (five; the
// kernel recomputes S and dP in its second pass, so it does 14 of that work).
#include <stdio.h>
#include <stdlib.h>

#include "backends/cpu/cpu_internal.h"
#include "ctxpar_cpu.h"

static void fill(float *x, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        x[i] = (float)((seed >> 8) * (1.0 / 16777216.0)) - 0.5f;
    }
}

static int run(ctxpar_device *dev, int64_t seq, int64_t heads, int64_t dim, int reps) {
    size_t n = (size_t)(seq * heads * dim);
    float *q = malloc(n * sizeof *q), *k = malloc(n * sizeof *k), *v = malloc(n * sizeof *v);
    float *o = malloc(n * sizeof *o), *dout = malloc(n * sizeof *dout);
    float *dq = malloc(n * sizeof *dq), *dk = malloc(n * sizeof *dk), *dv = malloc(n * sizeof *dv);
    float *lse = malloc((size_t)(seq * heads) * sizeof *lse);
    float *delta = malloc((size_t)(seq * heads) * sizeof *delta);
    int rc = 1;
    if (!q || !k || !v || !o || !dout || !dq || !dk || !dv || !lse || !delta) {
        fprintf(stderr, "cpu_bench: out of memory\n");
        goto done;
    }
    fill(q, n, 1);
    fill(k, n, 2);
    fill(v, n, 3);
    fill(dout, n, 4);
    ctxpar_span span = {0, seq, 1};
    ctxpar_attn_block blk = {
        .q = ctxpar_tensor_bshd(q, CTXPAR_DTYPE_F32, 1, seq, heads, dim),
        .k = ctxpar_tensor_bshd(k, CTXPAR_DTYPE_F32, 1, seq, heads, dim),
        .v = ctxpar_tensor_bshd(v, CTXPAR_DTYPE_F32, 1, seq, heads, dim),
        .q_pos = {&span, 1},
        .k_pos = {&span, 1},
        .mask = {0, 0, NULL, 0},
        .scale = 0.125f,
    };
    ctxpar_tensor ot = ctxpar_tensor_bshd(o, CTXPAR_DTYPE_F32, 1, seq, heads, dim);
    ctxpar_tensor dot = ctxpar_tensor_bshd(dout, CTXPAR_DTYPE_F32, 1, seq, heads, dim);
    const double flops = 4.0 * (double)heads * (double)seq * (double)seq * (double)dim;
    double best_f = 1e30, best_b = 1e30;
    for (int r = 0; r < reps; r++) {
        double t0 = ctxpar_now();
        if (ctxpar_dev_attn_block_fwd(dev, &blk, o, lse, 0, NULL) != CTXPAR_OK)
            goto fail;
        double t1 = ctxpar_now();
        if (ctxpar_dev_attn_bwd_prep(dev, &ot, &dot, delta, NULL) != CTXPAR_OK)
            goto fail;
        double t2 = ctxpar_now();
        if (ctxpar_dev_attn_block_bwd(dev, &blk, &dot, lse, delta, dq, dk, dv, NULL) != CTXPAR_OK)
            goto fail;
        double t3 = ctxpar_now();
        best_f = t1 - t0 < best_f ? t1 - t0 : best_f;
        best_b = t3 - t2 < best_b ? t3 - t2 : best_b;
    }
    printf("seq %lld heads %lld dim %3lld  fwd %7.3f s %6.1f GFLOP/s   bwd %7.3f s %6.1f GFLOP/s "
           "(2.5x fwd FLOPs)\n",
           (long long)seq, (long long)heads, (long long)dim, best_f, flops / best_f * 1e-9, best_b,
           2.5 * flops / best_b * 1e-9);
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "cpu_bench: %s\n", ctxpar_last_error());
done:
    free(q), free(k), free(v), free(o), free(dout), free(dq), free(dk), free(dv), free(lse);
    free(delta);
    return rc;
}

int main(int argc, char **argv) {
    int64_t seq = argc > 1 ? atoll(argv[1]) : 4096;
    int64_t heads = argc > 2 ? atoll(argv[2]) : 4;
    int threads = argc > 3 ? atoi(argv[3]) : 1;
    int reps = argc > 4 ? atoi(argv[4]) : 3;
    ctxpar_cpu_options opt = CTXPAR_CPU_OPTIONS_INIT;
    opt.num_threads = threads;
    ctxpar_device *dev = NULL;
    if (ctxpar_device_create_cpu(&opt, &dev) != CTXPAR_OK) {
        fprintf(stderr, "cpu_bench: %s\n", ctxpar_last_error());
        return 1;
    }
    printf("cpu kernels: %s, threads %d\n", ctxpar_cpu_kernels_name(dev), threads);
    int rc = run(dev, seq, heads, 64, reps) || run(dev, seq, heads, 128, reps);
    ctxpar_device_destroy(dev);
    return rc;
}
