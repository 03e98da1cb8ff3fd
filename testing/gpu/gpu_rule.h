// Skip or fail, one rule for every GPU test: skipping is only for "no GPU". Where a GPU is
// visible (cudaGetDeviceCount > 0, nvidia-smi lists one, or CTXPAR_GPU_EXPECTED=1), a test that
// cannot create its CUDA device or NCCL comm fails, naming why: a broken driver, library or build
// must not read as "skipped" on the one machine that could run it.
#ifndef CTXPAR_TESTING_GPU_GPU_RULE_H_
#define CTXPAR_TESTING_GPU_GPU_RULE_H_

#include <string>

namespace cpt_gpu {

enum class Verdict { kRun, kSkip, kFail };

// The rule itself: made → run; not made → fail where a GPU is visible, else skip.
Verdict Decide(bool gpu_visible, bool created);

// Whether a GPU is visible to this process (computed once).
bool Visible();

// "" when CUDA reports a device, else why not (CUDA's error, "no device found", or that this
// build has no CUDA).
const std::string &CudaReason();

// What a test says for a verdict: kFail records a fatal gtest failure naming why (so that no
// test body runs after it in SetUp); kSkip returns the skip's reason, "no CUDA device (why)".
std::string Report(Verdict v, const std::string &why);

// Report(Decide(Visible(), false), why): for a device or comm that could not be made.
std::string Unavailable(const std::string &why);

} // namespace cpt_gpu

// In a test or SetUp: skips, or fails where a GPU is visible, when CUDA reports no device.
#define CPT_SKIP_WITHOUT_GPU()                                                                     \
    do {                                                                                           \
        if (!cpt_gpu::CudaReason().empty())                                                        \
            GTEST_SKIP() << "skipped: " << cpt_gpu::Unavailable(cpt_gpu::CudaReason());            \
    } while (0)

#endif // CTXPAR_TESTING_GPU_GPU_RULE_H_
