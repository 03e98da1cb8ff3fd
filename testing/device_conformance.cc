// The device conformance suite: every device op against the fp64 oracle or exact values, run
// for every factory of device_conformance_test.cc (each CPU kernel table, CUDA). A device that
// cannot run here skips every case, saying why. Cases specific to one backend stay in its own
// suite (cpu_ops_test, cuda_ops_test).
#include "testing/device_conformance.h"

#include <cstring>
#include <ostream>
#include <tuple>

#include "ctxpar_cpu.h"
#include "dispatch.h"

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
        DeviceFactory ref = {"cpu", CreateCpuReference, nullptr, 0, false, 1, 1};
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
        DeviceFactory ref = {"cpu", CreateCpuReference, nullptr, 0, false, 1, 1};
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
