/* cpu_supports_shim.h - the prototype run_fuzzers.sh force-includes into cpu_device.c (see
 * cpu_supports_shim.c). */
#ifndef CTXPAR_FUZZ_CPU_SUPPORTS_SHIM_H
#define CTXPAR_FUZZ_CPU_SUPPORTS_SHIM_H

int ctxpar_fuzz_cpu_supports(const char *feature);

#endif /* CTXPAR_FUZZ_CPU_SUPPORTS_SHIM_H */
