/* cpu_supports_shim.h - the prototype run_fuzzers.sh force-includes into cpu_device.c (see
 * cpu_supports_shim.c). */
#ifndef CPT_FUZZ_CPU_SUPPORTS_SHIM_H
#define CPT_FUZZ_CPU_SUPPORTS_SHIM_H

int cpt_fuzz_cpu_supports(const char *feature);

#endif /* CPT_FUZZ_CPU_SUPPORTS_SHIM_H */
