// The registry of devices by name (ctxpar_device_names, ctxpar_device_create_by_name,
// ctxpar_device_register): the CPU device is there and first, a registered backend is found and
// its factory called, and bad registrations and unknown names are refused with a message.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "ctxpar_backend.h"
#include "dispatch.h"

namespace {

std::vector<std::string> Names() {
    const int n = ctxpar_device_names(nullptr, nullptr, 0);
    std::vector<const char *> names(n), about(n);
    EXPECT_EQ(ctxpar_device_names(names.data(), about.data(), n), n);
    std::vector<std::string> out;
    for (int i = 0; i < n; i++) {
        EXPECT_NE(about[i], nullptr);
        out.emplace_back(names[i]);
    }
    return out;
}

int fake_calls = 0, fake_threads = -1;

ctxpar_status FakeFactory(int num_threads, ctxpar_device **device_out) {
    fake_calls++;
    fake_threads = num_threads;
    *device_out = nullptr;
    return CTXPAR_ERROR(CTXPAR_ERR_DEVICE, "fake device: not really here");
}

TEST(DeviceRegistry, CpuIsFirstAndCreatesAWorkingDevice) {
    const std::vector<std::string> names = Names();
    ASSERT_FALSE(names.empty());
    EXPECT_EQ(names[0], "cpu");
    ctxpar_device *dev = nullptr;
    ASSERT_EQ(ctxpar_device_create_by_name("cpu", 2, &dev), CTXPAR_OK) << ctxpar_last_error();
    ASSERT_NE(dev, nullptr);
    EXPECT_STREQ(dev->ops->name, "cpu");
    EXPECT_TRUE(dev->host_memory);
    ctxpar_device_destroy(dev);
}

TEST(DeviceRegistry, UnknownNameListsTheNamesThereAre) {
    ctxpar_device *dev = reinterpret_cast<ctxpar_device *>(0x1);
    EXPECT_EQ(ctxpar_device_create_by_name("tpu", 0, &dev), CTXPAR_ERR_NOT_SUPPORTED);
    EXPECT_EQ(dev, reinterpret_cast<ctxpar_device *>(0x1)) << "written on error";
    const std::string msg = ctxpar_last_error();
    EXPECT_NE(msg.find("'tpu'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("cpu"), std::string::npos) << msg;
    EXPECT_EQ(ctxpar_device_create_by_name(nullptr, 0, &dev), CTXPAR_ERR_INVALID_ARG);
    EXPECT_EQ(ctxpar_device_create_by_name("cpu", 0, nullptr), CTXPAR_ERR_INVALID_ARG);
    EXPECT_EQ(ctxpar_device_create_by_name("cpu", -1, &dev), CTXPAR_ERR_INVALID_ARG);
}

TEST(DeviceRegistry, ARegisteredBackendIsFoundAndBadOnesAreRefused) {
    const size_t before = Names().size();
    ASSERT_EQ(ctxpar_device_register("fake", "a test's device", FakeFactory), CTXPAR_OK);
    const std::vector<std::string> names = Names();
    ASSERT_EQ(names.size(), before + 1);
    EXPECT_EQ(names.back(), "fake");
    ctxpar_device *dev = nullptr;
    EXPECT_EQ(ctxpar_device_create_by_name("fake", 3, &dev), CTXPAR_ERR_DEVICE);
    EXPECT_EQ(fake_calls, 1);
    EXPECT_EQ(fake_threads, 3);
    // Refused, and the registry is unchanged.
    EXPECT_EQ(ctxpar_device_register("fake", "again", FakeFactory), CTXPAR_ERR_INVALID_ARG);
    EXPECT_NE(std::string(ctxpar_last_error()).find("already registered"), std::string::npos);
    EXPECT_EQ(ctxpar_device_register("cpu", "a second cpu", FakeFactory), CTXPAR_ERR_INVALID_ARG);
    EXPECT_EQ(ctxpar_device_register("", "no name", FakeFactory), CTXPAR_ERR_INVALID_ARG);
    EXPECT_EQ(ctxpar_device_register(nullptr, "no name", FakeFactory), CTXPAR_ERR_INVALID_ARG);
    EXPECT_EQ(ctxpar_device_register("nofactory", "", nullptr), CTXPAR_ERR_INVALID_ARG);
    EXPECT_EQ(Names().size(), before + 1);
    // Full at 16: the rest are refused.
    static const char *const extra[] = {"x1", "x2", "x3", "x4", "x5", "x6", "x7", "x8",
                                        "x9", "x10", "x11", "x12", "x13", "x14", "x15", "x16"};
    int added = 0;
    for (const char *name : extra)
        added += ctxpar_device_register(name, "", FakeFactory) == CTXPAR_OK;
    EXPECT_EQ(static_cast<int>(before) + 1 + added, 16);
    EXPECT_EQ(Names().size(), 16u);
    EXPECT_NE(std::string(ctxpar_last_error()).find("full"), std::string::npos);
}

// What a device computes with, for people (the tool prints it beside timings): the CPU device
// names its kernels and threads; a device without the op is its name; a short buffer is cut and
// still ends.
TEST(DeviceRegistry, EveryDeviceDescribesItself) {
    ctxpar_device *cpu = nullptr;
    ASSERT_EQ(ctxpar_device_create_by_name("cpu", 3, &cpu), CTXPAR_OK) << ctxpar_last_error();
    char buf[256];
    ctxpar_dev_describe(cpu, buf, sizeof buf);
    const std::string d = buf;
    EXPECT_EQ(d.rfind("cpu: ", 0), 0u) << d;
    EXPECT_NE(d.find(" kernels"), std::string::npos) << d;
    EXPECT_NE(d.find(", 3 threads"), std::string::npos) << d;
    char tiny[5];
    ctxpar_dev_describe(cpu, tiny, sizeof tiny);
    EXPECT_STREQ(tiny, "cpu:");
    // The same device without the op: its ops table's name.
    ctxpar_device_ops plain_ops = *cpu->ops;
    plain_ops.name = "plain";
    plain_ops.describe = nullptr;
    plain_ops.destroy = [](ctxpar_device *) {}; // the impl stays cpu's
    ctxpar_device *plain = nullptr;
    ASSERT_EQ(ctxpar_device_create(&plain_ops, cpu->impl, cpu->host_memory, &plain), CTXPAR_OK)
        << ctxpar_last_error();
    ctxpar_dev_describe(plain, buf, sizeof buf);
    EXPECT_STREQ(buf, "plain");
    ctxpar_device_destroy(plain);
    ctxpar_device_destroy(cpu);
}

} // namespace
