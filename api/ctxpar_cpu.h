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

#ifdef __cplusplus
}
#endif

#endif /* CTXPAR_CPU_H */
