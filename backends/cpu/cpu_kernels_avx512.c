// The AVX-512 kernel table (16 lanes, 2 x 8 register tiles), chosen at run time when the CPU has
// AVX512F (cpu_uarch.c: the tile for cores that issue one 512-bit FMA per cycle).
#if defined(__x86_64__) && defined(__GNUC__)
#include "backends/cpu/cpu_vec_avx512.h"

#define MR 2
#define NR 8
#define KERNELS_TABLE ctxpar_cpu_kernels_avx512
#define KERNELS_LABEL "avx512"
#include "backends/cpu/cpu_kernels_impl.h"

#pragma GCC pop_options
#else
typedef int ctxpar_cpu_kernels_avx512_not_built; // ISO C wants a non-empty translation unit
#endif
