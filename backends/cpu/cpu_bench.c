// cpu_bench: GFLOP/s of the CPU block kernels (forward and backward) on F32 inputs.
//   bazel run -c opt //backends/cpu:cpu_bench -- [seq] [heads] [threads] [reps] [window] [dim]
// CTXPAR_CPU_UARCH=zen4|... in the environment forces a core class (its register tiles),
// CTXPAR_CPU_KERNELS=generic|avx2|avx512 an instruction set.
// window: 0 = no mask (default), -1 = causal, W > 0 = causal with a left window of W.
// dim: 0 = head_dim 64 and 128 (default), else that head_dim only.
// Forward FLOPs = 4*D per visible (query, key) pair (two matrix products: 4*B*H*Sq*Sk*D without
// a mask); backward = 10*D per pair (five; the kernel recomputes S and dP in its second pass, so
// it does 14), bwd_prep included.
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "backends/cpu/cpu_internal.h"
#include "backends/cpu/cpu_uarch.h"
#include "ctxpar_cpu.h"
#include "dispatch.h"

// CPU seconds of the whole process: on a shared machine the rate per CPU-second is the kernel's
// own speed (with one thread), while the wall-clock rate also counts time other jobs ran.
static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void fill(float *x, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        x[i] = (float)((seed >> 8) * (1.0 / 16777216.0)) - 0.5f;
    }
}

// Visible (query, key) pairs of one head with positions 0 .. seq-1 on both sides.
static double visible_pairs(int64_t seq, int64_t window) {
    if (window == 0)
        return (double)seq * (double)seq;
    double n = 0;
    for (int64_t q = 0; q < seq; q++)
        n += (double)(window > 0 && q + 1 > window ? window : q + 1);
    return n;
}

static int run(ctxpar_device *dev, int64_t seq, int64_t heads, int64_t dim, int reps,
               int64_t window) {
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
        .mask = {window != 0, window > 0 ? window : 0, NULL, 0},
        .scale = 0.125f,
    };
    ctxpar_tensor ot = ctxpar_tensor_bshd(o, CTXPAR_DTYPE_F32, 1, seq, heads, dim);
    ctxpar_tensor dot = ctxpar_tensor_bshd(dout, CTXPAR_DTYPE_F32, 1, seq, heads, dim);
    const double flops = 4.0 * (double)heads * visible_pairs(seq, window) * (double)dim;
    double wall_f = 1e30, wall_b = 1e30, cpu_f = 1e30, cpu_b = 1e30;
    for (int r = 0; r < reps; r++) {
        double w0 = ctxpar_now(), c0 = cpu_now();
        if (ctxpar_dev_attn_block_fwd(dev, &blk, o, lse, 0, NULL) != CTXPAR_OK)
            goto fail;
        double w1 = ctxpar_now(), c1 = cpu_now();
        if (ctxpar_dev_attn_bwd_prep(dev, &ot, &dot, delta, NULL) != CTXPAR_OK)
            goto fail;
        if (ctxpar_dev_attn_block_bwd(dev, &blk, &dot, lse, delta, dq, dk, dv, NULL) != CTXPAR_OK)
            goto fail;
        double w2 = ctxpar_now(), c2 = cpu_now();
        wall_f = w1 - w0 < wall_f ? w1 - w0 : wall_f;
        wall_b = w2 - w1 < wall_b ? w2 - w1 : wall_b;
        cpu_f = c1 - c0 < cpu_f ? c1 - c0 : cpu_f;
        cpu_b = c2 - c1 < cpu_b ? c2 - c1 : cpu_b;
    }
    printf("seq %lld heads %lld dim %3lld  fwd %6.1f GFLOP/s (%6.1f per CPU-s)   "
           "bwd %6.1f GFLOP/s (%6.1f per CPU-s)\n",
           (long long)seq, (long long)heads, (long long)dim, flops / wall_f * 1e-9,
           flops / cpu_f * 1e-9, 2.5 * flops / wall_b * 1e-9, 2.5 * flops / cpu_b * 1e-9);
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
    int64_t window = argc > 5 ? atoll(argv[5]) : 0;
    int64_t dim = argc > 6 ? atoll(argv[6]) : 0;
    ctxpar_cpu_options opt = CTXPAR_CPU_OPTIONS_INIT;
    opt.num_threads = threads;
    const char *uarch = getenv("CTXPAR_CPU_UARCH"); // to compare tiles on one machine
    if (uarch && *uarch && ctxpar_cpu_uarch_parse(uarch, &opt.uarch) != CTXPAR_OK) {
        fprintf(stderr, "cpu_bench: CTXPAR_CPU_UARCH: %s\n", ctxpar_last_error());
        return 1;
    }
    const char *isa = getenv("CTXPAR_CPU_KERNELS"); // to compare instruction sets on one machine
    if (isa && *isa && ctxpar_cpu_isa_parse(isa, &opt.kernels) != CTXPAR_OK) {
        fprintf(stderr, "cpu_bench: CTXPAR_CPU_KERNELS: %s\n", ctxpar_last_error());
        return 1;
    }
    ctxpar_device *dev = NULL;
    if (ctxpar_device_create_cpu(&opt, &dev) != CTXPAR_OK) {
        fprintf(stderr, "cpu_bench: %s\n", ctxpar_last_error());
        return 1;
    }
    const ctxpar_cpu_device *cpu = ctxpar_cpu_device_of(dev);
    printf("cpu kernels: %s, tiles %s (uarch %s), threads %d\n", cpu->kern->name, cpu->kern->tiles,
           ctxpar_cpu_uarch_name(cpu->uarch), threads);
    ctxpar_cpu_peak peak = CTXPAR_CPU_PEAK_INIT;
    if (ctxpar_cpu_measure_peak(dev, &peak) == CTXPAR_OK)
        printf("measured FP32 FMA peak (%s, %d lanes): %.1f GFLOP/s per core-second\n",
               peak.kernels, peak.vector_lanes, peak.flops_per_core * 1e-9);
    printf("mask: %s\n", window == 0 ? "none" : window < 0 ? "causal" : "causal + window");
    int rc =
        dim > 0 ? run(dev, seq, heads, dim, reps, window)
                : run(dev, seq, heads, 64, reps, window) || run(dev, seq, heads, 128, reps, window);
    ctxpar_device_destroy(dev);
    return rc;
}
