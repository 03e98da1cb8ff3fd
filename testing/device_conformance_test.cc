// The devices the conformance suite (device_conformance.cc) runs on: one factory per kind. A new
// backend gets the whole suite by adding its factory here (and its dependency in testing/BUILD).
#include <string>

#include "ctxpar_cpu.h"
#include "testing/device_conformance.h"
#include "testing/gpu/gpu_rule.h"
#include "reference/tolerance.h"

#ifndef CTXPAR_TEST_NO_CUDA
#include "ctxpar_cuda.h"
#endif

namespace cpt_devconf {
namespace {

// The CPU device with a forced kernel table and backward schedule (ctxpar_cpu_options).
template <const char *kKernels, const char *kBwd> std::string CreateCpu(ctxpar_device **dev_out) {
    ctxpar_cpu_options o = CTXPAR_CPU_OPTIONS_INIT; // OpenMP's default threads
    if (ctxpar_cpu_isa_parse(kKernels, &o.kernels) != CTXPAR_OK ||
        ctxpar_cpu_bwd_schedule_parse(kBwd, &o.bwd_schedule) != CTXPAR_OK)
        return ctxpar_last_error();
    const ctxpar_status st = ctxpar_device_create_cpu(&o, dev_out);
    if (st == CTXPAR_ERR_NOT_SUPPORTED)
        return std::string("this CPU cannot run the ") + kKernels + " kernels";
    return st == CTXPAR_OK ? "" : ctxpar_last_error();
}

// The CPU's block outputs are F32 whatever the input dtype (inputs are rounded before the oracle
// sees them): one F32 bound (cpu_ops_test's measurements: at most 8.6e-7).
double CpuOutTol(ctxpar_dtype, int64_t) {
    return kTolF32;
}

constexpr char kGeneric[] = "generic", kAvx2[] = "avx2", kAvx512[] = "avx512";
constexpr char kFused[] = "fused", kTwoPass[] = "two-pass";

// The CUDA device with cuDNN AUTO (the default: cuDNN's forward where it applies) or OFF.
constexpr int kCudnnAuto = 0, kCudnnOff = 2;
// backends/cuda/README.md, "Determinism".
constexpr char kCudnnRows[] = "cuDNN's forward (AUTO) takes some blocks and not others, with other "
                              "bits than ctxpar's kernels (the cuda_native factory keeps it)";

#ifndef CTXPAR_TEST_NO_CUDA
template <int kCudnn> std::string CreateCuda(ctxpar_device **dev_out) {
    ctxpar_cuda_options o = CTXPAR_CUDA_OPTIONS_INIT;
    o.use_cudnn = (ctxpar_cuda_cudnn)kCudnn;
    if (ctxpar_device_create_cuda(&o, dev_out) == CTXPAR_OK)
        return "";
    return cpt_gpu::Unavailable(ctxpar_last_error()); // fails where a GPU is visible
}

// F32 math (F32 inputs, or 16-bit with head_dim % 8 != 0 on the SIMT kernels): the F32 bound;
// the tensor-core forward rounds P to the input type before P V: the tolerance table's row.
double CudaOutTol(ctxpar_dtype dt, int64_t head_dim) {
    if (dt == CTXPAR_DTYPE_F32 || head_dim % 8 != 0)
        return kTolF32;
    return cpt_tolerance(dt, "out");
}
#else
template <int> std::string CreateCuda(ctxpar_device **) {
    return cpt_gpu::Unavailable("this build has no CUDA backend"); // fails on a GPU machine
}

double CudaOutTol(ctxpar_dtype, int64_t) {
    return kTolF32;
}
#endif

// CTXPAR_CUDA_MAX_HEAD_DIM of backends/cuda/cuda_kernels.h (a private header of the kernels).
constexpr int64_t kCudaMaxHeadDim = 256;

} // namespace

std::vector<DeviceFactory> DeviceFactories() {
    // The default tables (avx512 on the CI machine, avx2 without it) and CUDA sweep every case;
    // the generic table a third; two-pass only changes the backward, so its forward sweep is
    // avx2's again and takes a sixth. The sweeps are the oracle sweeps and the non-finite ones.
    return {
        {"cpu_generic", CreateCpu<kGeneric, kFused>, CpuOutTol, INT64_MAX, false, 3, 3, nullptr},
        {"cpu_avx2", CreateCpu<kAvx2, kFused>, CpuOutTol, INT64_MAX, false, 1, 1, nullptr},
        {"cpu_avx512", CreateCpu<kAvx512, kFused>, CpuOutTol, INT64_MAX, false, 1, 1, nullptr},
        {"cpu_avx2_two_pass", CreateCpu<kAvx2, kTwoPass>, CpuOutTol, INT64_MAX, false, 6, 1,
         nullptr},
        {"cuda", CreateCuda<kCudnnAuto>, CudaOutTol, kCudaMaxHeadDim, true, 1, 1, kCudnnRows},
        // ctxpar's own kernels alone: every contract, row independence included; the backward
        // is the same code as above's, so its sweep takes a sixth.
        {"cuda_native", CreateCuda<kCudnnOff>, CudaOutTol, kCudaMaxHeadDim, true, 1, 6, nullptr},
    };
}

} // namespace cpt_devconf
