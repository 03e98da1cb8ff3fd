// The tool's backend registry: the devices a run can compute on. The CPU backend always; CUDA in
// builds that have it (testing/gpu:cuda_config defines CTXPAR_TEST_NO_CUDA in those that do not).
// A new backend is one entry here (and its dependency in testing/BUILD).
#include <stdlib.h>
#include <string.h>

#include "ctxpar_backend.h"
#include "ctxpar_cpu.h"
#include "runner_internal.h"

#ifndef CTXPAR_TEST_NO_CUDA
#include "ctxpar_cuda.h"
#endif

// Overrides of the CPU device's options for the tool, to compare instruction sets, backward
// schedules and core classes (register tiles) on the same command line; tests choose through ctxpar_cpu_options instead.
static ctxpar_status cpu_env_overrides(ctxpar_cpu_options *co) {
    const char *isa = getenv("CTXPAR_CPU_KERNELS"), *bwd = getenv("CTXPAR_CPU_BWD");
    if (isa && *isa && ctxpar_cpu_isa_parse(isa, &co->kernels) != CTXPAR_OK)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG,
                            "CTXPAR_CPU_KERNELS=%s: unknown (auto, generic, avx2, avx512)", isa);
    if (bwd && *bwd && ctxpar_cpu_bwd_schedule_parse(bwd, &co->bwd_schedule) != CTXPAR_OK)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG,
                            "CTXPAR_CPU_BWD=%s: unknown (auto, fused, two-pass)", bwd);
    const char *uarch = getenv("CTXPAR_CPU_UARCH");
    if (uarch && *uarch && ctxpar_cpu_uarch_parse(uarch, &co->uarch) != CTXPAR_OK)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG,
                            "CTXPAR_CPU_UARCH=%s: unknown (auto, generic, avx2, zen4, zen5, "
                            "intel-1fma, intel-2fma)",
                            uarch);
    return CTXPAR_OK;
}

static ctxpar_status create_cpu(int threads, ctxpar_device **dev_out) {
    ctxpar_cpu_options co = CTXPAR_CPU_OPTIONS_INIT;
    co.num_threads = threads;
    CTXPAR_CHECK(cpu_env_overrides(&co));
    return ctxpar_device_create_cpu(&co, dev_out);
}

static const cpt_run_backend_info cpu = {
    "cpu", "the CPU reference device (OpenMP, deterministic)", create_cpu};

#ifndef CTXPAR_TEST_NO_CUDA
static ctxpar_status create_cuda(int threads, ctxpar_device **dev_out) {
    (void)threads;
    return ctxpar_device_create_cuda(NULL, dev_out); // every rank on GPU 0
}

static const cpt_run_backend_info cuda = {"cuda", "NVIDIA GPU 0 (CUDA kernels, cuDNN where built)",
                                             create_cuda};
#endif

static const cpt_run_backend_info *const registry[] = {
    &cpu, // CPT_RUN_CPU: first
#ifndef CTXPAR_TEST_NO_CUDA
    &cuda,
#endif
};
#define COUNT ((int)(sizeof registry / sizeof registry[0]))

const cpt_run_backend_info *const *cpt_run_backends(int *count_out) {
    *count_out = COUNT;
    return registry;
}

int cpt_run_backend_find(const char *name) {
    for (int i = 0; i < COUNT; i++)
        if (!strcmp(name, registry[i]->name))
            return i;
    return -1;
}

int cpt_run_backend_available(cpt_run_backend backend) {
    return (int)backend >= 0 && (int)backend < COUNT;
}

const char *cpt_run_backend_name(cpt_run_backend backend) {
    return cpt_run_backend_available(backend) ? registry[backend]->name : "?";
}

ctxpar_status cpt_run_backend_probe(cpt_run_backend backend) {
    if (!cpt_run_backend_available(backend))
        return CTXPAR_ERROR(CTXPAR_ERR_NOT_SUPPORTED, "backend %d is not built into this binary",
                            (int)backend);
    ctxpar_device *dev = NULL;
    CTXPAR_CHECK(registry[backend]->create(1, &dev));
    ctxpar_device_destroy(dev);
    return CTXPAR_OK;
}

ctxpar_status cpt_run_device_create(const cpt_run_config *cfg, int threads,
                                       ctxpar_device **dev_out) {
    if (!cpt_run_backend_available(cfg->backend))
        return CTXPAR_ERROR(CTXPAR_ERR_NOT_SUPPORTED, "backend %d is not built into this binary",
                            (int)cfg->backend);
    return registry[cfg->backend]->create(threads, dev_out);
}
