// The skip-or-fail rule of the GPU tests (gpu_rule.h), without a GPU: the decision for each
// (visible, created) pair, and what a test records for each verdict.
#include "testing/gpu/gpu_rule.h"

#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

namespace {

using cpt_gpu::Decide;
using cpt_gpu::Verdict;

TEST(GpuRule, Decide) {
    EXPECT_EQ(Decide(true, true), Verdict::kRun);
    EXPECT_EQ(Decide(false, true), Verdict::kRun); // made without a visible GPU: it works, run
    EXPECT_EQ(Decide(true, false), Verdict::kFail);
    EXPECT_EQ(Decide(false, false), Verdict::kSkip);
}

TEST(GpuRule, FailRecordsAFailureNamingWhy) {
    EXPECT_FATAL_FAILURE(cpt_gpu::Report(Verdict::kFail, "ncclCommInitAll: unhandled"),
                            "a GPU is visible but the test cannot run on it: ncclCommInitAll");
}

TEST(GpuRule, SkipSaysNoCudaDevice) {
    EXPECT_EQ(cpt_gpu::Report(Verdict::kSkip, "no device found"), "no CUDA device (no device found)");
    EXPECT_EQ(cpt_gpu::Report(Verdict::kRun, "x"), "");
}

// Here (no GPU visible) a device that cannot be made skips, and records no failure.
TEST(GpuRule, UnavailableSkipsWithoutAGpu) {
    if (cpt_gpu::Visible())
        GTEST_SKIP() << "skipped: a GPU is visible (this case needs a machine without one)";
    EXPECT_EQ(cpt_gpu::Unavailable("x"), "no CUDA device (x)");
}

} // namespace
