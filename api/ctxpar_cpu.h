/*
 * ctxpar_cpu.h - the CPU reference device: OpenMP kernels, F32 accumulation, deterministic
 * (bitwise identical results run to run and for any number of threads).
 */
#ifndef CTXPAR_CPU_H
#define CTXPAR_CPU_H

#include "ctxpar.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Options for the CPU device. Initialise with CTXPAR_CPU_OPTIONS_INIT. */
typedef struct ctxpar_cpu_options {
    size_t struct_size;
    /* OpenMP threads used by this device's kernels; 0 = the OpenMP default
     * (OMP_NUM_THREADS or the number of cores). */
    int num_threads;
} ctxpar_cpu_options;

#define CTXPAR_CPU_OPTIONS_INIT { sizeof(ctxpar_cpu_options), 0 }

/* Creates a CPU device; options may be NULL. Memory it uses is ordinary host memory, so tensors
 * passed to a context on it are host pointers. Destroy with ctxpar_device_destroy. */
ctxpar_status ctxpar_device_create_cpu(const ctxpar_cpu_options *options,
                                       ctxpar_device **device_out);

/* The FP32 peak of the cores a CPU device runs on, measured, not looked up: a loop of independent
 * fused multiply-adds on the vector instructions the device's kernels use (so a machine whose
 * FMA units are narrower than its registers reports what it really does). Benchmarks divide
 * their FLOP/s by it to give a percentage of peak that compares across machines. */
typedef struct ctxpar_cpu_peak {
    size_t struct_size;
    const char *kernels;   /* the instruction set measured: "avx512", "avx2" or "generic" */
    int vector_lanes;      /* FP32 lanes per vector instruction */
    int threads;           /* threads measured at once (the device's thread count) */
    /* FLOP/s of one core: per thread, FLOPs over the thread's own CPU time (so time the OS gave
     * to other processes does not count), best of 10 rounds; the mean over the threads. */
    double flops_per_core;
    /* FLOP/s of all threads together, per wall-clock second (less than threads x flops_per_core
     * when threads share cores or other processes run). */
    double flops_all_threads;
    double seconds;        /* wall-clock time the measurement took */
} ctxpar_cpu_peak;

#define CTXPAR_CPU_PEAK_INIT { sizeof(ctxpar_cpu_peak), NULL, 0, 0, 0.0, 0.0, 0.0 }

/* Measures the peak of `device` (a CPU device) with its kernels and thread count; takes about
 * 0.1-0.2 s. peak->struct_size must be set (CTXPAR_CPU_PEAK_INIT); *peak is written only on
 * success. */
ctxpar_status ctxpar_cpu_measure_peak(const ctxpar_device *device, ctxpar_cpu_peak *peak);

#ifdef __cplusplus
}
#endif

#endif /* CTXPAR_CPU_H */
