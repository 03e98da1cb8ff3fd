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

/* The class of core the kernels are tuned for: it picks their register tiles (how many vectors
 * of lanes times how many rows of the other operand each inner loop keeps in registers). No
 * choice changes a bit of any result: every lane's sums run in the same order whatever the tile
 * (backends/cpu/README.md); they differ only in speed. */
typedef enum ctxpar_cpu_uarch {
    CTXPAR_CPU_UARCH_AUTO = 0,       /* from CPUID, once per process (see below) */
    CTXPAR_CPU_UARCH_GENERIC = 1,    /* nothing known (not x86, or no AVX2): default tiles */
    CTXPAR_CPU_UARCH_AVX2 = 2,       /* an x86 core with AVX2 + FMA and without AVX-512 */
    CTXPAR_CPU_UARCH_ZEN4 = 3,       /* AMD Zen 4: each 512-bit FMA runs as two 256-bit halves */
    CTXPAR_CPU_UARCH_ZEN5 = 4,       /* AMD Zen 5: full-width 512-bit FMAs */
    CTXPAR_CPU_UARCH_INTEL_1FMA = 5, /* AVX-512 with one 512-bit FMA unit (Intel client cores) */
    CTXPAR_CPU_UARCH_INTEL_2FMA = 6, /* AVX-512 with two 512-bit FMA units (Intel server cores) */
} ctxpar_cpu_uarch;

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
    /* Core class for the register tiles. AUTO reads CPUID's vendor, family and model; for an
     * AVX-512 core whose model does not say how many 512-bit FMA units it has (Intel Skylake-SP
     * and Cascade Lake, whose Bronze/Silver parts have one; unknown models), it compares the
     * 512-bit and 256-bit FMA rates for a few milliseconds, once per process. */
    ctxpar_cpu_uarch uarch;
} ctxpar_cpu_options;

#define CTXPAR_CPU_OPTIONS_INIT                                                                    \
    {                                                                                              \
        sizeof(ctxpar_cpu_options), 0, CTXPAR_CPU_ISA_AUTO, CTXPAR_CPU_BWD_AUTO,                   \
            CTXPAR_CPU_UARCH_AUTO                                                                  \
    }

/* Names as text, for tools that take them from flags or the environment: "auto", "generic",
 * "avx2", "avx512"; "auto", "fused", "two-pass"; "auto", "generic", "avx2", "zen4", "zen5",
 * "intel-1fma", "intel-2fma". INVALID_ARG naming the choices otherwise. */
CTXPAR_API ctxpar_status ctxpar_cpu_isa_parse(const char *name, ctxpar_cpu_isa *isa_out);
CTXPAR_API ctxpar_status ctxpar_cpu_bwd_schedule_parse(const char *name,
                                                       ctxpar_cpu_bwd_schedule *schedule_out);
CTXPAR_API ctxpar_status ctxpar_cpu_uarch_parse(const char *name, ctxpar_cpu_uarch *uarch_out);

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
    /* The device's core class ("zen4", ... as ctxpar_cpu_uarch_parse takes them; what AUTO
     * found, or the option) and its kernels' register tile ("2x8": 2 vectors x 8 rows). */
    const char *uarch;
    const char *tiles;
} ctxpar_cpu_peak;

#define CTXPAR_CPU_PEAK_INIT                                                                       \
    { sizeof(ctxpar_cpu_peak), NULL, 0, 0, 0.0, 0.0, 0.0, NULL, NULL }

/* Measures the peak of `device` (a CPU device) with its kernels and thread count; takes about
 * 0.1-0.2 s. peak->struct_size must be set (CTXPAR_CPU_PEAK_INIT); *peak is written only on
 * success. */
CTXPAR_API ctxpar_status ctxpar_cpu_measure_peak(const ctxpar_device *device,
                                                 ctxpar_cpu_peak *peak);

#ifdef __cplusplus
}
#endif

#endif /* CTXPAR_CPU_H */
