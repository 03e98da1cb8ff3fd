// The device each rank of a run computes on: the CPU backend, or the CUDA one in builds that have
// it (testing/gpu:cuda_config defines CTXPAR_TEST_NO_CUDA in those that do not).
#include <stdlib.h>

#include "ctxpar_backend.h"
#include "ctxpar_cpu.h"
#include "runner_internal.h"

#ifndef CTXPAR_TEST_NO_CUDA
#include "ctxpar_cuda.h"
#endif

const char *cpt_run_backend_name(cpt_run_backend backend) {
    switch (backend) {
    case CPT_RUN_CPU: return "cpu";
    case CPT_RUN_CUDA: return "cuda";
    }
    return "?";
}

int cpt_run_backend_available(cpt_run_backend backend) {
#ifdef CTXPAR_TEST_NO_CUDA
    return backend == CPT_RUN_CPU;
#else
    return backend == CPT_RUN_CPU || backend == CPT_RUN_CUDA;
#endif
}

// Overrides of the CPU device's options for the tool, to compare instruction sets and backward
// schedules on the same command line; tests choose through ctxpar_cpu_options instead.
static ctxpar_status cpu_env_overrides(ctxpar_cpu_options *co) {
    const char *isa = getenv("CTXPAR_CPU_KERNELS"), *bwd = getenv("CTXPAR_CPU_BWD");
    if (isa && *isa && ctxpar_cpu_isa_parse(isa, &co->kernels) != CTXPAR_OK)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG,
                            "CTXPAR_CPU_KERNELS=%s: unknown (auto, generic, avx2, avx512)", isa);
    if (bwd && *bwd && ctxpar_cpu_bwd_schedule_parse(bwd, &co->bwd_schedule) != CTXPAR_OK)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG,
                            "CTXPAR_CPU_BWD=%s: unknown (auto, fused, two-pass)", bwd);
    return CTXPAR_OK;
}

ctxpar_status cpt_run_device_create(const cpt_run_config *cfg, int threads,
                                       ctxpar_device **dev_out) {
    if (cfg->backend == CPT_RUN_CPU) {
        ctxpar_cpu_options co = CTXPAR_CPU_OPTIONS_INIT;
        co.num_threads = threads;
        CTXPAR_CHECK(cpu_env_overrides(&co));
        return ctxpar_device_create_cpu(&co, dev_out);
    }
#ifndef CTXPAR_TEST_NO_CUDA
    if (cfg->backend == CPT_RUN_CUDA)
        return ctxpar_device_create_cuda(NULL, dev_out); // every rank on GPU 0
#endif
    return CTXPAR_ERROR(CTXPAR_ERR_NOT_SUPPORTED, "backend '%s' is not built into this binary",
                        cpt_run_backend_name(cfg->backend));
}
