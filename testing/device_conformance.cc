// The device conformance suite: every device op against the fp64 oracle or exact values, and
// the contracts the algorithms rely on (docs/architecture.md: row independence, the mask pair
// by pair, non-finite values, empty rows, determinism), run for every factory of
// device_conformance_test.cc (each CPU kernel table, CUDA with and without cuDNN). A device
// that cannot run here skips every case, saying why. Cases specific to one backend stay in its
// own suite (cpu_ops_test, cuda_ops_test).
#include "testing/device_conformance.h"

#include <algorithm>
#include <cstring>
#include <ostream>
#include <random>
#include <tuple>

#include "ctxpar_cpu.h"
#include "dispatch.h"
#include "testing/expect_nonfinite.h"
#include "testing/nonfinite_oracle.h"
#include "testing/random_mask.h"

namespace cpt_devconf {
namespace {

// The CPU reference device, for the ggml-style comparison (in addition to the oracle).
std::string CreateCpuReference(ctxpar_device **dev_out) {
    ctxpar_cpu_options o = CTXPAR_CPU_OPTIONS_INIT;
    return ctxpar_device_create_cpu(&o, dev_out) == CTXPAR_OK ? "" : ctxpar_last_error();
}

// ---------------------------------------------------------------- fixtures

class DeviceTest : public ::testing::TestWithParam<DeviceFactory> {
  protected:
    void SetUp() override {
        dev_.reset(new TestDevice(GetParam()));
        if (!dev_->skip.empty())
            GTEST_SKIP() << "skipped: " << dev_->skip;
    }
    const DeviceFactory &F() const { return GetParam(); }
    ctxpar_device *dev() const { return dev_->dev; }
    std::unique_ptr<TestDevice> dev_;
};

// Parameters are (case, factory): gtest runs them case by case, so the oracle's answer for one
// case is computed once and reused by every factory (OracleCache).
template <class C>
class DeviceCaseTest : public ::testing::TestWithParam<std::tuple<C, DeviceFactory>> {
  protected:
    void SetUp() override {
        dev_.reset(new TestDevice(F()));
        if (!dev_->skip.empty())
            GTEST_SKIP() << "skipped: " << dev_->skip;
    }
    const DeviceFactory &F() const { return std::get<1>(this->GetParam()); }
    const C &Case() const { return std::get<0>(this->GetParam()); }
    ctxpar_device *dev() const { return dev_->dev; }
    std::unique_ptr<TestDevice> dev_;
};

// Everything that determines a problem's oracle answers.
std::string Key(const Problem &p) {
    std::string k = std::to_string(p.B) + "," + std::to_string(p.Hq) + "," + std::to_string(p.Hkv) +
                    "," + std::to_string(p.D) + "," + std::to_string((int)p.dtype) + "," +
                    std::to_string(p.causal) + "," + std::to_string(p.window) + "," +
                    std::to_string(p.window_right) + "," + std::to_string(p.Scale()) + "," +
                    std::to_string(p.seed) + "," + std::to_string(p.seq_global) + "," +
                    std::to_string(p.DV()) + "," + std::to_string(p.softcap) + "|";
    for (const auto *spans : {&p.qs, &p.ks}) {
        for (const ctxpar_span &x : *spans)
            k += std::to_string(x.start) + ":" + std::to_string(x.len) + ":" +
                 std::to_string(x.stride) + ";";
        k += "|";
    }
    for (int32_t c : p.cu)
        k += std::to_string(c) + ";";
    return k;
}

// The oracle's answers for the latest problem (the fp64 oracle costs more than the devices).
struct OracleCache {
    std::string fwd_key, bwd_key;
    std::vector<double> out, lse, dq, dk, dv;
    void Fwd(const Problem &p) {
        const std::string k = Key(p);
        if (k != fwd_key) {
            p.OracleFwd(&out, &lse);
            fwd_key = k;
        }
    }
    void Bwd(const Problem &p) {
        Fwd(p);
        const std::string k = Key(p);
        if (k != bwd_key) {
            p.OracleBwd(&dq, &dk, &dv);
            bwd_key = k;
        }
    }
};

OracleCache &Oracle() {
    static OracleCache cache;
    return cache;
}

// The forward against the oracle (and the CPU reference where the factory asks for it).
void CheckFwd(const DeviceFactory &f, ctxpar_device *dev, const Problem &p) {
    Oracle().Fwd(p);
    const std::vector<double> ref_out = Oracle().out, ref_lse = Oracle().lse;
    const double tol = f.out_tol(p.dtype, p.D);
    FwdResult r = RunFwd(dev, p);
    ExpectClose(r.out, ref_out, tol, "out vs oracle");
    ExpectClose(r.lse, ref_lse, kTolF32, "lse vs oracle");
    ExpectEmptyRows(p, r, ref_lse);
    if (f.compare_with_cpu) {
        DeviceFactory ref = {"cpu", CreateCpuReference, nullptr, 0, false, 1, 1, nullptr};
        TestDevice cpu(ref);
        ASSERT_EQ(cpu.skip, "");
        FwdResult c = RunFwd(cpu.dev, p);
        ExpectClose(r.out, F64(c.out), tol, "out vs cpu");
        ExpectClose(r.lse, F64(c.lse), kTolF32, "lse vs cpu");
    }
}

// delta = rowsum(dout * out) in float64, out as the F32 values the device was given.
std::vector<double> RefDelta(const Problem &p, const std::vector<double> &ref_out) {
    std::vector<double> g = p.dout->f64(), delta(p.LseSize(), 0.0);
    for (int64_t b = 0; b < p.B; b++)
        for (int64_t s = 0; s < p.Sq(); s++)
            for (int64_t h = 0; h < p.Hq; h++)
                for (int64_t d = 0; d < p.D; d++) {
                    size_t i = (size_t)(((b * p.Sq() + s) * p.Hq + h) * p.D + d);
                    delta[(size_t)((b * p.Hq + h) * p.Sq() + s)] += (double)(float)ref_out[i] * g[i];
                }
    return delta;
}

void CheckBwd(const DeviceFactory &f, ctxpar_device *dev, const Problem &p) {
    Oracle().Bwd(p);
    const std::vector<double> ref_out = Oracle().out, ref_lse = Oracle().lse;
    const std::vector<double> dq = Oracle().dq, dk = Oracle().dk, dv = Oracle().dv;
    BwdResult r = RunBwd(dev, p, ref_out, ref_lse);
    ExpectClose(r.delta, RefDelta(p, ref_out), kTolSmall, "delta vs float64");
    ExpectClose(r.dq, dq, kTolF32, "dq vs oracle");
    ExpectClose(r.dk, dk, kTolF32, "dk vs oracle");
    ExpectClose(r.dv, dv, kTolF32, "dv vs oracle");
    if (f.compare_with_cpu) {
        DeviceFactory ref = {"cpu", CreateCpuReference, nullptr, 0, false, 1, 1, nullptr};
        TestDevice cpu(ref);
        ASSERT_EQ(cpu.skip, "");
        BwdResult c = RunBwd(cpu.dev, p, ref_out, ref_lse);
        ExpectClose(r.dq, F64(c.dq), kTolF32, "dq vs cpu");
        ExpectClose(r.dk, F64(c.dk), kTolF32, "dk vs cpu");
        ExpectClose(r.dv, F64(c.dv), kTolF32, "dv vs cpu");
    }
}

std::string FactoryName(const DeviceFactory &f) {
    return f.name;
}

// ---------------------------------------------------------------- forward and backward vs oracle

// Every mask x position x dtype x GQA ratio 1, 2, Hq (forward); the backward cycles the ratio.
struct BlockCase {
    MaskCase mask;
    PosCase pos;
    ctxpar_dtype dtype;
    int64_t hkv;
};

void PrintTo(const BlockCase &c, std::ostream *os) {
    *os << c.mask.name << "/" << c.pos.name << "/" << ctxpar_dtype_name(c.dtype) << "/hkv"
        << c.hkv;
}

std::vector<BlockCase> FwdCases() {
    std::vector<BlockCase> v;
    for (const MaskCase &m : MaskCases())
        for (const PosCase &pc : PosCases())
            for (ctxpar_dtype dt : {CTXPAR_DTYPE_F32, CTXPAR_DTYPE_BF16, CTXPAR_DTYPE_F16})
                for (int64_t hkv : {4, 2, 1})
                    v.push_back({m, pc, dt, hkv});
    return v;
}

std::vector<BlockCase> BwdCases() {
    std::vector<BlockCase> v;
    int i = 0;
    const int64_t hkv[3] = {4, 2, 1};
    for (const MaskCase &m : MaskCases())
        for (const PosCase &pc : PosCases())
            for (ctxpar_dtype dt : {CTXPAR_DTYPE_F32, CTXPAR_DTYPE_BF16, CTXPAR_DTYPE_F16})
                v.push_back({m, pc, dt, hkv[i++ % 3]});
    return v;
}

// (case, factory) pairs, case by case, each factory taking every n-th case of the sweep
// (offset by the factory's index, so that subsets of different factories differ).
std::vector<std::tuple<BlockCase, DeviceFactory>> Sweep(const std::vector<BlockCase> &cases,
                                                        bool bwd) {
    std::vector<std::tuple<BlockCase, DeviceFactory>> v;
    const std::vector<DeviceFactory> fs = DeviceFactories();
    for (size_t i = 0; i < cases.size(); i++)
        for (size_t j = 0; j < fs.size(); j++) {
            const size_t every = (size_t)(bwd ? fs[j].bwd_every : fs[j].fwd_every);
            if ((i + j) % every == 0)
                v.push_back(std::make_tuple(cases[i], fs[j]));
        }
    return v;
}

std::string BlockName(const ::testing::TestParamInfo<std::tuple<BlockCase, DeviceFactory>> &i) {
    const BlockCase &c = std::get<0>(i.param);
    return std::get<1>(i.param).name + "_" + c.mask.name + "_" + c.pos.name + "_" +
           ctxpar_dtype_name(c.dtype) + "_gqa" + std::to_string(4 / c.hkv);
}

Problem *MakeBlock(const BlockCase &c, Problem *p) {
    p->D = 40;
    p->dtype = c.dtype;
    p->Hkv = c.hkv;
    p->qs = c.pos.q;
    p->ks = c.pos.k;
    SetMask(p, c.mask);
    p->pad = c.hkv == 2 ? 5 : 0; // some cases on non-dense, unaligned rows
    p->Make();
    return p;
}

using FwdOracle = DeviceCaseTest<BlockCase>;

TEST_P(FwdOracle, MatchesOracle) {
    Problem p;
    CheckFwd(F(), dev(), *MakeBlock(Case(), &p));
}

INSTANTIATE_TEST_SUITE_P(Devices, FwdOracle, ::testing::ValuesIn(Sweep(FwdCases(), false)),
                         BlockName);

using BwdOracle = DeviceCaseTest<BlockCase>;

TEST_P(BwdOracle, MatchesOracle) {
    Problem p;
    CheckBwd(F(), dev(), *MakeBlock(Case(), &p));
}

INSTANTIATE_TEST_SUITE_P(Devices, BwdOracle, ::testing::ValuesIn(Sweep(BwdCases(), true)),
                         BlockName);

// Head dims from 1 to past 256 (every kernel bucket, tails in every tiled dimension); above a
// backend's limit the forward says NOT_SUPPORTED and writes nothing.
struct DimCase {
    int64_t d;
    ctxpar_dtype dtype;
};

void PrintTo(const DimCase &c, std::ostream *os) {
    *os << ctxpar_dtype_name(c.dtype) << "/d" << c.d;
}

std::vector<DimCase> DimCases() {
    std::vector<DimCase> v;
    for (int64_t d : {1, 3, 16, 17, 40, 64, 100, 128, 136, 256, 300})
        for (ctxpar_dtype dt : {CTXPAR_DTYPE_F32, CTXPAR_DTYPE_BF16, CTXPAR_DTYPE_F16})
            v.push_back({d, dt});
    return v;
}

std::string DimName(const ::testing::TestParamInfo<std::tuple<DimCase, DeviceFactory>> &i) {
    const DimCase &c = std::get<0>(i.param);
    return std::get<1>(i.param).name + "_" + ctxpar_dtype_name(c.dtype) + "_d" +
           std::to_string(c.d);
}

using HeadDim = DeviceCaseTest<DimCase>;

TEST_P(HeadDim, ForwardAndBackwardMatchOracle) {
    Problem p;
    p.B = 1;
    p.Hkv = 1;
    p.D = Case().d;
    p.dtype = Case().dtype;
    p.qs = {{10, 67, 1}};
    p.ks = {{0, 77, 1}};
    p.causal = 1;
    p.pad = p.D == 40 ? 4 : 0;
    p.Make();
    // attn_supported answers what the block ops then do, without work or allocation.
    const uint64_t allocs = ctxpar_dev_books_of(dev())->alloc_count;
    const size_t held = ctxpar_dev_books_of(dev())->mem_current;
    for (int backward : {0, 1}) {
        ctxpar_attn_query query = {p.dtype, p.B, p.Sq(), p.Sk(), p.Hq,
                                   p.Hkv,   p.D, {},     backward, p.D, 0.0f, 0};
        query.mask.causal = p.causal;
        ctxpar_clear_error();
        const ctxpar_status st = ctxpar_dev_attn_supported(dev(), &query);
        if (p.D > F().max_head_dim) {
            EXPECT_EQ(st, CTXPAR_ERR_NOT_SUPPORTED) << "backward=" << backward;
            EXPECT_STRNE(ctxpar_last_error(), "") << "NOT_SUPPORTED says why";
        } else {
            EXPECT_EQ(st, CTXPAR_OK) << "backward=" << backward << ": " << ctxpar_last_error();
        }
    }
    EXPECT_EQ(ctxpar_dev_books_of(dev())->alloc_count, allocs);
    EXPECT_EQ(ctxpar_dev_books_of(dev())->mem_current, held);
    if (p.D > F().max_head_dim) {
        Space sp(dev());
        ctxpar_attn_block blk = p.Block(&sp);
        std::vector<float> o(p.OutSize(), 42.0f), l(p.LseSize(), 42.0f);
        float *out = sp.Put(o), *lse = sp.Put(l);
        EXPECT_EQ(ctxpar_dev_attn_block_fwd(dev(), &blk, out, lse, 0, nullptr),
                  CTXPAR_ERR_NOT_SUPPORTED);
        EXPECT_EQ(BitDiff(sp.Get(out, o.size()), o), 0u);
        return;
    }
    CheckFwd(F(), dev(), p);
    if (p.dtype == CTXPAR_DTYPE_F32)
        CheckBwd(F(), dev(), p);
}

INSTANTIATE_TEST_SUITE_P(Devices, HeadDim,
                         ::testing::Combine(::testing::ValuesIn(DimCases()),
                                            ::testing::ValuesIn(DeviceFactories())),
                         DimName);

// MLA (v's head_dim 128 beside q/k's 192) and soft-capping, each kernel path: forward and
// backward against the oracle's own implementation of them. A device that reports the feature
// NOT_SUPPORTED through attn_supported (CUDA) skips, saying so.
struct FeatureCase {
    const char *name;
    int64_t d, dv;
    float softcap, scale;
    int causal;
    int64_t window;
};

void PrintTo(const FeatureCase &c, std::ostream *os) {
    *os << c.name;
}

std::vector<FeatureCase> FeatureCases() {
    return {{"mla", 192, 128, 0.0f, 0.0f, 1, 0},
            {"mla_small_v", 40, 16, 0.0f, 0.0f, 0, 48},
            {"softcap", 64, 0, 1.5f, 0.5f, 1, 0},
            {"softcap_window_mla", 96, 64, 2.0f, 0.4f, 0, 48}};
}

std::string FeatureName(const ::testing::TestParamInfo<std::tuple<FeatureCase, DeviceFactory>> &i) {
    return std::get<1>(i.param).name + "_" + std::get<0>(i.param).name;
}

using Features = DeviceCaseTest<FeatureCase>;

TEST_P(Features, ForwardAndBackwardMatchOracle) {
    const FeatureCase &c = Case();
    Problem p;
    p.D = c.d;
    p.Dv = c.dv;
    p.softcap = c.softcap;
    p.scale = c.scale;
    p.causal = c.causal;
    p.window = c.window;
    p.qs = {{50, 140, 1}};
    p.ks = {{100, 150, 1}};
    p.Make();
    ctxpar_attn_query query = {p.dtype, p.B,    p.Sq(), p.Sk(),    p.Hq,    p.Hkv,
                               p.D,     p.Mask(), 1,    p.DV(),    p.softcap, 0};
    if (ctxpar_dev_attn_supported(dev(), &query) == CTXPAR_ERR_NOT_SUPPORTED)
        GTEST_SKIP() << "skipped: the device does not support it: " << ctxpar_last_error();
    std::vector<double> out, lse, dq, dk, dv;
    p.OracleFwd(&out, &lse);
    FwdResult r = RunFwd(dev(), p);
    ExpectClose(r.out, out, kTolF32, "out vs oracle");
    ExpectClose(r.lse, lse, kTolF32, "lse vs oracle");
    p.OracleBwd(&dq, &dk, &dv);
    BwdResult b = RunBwd(dev(), p, out, lse);
    ExpectClose(b.dq, dq, kTolF32, "dq vs oracle");
    ExpectClose(b.dk, dk, kTolF32, "dk vs oracle");
    ExpectClose(b.dv, dv, kTolF32, "dv vs oracle");
}

INSTANTIATE_TEST_SUITE_P(Devices, Features,
                         ::testing::Combine(::testing::ValuesIn(FeatureCases()),
                                            ::testing::ValuesIn(DeviceFactories())),
                         FeatureName);

// Two-sided windows (window_right, mask none): blocks that the right limit cuts through, alone
// and with a left window, strided positions and documents, forward and backward.
TEST_P(DeviceTest, TwoSidedWindowMatchesOracle) {
    struct {
        int64_t left, right;
        std::vector<ctxpar_span> qs, ks;
        bool docs;
    } cases[] = {{0, 20, {{50, 90, 1}}, {{40, 120, 1}}, false},
                 {48, 20, {{100, 70, 1}}, {{60, 150, 1}}, false},
                 {30, 9, {{0, 40, 3}}, {{1, 60, 2}}, false},
                 {0, 33, {{20, 100, 1}}, {{0, 150, 1}}, true}};
    for (const auto &c : cases) {
        Problem p;
        p.window = c.left;
        p.window_right = c.right;
        p.qs = c.qs;
        p.ks = c.ks;
        if (c.docs)
            p.cu = Docs();
        p.Make();
        CheckFwd(F(), dev(), p);
        if (p.dtype == CTXPAR_DTYPE_F32)
            CheckBwd(F(), dev(), p);
    }
}

// ---------------------------------------------------------------- forward: scale, empty rows

TEST_P(DeviceTest, FwdScaleIsApplied) {
    Problem p;
    p.qs = {{0, 70, 1}};
    p.ks = {{0, 70, 1}};
    p.scale = 0.9f;
    p.Make();
    CheckFwd(F(), dev(), p);
}

// Rows with no visible key, mixed with rows that have some in the same tiles (docs + causal +
// window), and a block pair that is masked as a whole.
TEST_P(DeviceTest, FwdFullyMaskedRows) {
    for (int whole = 0; whole < 2; whole++) {
        Problem p;
        p.qs = whole ? std::vector<ctxpar_span>{{0, 90, 1}} : std::vector<ctxpar_span>{{20, 100, 1}};
        p.ks = {{95, 120, 1}};
        p.causal = 1;
        p.window = whole ? 0 : 30;
        p.cu = Docs();
        p.Make();
        std::vector<double> ref_out, ref_lse;
        p.OracleFwd(&ref_out, &ref_lse);
        int empty = 0;
        for (double x : ref_lse)
            empty += x == -INFINITY;
        ASSERT_GT(empty, 0);
        CheckFwd(F(), dev(), p);
    }
}

TEST_P(DeviceTest, FwdEmptyKeyBlock) {
    Problem p;
    p.qs = {{0, 30, 1}};
    p.ks = {};
    p.Make();
    FwdResult r = RunFwd(dev(), p);
    ASSERT_EQ(r.lse.size(), p.LseSize());
    for (float x : r.lse)
        ASSERT_EQ(x, -INFINITY);
    for (float x : r.out)
        ASSERT_EQ(x, 0.0f);
}

// ---------------------------------------------------------------- merge algebra

// The forward of p against keys [k0, k0 + n) of its K/V block into (out, lse) in `sp`.
void FwdPart(Space *sp, const Problem &p, int64_t k0, int64_t n, float *out, float *lse,
             int merge) {
    ctxpar_attn_block blk = p.Block(sp);
    ctxpar_span ks = {p.kpos[(size_t)k0], n, 1};
    blk.k.data = (char *)blk.k.data + k0 * blk.k.stride[1] * (int64_t)DtypeSize(p.dtype);
    blk.v.data = (char *)blk.v.data + k0 * blk.v.stride[1] * (int64_t)DtypeSize(p.dtype);
    blk.k.shape[1] = blk.v.shape[1] = n;
    blk.k_pos = {&ks, 1};
    ASSERT_EQ(ctxpar_dev_attn_block_fwd(sp->dev(), &blk, out, lse, merge, nullptr), CTXPAR_OK)
        << ctxpar_last_error();
}

void MakeMergeProblem(Problem *p, ctxpar_dtype dt) {
    p->dtype = dt;
    p->qs = {{60, 130, 1}};
    p->ks = {{0, 200, 1}};
    p->causal = 1;
    p->cu = Docs();
    p->Make();
}

// Two halves of K/V merged by the forward (merge = 1) and by attn_merge both equal the whole;
// three partials merged in two orders agree up to rounding.
TEST_P(DeviceTest, MergeOfPartsEqualsTheWhole) {
    for (ctxpar_dtype dt : {CTXPAR_DTYPE_F32, CTXPAR_DTYPE_BF16, CTXPAR_DTYPE_F16}) {
        SCOPED_TRACE(ctxpar_dtype_name(dt));
        Problem p;
        MakeMergeProblem(&p, dt);
        std::vector<double> ref_out, ref_lse;
        p.OracleFwd(&ref_out, &ref_lse);
        const double tol = F().out_tol(dt, p.D);
        Space sp(dev());
        std::vector<float> nan_o(p.OutSize(), NAN), nan_l(p.LseSize(), NAN);
        float *o1 = sp.Put(nan_o), *l1 = sp.Put(nan_l);
        FwdPart(&sp, p, 0, 77, o1, l1, 0);
        FwdPart(&sp, p, 77, 123, o1, l1, 1);
        ExpectClose(sp.Get(o1, p.OutSize()), ref_out, tol, "fwd merge out");
        ExpectClose(sp.Get(l1, p.LseSize()), ref_lse, kTolF32, "fwd merge lse");

        float *o2 = sp.Put(nan_o), *l2 = sp.Put(nan_l), *ob = sp.Put(nan_o), *lb = sp.Put(nan_l);
        FwdPart(&sp, p, 0, 77, o2, l2, 0);
        FwdPart(&sp, p, 77, 123, ob, lb, 0);
        ASSERT_EQ(ctxpar_dev_attn_merge(dev(), o2, l2, ob, lb, p.B, p.Sq(), p.Hq, p.D, nullptr),
                  CTXPAR_OK);
        std::vector<float> merged = sp.Get(o2, p.OutSize()), merged_l = sp.Get(l2, p.LseSize());
        ExpectClose(merged, ref_out, tol, "attn_merge out");
        ExpectClose(merged_l, ref_lse, kTolF32, "attn_merge lse");

        const int64_t cut[4] = {0, 64, 140, 200};
        float *po[3], *pl[3];
        for (int i = 0; i < 3; i++) {
            po[i] = sp.Put(nan_o), pl[i] = sp.Put(nan_l);
            FwdPart(&sp, p, cut[i], cut[i + 1] - cut[i], po[i], pl[i], 0);
        }
        std::vector<float> order_o[2], order_l[2];
        const int orders[2][3] = {{0, 1, 2}, {2, 1, 0}};
        for (int k = 0; k < 2; k++) {
            float *ao = sp.Put(sp.Get(po[orders[k][0]], p.OutSize()));
            float *al = sp.Put(sp.Get(pl[orders[k][0]], p.LseSize()));
            for (int i = 1; i < 3; i++)
                ASSERT_EQ(ctxpar_dev_attn_merge(dev(), ao, al, po[orders[k][i]], pl[orders[k][i]],
                                                p.B, p.Sq(), p.Hq, p.D, nullptr),
                          CTXPAR_OK);
            order_o[k] = sp.Get(ao, p.OutSize());
            order_l[k] = sp.Get(al, p.LseSize());
            ExpectClose(order_o[k], ref_out, tol, "three parts out");
        }
        ExpectClose(order_o[1], F64(order_o[0]), kTolSmall, "012 vs 210 out");
        ExpectClose(order_l[1], F64(order_l[0]), kTolSmall, "012 vs 210 lse");
    }
}

// Merging an empty partial (0, -inf) is the identity, both ways round, bit for bit; two empty
// rows give (0, -inf); the forward merging a block masked as a whole changes nothing.
TEST_P(DeviceTest, MergeOfAnEmptyPartialIsTheIdentity) {
    Problem p;
    MakeMergeProblem(&p, CTXPAR_DTYPE_F32);
    FwdResult a = RunFwd(dev(), p);
    const std::vector<float> zero(p.OutSize(), 0.0f), ninf(p.LseSize(), -INFINITY);
    struct Way {
        const std::vector<float> *acc_o, *acc_l, *b_o, *b_l, *want_o, *want_l;
    };
    const Way ways[3] = {{&a.out, &a.lse, &zero, &ninf, &a.out, &a.lse},
                         {&zero, &ninf, &a.out, &a.lse, &a.out, &a.lse},
                         {&zero, &ninf, &zero, &ninf, &zero, &ninf}};
    for (const Way &w : ways) {
        Space sp(dev());
        float *o = sp.Put(*w.acc_o), *l = sp.Put(*w.acc_l);
        ASSERT_EQ(ctxpar_dev_attn_merge(dev(), o, l, sp.Put(*w.b_o), sp.Put(*w.b_l), p.B, p.Sq(),
                                        p.Hq, p.D, nullptr),
                  CTXPAR_OK);
        EXPECT_EQ(BitDiff(sp.Get(o, p.OutSize()), *w.want_o), 0u);
        EXPECT_EQ(BitDiff(sp.Get(l, p.LseSize()), *w.want_l), 0u);
    }
    Problem m;
    m.qs = {{0, 50, 1}};
    m.ks = {{100, 60, 1}};
    m.causal = 1;
    m.Make();
    FwdResult init;
    init.out.assign(m.OutSize(), 1.0f); // a finite partial in every row, to keep
    init.lse.assign(m.LseSize(), 0.5f);
    FwdResult after = RunFwd(dev(), m, 1, &init);
    EXPECT_EQ(BitDiff(after.out, init.out), 0u);
    EXPECT_EQ(BitDiff(after.lse, init.lse), 0u);
}

// ---------------------------------------------------------------- backward

// Accumulators are added to, and a NULL one is simply not computed: the others keep their bits.
TEST_P(DeviceTest, BwdAccumulatesAndSkipsNullOutputs) {
    Problem p;
    p.qs = {{0, 100, 1}};
    p.ks = {{0, 300, 1}};
    p.causal = 1;
    p.Make();
    std::vector<double> ref_out, ref_lse;
    p.OracleFwd(&ref_out, &ref_lse);
    BwdResult all = RunBwd(dev(), p, ref_out, ref_lse);
    BwdResult acc = RunBwd(dev(), p, ref_out, ref_lse, 0.25f, true, true, false);
    for (size_t i = 0; i < acc.dq.size(); i++)
        ASSERT_EQ(acc.dq[i], all.dq[i] + 0.25f) << i;
    for (size_t i = 0; i < acc.dk.size(); i++)
        ASSERT_EQ(acc.dk[i], all.dk[i] + 0.25f) << i;
    for (float x : acc.dv)
        ASSERT_EQ(x, 0.25f) << "dv was not asked for";
    BwdResult only_dv = RunBwd(dev(), p, ref_out, ref_lse, 0.0f, false, false, true);
    EXPECT_EQ(BitDiff(only_dv.dv, all.dv), 0u);
    BwdResult none = RunBwd(dev(), p, ref_out, ref_lse, 0.0f, false, false, false);
    for (float x : none.dq)
        ASSERT_EQ(x, 0.0f);
}

// delta over 16-bit and F32 out and dout, D above 256 (the kernels' chunks), padded rows.
TEST_P(DeviceTest, BwdPrepMatchesFloat64) {
    for (ctxpar_dtype dt_out : {CTXPAR_DTYPE_F32, CTXPAR_DTYPE_BF16, CTXPAR_DTYPE_F16})
        for (ctxpar_dtype dt_dout : {CTXPAR_DTYPE_F32, CTXPAR_DTYPE_BF16}) {
            const int64_t B = 2, S = 33, H = 3, D = 300;
            HostTensor out(dt_out, B, S, H, D, 7), dout(dt_dout, B, S, H, D);
            cpt_test_fill(&out.t, 11, 1, S, nullptr);
            cpt_test_fill(&dout.t, 11, 2, S, nullptr);
            std::vector<double> o = out.f64(), g = dout.f64(), ref((size_t)(B * H * S), 0.0);
            for (int64_t b = 0; b < B; b++)
                for (int64_t s = 0; s < S; s++)
                    for (int64_t h = 0; h < H; h++)
                        for (int64_t d = 0; d < D; d++) {
                            size_t i = (size_t)(((b * S + s) * H + h) * D + d);
                            ref[(size_t)((b * H + h) * S + s)] += o[i] * g[i];
                        }
            Space sp(dev());
            ctxpar_tensor o_d = out.On(&sp), g_d = dout.On(&sp);
            float *delta = sp.Put(std::vector<float>(ref.size(), NAN));
            ASSERT_EQ(ctxpar_dev_attn_bwd_prep(dev(), &o_d, &g_d, delta, nullptr), CTXPAR_OK)
                << ctxpar_last_error();
            ExpectClose(sp.Get(delta, ref.size()), ref, kTolSmall, "delta");
        }
}

// ---------------------------------------------------------------- bitwise properties

// The same call twice, and on a second device of the kind, gives the same bits: forward and
// backward.
TEST_P(DeviceTest, RepeatedCallsGiveIdenticalBits) {
    TestDevice second(F());
    ASSERT_EQ(second.skip, "");
    for (ctxpar_dtype dt : {CTXPAR_DTYPE_F32, CTXPAR_DTYPE_BF16}) {
        Problem p;
        p.dtype = dt;
        p.D = 72;
        p.qs = {{0, 300, 1}};
        p.ks = {{0, 300, 1}};
        p.causal = 1;
        p.cu = Docs();
        p.Make();
        FwdResult a = RunFwd(dev(), p), b = RunFwd(dev(), p), c = RunFwd(second.dev, p);
        EXPECT_EQ(BitDiff(a.out, b.out), 0u);
        EXPECT_EQ(BitDiff(a.lse, b.lse), 0u);
        EXPECT_EQ(BitDiff(a.out, c.out), 0u);
        EXPECT_EQ(BitDiff(a.lse, c.lse), 0u);
        std::vector<double> o = F64(a.out), l = F64(a.lse);
        BwdResult x = RunBwd(dev(), p, o, l), y = RunBwd(dev(), p, o, l);
        BwdResult z = RunBwd(second.dev, p, o, l);
        for (const BwdResult *r : {&y, &z}) {
            EXPECT_EQ(BitDiff(x.delta, r->delta), 0u);
            EXPECT_EQ(BitDiff(x.dq, r->dq), 0u);
            EXPECT_EQ(BitDiff(x.dk, r->dk), 0u);
            EXPECT_EQ(BitDiff(x.dv, r->dv), 0u);
        }
    }
}

// A query row's forward bits (out, lse and the lse's low part) depend only on that row and the
// keys: not on which other rows share the call, how many, at what offsets or strides, nor on
// the rows' layout in memory. All-gather computes each rank's rows against the whole K/V and
// promises one rank's bits (docs/numerics.md, "Bitwise guarantees"), which rests on this.
struct FwdBits {
    std::vector<float> out, lse, lse_lo;
};

FwdBits RunFwdBits(ctxpar_device *dev, const Problem &p) {
    Space sp(dev);
    ctxpar_attn_block blk = p.Block(&sp);
    float *out = sp.Put(std::vector<float>(p.OutSize(), NAN));
    float *lse = sp.Put(std::vector<float>(p.LseSize(), NAN));
    blk.lse_lo = sp.Put(std::vector<float>(p.LseSize(), 0.0f)); // the algorithms' zeros
    EXPECT_EQ(ctxpar_dev_attn_block_fwd(dev, &blk, out, lse, 0, nullptr), CTXPAR_OK)
        << ctxpar_last_error();
    return {sp.Get(out, p.OutSize()), sp.Get(lse, p.LseSize()), sp.Get(blk.lse_lo, p.LseSize())};
}

TEST_P(DeviceTest, QueryRowBitsDependOnlyOnTheRow) {
    if (F().rows_differ)
        GTEST_SKIP() << "skipped: the device does not promise it: " << F().rows_differ;
    struct Case {
        ctxpar_dtype dt;
        int64_t d, hkv;
        MaskCase mask;
    };
    const std::vector<MaskCase> masks = MaskCases();
    std::vector<Case> cases;
    for (const MaskCase &m : masks)
        cases.push_back({CTXPAR_DTYPE_F32, 48, 2, m});
    cases.push_back({CTXPAR_DTYPE_BF16, 64, 1, masks[5]}); // docs_causal
    cases.push_back({CTXPAR_DTYPE_F16, 128, 4, masks[2]}); // causal_window
    cases.push_back({CTXPAR_DTYPE_BF16, 64, 2, masks[0]}); // none: whole tiles
    cases.push_back({CTXPAR_DTYPE_BF16, 40, 2, masks[4]}); // docs
    // Each with another layout in memory: rows padded by 8 elements (16-byte aligned, vector
    // loads) or by 2 (unaligned).
    const struct {
        std::vector<ctxpar_span> qs;
        int64_t pad;
    } subsets[] = {
        {{{1, 100, 4}}, 8},              // striped, stride 4
        {{{37, 150, 1}}, 2},             // contiguous, not tile-aligned
        {{{0, 50, 1}, {350, 50, 1}}, 8}, // zigzag
        {{{399, 1, 1}}, 2},              // one row
    };
    for (const Case &c : cases) {
        SCOPED_TRACE(std::string(ctxpar_dtype_name(c.dt)) + " d" + std::to_string(c.d) + " hkv" +
                     std::to_string(c.hkv) + " " + c.mask.name);
        Problem full;
        full.dtype = c.dt;
        full.Hkv = c.hkv;
        full.D = c.d;
        full.qs = {{0, 400, 1}};
        full.ks = {{0, 400, 1}};
        SetMask(&full, c.mask);
        full.Make();
        const FwdBits whole = RunFwdBits(dev(), full);
        for (const auto &subset : subsets) {
            const std::vector<ctxpar_span> &qs = subset.qs;
            Problem sub;
            sub.dtype = c.dt;
            sub.Hkv = c.hkv;
            sub.D = c.d;
            sub.qs = qs;
            sub.ks = full.ks;
            SetMask(&sub, c.mask);
            sub.pad = subset.pad;
            sub.Make();
            const FwdBits r = RunFwdBits(dev(), sub);
            size_t bad = 0;
            for (int64_t b = 0; b < sub.B; b++)
                for (int64_t h = 0; h < sub.Hq; h++)
                    for (int64_t s = 0; s < sub.Sq(); s++) {
                        const int64_t g = sub.qpos[(size_t)s];
                        const size_t o = (size_t)(((b * sub.Sq() + s) * sub.Hq + h) * sub.D);
                        const size_t w = (size_t)(((b * 400 + g) * sub.Hq + h) * sub.D);
                        bad += std::memcmp(&r.out[o], &whole.out[w],
                                           (size_t)sub.D * sizeof(float)) != 0;
                        const size_t lo = (size_t)((b * sub.Hq + h) * sub.Sq() + s);
                        const size_t lw = (size_t)((b * sub.Hq + h) * 400 + g);
                        bad += std::memcmp(&r.lse[lo], &whole.lse[lw], sizeof(float)) != 0;
                        bad += std::memcmp(&r.lse_lo[lo], &whole.lse_lo[lw], sizeof(float)) != 0;
                    }
            EXPECT_EQ(bad, 0u) << "rows differing from the whole call's, subset starting at "
                               << qs[0].start << " stride " << qs[0].stride;
        }
    }
}

// ---------------------------------------------------------------- masks, pair by pair

// Sums computed exactly enough in float64, each with the sum of its terms' magnitudes: a
// result is within kTolF32 of that magnitude, element by element.
struct Exact {
    std::vector<double> value, mag;
    explicit Exact(int64_t n) : value((size_t)n, 0.0), mag((size_t)n, 0.0) {}
    void Add(int64_t e, double term, double term_mag) {
        value[(size_t)e] += term;
        mag[(size_t)e] += term_mag;
    }
    // Elements of got off their value by more (NaN included); a sum of no term must be 0.
    size_t Wrong(const std::vector<float> &got) const {
        if (got.size() != value.size())
            return SIZE_MAX;
        size_t wrong = 0;
        for (size_t e = 0; e < got.size(); e++)
            wrong += !(std::fabs((double)got[e] - value[e]) <= kTolF32 * mag[e]);
        return wrong;
    }
};

// The device's mask is the oracle's (cpt_oracle_visibility), pair by pair, forward and backward,
// on random masks (causal, both windows, documents with empty ones) and random spans
// (consecutive and strided), each moved, where it can be, to put a corner of the block on an
// edge of the mask, where a tile's FULL or SKIP claim is decided. The inputs make every answer
// exact arithmetic on the oracle's visibility matrix, with no oracle call: q = e_last and k's
// last column 0 make every score 0, so row i weighs the n_i keys it sees 1/n_i each (P); v the
// identity makes out[i][j] = P_ij (a hidden pair exactly 0) and lse_i = log n_i (out 0, lse -inf
// for a row that sees none). The backward runs twice: dO the identity makes dv[j][i] = P_ij (a
// hidden pair exactly 0); dO one varied row for every query makes every visible pair's dS count
// in dq and dk. (A kernel that multiplies a hidden weight by 0 passes here; the non-finite cases
// below catch that.)
TEST_P(DeviceTest, MaskIsTheOraclesPairByPair) {
    constexpr int64_t kMaxS = 127, kD = 128; // one-hot rows of up to 127, then q's 1 and k's 0
    constexpr int kBlocks = 1000;
    std::mt19937 rng(2027);
    const ctxpar_dtype dtypes[3] = {CTXPAR_DTYPE_F32, CTXPAR_DTYPE_BF16, CTXPAR_DTYPE_F16};
    int partial = 0, shifted = 0;
    for (int it = 0; it < kBlocks; it++) {
        Problem p;
        int64_t S = 0;
        std::vector<int32_t> cu;
        ctxpar_mask_desc m = cpt_mask::RandomMask(rng, kMaxS, &S, &cu);
        if (it % 4 == 3 && m.cu_seqlens) // documents alone decide the edges
            m.causal = 0, m.window_left = m.window_right = 0;
        p.qs = {cpt_mask::RandomSpan(rng, S)};
        p.ks = {cpt_mask::RandomSpan(rng, S)};
        shifted += cpt_mask::ShiftToAnEdge(rng, S, m, &p.qs[0], &p.ks[0]);
        p.causal = m.causal;
        p.window = m.window_left;
        p.window_right = m.window_right;
        p.cu = cu;
        p.B = 1, p.Hq = 1, p.Hkv = 1, p.D = kD;
        p.dtype = dtypes[it % 3];
        p.Make();
        const int64_t Sq = p.Sq(), Sk = p.Sk(), D = p.D;
        SCOPED_TRACE(::testing::Message()
                     << "block " << it << ": S " << S << " causal " << m.causal << " window "
                     << m.window_left << "/" << m.window_right << " docs " << m.num_docs << " q ["
                     << p.qs[0].start << " +" << p.qs[0].len << " x" << p.qs[0].stride << "] k ["
                     << p.ks[0].start << " +" << p.ks[0].len << " x" << p.ks[0].stride << "] "
                     << ctxpar_dtype_name(p.dtype));
        for (HostTensor *t : {p.q.get(), p.v.get(), p.dout.get()})
            std::fill(t->mem.begin(), t->mem.end(), 0);
        for (int64_t i = 0; i < Sq; i++)
            cpt_test_set(&p.q->t, 0, i, 0, D - 1, 1.0);
        for (int64_t j = 0; j < Sk; j++) {
            cpt_test_set(&p.k->t, 0, j, 0, D - 1, 0.0);
            cpt_test_set(&p.v->t, 0, j, 0, j, 1.0);
        }
        const ctxpar_mask_desc mask = p.Mask();
        const cpt_oracle_shape one = {1, Sq, Sk, 1, 1, 1};
        std::vector<uint8_t> vis((size_t)(Sq * Sk));
        ASSERT_EQ(cpt_oracle_visibility(&one, p.qpos.data(), p.kpos.data(), &mask, vis.data()),
                  CTXPAR_OK);
        std::vector<int64_t> n((size_t)Sq, 0);
        int64_t seen = 0;
        for (int64_t i = 0; i < Sq; i++)
            for (int64_t j = 0; j < Sk; j++)
                n[(size_t)i] += vis[(size_t)(i * Sk + j)];
        for (int64_t c : n)
            seen += c;
        partial += seen > 0 && seen < Sq * Sk;
        auto P = [&](int64_t i, int64_t j) {
            return vis[(size_t)(i * Sk + j)] ? 1.0 / (double)n[(size_t)i] : 0.0;
        };

        // Forward: out = P, lse = log n.
        std::vector<double> out((size_t)(Sq * D), 0.0), lse((size_t)Sq, -INFINITY);
        for (int64_t i = 0; i < Sq; i++) {
            if (n[(size_t)i])
                lse[(size_t)i] = std::log((double)n[(size_t)i]);
            for (int64_t j = 0; j < Sk; j++)
                out[(size_t)(i * D + j)] = P(i, j);
        }
        const FwdResult f = RunFwd(dev(), p);
        const double tol = std::max(F().out_tol(p.dtype, D), kTolF32);
        size_t wrong = 0;
        for (int64_t i = 0; i < Sq; i++) {
            const float l = f.lse[(size_t)i];
            wrong +=
                n[(size_t)i] ? !(std::fabs(l - lse[(size_t)i]) <= 5 * kTolF32) : l != -INFINITY;
            for (int64_t j = 0; j < D; j++) {
                const double want = out[(size_t)(i * D + j)];
                const float o = f.out[(size_t)(i * D + j)];
                wrong += want != 0.0 ? !(std::fabs(o - want) <= tol * want) : o != 0.0f;
            }
        }
        EXPECT_EQ(wrong, 0u) << "forward elements off their exact values";

        // Backward, from the exact out and lse: dP_ij = dO_i[j] (v the identity), delta_i =
        // sum_j P_ij dO_i[j], dS = P (dP - delta); dq = scale dS k, dk = scale dS^T q, dv = P^T dO.
        // Each element is held to kTolF32 times the sum of its terms' magnitudes (sums that
        // cancel to 0 stay within F32 rounding of their terms); a single term of dv is its value,
        // so with dO the identity dv[j][i] = P_ij each pair alone, a hidden one exactly 0.
        const std::vector<double> q = p.q->f64(), k = p.k->f64();
        for (int round = 0; round < 2; round++) {
            SCOPED_TRACE(round ? "dO one varied row" : "dO the identity");
            for (int64_t i = 0; i < Sq; i++)
                for (int64_t d = 0; d < D; d++)
                    cpt_test_set(&p.dout->t, 0, i, 0, d,
                                 round ? (double)(1 + d * 5 % 8) / 8 : (double)(i == d));
            const std::vector<double> g = p.dout->f64();
            const double scale = (double)p.Scale();
            Exact dq(Sq * D), dk(Sk * D), dv(Sk * D);
            for (int64_t i = 0; i < Sq; i++) {
                double delta = 0.0, delta_mag = 0.0;
                for (int64_t j = 0; j < Sk; j++) {
                    delta += P(i, j) * g[(size_t)(i * D + j)];
                    delta_mag += P(i, j) * std::fabs(g[(size_t)(i * D + j)]);
                }
                const double *gi = &g[(size_t)(i * D)], *qi = &q[(size_t)(i * D)];
                for (int64_t j = 0; j < Sk; j++) {
                    const double pij = P(i, j);
                    if (pij == 0.0)
                        continue;
                    const double *kj = &k[(size_t)(j * D)];
                    const double ds = pij * (gi[j] - delta);
                    const double ds_mag = pij * (std::fabs(gi[j]) + delta_mag);
                    // A zero factor adds nothing (q is one-hot, dO too in the first round).
                    for (int64_t d = 0; d < D; d++) {
                        dq.Add(i * D + d, scale * ds * kj[d], scale * ds_mag * std::fabs(kj[d]));
                        if (qi[d] != 0.0)
                            dk.Add(j * D + d, scale * ds * qi[d],
                                   scale * ds_mag * std::fabs(qi[d]));
                        if (gi[d] != 0.0)
                            dv.Add(j * D + d, pij * gi[d], pij * std::fabs(gi[d]));
                    }
                }
            }
            const BwdResult r = RunBwd(dev(), p, out, lse);
            EXPECT_EQ(dq.Wrong(r.dq), 0u) << "dq elements off their exact values";
            EXPECT_EQ(dk.Wrong(r.dk), 0u) << "dk elements off their exact values";
            EXPECT_EQ(dv.Wrong(r.dv), 0u) << "dv elements off their exact values";
        }
        if (HasFailure())
            return;
    }
    EXPECT_GT(partial, kBlocks / 2) << "most blocks are partly visible: the mask is exercised";
    EXPECT_GT(shifted, kBlocks / 2) << "most blocks have a corner on an edge of the mask";
}

// ---------------------------------------------------------------- non-finite values

// A NaN or an infinity in Q, K, V or dO reaches exactly the outputs the float64 oracle says: a
// NaN a row sees makes that row NaN, never silently dropped; a value in a row that a pair does
// not see (the causal future, another document, outside the window) must not reach that pair,
// wherever the tiles cut the mask (0 x NaN or 0 x inf in a kernel that multiplies masked weights
// would leak). A row whose visible scores are all -inf is a fully masked row (docs/numerics.md's
// one convention). The value goes in the last batch row only: the first stays finite.
enum NfWhich { kNfQ, kNfK, kNfV, kNfDout };

struct NfCase {
    const char *name;
    NfWhich which;
    int64_t pos, head, dim; // global position of the row, head of that tensor, element
    float value;
    int causal;
    int64_t window;
    bool docs;
    bool striped;    // queries at the odd positions only, so every tile is cut by the mask
    bool positive_q; // q at `pos` made positive (an exact -inf score against a -inf key)
};

const std::vector<int32_t> kNfDocs = {0, 45, 110, 200}; // documents of a sequence of 200

const NfCase kNfCases[] = {
    // Every row of the K/V head's query heads sees key 70.
    {"nan_k_visible", kNfK, 70, 0, 3, NAN, 0, 0, false, false, false},
    // Only rows >= 70 see key 70: the rows before it, in the same tiles, must stay finite.
    {"nan_k_causal_future", kNfK, 70, 1, 0, NAN, 1, 0, false, false, false},
    // A masked V value: 0 x NaN or 0 x inf in P V would leak.
    {"nan_v_causal_future", kNfV, 27, 0, 5, NAN, 1, 0, false, true, false},
    {"inf_v_causal_future", kNfV, 100, 1, 2, INFINITY, 1, 0, false, false, false},
    // Key 60 lies in document 1 (45..109): documents 0 and 2 must not see it.
    {"nan_k_other_document", kNfK, 60, 0, 7, NAN, 0, 0, true, false, false},
    {"nan_v_other_document_causal", kNfV, 50, 1, 1, NAN, 1, 0, true, true, false},
    // Causal window 5: key 80 is seen by rows 80..84 only. Window 4 alone: by rows <= 133.
    {"nan_v_window", kNfV, 80, 0, 4, NAN, 1, 5, false, false, false},
    {"nan_k_window_no_causal", kNfK, 130, 1, 9, NAN, 0, 4, false, true, false},
    {"neg_inf_v_visible", kNfV, 4, 1, 0, -INFINITY, 0, 0, false, false, false},
    // A NaN query row: that row, and in the backward the keys it sees.
    {"nan_q_causal", kNfQ, 151, 3, 7, NAN, 1, 0, false, true, false},
    // +inf in a query: each score of the row is +inf, -inf or NaN by the sign of the key.
    {"inf_q", kNfQ, 9, 1, 2, INFINITY, 0, 0, false, false, false},
    // +inf in a key: rows whose q[1] is positive get a +inf score (a NaN row), the others a -inf
    // score (weight 0) beside finite ones; rows before key 3 do not see it.
    {"inf_k_causal", kNfK, 3, 0, 1, INFINITY, 1, 0, false, false, false},
    // Row 0 sees only key 0, whose score is exactly -inf: by the convention a fully masked row
    // (out 0, lse -inf, dq 0, nothing to dk and dv), where the literal softmax gives 0/0.
    {"neg_inf_only_score", kNfK, 0, 0, 0, -INFINITY, 1, 0, false, false, true},
    // NaN in dO: the forward is finite; dq of the row and dk, dv of the keys it sees are NaN.
    {"nan_dout_causal", kNfDout, 6, 0, 0, NAN, 1, 0, false, false, false},
    {"nan_dout_docs", kNfDout, 51, 2, 3, NAN, 0, 0, true, true, false},
};

// Dtypes and head dims: on CUDA each takes another forward path (the SIMT kernel for F32 and for
// head_dim % 8 != 0, the tensor cores with key tiles of 64, and of 32 at head_dim 256), on the
// CPU other column tiles and tails. The backward is one kernel for every dtype on both: it takes
// three of them (F32, 16-bit, head_dim tails), which keeps the fp64 backward's cost down.
struct NfPath {
    const char *name;
    ctxpar_dtype dtype;
    int64_t d;
    bool bwd;
};

const NfPath kNfPaths[] = {
    {"f32_d64", CTXPAR_DTYPE_F32, 64, true},    {"bf16_d36", CTXPAR_DTYPE_BF16, 36, true},
    {"bf16_d64", CTXPAR_DTYPE_BF16, 64, false}, {"f16_d128", CTXPAR_DTYPE_F16, 128, true},
    {"f16_d256", CTXPAR_DTYPE_F16, 256, false},
};

struct NfParam {
    NfCase sc;
    NfPath path;
};

// Named in test output; without this GoogleTest prints the struct's bytes, padding included.
void PrintTo(const NfParam &prm, std::ostream *os) {
    *os << prm.sc.name << " on " << prm.path.name;
}

// Writes the case's value into p's tensor (last batch) at the row of its position, if p has
// that row; returns how many elements it wrote.
int NfPlace(Problem *p, const NfCase &sc) {
    const bool q_side = sc.which == kNfQ || sc.which == kNfDout;
    HostTensor *t = sc.which == kNfQ   ? p->q.get()
                    : sc.which == kNfK ? p->k.get()
                    : sc.which == kNfV ? p->v.get()
                                       : p->dout.get();
    const std::vector<int64_t> &pos = q_side ? p->qpos : p->kpos;
    int placed = 0;
    for (size_t i = 0; i < pos.size(); i++) {
        if (pos[i] != sc.pos)
            continue;
        cpt_test_set(&t->t, p->B - 1, (int64_t)i, sc.head, sc.dim, sc.value);
        placed++;
    }
    if (sc.positive_q)
        for (size_t i = 0; i < p->qpos.size(); i++)
            if (p->qpos[i] == sc.pos)
                for (int64_t h = 0; h < p->Hq; h++)
                    for (int64_t d = 0; d < p->D; d++)
                        cpt_test_set(&p->q->t, p->B - 1, (int64_t)i, h, d,
                                     std::fabs(cpt_test_get(&p->q->t, p->B - 1, (int64_t)i, h, d)) +
                                         0.25);
    return placed;
}

Problem NfProblem(const NfParam &prm) {
    Problem p;
    p.B = 2;
    p.Hq = 4;
    p.Hkv = 2;
    p.D = prm.path.d;
    p.dtype = prm.path.dtype;
    p.seq_global = 200;
    p.qs = prm.sc.striped ? std::vector<ctxpar_span>{{1, 100, 2}}
                          : std::vector<ctxpar_span>{{0, 200, 1}};
    p.ks = {{0, 200, 1}};
    p.causal = prm.sc.causal;
    p.window = prm.sc.window;
    if (prm.sc.docs)
        p.cu = kNfDocs;
    p.Make();
    EXPECT_EQ(NfPlace(&p, prm.sc), 1) << "position " << prm.sc.pos << " is not a row";
    return p;
}

// The oracle's answers for a case (under the convention), computed once for every factory:
// the forward alone, or with the backward.
struct NfReference {
    std::string key;
    bool bwd = false;
    std::vector<cpt_nonfinite::Row> minus_inf;
    std::vector<double> out, lse, dq, dk, dv;
};

const NfReference &NfOracle(const NfParam &prm, const Problem &p, bool bwd) {
    static NfReference ref;
    const std::string key = std::string(prm.sc.name) + "/" + prm.path.name;
    if (ref.key == key && (ref.bwd || !bwd))
        return ref;
    std::vector<double> q = p.q->f64(), k = p.k->f64(), v = p.v->f64(), g = p.dout->f64();
    const ctxpar_mask_desc m = p.Mask();
    const cpt_nonfinite::Inputs in = {
        p.Shape(),     q.data(),      k.data(), v.data(),         bwd ? g.data() : nullptr,
        p.qpos.data(), p.kpos.data(), &m,       (double)p.Scale()};
    ref.minus_inf = cpt_nonfinite::MinusInfRows(in);
    cpt_nonfinite::Oracle(in, ref.minus_inf, &ref.out, &ref.lse, &ref.dq, &ref.dk, &ref.dv);
    ref.key = key;
    ref.bwd = bwd;
    return ref;
}

// The case means something: some of the reference values are non-finite and some are finite.
void ExpectSomeNonFinite(const std::vector<const std::vector<double> *> &refs) {
    size_t bad = 0, total = 0;
    for (const std::vector<double> *r : refs) {
        for (double x : *r)
            bad += !std::isfinite(x);
        total += r->size();
    }
    EXPECT_GT(bad, 0u) << "the oracle is finite: the case tests nothing";
    EXPECT_LT(bad, total) << "the oracle is all non-finite: the case tests nothing";
}

std::vector<std::tuple<NfParam, DeviceFactory>> NfSweep(bool bwd) {
    std::vector<std::tuple<NfParam, DeviceFactory>> v;
    const std::vector<DeviceFactory> fs = DeviceFactories();
    size_t i = 0;
    for (const NfCase &sc : kNfCases) {
        if (!bwd && sc.which == kNfDout)
            continue; // the forward does not read dO
        for (const NfPath &path : kNfPaths) {
            if (bwd && !path.bwd)
                continue;
            for (size_t j = 0; j < fs.size(); j++) {
                // i / every turns the subset by one each round, so that a count of paths that
                // divides by `every` does not give a factory the same path for every case.
                const size_t every = (size_t)(bwd ? fs[j].bwd_every : fs[j].fwd_every);
                if ((i + i / every + j) % every == 0)
                    v.push_back(std::make_tuple(NfParam{sc, path}, fs[j]));
            }
            i++;
        }
    }
    return v;
}

std::string NfName(const ::testing::TestParamInfo<std::tuple<NfParam, DeviceFactory>> &i) {
    const NfParam &prm = std::get<0>(i.param);
    return std::get<1>(i.param).name + "_" + prm.sc.name + "_" + prm.path.name;
}

using NonFiniteFwd = DeviceCaseTest<NfParam>;

// The block forward, and the same keys in two parts with the second merged onto the first (the
// ring's way: a NaN lse must survive the merge, a masked one must not arrive).
TEST_P(NonFiniteFwd, PropagatesAsTheOracleSays) {
    const Problem p = NfProblem(Case());
    const NfReference &ref = NfOracle(Case(), p, false);
    ExpectSomeNonFinite({&ref.out, &ref.lse});
    const double tol = F().out_tol(p.dtype, p.D);
    const FwdResult r = RunFwd(dev(), p);
    ExpectSameNonFinite(r.out, ref.out, tol, "out");
    ExpectSameNonFinite(r.lse, ref.lse, kTolF32, "lse");

    Space sp(dev());
    float *out = sp.Put(std::vector<float>(p.OutSize(), NAN));
    float *lse = sp.Put(std::vector<float>(p.LseSize(), NAN));
    FwdPart(&sp, p, 0, 100, out, lse, 0);
    FwdPart(&sp, p, 100, 100, out, lse, 1);
    const std::vector<float> merged_out = sp.Get(out, p.OutSize());
    const std::vector<float> merged_lse = sp.Get(lse, p.LseSize());
    ExpectSameNonFinite(merged_out, ref.out, tol, "merged out");
    ExpectSameNonFinite(merged_lse, ref.lse, kTolF32, "merged lse");
    // The convention's rows exactly, whole and merged.
    for (const cpt_nonfinite::Row &row : ref.minus_inf) {
        const size_t l = (size_t)((row.b * p.Hq + row.h) * p.Sq() + row.i);
        EXPECT_EQ(r.lse[l], -INFINITY) << "row " << row.i << " head " << row.h;
        EXPECT_EQ(merged_lse[l], -INFINITY) << "row " << row.i << " head " << row.h;
        for (int64_t d = 0; d < p.D; d++) {
            const size_t o = (size_t)(((row.b * p.Sq() + row.i) * p.Hq + row.h) * p.D + d);
            EXPECT_EQ(r.out[o], 0.0f) << "row " << row.i << " head " << row.h;
            EXPECT_EQ(merged_out[o], 0.0f) << "row " << row.i << " head " << row.h;
        }
    }
}

INSTANTIATE_TEST_SUITE_P(Devices, NonFiniteFwd, ::testing::ValuesIn(NfSweep(false)), NfName);

using NonFiniteBwd = DeviceCaseTest<NfParam>;

// The block backward from the oracle's out and lse (NaN rows and the convention's rows included).
TEST_P(NonFiniteBwd, PropagatesAsTheOracleSays) {
    const Problem p = NfProblem(Case());
    const NfReference &ref = NfOracle(Case(), p, true);
    ExpectSomeNonFinite({&ref.dq, &ref.dk, &ref.dv});
    const BwdResult r = RunBwd(dev(), p, ref.out, ref.lse);
    ExpectSameNonFinite(r.dq, ref.dq, kTolF32, "dq");
    ExpectSameNonFinite(r.dk, ref.dk, kTolF32, "dk");
    ExpectSameNonFinite(r.dv, ref.dv, kTolF32, "dv");
    for (const cpt_nonfinite::Row &row : ref.minus_inf)
        for (int64_t d = 0; d < p.D; d++)
            EXPECT_EQ(r.dq[(size_t)(((row.b * p.Sq() + row.i) * p.Hq + row.h) * p.D + d)], 0.0f)
                << "dq row " << row.i << " head " << row.h;
}

INSTANTIATE_TEST_SUITE_P(Devices, NonFiniteBwd, ::testing::ValuesIn(NfSweep(true)), NfName);

// ---------------------------------------------------------------- elementwise and memory

TEST_P(DeviceTest, AddFillMemsetCopy) {
    for (size_t n : {(size_t)1, (size_t)1000, (size_t)100003}) {
        Space sp(dev());
        std::vector<float> a(n), b(n);
        for (size_t i = 0; i < n; i++) {
            a[i] = (float)i;
            b[i] = 0.5f * (float)(n - i);
        }
        float *da = sp.Put(a), *db = sp.Put(b);
        ASSERT_EQ(ctxpar_dev_add(dev(), da, db, n, nullptr), CTXPAR_OK);
        std::vector<float> r = sp.Get(da, n);
        for (size_t i = 0; i < n; i++)
            ASSERT_EQ(r[i], (float)i + 0.5f * (float)(n - i)) << i;
        ASSERT_EQ(ctxpar_dev_fill(dev(), da, -INFINITY, n, nullptr), CTXPAR_OK);
        r = sp.Get(da, n);
        for (size_t i = 0; i < n; i++)
            ASSERT_EQ(r[i], -INFINITY) << i;
        ASSERT_EQ(ctxpar_dev_memset(dev(), da, 0, n * sizeof(float), nullptr), CTXPAR_OK);
        ASSERT_EQ(ctxpar_dev_copy(dev(), db, da, n * sizeof(float), CTXPAR_COPY_D2D, nullptr),
                  CTXPAR_OK);
        r = sp.Get(db, n);
        for (size_t i = 0; i < n; i++)
            ASSERT_EQ(r[i], 0.0f) << i;
    }
    void *h = nullptr, *h2 = nullptr;
    ASSERT_EQ(ctxpar_dev_alloc(dev(), 4096, CTXPAR_MEM_HOST, &h), CTXPAR_OK);
    ASSERT_EQ(ctxpar_dev_alloc(dev(), 4096, CTXPAR_MEM_HOST, &h2), CTXPAR_OK);
    std::memset(h, 7, 4096);
    ASSERT_EQ(ctxpar_dev_copy(dev(), h2, h, 4096, CTXPAR_COPY_H2H, nullptr), CTXPAR_OK);
    ASSERT_EQ(ctxpar_dev_stream_sync(dev(), nullptr), CTXPAR_OK);
    EXPECT_EQ(std::memcmp(h, h2, 4096), 0);
    EXPECT_EQ(ctxpar_dev_free(dev(), h, 4096, CTXPAR_MEM_HOST), CTXPAR_OK);
    EXPECT_EQ(ctxpar_dev_free(dev(), h2, 4096, CTXPAR_MEM_HOST), CTXPAR_OK);
    EXPECT_EQ(ctxpar_dev_books_of(dev())->mem_current, 0u) << "the dispatch counts what is held";
    // The dispatch knows every block: a second free, or one of the wrong size, frees nothing.
    EXPECT_EQ(ctxpar_dev_free(dev(), h, 4096, CTXPAR_MEM_HOST), CTXPAR_ERR_INTERNAL);
    void *d = nullptr;
    ASSERT_EQ(ctxpar_dev_alloc(dev(), 256, CTXPAR_MEM_DEVICE, &d), CTXPAR_OK);
    EXPECT_EQ(ctxpar_dev_free(dev(), d, 512, CTXPAR_MEM_DEVICE), CTXPAR_ERR_INTERNAL);
    EXPECT_EQ(ctxpar_dev_books_of(dev())->mem_current, 256u);
    EXPECT_EQ(ctxpar_dev_free(dev(), d, 256, CTXPAR_MEM_DEVICE), CTXPAR_OK);
    EXPECT_EQ(ctxpar_dev_books_of(dev())->mem_current, 0u);
}

// The scratch block a backend op takes for its temporaries (the context's steady state depends
// on it): it grows to the largest request, is kept (no allocation for a smaller one), is counted
// in the memory statistics and is given back by release.
TEST_P(DeviceTest, ScratchGrowsIsKeptAndCounted) {
    void *a = nullptr, *b = nullptr;
    ASSERT_EQ(ctxpar_dev_scratch(dev(), 4096, &a), CTXPAR_OK) << ctxpar_last_error();
    ASSERT_NE(a, nullptr);
    EXPECT_GE(ctxpar_dev_books_of(dev())->mem_current, 4096u);
    const uint64_t allocs = ctxpar_dev_books_of(dev())->alloc_count;
    ASSERT_EQ(ctxpar_dev_scratch(dev(), 1000, &b), CTXPAR_OK);
    EXPECT_EQ(b, a);
    EXPECT_EQ(ctxpar_dev_books_of(dev())->alloc_count, allocs) << "a smaller request allocates nothing";
    ASSERT_EQ(ctxpar_dev_scratch(dev(), 1 << 20, &b), CTXPAR_OK);
    EXPECT_GE(ctxpar_dev_books_of(dev())->mem_current, (size_t)1 << 20);
    // The block is usable memory of the device.
    ASSERT_EQ(ctxpar_dev_fill(dev(), (float *)b, 3.0f, (1 << 20) / sizeof(float), nullptr),
              CTXPAR_OK);
    Space sp(dev());
    std::vector<float> got = sp.Get((const float *)b + ((1 << 18) - 1), 1);
    EXPECT_EQ(got[0], 3.0f);
    EXPECT_EQ(ctxpar_dev_scratch_release(dev()), CTXPAR_OK);
    EXPECT_EQ(ctxpar_dev_books_of(dev())->mem_current, 0u);
}

// Work on one stream ordered after another's by an event (how the context's workspace passes
// from one call's stream to the next): the copy on the second stream sees the fill of the first.
// On a synchronous device the streams are NULL and the events no-ops; the result is the same.
TEST_P(DeviceTest, EventsOrderWorkAcrossStreams) {
    const size_t n = 1 << 16;
    Space sp(dev());
    float *src = sp.Put(std::vector<float>(n, 0.0f)), *dst = sp.Put(std::vector<float>(n, 1.0f));
    ctxpar_stream *s1 = nullptr, *s2 = nullptr;
    ctxpar_event *ev = nullptr;
    ASSERT_EQ(ctxpar_dev_stream_create(dev(), &s1), CTXPAR_OK) << ctxpar_last_error();
    ASSERT_EQ(ctxpar_dev_stream_create(dev(), &s2), CTXPAR_OK) << ctxpar_last_error();
    ASSERT_EQ(ctxpar_dev_event_create(dev(), &ev), CTXPAR_OK) << ctxpar_last_error();
    EXPECT_EQ(ctxpar_dev_has_streams(dev()) != 0, s1 != nullptr);
    for (int round = 1; round <= 3; round++) {
        ASSERT_EQ(ctxpar_dev_fill(dev(), src, (float)round, n, s1), CTXPAR_OK);
        ASSERT_EQ(ctxpar_dev_event_record(dev(), ev, s1), CTXPAR_OK);
        ASSERT_EQ(ctxpar_dev_stream_wait_event(dev(), s2, ev), CTXPAR_OK);
        ASSERT_EQ(ctxpar_dev_copy(dev(), dst, src, n * sizeof(float), CTXPAR_COPY_D2D, s2),
                  CTXPAR_OK);
        ASSERT_EQ(ctxpar_dev_stream_sync(dev(), s2), CTXPAR_OK) << ctxpar_last_error();
        std::vector<float> got = sp.Get(dst, n);
        for (size_t i = 0; i < n; i += 997)
            ASSERT_EQ(got[i], (float)round) << "round " << round << " element " << i;
        ASSERT_EQ(got[n - 1], (float)round);
    }
    ASSERT_EQ(ctxpar_dev_stream_sync(dev(), s1), CTXPAR_OK);
    ctxpar_dev_event_destroy(dev(), ev);
    ctxpar_dev_stream_destroy(dev(), s1);
    ctxpar_dev_stream_destroy(dev(), s2);
}

// F32 -> 16-bit -> F32 through the device's cast gives each value rounded to the 16-bit type
// (round to nearest even, as cpt_test_round says), on padded tensors.
TEST_P(DeviceTest, CastRoundsAsTheDtypeSays) {
    for (ctxpar_dtype dt : {CTXPAR_DTYPE_BF16, CTXPAR_DTYPE_F16}) {
        HostTensor src(CTXPAR_DTYPE_F32, 2, 17, 3, 40, 3), mid(dt, 2, 17, 3, 40, 5),
            back(CTXPAR_DTYPE_F32, 2, 17, 3, 40);
        cpt_test_fill(&src.t, 5, 1, 17, nullptr);
        Space sp(dev());
        ctxpar_tensor s = src.On(&sp), m = mid.On(&sp), b = back.On(&sp);
        ASSERT_EQ(ctxpar_dev_cast(dev(), &s, &m, nullptr), CTXPAR_OK) << ctxpar_last_error();
        ASSERT_EQ(ctxpar_dev_cast(dev(), &m, &b, nullptr), CTXPAR_OK) << ctxpar_last_error();
        sp.Get(back.mem.data(), b.data, back.mem.size());
        std::vector<double> want = src.f64(), got = back.f64();
        for (size_t i = 0; i < want.size(); i++)
            ASSERT_EQ(got[i], cpt_test_round(dt, want[i])) << ctxpar_dtype_name(dt) << " " << i;
    }
}

// ---------------------------------------------------------------- bad arguments

// Rejected by the dispatch (the same for every backend), naming the argument; nothing written.
TEST_P(DeviceTest, BadArgumentsAreReportedAndOutputsUntouched) {
    Problem p;
    p.qs = {{0, 20, 1}};
    p.ks = {{0, 20, 1}};
    p.Make();
    Space sp(dev());
    const std::vector<float> o42(p.OutSize(), 42.0f), l42(p.LseSize(), 42.0f);
    float *out = sp.Put(o42), *lse = sp.Put(l42);
    auto fwd = [&](const ctxpar_attn_block &blk, int merge = 0) {
        ctxpar_clear_error();
        return ctxpar_dev_attn_block_fwd(dev(), &blk, out, lse, merge, nullptr);
    };
    auto says = [](const char *what) {
        return std::string(ctxpar_last_error()).find(what) != std::string::npos;
    };
    const ctxpar_attn_block good = p.Block(&sp);
    ctxpar_attn_block blk = good;
    blk.q.dtype = blk.k.dtype = blk.v.dtype = (ctxpar_dtype)3; // inside the enum's range
    EXPECT_EQ(fwd(blk), CTXPAR_ERR_NOT_SUPPORTED);
    EXPECT_TRUE(says("dtype")) << ctxpar_last_error();
    blk = good;
    blk.k.dtype = blk.v.dtype = CTXPAR_DTYPE_BF16;
    EXPECT_EQ(fwd(blk), CTXPAR_ERR_INVALID_ARG);
    blk = good;
    blk.q.shape[2] = 3; // 3 query heads over 2 K/V heads
    EXPECT_EQ(fwd(blk), CTXPAR_ERR_INVALID_ARG);
    EXPECT_TRUE(says("multiple")) << ctxpar_last_error();
    blk = good;
    blk.q.shape[3] = blk.k.shape[3] = blk.v.shape[3] = 0;
    EXPECT_EQ(fwd(blk), CTXPAR_ERR_INVALID_ARG);
    blk = good;
    ctxpar_span short_span = {0, 19, 1};
    blk.k_pos = {&short_span, 1};
    EXPECT_EQ(fwd(blk), CTXPAR_ERR_INVALID_ARG);
    EXPECT_TRUE(says("k_pos")) << ctxpar_last_error();
    blk = good;
    blk.q.stride[3] = 2;
    EXPECT_EQ(fwd(blk), CTXPAR_ERR_INVALID_ARG);
    blk = good;
    blk.scale = NAN;
    EXPECT_EQ(fwd(blk), CTXPAR_ERR_INVALID_ARG);
    EXPECT_EQ(fwd(good, 2), CTXPAR_ERR_INVALID_ARG);
    EXPECT_TRUE(says("merge")) << ctxpar_last_error();
    EXPECT_EQ(ctxpar_dev_attn_block_fwd(dev(), &good, nullptr, lse, 0, nullptr),
              CTXPAR_ERR_INVALID_ARG);
    EXPECT_EQ(ctxpar_dev_attn_block_fwd(dev(), nullptr, out, lse, 0, nullptr),
              CTXPAR_ERR_INVALID_ARG);
    EXPECT_EQ(BitDiff(sp.Get(out, o42.size()), o42), 0u);
    EXPECT_EQ(BitDiff(sp.Get(lse, l42.size()), l42), 0u);

    float *g = sp.Put(std::vector<float>(p.OutSize(), 0.0f));
    ctxpar_tensor dout = p.dout->On(&sp), bad_dout = dout;
    bad_dout.dtype = CTXPAR_DTYPE_F16;
    EXPECT_EQ(ctxpar_dev_attn_block_bwd(dev(), &good, &bad_dout, lse, lse, g, nullptr, nullptr,
                                        nullptr),
              CTXPAR_ERR_INVALID_ARG);
    EXPECT_EQ(ctxpar_dev_attn_block_bwd(dev(), &good, &dout, nullptr, lse, g, nullptr, nullptr,
                                        nullptr),
              CTXPAR_ERR_INVALID_ARG);
    EXPECT_EQ(ctxpar_dev_attn_merge(dev(), out, lse, nullptr, lse, p.B, p.Sq(), p.Hq, p.D,
                                    nullptr),
              CTXPAR_ERR_INVALID_ARG);
    EXPECT_EQ(ctxpar_dev_attn_merge(dev(), out, lse, out, lse, -1, p.Sq(), p.Hq, p.D, nullptr),
              CTXPAR_ERR_INVALID_ARG);
    EXPECT_EQ(BitDiff(sp.Get(g, p.OutSize()), std::vector<float>(p.OutSize(), 0.0f)), 0u);
    HostTensor small(CTXPAR_DTYPE_F32, 1, 1, 1, 3), other(CTXPAR_DTYPE_F32, 1, 1, 1, 4);
    ctxpar_tensor s = small.On(&sp), o = other.On(&sp);
    EXPECT_EQ(ctxpar_dev_cast(dev(), &s, &o, nullptr), CTXPAR_ERR_INVALID_ARG);
    EXPECT_EQ(ctxpar_dev_attn_bwd_prep(dev(), &s, &o, g, nullptr), CTXPAR_ERR_INVALID_ARG);
    EXPECT_EQ(ctxpar_dev_attn_bwd_prep(dev(), &s, &s, nullptr, nullptr), CTXPAR_ERR_INVALID_ARG);
    EXPECT_EQ(ctxpar_dev_add(dev(), nullptr, g, 4, nullptr), CTXPAR_ERR_INVALID_ARG);
    EXPECT_EQ(ctxpar_dev_fill(dev(), nullptr, 0.0f, 4, nullptr), CTXPAR_ERR_INVALID_ARG);
}

INSTANTIATE_TEST_SUITE_P(Devices, DeviceTest, ::testing::ValuesIn(DeviceFactories()),
                         [](const ::testing::TestParamInfo<DeviceFactory> &i) {
                             return FactoryName(i.param);
                         });

} // namespace
} // namespace cpt_devconf
