/*
 * cpu_supports_shim.c - lets clang build backends/cpu/cpu_device.c for the fuzzers.
 *
 * clang 14's __builtin_cpu_supports does not know "f16c" (GCC's does), so run_fuzzers.sh
 * compiles cpu_device.c with -D__builtin_cpu_supports=cpt_fuzz_cpu_supports (and
 * cpu_supports_shim.h force-included) and this file
 * answers instead: CPUID for f16c, the builtin for everything else. Built with the fuzzers only.
 */
#include "cpu_supports_shim.h"

#include <cpuid.h>
#include <string.h>

int cpt_fuzz_cpu_supports(const char *feature) {
    if (strcmp(feature, "f16c") == 0) {
        unsigned a, b, c, d;
        return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C) != 0;
    }
    if (strcmp(feature, "avx512f") == 0)
        return __builtin_cpu_supports("avx512f");
    if (strcmp(feature, "avx2") == 0)
        return __builtin_cpu_supports("avx2");
    if (strcmp(feature, "fma") == 0)
        return __builtin_cpu_supports("fma");
    return 0;
}
