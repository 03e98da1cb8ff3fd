// The GPU tests' skip-or-fail rule (gpu_rule.h).
#include "testing/gpu/gpu_rule.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#ifndef CTXPAR_TEST_NO_CUDA
#include <cuda_runtime_api.h>
#endif

namespace cpt_gpu {

Verdict Decide(bool gpu_visible, bool created) {
    if (created)
        return Verdict::kRun;
    return gpu_visible ? Verdict::kFail : Verdict::kSkip;
}

const std::string &CudaReason() {
    static const std::string reason = [] {
#ifdef CTXPAR_TEST_NO_CUDA
        return std::string("this build has no CUDA backend");
#else
        int n = 0;
        const cudaError_t e = cudaGetDeviceCount(&n);
        if (e != cudaSuccess)
            return std::string("cudaGetDeviceCount: ") + cudaGetErrorString(e);
        return n > 0 ? std::string() : std::string("no device found");
#endif
    }();
    return reason;
}

// nvidia-smi sees a GPU even where CUDA cannot use it (a driver too old for the runtime).
static bool NvidiaSmiListsGpu() {
    FILE *p = popen("nvidia-smi -L 2>/dev/null", "r");
    if (!p)
        return false;
    char line[256];
    bool found = false;
    while (fgets(line, sizeof line, p))
        found = found || std::strncmp(line, "GPU ", 4) == 0;
    pclose(p);
    return found;
}

bool Visible() {
    static const bool visible = [] {
        const char *e = std::getenv("CTXPAR_GPU_EXPECTED"); // set by first_run.sh with a GPU
        return CudaReason().empty() || (e && std::strcmp(e, "1") == 0) || NvidiaSmiListsGpu();
    }();
    return visible;
}

// Fatal, so that gtest runs no test body after a SetUp that failed this way (a non-fatal failure
// followed by GTEST_SKIP would run it, on a device that does not exist).
static void FailFatally(const std::string &what) {
    FAIL() << what;
}

std::string Report(Verdict v, const std::string &why) {
    if (v == Verdict::kFail) {
        const std::string what = "a GPU is visible but the test cannot run on it: " + why;
        FailFatally(what);
        return what;
    }
    return v == Verdict::kSkip ? "no CUDA device (" + why + ")" : "";
}

std::string Unavailable(const std::string &why) {
    return Report(Decide(Visible(), false), why);
}

} // namespace cpt_gpu
