// cpu_ops_test: what only the CPU device has: the backward's two schedules, determinism over
// thread counts (for each kernel table), each table's peak probe, casts against the scalar
// conversions, its memory and options. The ops and contracts every device shares (a query row's
// bits independent of the other rows, non-finite values, the mask pair by pair) are checked,
// for every kernel table, by the device conformance suite (device_conformance.cc) on the same
// harness.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ostream>
#include <string>
#include <vector>

#include "backends/cpu/cpu_internal.h"
#include "backends/cpu/cpu_uarch.h"
#include "dispatch.h"
#include "ctxpar_cpu.h"
#include "ctxpar_half.h"
#include "reference/data.h"
#include "testing/device_conformance.h"
#include "reference/metrics.h"
#include "reference/oracle.h"

namespace {

using namespace cpt_devconf;

// Tolerances: max |got - oracle| / max |oracle| (metrics.h). Inputs in F16/BF16 are rounded
// before the oracle sees them (cpt_test_to_f64 reads the stored values), and every output of
// the block kernels is F32, so one bound serves all three dtypes; it covers F32 accumulation only.
//  - forward out and lse: F32 rounding (2^-24 ~ 6e-8) of the pre-scaled q, of every score (a
//    D-term FMA chain), of the 2^x polynomial (~1 ulp) and of the O(Sk)-term running sums. The
//    largest error over this suite is 8.6e-7 (out) and 1.7e-7 (lse); 1e-5 leaves a factor ~10
//    for other shapes, while a real bug (a wrong mask element, a lost tile, a wrong head) costs
//    1e-3 or more.
constexpr double kTolFwd = 1e-5;
//  - backward dq, dk, dv: dS = P * (dP - delta) cancels (delta is the P-weighted mean of dP), so
//    relative to max |grad| the error is a little above the forward's (largest seen: 1.1e-6).
constexpr double kTolBwd = 1e-5;

// The backward's schedules (cpu_attn_bwd.c): chosen from the shapes, or by the device's options.
const char *const kSchedules[] = {"fused", "two-pass"};

// A CPU device with `threads` threads and, if named, a kernel table and a backward schedule
// (chosen through ctxpar_cpu_options; the names as ctxpar_cpu_isa_parse and
// ctxpar_cpu_bwd_schedule_parse take them).
struct Device {
    ctxpar_device *dev = nullptr;
    ctxpar_status st = CTXPAR_OK;
    explicit Device(int threads = 0, const char *kernels = nullptr, const char *bwd = nullptr,
                    const char *uarch = nullptr) {
        ctxpar_cpu_options opt = CTXPAR_CPU_OPTIONS_INIT;
        opt.num_threads = threads;
        if (kernels)
            st = ctxpar_cpu_isa_parse(kernels, &opt.kernels);
        if (bwd && st == CTXPAR_OK)
            st = ctxpar_cpu_bwd_schedule_parse(bwd, &opt.bwd_schedule);
        if (uarch && st == CTXPAR_OK)
            st = ctxpar_cpu_uarch_parse(uarch, &opt.uarch);
        if (st == CTXPAR_OK)
            st = ctxpar_device_create_cpu(&opt, &dev);
    }
    ~Device() { ctxpar_device_destroy(dev); }
    Device(const Device &) = delete;
    Device &operator=(const Device &) = delete;
};

// Whether this CPU can run a kernel table (a device forced to it can be created).
bool KernelsAvailable(const char *name) {
    Device d(1, name);
    return d.st == CTXPAR_OK;
}

// Runs the block forward (merge = 0) on a fresh device.
FwdResult RunFwd(const Problem &p, int threads = 0, const char *kernels = nullptr,
                 const char *uarch = nullptr) {
    Device d(threads, kernels, nullptr, uarch);
    EXPECT_EQ(d.st, CTXPAR_OK) << ctxpar_last_error();
    FwdResult r;
    r.out.assign(p.OutSize(), NAN);
    r.lse.assign(p.LseSize(), NAN);
    if (d.st != CTXPAR_OK)
        return r;
    ctxpar_attn_block blk = p.Block();
    EXPECT_EQ(ctxpar_dev_attn_block_fwd(d.dev, &blk, r.out.data(), r.lse.data(), 0, nullptr),
              CTXPAR_OK)
        << ctxpar_last_error();
    return r;
}

struct CpuBwd {
    FwdResult fwd;
    std::vector<float> delta, dq, dk, dv;
};

// Forward, bwd_prep on the F32 output, then the block backward into zeroed accumulators.
CpuBwd RunBwd(const Problem &p, int threads = 0, const char *kernels = nullptr,
              const char *bwd = nullptr, const char *uarch = nullptr) {
    CpuBwd r;
    r.fwd = RunFwd(p, threads, kernels, uarch);
    Device d(threads, kernels, bwd, uarch);
    EXPECT_EQ(d.st, CTXPAR_OK) << ctxpar_last_error();
    r.delta.assign(p.LseSize(), NAN);
    r.dq.assign(p.OutSize(), 0.0f);
    r.dk.assign(p.KvSize(), 0.0f);
    r.dv.assign(p.KvSize(), 0.0f);
    if (d.st != CTXPAR_OK)
        return r;
    ctxpar_tensor out =
        ctxpar_tensor_bshd(r.fwd.out.data(), CTXPAR_DTYPE_F32, p.B, p.Sq(), p.Hq, p.D);
    EXPECT_EQ(ctxpar_dev_attn_bwd_prep(d.dev, &out, &p.dout->t, r.delta.data(), nullptr), CTXPAR_OK)
        << ctxpar_last_error();
    ctxpar_attn_block blk = p.Block();
    EXPECT_EQ(ctxpar_dev_attn_block_bwd(d.dev, &blk, &p.dout->t, r.fwd.lse.data(), r.delta.data(),
                                        r.dq.data(), r.dk.data(), r.dv.data(), nullptr),
              CTXPAR_OK)
        << ctxpar_last_error();
    return r;
}

// Forward of p against keys [k0, k0 + n) of its K/V block, into (out, lse) with merge.
void FwdPart(ctxpar_device *dev, const Problem &p, int64_t k0, int64_t n, float *out, float *lse,
             int merge) {
    ctxpar_attn_block blk = p.Block();
    ctxpar_span ks = {p.kpos[(size_t)k0], n, 1};
    blk.k.data = (char *)blk.k.data + k0 * blk.k.stride[1] * (int64_t)DtypeSize(p.dtype);
    blk.v.data = (char *)blk.v.data + k0 * blk.v.stride[1] * (int64_t)DtypeSize(p.dtype);
    blk.k.shape[1] = blk.v.shape[1] = n;
    blk.k_pos = {&ks, 1};
    ASSERT_EQ(ctxpar_dev_attn_block_fwd(dev, &blk, out, lse, merge, nullptr), CTXPAR_OK)
        << ctxpar_last_error();
}

// ---------------------------------------------------------------- backward schedules

void CheckBwd(const Problem &p, const CpuBwd &r) {
    std::vector<double> dq, dk, dv;
    p.OracleBwd(&dq, &dk, &dv);
    ExpectClose(r.dq, dq, kTolBwd, "dq");
    ExpectClose(r.dk, dk, kTolBwd, "dk");
    ExpectClose(r.dv, dv, kTolBwd, "dv");
}

class BwdSchedule : public ::testing::TestWithParam<const char *> {};

TEST_P(BwdSchedule, AccumulatesAndSkipsNullOutputs) {
    Problem p;
    p.qs = {{0, 100, 1}};
    p.ks = {{0, 300, 1}};
    p.causal = 1;
    p.Make();
    CpuBwd all = RunBwd(p, 2, nullptr, GetParam());
    Device d(2, nullptr, GetParam());
    ASSERT_EQ(d.st, CTXPAR_OK);
    ctxpar_attn_block blk = p.Block();
    std::vector<float> dq(p.OutSize(), 0.25f), dk(p.KvSize(), -0.5f), dv(p.KvSize(), 0.0f);
    ASSERT_EQ(ctxpar_dev_attn_block_bwd(d.dev, &blk, &p.dout->t, all.fwd.lse.data(),
                                        all.delta.data(), dq.data(), dk.data(), nullptr, nullptr),
              CTXPAR_OK);
    for (size_t i = 0; i < dq.size(); i++)
        ASSERT_EQ(dq[i], all.dq[i] + 0.25f) << i;
    for (size_t i = 0; i < dk.size(); i++)
        ASSERT_EQ(dk[i], all.dk[i] - 0.5f) << i;
    ASSERT_EQ(ctxpar_dev_attn_block_bwd(d.dev, &blk, &p.dout->t, all.fwd.lse.data(),
                                        all.delta.data(), nullptr, nullptr, dv.data(), nullptr),
              CTXPAR_OK);
    EXPECT_EQ(BitDiff(dv, all.dv), 0u);
    ASSERT_EQ(ctxpar_dev_attn_block_bwd(d.dev, &blk, &p.dout->t, all.fwd.lse.data(),
                                        all.delta.data(), nullptr, nullptr, nullptr, nullptr),
              CTXPAR_OK);
}

// The fused schedule's dQ partial sums live in the device's scratch: counted, kept for the next
// call (which allocates nothing), and returned by ctxpar_dev_scratch_release.
TEST_P(BwdSchedule, KeepsItsScratchCountedAndReleasesIt) {
    Problem p;
    p.B = 2;
    p.Hkv = 2;
    p.qs = {{0, 200, 1}};
    p.ks = {{0, 600, 1}};
    p.Make();
    CpuBwd all = RunBwd(p, 2, nullptr, GetParam());
    Device d(2, nullptr, GetParam());
    ASSERT_EQ(d.st, CTXPAR_OK);
    ctxpar_attn_block blk = p.Block();
    std::vector<float> dq(p.OutSize(), 0.0f), dk(p.KvSize(), 0.0f), dv(p.KvSize(), 0.0f);
    ASSERT_EQ(ctxpar_dev_attn_block_bwd(d.dev, &blk, &p.dout->t, all.fwd.lse.data(),
                                        all.delta.data(), dq.data(), dk.data(), dv.data(), nullptr),
              CTXPAR_OK);
    EXPECT_EQ(ctxpar_dev_books_of(d.dev)->mem_current, ctxpar_dev_books_of(d.dev)->scratch_bytes);
    if (std::string(GetParam()) == "fused")
        EXPECT_GE(ctxpar_dev_books_of(d.dev)->mem_peak, p.OutSize() * sizeof(float)) << "one dQ-sized partial sum";
    else
        EXPECT_EQ(ctxpar_dev_books_of(d.dev)->mem_peak, 0u);
    EXPECT_EQ(BitDiff(dq, all.dq), 0u);
    const uint64_t allocs = ctxpar_dev_books_of(d.dev)->alloc_count;
    ASSERT_EQ(ctxpar_dev_attn_block_bwd(d.dev, &blk, &p.dout->t, all.fwd.lse.data(),
                                        all.delta.data(), dq.data(), dk.data(), dv.data(), nullptr),
              CTXPAR_OK);
    EXPECT_EQ(ctxpar_dev_books_of(d.dev)->alloc_count, allocs) << "the second call reuses the scratch";
    EXPECT_EQ(ctxpar_dev_scratch_release(d.dev), CTXPAR_OK);
    EXPECT_EQ(ctxpar_dev_books_of(d.dev)->mem_current, 0u);
}

INSTANTIATE_TEST_SUITE_P(Cpu, BwdSchedule, ::testing::ValuesIn(kSchedules),
                         [](const ::testing::TestParamInfo<const char *> &i) {
                             return std::string(i.param) == "fused" ? "fused" : "two_pass";
                         });

// Without a forced schedule the shapes choose: fused when (batch x K/V heads x key chunks) gives
// enough items, two-pass for one K/V head and batch 1. Either way the same bits as forcing it.
TEST(Bwd, ShapesChooseTheSchedule) {
    struct Case {
        int64_t B, Hkv;
        const char *want;
    };
    for (const Case &c : {Case{2, 2, "fused"}, Case{1, 1, "two-pass"}}) {
        Problem p;
        p.B = c.B;
        p.Hkv = c.Hkv;
        p.qs = {{0, 150, 1}};
        p.ks = {{0, 600, 1}};
        p.causal = 1;
        p.Make();
        CpuBwd chosen = RunBwd(p, 2), forced = RunBwd(p, 2, nullptr, c.want);
        EXPECT_EQ(BitDiff(chosen.dq, forced.dq), 0u) << c.want;
        EXPECT_EQ(BitDiff(chosen.dk, forced.dk), 0u) << c.want;
        EXPECT_EQ(BitDiff(chosen.dv, forced.dv), 0u) << c.want;
        CheckBwd(p, chosen);
    }
}

// ---------------------------------------------------------------- bitwise properties

Problem *DeterminismProblem(ctxpar_dtype dt) {
    Problem *p = new Problem;
    p->dtype = dt;
    p->B = 2;
    p->Hq = 4;
    p->Hkv = 2;
    p->D = 72;
    p->qs = {{0, 300, 1}};
    p->ks = {{0, 300, 1}};
    p->causal = 1;
    p->cu = Docs();
    p->Make();
    return p;
}

// Identical bits run to run and for 1, 2 and 3 threads: forward, merge, prep, backward.
TEST(Determinism, ThreadCountsGiveIdenticalBits) {
    for (ctxpar_dtype dt : {CTXPAR_DTYPE_F32, CTXPAR_DTYPE_BF16}) {
        Problem *p = DeterminismProblem(dt);
        for (const char *schedule : kSchedules) {
            CpuBwd ref = RunBwd(*p, 1, nullptr, schedule);
            for (int threads : {2, 3}) {
                CpuBwd r = RunBwd(*p, threads, nullptr, schedule);
                EXPECT_EQ(BitDiff(r.dq, ref.dq), 0u) << schedule << ", threads " << threads;
                EXPECT_EQ(BitDiff(r.dk, ref.dk), 0u) << schedule << ", threads " << threads;
                EXPECT_EQ(BitDiff(r.dv, ref.dv), 0u) << schedule << ", threads " << threads;
            }
        }
        CpuBwd ref = RunBwd(*p, 1);
        std::vector<float> ref_o, ref_l; // the two-part merge on one thread
        for (int threads : {1, 2, 3}) {
            CpuBwd r = RunBwd(*p, threads);
            EXPECT_EQ(BitDiff(r.fwd.out, ref.fwd.out), 0u) << "threads " << threads;
            EXPECT_EQ(BitDiff(r.fwd.lse, ref.fwd.lse), 0u) << "threads " << threads;
            EXPECT_EQ(BitDiff(r.delta, ref.delta), 0u) << "threads " << threads;
            EXPECT_EQ(BitDiff(r.dq, ref.dq), 0u) << "threads " << threads;
            EXPECT_EQ(BitDiff(r.dk, ref.dk), 0u) << "threads " << threads;
            EXPECT_EQ(BitDiff(r.dv, ref.dv), 0u) << "threads " << threads;

            Device d(threads);
            ASSERT_EQ(d.st, CTXPAR_OK);
            std::vector<float> o(p->OutSize()), l(p->LseSize());
            FwdPart(d.dev, *p, 0, 130, o.data(), l.data(), 0);
            FwdPart(d.dev, *p, 130, 170, o.data(), l.data(), 1);
            if (threads == 1) {
                ref_o = o;
                ref_l = l;
            }
            EXPECT_EQ(BitDiff(o, ref_o), 0u) << "merge, threads " << threads;
            EXPECT_EQ(BitDiff(l, ref_l), 0u) << "merge, threads " << threads;
        }
        delete p;
    }
}

// ---------------------------------------------------------------- every kernel table

class KernelTables : public ::testing::TestWithParam<const char *> {
  protected:
    void SetUp() override {
        if (!KernelsAvailable(GetParam()))
            GTEST_SKIP() << "this CPU cannot run the " << GetParam() << " kernels";
    }
};

// Each table's bits for 1 and 3 threads (its row independence is the conformance suite's).
TEST_P(KernelTables, ThreadCountsGiveIdenticalBits) {
    Problem *p = DeterminismProblem(CTXPAR_DTYPE_F32);
    CpuBwd a = RunBwd(*p, 1, GetParam()), b = RunBwd(*p, 3, GetParam());
    EXPECT_EQ(BitDiff(a.fwd.out, b.fwd.out), 0u);
    EXPECT_EQ(BitDiff(a.dq, b.dq), 0u);
    EXPECT_EQ(BitDiff(a.dk, b.dk), 0u);
    EXPECT_EQ(BitDiff(a.dv, b.dv), 0u);
    delete p;
}

// The peak probe measures with the device's own kernel table and threads.
TEST_P(KernelTables, PeakProbeUsesTheTable) {
    Device d(2, GetParam());
    ASSERT_EQ(d.st, CTXPAR_OK);
    ctxpar_cpu_peak p = CTXPAR_CPU_PEAK_INIT;
    ASSERT_EQ(ctxpar_cpu_measure_peak(d.dev, &p), CTXPAR_OK) << ctxpar_last_error();
    EXPECT_STREQ(p.kernels, GetParam());
    const std::string name = GetParam();
    EXPECT_EQ(p.vector_lanes, name == "avx512" ? 16 : name == "avx2" ? 8 : 4);
    EXPECT_EQ(p.threads, 2);
    EXPECT_TRUE(std::isfinite(p.flops_per_core) && p.flops_per_core > 0) << p.flops_per_core;
    EXPECT_TRUE(std::isfinite(p.flops_all_threads) && p.flops_all_threads > 0);
    EXPECT_GT(p.seconds, 0);
    EXPECT_EQ(p.struct_size, sizeof p);
}

INSTANTIATE_TEST_SUITE_P(Cpu, KernelTables, ::testing::Values("generic", "avx2", "avx512"),
                         [](const ::testing::TestParamInfo<const char *> &i) {
                             return std::string(i.param);
                         });

// ---------------------------------------------------------------- core classes (register tiles)

// The classifier on CPUs described by hand: vendor, family, model and features in, class out;
// the FMA-rate probe is asked only where the model does not tell.
int g_probe_calls = 0;
int ProbeTwo() {
    g_probe_calls++;
    return 1;
}
int ProbeOne() {
    g_probe_calls++;
    return 0;
}

TEST(Uarch, ClassifiesFakeCpuid) {
    struct Case {
        const char *vendor;
        int family, model, avx512f, avx2;
        int (*probe)();
        int hypervisor;
        ctxpar_cpu_uarch want;
        int probed;
    };
    const Case cases[] = {
        {"AuthenticAMD", 0x19, 0x11, 1, 1, ProbeTwo, 0, CTXPAR_CPU_UARCH_ZEN4, 0},    // Genoa
        {"AuthenticAMD", 0x19, 0x61, 1, 1, ProbeTwo, 0, CTXPAR_CPU_UARCH_ZEN4, 0},    // Raphael
        {"AuthenticAMD", 0x1a, 0x02, 1, 1, ProbeOne, 0, CTXPAR_CPU_UARCH_ZEN5, 0},    // Turin
        {"AuthenticAMD", 0x19, 0x01, 0, 1, ProbeTwo, 0, CTXPAR_CPU_UARCH_AVX2, 0},    // Milan
        {"AuthenticAMD", 0x17, 0x31, 0, 1, ProbeTwo, 0, CTXPAR_CPU_UARCH_AVX2, 0},    // Rome
        {"GenuineIntel", 6, 0x8f, 1, 1, ProbeOne, 0, CTXPAR_CPU_UARCH_INTEL_2FMA, 0}, // SPR
        {"GenuineIntel", 6, 0xcf, 1, 1, ProbeOne, 0, CTXPAR_CPU_UARCH_INTEL_2FMA, 0}, // EMR
        {"GenuineIntel", 6, 0x6a, 1, 1, ProbeOne, 0, CTXPAR_CPU_UARCH_INTEL_2FMA, 0}, // ICX
        {"GenuineIntel", 6, 0x8c, 1, 1, ProbeTwo, 0, CTXPAR_CPU_UARCH_INTEL_1FMA, 0}, // TGL
        {"GenuineIntel", 6, 0x7e, 1, 1, ProbeTwo, 0, CTXPAR_CPU_UARCH_INTEL_1FMA, 0}, // ICL
        // Skylake-SP / Cascade Lake: one or two units under one model number: measured.
        {"GenuineIntel", 6, 0x55, 1, 1, ProbeTwo, 0, CTXPAR_CPU_UARCH_INTEL_2FMA, 1},
        {"GenuineIntel", 6, 0x55, 1, 1, ProbeOne, 0, CTXPAR_CPU_UARCH_INTEL_1FMA, 1},
        {"GenuineIntel", 6, 0x55, 1, 1, nullptr, 0, CTXPAR_CPU_UARCH_INTEL_1FMA, 0},
        {"GenuineIntel", 6, 0xba, 0, 1, ProbeTwo, 0, CTXPAR_CPU_UARCH_AVX2, 0},       // Raptor Lake
        {"GenuineIntel", 6, 0x3f, 0, 1, ProbeTwo, 0, CTXPAR_CPU_UARCH_AVX2, 0},       // Haswell
        {"GenuineIntel", 6, 0x2a, 0, 0, ProbeTwo, 0, CTXPAR_CPU_UARCH_GENERIC, 0},    // Sandy Bridge
        {"CentaurHauls", 7, 0x3b, 1, 1, ProbeTwo, 0, CTXPAR_CPU_UARCH_INTEL_2FMA, 1}, // unknown
        {"", 0, 0, 0, 0, ProbeTwo, 0, CTXPAR_CPU_UARCH_GENERIC, 0},                   // not x86
        // Under a hypervisor the Intel model may be another core's: the probe decides (this
        // machine's VM reports Rocket Lake, 0xa7, on a two-unit server core), or the model
        // when there is no probe.
        {"GenuineIntel", 6, 0xa7, 1, 1, ProbeTwo, 1, CTXPAR_CPU_UARCH_INTEL_2FMA, 1},
        {"GenuineIntel", 6, 0x8f, 1, 1, ProbeOne, 1, CTXPAR_CPU_UARCH_INTEL_1FMA, 1},
        {"GenuineIntel", 6, 0xa7, 1, 1, nullptr, 1, CTXPAR_CPU_UARCH_INTEL_1FMA, 0},
        {"GenuineIntel", 6, 0x8f, 1, 1, nullptr, 1, CTXPAR_CPU_UARCH_INTEL_2FMA, 0},
        {"AuthenticAMD", 0x19, 0x11, 1, 1, ProbeTwo, 1, CTXPAR_CPU_UARCH_ZEN4, 0},
    };
    for (const Case &c : cases) {
        ctxpar_cpu_id id;
        std::memset(&id, 0, sizeof id);
        std::strncpy(id.vendor, c.vendor, sizeof id.vendor - 1);
        id.family = c.family;
        id.model = c.model;
        id.avx512f = c.avx512f;
        id.avx2 = c.avx2;
        id.hypervisor = c.hypervisor;
        g_probe_calls = 0;
        EXPECT_EQ(ctxpar_cpu_uarch_classify(&id, c.probe), c.want)
            << c.vendor << " family " << c.family << " model " << c.model;
        EXPECT_EQ(g_probe_calls, c.probed) << c.vendor << " model " << c.model;
    }
}

// This CPU's identity agrees with what the kernels can run, and detection is stable.
TEST(Uarch, DetectsThisCpu) {
    ctxpar_cpu_id id;
    ctxpar_cpu_id_read(&id);
    const ctxpar_cpu_uarch u = ctxpar_cpu_uarch_detect();
    EXPECT_NE(u, CTXPAR_CPU_UARCH_AUTO);
    EXPECT_EQ(ctxpar_cpu_uarch_detect(), u); // cached
    EXPECT_EQ(id.avx512f != 0, KernelsAvailable("avx512"));
    if (!id.avx512f) {
        EXPECT_EQ(u, id.avx2 ? CTXPAR_CPU_UARCH_AVX2 : CTXPAR_CPU_UARCH_GENERIC);
    }
}

const char *const kUarchs[] = {"generic", "avx2", "zen4", "zen5", "intel-1fma", "intel-2fma"};

TEST(Uarch, ParseOptionsAndPeakReport) {
    for (int i = 0; i <= CTXPAR_CPU_UARCH_INTEL_2FMA; i++) {
        ctxpar_cpu_uarch u = CTXPAR_CPU_UARCH_AUTO;
        const char *name = ctxpar_cpu_uarch_name(static_cast<ctxpar_cpu_uarch>(i));
        ASSERT_NE(name, nullptr);
        EXPECT_EQ(ctxpar_cpu_uarch_parse(name, &u), CTXPAR_OK);
        EXPECT_EQ(u, i);
    }
    ctxpar_cpu_uarch u = CTXPAR_CPU_UARCH_ZEN4;
    EXPECT_EQ(ctxpar_cpu_uarch_parse("zen9", &u), CTXPAR_ERR_INVALID_ARG);
    EXPECT_EQ(u, CTXPAR_CPU_UARCH_ZEN4); // untouched on error
    EXPECT_NE(std::string(ctxpar_last_error()).find("intel-2fma"), std::string::npos);
    EXPECT_EQ(ctxpar_cpu_uarch_parse("zen4", nullptr), CTXPAR_ERR_INVALID_ARG);

    ctxpar_cpu_options opt = CTXPAR_CPU_OPTIONS_INIT;
    EXPECT_EQ(opt.uarch, CTXPAR_CPU_UARCH_AUTO);
    opt.uarch = static_cast<ctxpar_cpu_uarch>(7);
    ctxpar_device *dev = nullptr;
    EXPECT_EQ(ctxpar_device_create_cpu(&opt, &dev), CTXPAR_ERR_INVALID_ARG);
    EXPECT_EQ(dev, nullptr);
    EXPECT_NE(std::string(ctxpar_last_error()).find("options->uarch"), std::string::npos);

    // The peak names the class and the tile: 4 x 4 for two-unit AVX-512 cores, 2 x 8 for the
    // others; AVX2 keeps 2 x 6 and generic 2 x 4 on every class.
    struct Want {
        const char *kernels, *uarch, *tiles;
    };
    const Want wants[] = {{"avx512", "intel-2fma", "4x4"}, {"avx512", "zen5", "4x4"},
                          {"avx512", "zen4", "2x8"},       {"avx512", "intel-1fma", "2x8"},
                          {"avx2", "intel-2fma", "2x6"},   {"avx2", "avx2", "2x6"},
                          {"generic", "zen5", "2x4"}};
    for (const Want &w : wants) {
        if (!KernelsAvailable(w.kernels)) {
            std::printf("skipped: this CPU cannot run the %s kernels (tile %s for %s)\n", w.kernels,
                        w.tiles, w.uarch);
            continue;
        }
        Device d(1, w.kernels, nullptr, w.uarch);
        ASSERT_EQ(d.st, CTXPAR_OK) << ctxpar_last_error();
        ctxpar_cpu_peak p = CTXPAR_CPU_PEAK_INIT;
        ASSERT_EQ(ctxpar_cpu_measure_peak(d.dev, &p), CTXPAR_OK) << ctxpar_last_error();
        EXPECT_STREQ(p.uarch, w.uarch);
        EXPECT_STREQ(p.tiles, w.tiles) << w.kernels << " " << w.uarch;
    }
    Device d(1);
    ctxpar_cpu_peak p = CTXPAR_CPU_PEAK_INIT;
    ASSERT_EQ(ctxpar_cpu_measure_peak(d.dev, &p), CTXPAR_OK);
    EXPECT_STREQ(p.uarch, ctxpar_cpu_uarch_name(ctxpar_cpu_uarch_detect())); // auto: detected
}

// Every class on every kernel table this CPU runs: the oracle's bound, the same bits for 1 and
// 3 threads, and the same bits as every other class of the table (a register tile never
// changes a sum's order). Head dims 72 (causal with documents) and 64 (causal): partial
// tiles, and column tiles that do and do not divide D.
class UarchChoices : public KernelTables {}; // skips the tables this CPU cannot run

TEST_P(UarchChoices, WithinBoundDeterministicAndTheSameBits) {
    Problem *d64 = new Problem;
    d64->D = 64;
    d64->qs = {{0, 200, 1}};
    d64->ks = {{0, 200, 1}};
    d64->causal = 1;
    d64->Make();
    for (Problem *p : {DeterminismProblem(CTXPAR_DTYPE_F32), d64}) {
        std::vector<double> out, lse;
        p->OracleFwd(&out, &lse);
        CpuBwd first;
        for (const char *uarch : kUarchs) {
            SCOPED_TRACE(std::string(GetParam()) + " kernels, uarch " + uarch + ", D " +
                         std::to_string(p->D));
            CpuBwd a = RunBwd(*p, 1, GetParam(), nullptr, uarch);
            CpuBwd b = RunBwd(*p, 3, GetParam(), nullptr, uarch);
            ExpectClose(a.fwd.out, out, kTolFwd, "out");
            ExpectClose(a.fwd.lse, lse, kTolFwd, "lse");
            CheckBwd(*p, a);
            EXPECT_EQ(BitDiff(a.fwd.out, b.fwd.out), 0u);
            EXPECT_EQ(BitDiff(a.fwd.lse, b.fwd.lse), 0u);
            EXPECT_EQ(BitDiff(a.dq, b.dq), 0u);
            EXPECT_EQ(BitDiff(a.dk, b.dk), 0u);
            EXPECT_EQ(BitDiff(a.dv, b.dv), 0u);
            if (uarch == kUarchs[0]) {
                first = a;
                continue;
            }
            EXPECT_EQ(BitDiff(a.fwd.out, first.fwd.out), 0u);
            EXPECT_EQ(BitDiff(a.fwd.lse, first.fwd.lse), 0u);
            EXPECT_EQ(BitDiff(a.dq, first.dq), 0u);
            EXPECT_EQ(BitDiff(a.dk, first.dk), 0u);
            EXPECT_EQ(BitDiff(a.dv, first.dv), 0u);
        }
        delete p;
    }
}

INSTANTIATE_TEST_SUITE_P(Cpu, UarchChoices, ::testing::Values("generic", "avx2", "avx512"),
                         [](const ::testing::TestParamInfo<const char *> &i) {
                             return std::string(i.param);
                         });

// ---------------------------------------------------------------- soft-capping's tanh

// The kernel table's vectorised tanh (ctxpar_cpu_softcap) against libm's, in F64 then rounded once
// to F32: scores over 16 decades, both signs, zeros, infinities, NaN and hidden pairs. Its
// documented bound (relative error < 1e-15 before the F32 rounding) means: equal to (float)(C tanh)
// except where that lies within 1e-15 of a midpoint between floats, and then one F32 ulp away.
void CheckSoftcap(const ctxpar_cpu_kernels *kern) {
    const size_t n = 200003; // odd: the tail of the 4-wide loop too
    std::vector<float> s(n), s0(n), dcap(n, NAN);
    std::vector<uint32_t> vis(n, 0xffffffffu);
    for (size_t i = 0; i < n; i++)
        s[i] = (float)(cpt_test_value(7, 3, i) * std::ldexp(1.0, (int)(i % 64) - 32));
    const float special[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 1e-40f, -1e-40f, 3.0e38f};
    for (size_t i = 0; i < sizeof special / sizeof special[0]; i++)
        s[i] = special[i];
    for (size_t i = 100; i < n; i += 97) { // hidden pairs: -inf, left alone, derivative 0
        s[i] = -INFINITY;
        vis[i] = 0;
    }
    s0 = s;
    ctxpar_attn_block blk;
    std::memset(&blk, 0, sizeof blk);
    blk.softcap = 30.0f;
    blk.scale = -0.125f; // the sign is in the packed operand: |scale| is used
    ctxpar_cpu_softcap(kern, &blk, s.data(), dcap.data(), vis.data(), (int64_t)n, 1);
    const double mul = 0.125 / 30.0;
    size_t inexact = 0;
    for (size_t i = 0; i < n; i++) {
        if (!vis[i]) {
            EXPECT_EQ(s[i], -INFINITY) << i;
            EXPECT_EQ(dcap[i], 0.0f) << i;
            continue;
        }
        const double t = std::tanh((double)s0[i] * mul);
        const float want = (float)(30.0 * t), want_d = (float)(1.0 - t * t);
        if (std::isnan(want)) {
            EXPECT_TRUE(std::isnan(s[i])) << i;
            continue;
        }
        if (std::memcmp(&want, &s[i], sizeof want) != 0) {
            inexact++;
            EXPECT_EQ(std::nextafter(want, s[i]), s[i]) << "score " << s0[i];
        }
        EXPECT_LE(std::fabs((double)dcap[i] - (double)want_d), 1e-15 + std::ldexp(1.0, -24))
            << "score " << s0[i];
    }
    EXPECT_EQ(std::signbit(s[1]), true); // -0 stays -0
    EXPECT_EQ(s[2], 30.0f);
    EXPECT_EQ(s[3], -30.0f);
    EXPECT_LE(inexact, n / 100000) << "more F32 roundings differ from libm's than the bound allows";
}

// Every kernel table this CPU runs (each evaluates the tanh with its own vectors).
TEST(Softcap, VectorisedTanhWithinItsBound) {
    for (const char *name : {"generic", "avx2", "avx512"}) {
        Device d(1, name);
        if (d.st != CTXPAR_OK) {
            std::printf("skipped: this CPU cannot run the %s kernels\n", name);
            continue;
        }
        SCOPED_TRACE(name);
        CheckSoftcap(ctxpar_cpu_device_of(d.dev)->kern);
    }
}

// ---------------------------------------------------------------- the backward's transpose

// kern->transpose against the definition, word for word: whole register blocks, edges of every
// size (rows and columns not multiples of the vector, fewer than one vector), padding lanes, and
// nothing written outside cols x lanes. The source outside rows x cols is poisoned, so a word
// taken from there would show.
void CheckTranspose(const ctxpar_cpu_kernels *kern) {
    const int64_t lds = 70, ldd = 72;
    std::vector<uint32_t> src(64 * lds), dst(64 * ldd);
    for (int64_t rows : {1, 3, 8, 15, 16, 17, 40, 63, 64})
        for (int64_t cols : {1, 5, 16, 31, 33, 64}) {
            const int64_t vl = kern->vector_lanes;
            const int64_t lanes = (rows + vl - 1) / vl * vl;
            for (int64_t i = 0; i < (int64_t)src.size(); i++) {
                const bool inside = i / lds < rows && i % lds < cols;
                src[i] = inside ? (uint32_t)(i * 2654435761u) : 0x7fc0dead; // a NaN outside
            }
            std::fill(dst.begin(), dst.end(), 0x12345678u);
            kern->transpose(dst.data(), ldd, src.data(), lds, rows, cols, lanes, 0xffffffffu);
            for (int64_t m = 0; m < 64; m++)
                for (int64_t l = 0; l < ldd; l++) {
                    const uint32_t want = m >= cols || l >= lanes ? 0x12345678u // not written
                                          : l < rows              ? src[l * lds + m]
                                                                  : 0xffffffffu;
                    ASSERT_EQ(dst[m * ldd + l], want)
                        << "rows " << rows << " cols " << cols << " at m " << m << " l " << l;
                }
        }
}

TEST(Transpose, EveryTableMatchesTheDefinition) {
    for (const char *name : {"generic", "avx2", "avx512"}) {
        Device d(1, name);
        if (d.st != CTXPAR_OK) {
            std::printf("skipped: this CPU cannot run the %s kernels\n", name);
            continue;
        }
        SCOPED_TRACE(name);
        CheckTranspose(ctxpar_cpu_device_of(d.dev)->kern);
    }
#ifdef CTXPAR_CPU_HAVE_X86_KERNELS
    if (KernelsAvailable("avx512")) // the 4 x 4 tile's table: the same code, its own compile
        CheckTranspose(&ctxpar_cpu_kernels_avx512_4x4);
#endif
}

// ---------------------------------------------------------------- elementwise

// Values that exercise rounding: random, ties, subnormals of F16, overflow, specials.
std::vector<float> CastValues(size_t n) {
    std::vector<float> x(n);
    const float special[] = {0.0f,      -0.0f,   1.0f / 3.0f, 65504.0f,      65520.0f,
                             1e-8f,     6.0e-5f, -2.5e-6f,    3.0e38f,       INFINITY,
                             -INFINITY, NAN,     1.00390625f, 1.0009765625f, 1e-40f};
    for (size_t i = 0; i < n; i++)
        x[i] = i < sizeof special / sizeof special[0]
                   ? special[i]
                   : (float)(cpt_test_value(3, 9, i) * std::ldexp(1.0, (int)(i % 40) - 20));
    return x;
}

uint16_t ToBits16(ctxpar_dtype dt, float f) {
    return dt == CTXPAR_DTYPE_F16 ? ctxpar_f32_to_f16(f) : ctxpar_f32_to_bf16(f);
}
float FromBits16(ctxpar_dtype dt, uint16_t h) {
    return dt == CTXPAR_DTYPE_F16 ? ctxpar_f16_to_f32(h) : ctxpar_bf16_to_f32(h);
}

// Every dtype pair, strided on both sides: each element equals the scalar conversion of
// ctxpar_half.h (through F32 between the two 16-bit formats), bit for bit.
TEST(Cast, EveryPairMatchesScalarConversions) {
    const int64_t B = 2, S = 9, H = 3, D = 300;
    const ctxpar_dtype all[3] = {CTXPAR_DTYPE_F32, CTXPAR_DTYPE_F16, CTXPAR_DTYPE_BF16};
    std::vector<float> vals = CastValues((size_t)(B * S * H * D));
    Device d(2);
    ASSERT_EQ(d.st, CTXPAR_OK);
    for (ctxpar_dtype from : all)
        for (ctxpar_dtype to : all) {
            HostTensor src(from, B, S, H, D, 3), dst(to, B, S, H, D, 11);
            std::vector<uint32_t> want;
            size_t i = 0;
            for (int64_t b = 0; b < B; b++)
                for (int64_t s = 0; s < S; s++)
                    for (int64_t h = 0; h < H; h++)
                        for (int64_t e = 0; e < D; e++, i++) {
                            int64_t off =
                                b * src.t.stride[0] + s * src.t.stride[1] + h * src.t.stride[2] + e;
                            float f = vals[i];
                            if (from == CTXPAR_DTYPE_F32) {
                                ((float *)src.t.data)[off] = f;
                            } else {
                                uint16_t hb = ToBits16(from, f);
                                ((uint16_t *)src.t.data)[off] = hb;
                                f = FromBits16(from, hb);
                            }
                            if (to == from && from != CTXPAR_DTYPE_F32)
                                want.push_back(ToBits16(from, vals[i]));
                            else if (to == CTXPAR_DTYPE_F32)
                                want.push_back(ctxpar_f32_bits(f));
                            else
                                want.push_back(ToBits16(to, f));
                        }
            ASSERT_EQ(ctxpar_dev_cast(d.dev, &src.t, &dst.t, nullptr), CTXPAR_OK)
                << ctxpar_last_error();
            i = 0;
            size_t bad = 0;
            for (int64_t b = 0; b < B; b++)
                for (int64_t s = 0; s < S; s++)
                    for (int64_t h = 0; h < H; h++)
                        for (int64_t e = 0; e < D; e++, i++) {
                            int64_t off =
                                b * dst.t.stride[0] + s * dst.t.stride[1] + h * dst.t.stride[2] + e;
                            uint32_t got = to == CTXPAR_DTYPE_F32
                                               ? ctxpar_f32_bits(((float *)dst.t.data)[off])
                                               : ((uint16_t *)dst.t.data)[off];
                            bad += got != want[i];
                        }
            EXPECT_EQ(bad, 0u) << ctxpar_dtype_name(from) << " -> " << ctxpar_dtype_name(to);
        }
}

// Round trips: 16-bit -> F32 -> 16-bit gives the same bits; a few values checked by hand.
TEST(Cast, RoundTripsAndKnownValues) {
    Device d(1);
    ASSERT_EQ(d.st, CTXPAR_OK);
    for (ctxpar_dtype dt : {CTXPAR_DTYPE_F16, CTXPAR_DTYPE_BF16}) {
        const int64_t n = 65536; // every 16-bit pattern
        HostTensor h(dt, 1, 1, 1, n), f(CTXPAR_DTYPE_F32, 1, 1, 1, n), back(dt, 1, 1, 1, n);
        for (int64_t i = 0; i < n; i++)
            ((uint16_t *)h.t.data)[i] = (uint16_t)i;
        ASSERT_EQ(ctxpar_dev_cast(d.dev, &h.t, &f.t, nullptr), CTXPAR_OK);
        ASSERT_EQ(ctxpar_dev_cast(d.dev, &f.t, &back.t, nullptr), CTXPAR_OK);
        size_t bad = 0;
        for (int64_t i = 0; i < n; i++) {
            float x = ((float *)f.t.data)[i];
            if (std::isnan(x))
                continue; // NaN payloads may be quietened; NaN stays NaN
            bad += ((uint16_t *)back.t.data)[i] != (uint16_t)i;
        }
        EXPECT_EQ(bad, 0u) << ctxpar_dtype_name(dt);
    }
    // 1/3: F16 0x3555, BF16 0x3EAB; 1 + 2^-11 is a tie in F16 and rounds to even (1.0).
    HostTensor f(CTXPAR_DTYPE_F32, 1, 1, 1, 2), h16(CTXPAR_DTYPE_F16, 1, 1, 1, 2),
        hb(CTXPAR_DTYPE_BF16, 1, 1, 1, 2);
    ((float *)f.t.data)[0] = 1.0f / 3.0f;
    ((float *)f.t.data)[1] = 1.00048828125f;
    ASSERT_EQ(ctxpar_dev_cast(d.dev, &f.t, &h16.t, nullptr), CTXPAR_OK);
    ASSERT_EQ(ctxpar_dev_cast(d.dev, &f.t, &hb.t, nullptr), CTXPAR_OK);
    EXPECT_EQ(((uint16_t *)h16.t.data)[0], 0x3555);
    EXPECT_EQ(((uint16_t *)h16.t.data)[1], 0x3c00);
    EXPECT_EQ(((uint16_t *)hb.t.data)[0], 0x3eab);
}

TEST(Memory, AllocCopyMemset) {
    Device d(1);
    ASSERT_EQ(d.st, CTXPAR_OK);
    for (ctxpar_mem_kind kind : {CTXPAR_MEM_DEVICE, CTXPAR_MEM_HOST}) {
        void *a = nullptr, *b = nullptr;
        ASSERT_EQ(ctxpar_dev_alloc(d.dev, 1000, kind, &a), CTXPAR_OK);
        ASSERT_EQ(ctxpar_dev_alloc(d.dev, 1000, kind, &b), CTXPAR_OK);
        EXPECT_EQ((uintptr_t)a % 64, 0u);
        ASSERT_EQ(ctxpar_dev_memset(d.dev, a, 0x5a, 1000, nullptr), CTXPAR_OK);
        for (ctxpar_copy_kind ck :
             {CTXPAR_COPY_D2D, CTXPAR_COPY_H2D, CTXPAR_COPY_D2H, CTXPAR_COPY_H2H}) {
            std::memset(b, 0, 1000);
            ASSERT_EQ(ctxpar_dev_copy(d.dev, b, a, 1000, ck, nullptr), CTXPAR_OK);
            EXPECT_EQ(std::memcmp(a, b, 1000), 0);
        }
        ctxpar_dev_free(d.dev, a, 1000, kind);
        ctxpar_dev_free(d.dev, b, 1000, kind);
    }
    EXPECT_EQ(ctxpar_dev_has_streams(d.dev), 0);
}

// Blocks are 64-byte aligned and whole, distinct while both are held, and every byte is given back
// (the device keeps no cache: the context's workspace is what is reused; ASan and valgrind check
// that no block leaks).
TEST(Memory, BlocksAreAlignedAndGivenBack) {
    Device d(1);
    ASSERT_EQ(d.st, CTXPAR_OK);
    void *a = nullptr, *b = nullptr, *c = nullptr;
    ASSERT_EQ(ctxpar_dev_alloc(d.dev, 100000, CTXPAR_MEM_DEVICE, &a), CTXPAR_OK);
    std::memset(a, 1, 100000);
    ctxpar_dev_free(d.dev, a, 100000, CTXPAR_MEM_DEVICE);
    ASSERT_EQ(ctxpar_dev_alloc(d.dev, 100000, CTXPAR_MEM_DEVICE, &b), CTXPAR_OK);
    ASSERT_EQ(ctxpar_dev_alloc(d.dev, 100000, CTXPAR_MEM_DEVICE, &c), CTXPAR_OK);
    EXPECT_NE(c, b);
    for (void *p : {b, c}) {
        EXPECT_EQ((uintptr_t)p % 64, 0u);
        std::memset(p, 2, 100000);
    }
    ctxpar_dev_free(d.dev, b, 100000, CTXPAR_MEM_DEVICE);
    ctxpar_dev_free(d.dev, c, 100000, CTXPAR_MEM_DEVICE);
    std::vector<void *> many(40);
    for (size_t i = 0; i < many.size(); i++) {
        ASSERT_EQ(ctxpar_dev_alloc(d.dev, 4096 * (i + 1), CTXPAR_MEM_HOST, &many[i]), CTXPAR_OK);
        std::memset(many[i], 3, 4096 * (i + 1));
    }
    for (size_t i = 0; i < many.size(); i++)
        ctxpar_dev_free(d.dev, many[i], 4096 * (i + 1), CTXPAR_MEM_HOST);
    EXPECT_EQ(ctxpar_dev_books_of(d.dev)->mem_current, 0u);
}

TEST(Errors, DeviceOptions) {
    ctxpar_device *dev = nullptr;
    ctxpar_cpu_options opt = CTXPAR_CPU_OPTIONS_INIT;
    opt.num_threads = -1;
    EXPECT_EQ(ctxpar_device_create_cpu(&opt, &dev), CTXPAR_ERR_INVALID_ARG);
    opt = CTXPAR_CPU_OPTIONS_INIT;
    opt.struct_size = 0;
    EXPECT_EQ(ctxpar_device_create_cpu(&opt, &dev), CTXPAR_ERR_INVALID_ARG);
    EXPECT_EQ(dev, nullptr);
    EXPECT_EQ(ctxpar_device_create_cpu(nullptr, nullptr), CTXPAR_ERR_INVALID_ARG);
    Device unknown(1, "sse9");
    EXPECT_EQ(unknown.st, CTXPAR_ERR_INVALID_ARG);
    EXPECT_NE(std::string(ctxpar_last_error()).find("'sse9'"), std::string::npos)
        << ctxpar_last_error();
    Device unknown_bwd(1, nullptr, "three-pass");
    EXPECT_EQ(unknown_bwd.st, CTXPAR_ERR_INVALID_ARG);
    EXPECT_NE(std::string(ctxpar_last_error()).find("'three-pass'"), std::string::npos)
        << ctxpar_last_error();
    // Values outside the enums, and a table this build or CPU cannot run.
    opt = CTXPAR_CPU_OPTIONS_INIT;
    opt.kernels = static_cast<ctxpar_cpu_isa>(9);
    EXPECT_EQ(ctxpar_device_create_cpu(&opt, &dev), CTXPAR_ERR_INVALID_ARG);
    EXPECT_NE(std::string(ctxpar_last_error()).find("options->kernels"), std::string::npos);
    opt = CTXPAR_CPU_OPTIONS_INIT;
    opt.bwd_schedule = static_cast<ctxpar_cpu_bwd_schedule>(-1);
    EXPECT_EQ(ctxpar_device_create_cpu(&opt, &dev), CTXPAR_ERR_INVALID_ARG);
    EXPECT_NE(std::string(ctxpar_last_error()).find("options->bwd_schedule"), std::string::npos);
    EXPECT_EQ(dev, nullptr);
    // A caller compiled before kernels and bwd_schedule existed: what lies past its struct_size
    // is not read, and those fields keep their defaults.
    struct OldOptions {
        size_t struct_size;
        int num_threads;
    };
    std::vector<unsigned char> buf(sizeof(ctxpar_cpu_options), 0xff); // garbage past the end
    OldOptions old = {sizeof(OldOptions), 1};
    std::memcpy(buf.data(), &old, sizeof old);
    ctxpar_device *old_dev = nullptr;
    ASSERT_EQ(
        ctxpar_device_create_cpu(reinterpret_cast<ctxpar_cpu_options *>(buf.data()), &old_dev),
        CTXPAR_OK)
        << ctxpar_last_error();
    ctxpar_device_destroy(old_dev);
    ctxpar_device_destroy(nullptr);
    Device ok(0);
    ASSERT_EQ(ok.st, CTXPAR_OK);
}

} // namespace
