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

/* The kernel table: one kernel source compiled per instruction set. Results differ between
 * tables only by rounding (the generic one does not fuse multiply-adds). */
typedef enum ctxpar_cpu_isa {
    CTXPAR_CPU_ISA_AUTO = 0, /* the best the CPU supports */
    CTXPAR_CPU_ISA_GENERIC = 1,
    CTXPAR_CPU_ISA_AVX2 = 2,   /* AVX2 + FMA + F16C */
    CTXPAR_CPU_ISA_AVX512 = 3, /* AVX-512F */
} ctxpar_cpu_isa;

/* How the backward is scheduled (same results either way, up to rounding of dQ's sums). */
typedef enum ctxpar_cpu_bwd_schedule {
    CTXPAR_CPU_BWD_AUTO = 0,     /* chosen from the shapes */
    CTXPAR_CPU_BWD_FUSED = 1,    /* one pass: dK/dV per key chunk, dQ as partial sums */
    CTXPAR_CPU_BWD_TWO_PASS = 2, /* one pass for dK/dV, another for dQ */
} ctxpar_cpu_bwd_schedule;

/* Options for the CPU device. Initialise with CTXPAR_CPU_OPTIONS_INIT: new fields are only
 * appended, and struct_size tells the library which ones the caller knows (the others keep
 * their defaults; a struct_size of the first version, 16 bytes, means num_threads alone). */
typedef struct ctxpar_cpu_options {
    size_t struct_size;
    /* OpenMP threads used by this device's kernels; 0 = the OpenMP default
     * (OMP_NUM_THREADS or the number of cores). */
    int num_threads;
    /* Kernel table; one the CPU cannot run gives CTXPAR_ERR_NOT_SUPPORTED at creation. */
    ctxpar_cpu_isa kernels;
    ctxpar_cpu_bwd_schedule bwd_schedule;
} ctxpar_cpu_options;

#define CTXPAR_CPU_OPTIONS_INIT                                                                    \
    { sizeof(ctxpar_cpu_options), 0, CTXPAR_CPU_ISA_AUTO, CTXPAR_CPU_BWD_AUTO }

/* Names as text, for tools that take them from flags or the environment: "auto", "generic",
 * "avx2", "avx512" and "auto", "fused", "two-pass". INVALID_ARG naming the choices otherwise. */
CTXPAR_API ctxpar_status ctxpar_cpu_isa_parse(const char *name, ctxpar_cpu_isa *isa_out);
CTXPAR_API ctxpar_status ctxpar_cpu_bwd_schedule_parse(const char *name,
                                                       ctxpar_cpu_bwd_schedule *schedule_out);

/* Creates a CPU device; options may be NULL. Memory it uses is ordinary host memory, so tensors
 * passed to a context on it are host pointers. Destroy with ctxpar_device_destroy. */
CTXPAR_API ctxpar_status ctxpar_device_create_cpu(const ctxpar_cpu_options *options,
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
CTXPAR_API ctxpar_status ctxpar_cpu_measure_peak(const ctxpar_device *device,
                                                 ctxpar_cpu_peak *peak);

#ifdef __cplusplus
}
#endif

#endif /* CTXPAR_CPU_H */
