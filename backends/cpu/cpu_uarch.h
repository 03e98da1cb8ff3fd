/*
 * cpu_uarch.h - which class of core this is (ctxpar_cpu_uarch), from CPUID, and the kernel
 * table (instruction set x register tile) each class gets.
 */
#ifndef CTXPAR_CPU_UARCH_H
#define CTXPAR_CPU_UARCH_H

#include "backends/cpu/cpu_kernels.h"
#include "ctxpar_cpu.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What the classifier reads from CPUID: kept apart so that tests can give it any CPU. */
typedef struct ctxpar_cpu_id {
    char vendor[13];   /* "GenuineIntel", "AuthenticAMD", ...; "" off x86 */
    int family, model; /* display family and model (base plus extended fields) */
    int avx512f, avx2; /* usable: the CPU has them and the OS saves their registers */
    int hypervisor;    /* CPUID says it runs under a hypervisor, which may report any model */
} ctxpar_cpu_id;

/* This CPU's identity (all zero off x86). */
void ctxpar_cpu_id_read(ctxpar_cpu_id *id);

/* The class of core `id` describes. Where family and model do not say how many 512-bit FMA
 * units an AVX-512 core has, or may not be the core's own (an Intel model under a hypervisor),
 * it calls two_fma_units() (1: two, 0: one); NULL means the model's word, else one. */
ctxpar_cpu_uarch ctxpar_cpu_uarch_classify(const ctxpar_cpu_id *id, int (*two_fma_units)(void));

/* This CPU's class: ctxpar_cpu_uarch_classify on CPUID with the FMA-rate probe below,
 * computed once per process. */
ctxpar_cpu_uarch ctxpar_cpu_uarch_detect(void);

/* 1 when 512-bit FMAs run at least 1.5x the FLOP rate of 256-bit ones on this core (two full
 * 512-bit units; split or single units run both at about the same rate), else 0 (also when the
 * CPU cannot run AVX-512). About 20 ms. */
int ctxpar_cpu_two_fma512_probe(void);

/* "auto", "generic", "avx2", "zen4", "zen5", "intel-1fma", "intel-2fma" (NULL when out of range).
 */
const char *ctxpar_cpu_uarch_name(ctxpar_cpu_uarch uarch);

/* The kernel table for instruction set `isa` (one of the ctxpar_cpu_kernels_* tables) on a core
 * of class `uarch`: the same instructions with the register tile that class runs fastest. Every
 * tile of one instruction set gives the same bits. */
const ctxpar_cpu_kernels *ctxpar_cpu_kernels_for(const ctxpar_cpu_kernels *isa,
                                                 ctxpar_cpu_uarch uarch);

/* Best FP32 FLOP/s of the calling thread on `kern`'s FMA chains over `rounds` rounds of about
 * `round_seconds` of its CPU time (cpu_peak.c). */
double ctxpar_cpu_thread_fma_rate(const ctxpar_cpu_kernels *kern, int rounds, double round_seconds);

#ifdef __cplusplus
}
#endif

#endif /* CTXPAR_CPU_UARCH_H */
