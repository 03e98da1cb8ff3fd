// The runner's devices: the library's registry of devices by name (ctxpar_device_names), so that
// every backend built into this binary or loaded beside it is one the tool can run on. The CPU
// device also takes the tool's overrides of its options from the environment.
#include <stdlib.h>
#include <string.h>

#include "ctxpar_backend.h"
#include "ctxpar_cpu.h"
#include "runner_internal.h"

#define MAX_BACKENDS 16

// Overrides of the CPU device's options for the tool, to compare instruction sets, backward
// schedules and core classes (register tiles) on the same command line; tests choose through
// ctxpar_cpu_options instead. *any: whether one is set.
static ctxpar_status cpu_env_overrides(ctxpar_cpu_options *co, int *any) {
    const char *isa = getenv("CTXPAR_CPU_KERNELS"), *bwd = getenv("CTXPAR_CPU_BWD");
    const char *uarch = getenv("CTXPAR_CPU_UARCH");
    *any = (isa && *isa) || (bwd && *bwd) || (uarch && *uarch);
    if (isa && *isa && ctxpar_cpu_isa_parse(isa, &co->kernels) != CTXPAR_OK)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG,
                            "CTXPAR_CPU_KERNELS=%s: unknown (auto, generic, avx2, avx512)", isa);
    if (bwd && *bwd && ctxpar_cpu_bwd_schedule_parse(bwd, &co->bwd_schedule) != CTXPAR_OK)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG,
                            "CTXPAR_CPU_BWD=%s: unknown (auto, fused, two-pass)", bwd);
    if (uarch && *uarch && ctxpar_cpu_uarch_parse(uarch, &co->uarch) != CTXPAR_OK)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG,
                            "CTXPAR_CPU_UARCH=%s: unknown (auto, generic, avx2, zen4, zen5, "
                            "intel-1fma, intel-2fma)",
                            uarch);
    return CTXPAR_OK;
}

int cpt_run_backend_count(void) { return ctxpar_device_names(NULL, NULL, 0); }

// Entry b of the registry (NULL where there is none).
static void entry(cpt_run_backend b, const char **name, const char **about) {
    const char *names[MAX_BACKENDS], *abouts[MAX_BACKENDS];
    const int n = ctxpar_device_names(names, abouts, MAX_BACKENDS);
    const int ok = (int)b >= 0 && (int)b < n && (int)b < MAX_BACKENDS;
    *name = ok ? names[b] : NULL;
    *about = ok ? abouts[b] : NULL;
}

int cpt_run_backend_find(const char *name) {
    for (int i = 0; i < cpt_run_backend_count(); i++)
        if (!strcmp(name, cpt_run_backend_name((cpt_run_backend)i)))
            return i;
    return -1;
}

int cpt_run_backend_available(cpt_run_backend backend) {
    return (int)backend >= 0 && (int)backend < cpt_run_backend_count();
}

const char *cpt_run_backend_name(cpt_run_backend backend) {
    const char *name, *about;
    entry(backend, &name, &about);
    return name ? name : "?";
}

const char *cpt_run_backend_about(cpt_run_backend backend) {
    const char *name, *about;
    entry(backend, &name, &about);
    return about ? about : "";
}

static ctxpar_status create(cpt_run_backend backend, int threads, ctxpar_device **dev_out) {
    if (!cpt_run_backend_available(backend))
        return CTXPAR_ERROR(CTXPAR_ERR_NOT_SUPPORTED, "backend %d is not built into this binary",
                            (int)backend);
    if (backend == CPT_RUN_CPU) {
        ctxpar_cpu_options co = CTXPAR_CPU_OPTIONS_INIT;
        int any = 0;
        co.num_threads = threads;
        CTXPAR_CHECK(cpu_env_overrides(&co, &any));
        if (any)
            return ctxpar_device_create_cpu(&co, dev_out);
    }
    return ctxpar_device_create_by_name(cpt_run_backend_name(backend), threads, dev_out);
}

ctxpar_status cpt_run_backend_probe(cpt_run_backend backend) {
    ctxpar_device *dev = NULL;
    CTXPAR_CHECK(create(backend, 1, &dev));
    ctxpar_device_destroy(dev);
    return CTXPAR_OK;
}

ctxpar_status cpt_run_device_create(const cpt_run_config *cfg, int threads,
                                    ctxpar_device **dev_out) {
    return create(cfg->backend, threads, dev_out);
}
