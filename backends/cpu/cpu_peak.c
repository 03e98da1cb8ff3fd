// ctxpar_cpu_measure_peak: the FP32 multiply-add peak of the cores, measured with the kernel
// table's own vectors (cpu_kernels.h, fma_chains).
#define _POSIX_C_SOURCE 200809L
#include <stddef.h>
#include <string.h>
#include <time.h>

#include "backends/cpu/cpu_internal.h"
#include "backends/cpu/cpu_uarch.h"
#include "ctxpar_cpu.h"

// A round should last long enough that clock granularity and the loop's start-up do not matter
// (microseconds), and short enough that the whole probe stays well under a second. Many short
// rounds, keeping the best: on a virtual machine a thread's CPU clock also runs while the host
// has taken the core away, so an unlucky round reads low.
#define ROUND_SECONDS 0.01
#define ROUNDS 10

static double seconds_of(clockid_t clock) {
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// Best FLOP/s of one thread over `rounds` rounds, per second of this thread's CPU time. `sink`
// receives the loop's result so that no round can be optimised away.
static double thread_peak(const ctxpar_cpu_kernels *kern, int64_t iters, int rounds,
                          volatile float *sink) {
    const double flops = 2.0 * kern->vector_lanes * CTXPAR_CPU_FMA_CHAINS * (double)iters;
    double best = 0.0;
    for (int r = 0; r < rounds; r++) {
        double t0 = seconds_of(CLOCK_THREAD_CPUTIME_ID);
        *sink = kern->fma_chains(iters);
        double t = seconds_of(CLOCK_THREAD_CPUTIME_ID) - t0;
        if (t > 0 && flops / t > best)
            best = flops / t;
    }
    return best;
}

// Iterations for one round of about round_s on this core: doubled from a small count until
// a round takes a tenth of that, then scaled.
static int64_t calibrate(const ctxpar_cpu_kernels *kern, double round_s, volatile float *sink) {
    int64_t iters = 1024;
    for (;;) {
        double t0 = seconds_of(CLOCK_THREAD_CPUTIME_ID);
        *sink = kern->fma_chains(iters);
        double t = seconds_of(CLOCK_THREAD_CPUTIME_ID) - t0;
        if (t >= round_s / 10 || iters >= ((int64_t)1 << 40))
            return (int64_t)((double)iters * (round_s / (t > 0 ? t : round_s / 10)));
        iters *= 2;
    }
}

double ctxpar_cpu_thread_fma_rate(const ctxpar_cpu_kernels *kern, int rounds,
                                  double round_seconds) {
    volatile float sink = 0.0f;
    return thread_peak(kern, calibrate(kern, round_seconds, &sink), rounds, &sink);
}

ctxpar_status ctxpar_cpu_measure_peak(const ctxpar_device *device, ctxpar_cpu_peak *peak) {
    if (!peak)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "cpu_measure_peak: peak is NULL");
    const size_t need = offsetof(ctxpar_cpu_peak, seconds) + sizeof peak->seconds;
    if (peak->struct_size < need)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG,
                            "cpu_measure_peak: peak->struct_size (%zu) < %zu: initialise it with "
                            "CTXPAR_CPU_PEAK_INIT",
                            peak->struct_size, need);
    const ctxpar_cpu_device *cpu = ctxpar_cpu_device_of(device);
    if (!cpu)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "cpu_measure_peak: device is %s",
                            device ? "not a CPU device" : "NULL");
    const ctxpar_cpu_kernels *kern = cpu->kern;
    const int threads = ctxpar_cpu_threads(cpu);
    const double start = seconds_of(CLOCK_MONOTONIC);
    volatile float sink = 0.0f;
    const int64_t iters = calibrate(kern, ROUND_SECONDS, &sink);
    double per_thread_sum = 0.0;
    int ran = 0; // the threads OpenMP gave (fewer than asked inside another parallel region)
    const double w0 = seconds_of(CLOCK_MONOTONIC);
#pragma omp parallel num_threads(threads) reduction(+ : per_thread_sum, ran)
    {
        volatile float own_sink = 0.0f;
        per_thread_sum += thread_peak(kern, iters, ROUNDS, &own_sink);
        ran += 1;
    }
    const double end = seconds_of(CLOCK_MONOTONIC);
    // The threads ran ROUNDS rounds each, side by side: all threads' FLOPs over the wall time.
    const double all_flops =
        2.0 * kern->vector_lanes * CTXPAR_CPU_FMA_CHAINS * (double)iters * ROUNDS * ran;
    ctxpar_cpu_peak r;
    memset(&r, 0, sizeof r);
    r.struct_size = peak->struct_size < sizeof r ? peak->struct_size : sizeof r;
    r.kernels = kern->name;
    r.vector_lanes = kern->vector_lanes;
    r.threads = ran;
    r.flops_per_core = per_thread_sum / ran;
    r.flops_all_threads = end > w0 ? all_flops / (end - w0) : 0.0;
    r.seconds = end - start;
    r.uarch = ctxpar_cpu_uarch_name(cpu->uarch);
    r.tiles = kern->tiles;
    memcpy(peak, &r, r.struct_size);
    return CTXPAR_OK;
}
