// The registry's "cuda" device takes its cuDNN choice from CTXPAR_CUDNN (auto, on, off; what the
// tool's --cudnn sets): a bad value is refused naming the variable, before any GPU is touched, so
// this runs on machines without one. With a GPU, "off" makes a device that sends no forward
// block to cuDNN and says so.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "ctxpar_backend.h"
#include "dispatch.h"

namespace {

TEST(CudaRegistry, ABadCudnnChoiceIsRefusedNamingTheVariable) {
    ctxpar_device *dev = nullptr;
    ASSERT_EQ(setenv("CTXPAR_CUDNN", "maybe", 1), 0);
    EXPECT_EQ(ctxpar_device_create_by_name("cuda", 0, &dev), CTXPAR_ERR_INVALID_ARG);
    const std::string msg = ctxpar_last_error();
    EXPECT_NE(msg.find("CTXPAR_CUDNN is 'maybe': auto, on or off"), std::string::npos) << msg;
    EXPECT_EQ(dev, nullptr);
    unsetenv("CTXPAR_CUDNN");
}

TEST(CudaRegistry, OffSendsNoBlockToCudnn) {
    ctxpar_device *dev = nullptr;
    ASSERT_EQ(setenv("CTXPAR_CUDNN", "off", 1), 0);
    const ctxpar_status st = ctxpar_device_create_by_name("cuda", 0, &dev);
    unsetenv("CTXPAR_CUDNN");
    if (st == CTXPAR_ERR_DEVICE) // no usable GPU: the value itself was accepted
        GTEST_SKIP() << "no CUDA device: " << ctxpar_last_error();
    ASSERT_EQ(st, CTXPAR_OK) << ctxpar_last_error();
    char buf[256];
    ctxpar_dev_describe(dev, buf, sizeof buf);
    EXPECT_NE(std::string(buf).find("on cuDNN off"), std::string::npos) << buf;
    ctxpar_device_destroy(dev);
}

} // namespace
