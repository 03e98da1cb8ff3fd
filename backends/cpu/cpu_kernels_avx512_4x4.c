// The AVX-512 kernel table with 4 x 4 register tiles (lane block 64), for cores with two full
// 512-bit FMA units (cpu_uarch.c). The same kernels as cpu_kernels_avx512.c: the same bits.
#if defined(__x86_64__) && defined(__GNUC__)
#include "backends/cpu/cpu_vec_avx512.h"

#define MR 4
#define NR 4
#define KERNELS_TABLE ctxpar_cpu_kernels_avx512_4x4
#define KERNELS_LABEL "avx512"
#include "backends/cpu/cpu_kernels_impl.h"

#pragma GCC pop_options
#else
typedef int ctxpar_cpu_kernels_avx512_4x4_not_built; // ISO C wants a non-empty translation unit
#endif
