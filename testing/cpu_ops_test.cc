// cpu_ops_test: every op of the CPU device against the float64 oracle (testing/oracle.h), plus
// the bitwise properties other parts rely on: determinism over thread counts, a query row's bits
// independent of the other rows of the call, merge algebra, and each kernel table the CPU has.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <ostream>
#include <string>
#include <vector>

#include "backends/cpu/cpu_internal.h"
#include "ctxpar_backend.h"
#include "ctxpar_cpu.h"
#include "ctxpar_half.h"
#include "testing/data.h"
#include "testing/metrics.h"
#include "testing/oracle.h"

namespace {

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
//  - delta = rowsum(dout * out): one D-term F32 sum per row (largest seen: 1.8e-7).
constexpr double kTolPrep = 1e-6;
//  - merged partials vs one pass over the whole K/V, or two merge orders: they differ by a few
//    roundings of each output (largest seen: 1.2e-7).
constexpr double kTolMerge = 1e-6;

// The backward's schedules (cpu_attn_bwd.c): chosen from the shapes, or by the device's options.
const char *const kSchedules[] = {"fused", "two-pass"};

// A CPU device with `threads` threads and, if named, a kernel table and a backward schedule
// (chosen through ctxpar_cpu_options; the names as ctxpar_cpu_isa_parse and
// ctxpar_cpu_bwd_schedule_parse take them).
struct Device {
    ctxpar_device *dev = nullptr;
    ctxpar_status st = CTXPAR_OK;
    explicit Device(int threads = 0, const char *kernels = nullptr, const char *bwd = nullptr) {
        ctxpar_cpu_options opt = CTXPAR_CPU_OPTIONS_INIT;
        opt.num_threads = threads;
        if (kernels)
            st = ctxpar_cpu_isa_parse(kernels, &opt.kernels);
        if (bwd && st == CTXPAR_OK)
            st = ctxpar_cpu_bwd_schedule_parse(bwd, &opt.bwd_schedule);
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

size_t DtypeSize(ctxpar_dtype dt) {
    return dt == CTXPAR_DTYPE_F32 ? 4 : 2;
}

// A host tensor that owns its memory; pad adds elements to the row stride (seq dimension) so
// that kernels see non-dense tensors.
struct HostTensor {
    std::vector<unsigned char> mem;
    ctxpar_tensor t;
    HostTensor(ctxpar_dtype dt, int64_t b, int64_t s, int64_t h, int64_t d, int64_t pad = 0) {
        int64_t row = h * d + pad;
        mem.assign((size_t)(b * s * row + 1) * DtypeSize(dt), 0);
        t.data = mem.data();
        t.dtype = dt;
        t.shape[0] = b, t.shape[1] = s, t.shape[2] = h, t.shape[3] = d;
        t.stride[0] = s * row, t.stride[1] = row, t.stride[2] = d, t.stride[3] = 1;
    }
    int64_t numel() const { return t.shape[0] * t.shape[1] * t.shape[2] * t.shape[3]; }
    std::vector<double> f64() const {
        std::vector<double> x((size_t)numel());
        cpt_test_to_f64(&t, x.data());
        return x;
    }
};

std::vector<int64_t> Positions(const std::vector<ctxpar_span> &spans) {
    std::vector<int64_t> pos;
    for (const ctxpar_span &s : spans)
        for (int64_t i = 0; i < s.len; i++)
            pos.push_back(s.start + i * s.stride);
    return pos;
}

int64_t Total(const std::vector<ctxpar_span> &spans) {
    return (int64_t)Positions(spans).size();
}

// Where the query and key rows of a block sit in the global sequence (seq_global = 512).
struct PosCase {
    const char *name;
    std::vector<ctxpar_span> q, k;
};

std::vector<PosCase> PosCases() {
    return {
        {"same", {{0, 150, 1}}, {{0, 150, 1}}},
        {"q_after_k", {{300, 100, 1}}, {{100, 130, 1}}},
        {"q_before_k", {{0, 90, 1}}, {{200, 120, 1}}},
        {"overlap", {{50, 140, 1}}, {{100, 150, 1}}},
        // striped over 4 ranks: rank 3's queries against rank 1's keys
        {"striped", {{3, 100, 4}}, {{1, 110, 4}}},
        // zigzag over 2 ranks of 4 chunks of 64: rank 0's queries against rank 1's keys
        {"zigzag", {{0, 64, 1}, {192, 64, 1}}, {{64, 64, 1}, {128, 64, 1}}},
    };
}

// Document boundaries not aligned with tiles, of very different lengths.
const std::vector<int32_t> kDocs = {0, 37, 100, 230, 300, 512};

struct MaskCase {
    const char *name;
    int causal;
    int64_t window;
    bool docs;
};

std::vector<MaskCase> MaskCases() {
    return {
        {"none", 0, 0, false},    {"causal", 1, 0, false}, {"causal_window", 1, 48, false},
        {"window", 0, 48, false}, {"docs", 0, 0, true},    {"docs_causal", 1, 0, true},
    };
}

const char *DtypeName(ctxpar_dtype dt) {
    return ctxpar_dtype_name(dt);
}

// One block pair: shapes, positions, mask, and the tensors filled from the global data.
struct Problem {
    int64_t B = 2, Hq = 4, Hkv = 2, D = 40, seq_global = 512, pad = 0;
    ctxpar_dtype dtype = CTXPAR_DTYPE_F32;
    std::vector<ctxpar_span> qs, ks;
    int causal = 0;
    int64_t window = 0;
    std::vector<int32_t> cu; // empty: one document
    float scale = 0.0f;      // 0: 1/sqrt(D)
    uint64_t seed = 7;

    HostTensor *q = nullptr, *k = nullptr, *v = nullptr, *dout = nullptr;
    std::vector<int64_t> qpos, kpos;

    Problem() = default;
    Problem(const Problem &) = delete;
    Problem &operator=(const Problem &) = delete;
    ~Problem() {
        delete q;
        delete k;
        delete v;
        delete dout;
    }

    int64_t Sq() const { return Total(qs); }
    int64_t Sk() const { return Total(ks); }
    float Scale() const { return scale != 0.0f ? scale : 1.0f / std::sqrt((float)D); }

    void Make() {
        qpos = Positions(qs);
        kpos = Positions(ks);
        q = new HostTensor(dtype, B, Sq(), Hq, D, pad);
        k = new HostTensor(dtype, B, Sk(), Hkv, D, pad);
        v = new HostTensor(dtype, B, Sk(), Hkv, D, pad);
        dout = new HostTensor(dtype, B, Sq(), Hq, D, pad);
        cpt_test_fill(&q->t, seed, 1, seq_global, qpos.data());
        cpt_test_fill(&k->t, seed, 2, seq_global, kpos.data());
        cpt_test_fill(&v->t, seed, 3, seq_global, kpos.data());
        cpt_test_fill(&dout->t, seed, 4, seq_global, qpos.data());
    }

    ctxpar_mask_desc Mask() const {
        ctxpar_mask_desc m = {causal, window, nullptr, 0};
        if (!cu.empty()) {
            m.cu_seqlens = cu.data();
            m.num_docs = (int64_t)cu.size() - 1;
        }
        return m;
    }

    ctxpar_attn_block Block() const {
        ctxpar_attn_block blk;
        blk.q = q->t;
        blk.k = k->t;
        blk.v = v->t;
        blk.q_pos = {qs.data(), (int)qs.size()};
        blk.k_pos = {ks.data(), (int)ks.size()};
        blk.mask = Mask();
        blk.scale = Scale();
        return blk;
    }

    cpt_oracle_shape Shape() const { return {B, Sq(), Sk(), Hq, Hkv, D}; }
    size_t OutSize() const { return (size_t)(B * Sq() * Hq * D); }
    size_t LseSize() const { return (size_t)(B * Hq * Sq()); }
    size_t KvSize() const { return (size_t)(B * Sk() * Hkv * D); }

    void OracleFwd(std::vector<double> *out, std::vector<double> *lse) const {
        out->assign(OutSize(), 0.0);
        lse->assign(LseSize(), 0.0);
        cpt_oracle_shape sh = Shape();
        ctxpar_mask_desc m = Mask();
        std::vector<double> qd = q->f64(), kd = k->f64(), vd = v->f64();
        cpt_oracle_fwd(&sh, qd.data(), kd.data(), vd.data(), qpos.data(), kpos.data(), &m,
                          (double)Scale(), out->data(), lse->data());
    }

    void OracleBwd(std::vector<double> *dq, std::vector<double> *dk,
                   std::vector<double> *dv) const {
        dq->assign(OutSize(), 0.0);
        dk->assign(KvSize(), 0.0);
        dv->assign(KvSize(), 0.0);
        cpt_oracle_shape sh = Shape();
        ctxpar_mask_desc m = Mask();
        std::vector<double> qd = q->f64(), kd = k->f64(), vd = v->f64(), dod = dout->f64();
        cpt_oracle_bwd(&sh, qd.data(), kd.data(), vd.data(), qpos.data(), kpos.data(), &m,
                          (double)Scale(), dod.data(), dq->data(), dk->data(), dv->data());
    }
};

void SetMask(Problem *p, const MaskCase &m) {
    p->causal = m.causal;
    p->window = m.window;
    if (m.docs)
        p->cu = kDocs;
}

struct FwdResult {
    std::vector<float> out, lse;
};

// Runs the block forward (merge = 0) on a fresh device.
FwdResult RunFwd(const Problem &p, int threads = 0, const char *kernels = nullptr) {
    Device d(threads, kernels);
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

struct BwdResult {
    FwdResult fwd;
    std::vector<float> delta, dq, dk, dv;
};

// Forward, bwd_prep on the F32 output, then the block backward into zeroed accumulators.
BwdResult RunBwd(const Problem &p, int threads = 0, const char *kernels = nullptr,
                 const char *bwd = nullptr) {
    BwdResult r;
    r.fwd = RunFwd(p, threads, kernels);
    Device d(threads, kernels, bwd);
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

// Relative error of got against ref, with no non-finite mismatch.
void ExpectClose(const std::vector<float> &got, const std::vector<double> &ref, double tol,
                 const char *what) {
    ASSERT_EQ(got.size(), ref.size()) << what;
    cpt_error_stats e = cpt_compare_f32(got.data(), ref.data(), got.size());
    EXPECT_EQ(e.nonfinite, 0) << what << ": worst element " << e.worst;
    EXPECT_LE(e.rel, tol) << what << ": worst element " << e.worst << " got "
                          << (e.worst >= 0 ? got[(size_t)e.worst] : 0.0) << " want "
                          << (e.worst >= 0 ? ref[(size_t)e.worst] : 0.0);
}

// Fully masked rows: out exactly 0 and lse -inf where the oracle says so; no NaN anywhere.
void ExpectEmptyRows(const Problem &p, const FwdResult &r, const std::vector<double> &ref_lse) {
    for (int64_t b = 0; b < p.B; b++)
        for (int64_t h = 0; h < p.Hq; h++)
            for (int64_t s = 0; s < p.Sq(); s++) {
                size_t li = (size_t)((b * p.Hq + h) * p.Sq() + s);
                ASSERT_FALSE(std::isnan(r.lse[li]));
                if (ref_lse[li] != -INFINITY)
                    continue;
                ASSERT_EQ(r.lse[li], -INFINITY) << "row b" << b << " h" << h << " s" << s;
                for (int64_t d = 0; d < p.D; d++)
                    ASSERT_EQ(r.out[(size_t)(((b * p.Sq() + s) * p.Hq + h) * p.D + d)], 0.0f);
            }
    for (float x : r.out)
        ASSERT_FALSE(std::isnan(x));
}

size_t BitDiff(const std::vector<float> &a, const std::vector<float> &b) {
    if (a.size() != b.size())
        return SIZE_MAX;
    return cpt_bitwise_diff(a.data(), b.data(), a.size(), sizeof(float), nullptr);
}

// ---------------------------------------------------------------- forward vs oracle

// Every mask x every position case x every dtype x GQA ratio 1, 2, Hq.
struct FwdParam {
    MaskCase mask;
    PosCase pos;
    ctxpar_dtype dtype;
    int64_t hkv;
};

class FwdOracle : public ::testing::TestWithParam<FwdParam> {};

TEST_P(FwdOracle, MatchesOracle) {
    const FwdParam &prm = GetParam();
    Problem p;
    p.dtype = prm.dtype;
    p.Hkv = prm.hkv;
    p.qs = prm.pos.q;
    p.ks = prm.pos.k;
    SetMask(&p, prm.mask);
    p.pad = prm.hkv == 2 ? 5 : 0; // some cases on non-dense tensors
    p.Make();
    std::vector<double> ref_out, ref_lse;
    p.OracleFwd(&ref_out, &ref_lse);
    FwdResult r = RunFwd(p);
    ExpectClose(r.out, ref_out, kTolFwd, "out");
    ExpectClose(r.lse, ref_lse, kTolFwd, "lse");
    ExpectEmptyRows(p, r, ref_lse);
}

std::vector<FwdParam> FwdParams() {
    std::vector<FwdParam> v;
    for (const MaskCase &m : MaskCases())
        for (const PosCase &pc : PosCases())
            for (ctxpar_dtype dt : {CTXPAR_DTYPE_F32, CTXPAR_DTYPE_BF16, CTXPAR_DTYPE_F16})
                for (int64_t hkv : {4, 2, 1})
                    v.push_back({m, pc, dt, hkv});
    return v;
}

std::string FwdName(const ::testing::TestParamInfo<FwdParam> &info) {
    const FwdParam &p = info.param;
    return std::string(p.mask.name) + "_" + p.pos.name + "_" + DtypeName(p.dtype) + "_gqa" +
           std::to_string(4 / p.hkv);
}

// gtest would otherwise print the parameter's raw bytes, padding included.
void PrintTo(const FwdParam &p, std::ostream *os) {
    *os << p.mask.name << "/" << p.pos.name << "/" << DtypeName(p.dtype) << "/hkv" << p.hkv;
}

INSTANTIATE_TEST_SUITE_P(All, FwdOracle, ::testing::ValuesIn(FwdParams()), FwdName);

// Head dims from 1 to past 256, odd sequence lengths (tails in every tiled dimension).
class FwdHeadDim : public ::testing::TestWithParam<int64_t> {};

TEST_P(FwdHeadDim, MatchesOracle) {
    Problem p;
    p.B = 1;
    p.D = GetParam();
    p.qs = {{10, 67, 1}};
    p.ks = {{0, 77, 1}};
    p.causal = 1;
    p.Make();
    std::vector<double> ref_out, ref_lse;
    p.OracleFwd(&ref_out, &ref_lse);
    FwdResult r = RunFwd(p);
    ExpectClose(r.out, ref_out, kTolFwd, "out");
    ExpectClose(r.lse, ref_lse, kTolFwd, "lse");
}

INSTANTIATE_TEST_SUITE_P(Dims, FwdHeadDim, ::testing::Values(1, 3, 16, 17, 64, 100, 128, 256, 300));

TEST(Fwd, ScaleIsApplied) {
    Problem p;
    p.qs = {{0, 70, 1}};
    p.ks = {{0, 70, 1}};
    p.scale = 0.9f;
    p.Make();
    std::vector<double> ref_out, ref_lse;
    p.OracleFwd(&ref_out, &ref_lse);
    FwdResult r = RunFwd(p);
    ExpectClose(r.out, ref_out, kTolFwd, "out");
    ExpectClose(r.lse, ref_lse, kTolFwd, "lse");
}

// Rows with no visible key, mixed with rows that have some in the same tiles (docs + causal +
// window), and a block pair that is masked as a whole.
TEST(Fwd, FullyMaskedRows) {
    for (int whole = 0; whole < 2; whole++) {
        Problem p;
        p.qs =
            whole ? std::vector<ctxpar_span>{{0, 90, 1}} : std::vector<ctxpar_span>{{20, 100, 1}};
        p.ks = {{95, 120, 1}};
        p.causal = 1;
        p.window = whole ? 0 : 30;
        p.cu = kDocs;
        p.Make();
        std::vector<double> ref_out, ref_lse;
        p.OracleFwd(&ref_out, &ref_lse);
        int empty = 0;
        for (double x : ref_lse)
            empty += x == -INFINITY;
        ASSERT_GT(empty, 0);
        FwdResult r = RunFwd(p);
        ExpectEmptyRows(p, r, ref_lse);
        ExpectClose(r.out, ref_out, kTolFwd, "out");
        ExpectClose(r.lse, ref_lse, kTolFwd, "lse");
    }
}

TEST(Fwd, EmptyKeyBlock) {
    Problem p;
    p.qs = {{0, 30, 1}};
    p.ks = {};
    p.Make();
    FwdResult r = RunFwd(p);
    for (float x : r.lse)
        ASSERT_EQ(x, -INFINITY);
    for (float x : r.out)
        ASSERT_EQ(x, 0.0f);
}

// ---------------------------------------------------------------- merge algebra

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

class Merge : public ::testing::TestWithParam<ctxpar_dtype> {
  protected:
    void SetUp() override {
        p.dtype = GetParam();
        p.qs = {{60, 130, 1}};
        p.ks = {{0, 200, 1}};
        p.causal = 1;
        p.cu = kDocs;
        p.Make();
        p.OracleFwd(&ref_out, &ref_lse);
    }
    Problem p;
    std::vector<double> ref_out, ref_lse;
};

// Two halves of K/V merged by the forward (merge = 1) and by attn_merge both equal the whole.
TEST_P(Merge, HalvesEqualWhole) {
    Device d(2);
    ASSERT_EQ(d.st, CTXPAR_OK);
    std::vector<float> out(p.OutSize()), lse(p.LseSize());
    FwdPart(d.dev, p, 0, 77, out.data(), lse.data(), 0);
    FwdPart(d.dev, p, 77, 123, out.data(), lse.data(), 1);
    ExpectClose(out, ref_out, kTolFwd, "fwd merge out");
    ExpectClose(lse, ref_lse, kTolFwd, "fwd merge lse");

    std::vector<float> out2(p.OutSize()), lse2(p.LseSize()), ob(p.OutSize()), lb(p.LseSize());
    FwdPart(d.dev, p, 0, 77, out2.data(), lse2.data(), 0);
    FwdPart(d.dev, p, 77, 123, ob.data(), lb.data(), 0);
    ASSERT_EQ(ctxpar_dev_attn_merge(d.dev, out2.data(), lse2.data(), ob.data(), lb.data(), p.B,
                                    p.Sq(), p.Hq, p.D, nullptr),
              CTXPAR_OK);
    ExpectClose(out2, ref_out, kTolFwd, "attn_merge out");
    ExpectClose(lse2, ref_lse, kTolFwd, "attn_merge lse");

    FwdResult whole = RunFwd(p, 2);
    std::vector<double> wo(whole.out.begin(), whole.out.end()),
        wl(whole.lse.begin(), whole.lse.end());
    ExpectClose(out2, wo, kTolMerge, "merged vs whole out");
    ExpectClose(lse2, wl, kTolMerge, "merged vs whole lse");
}

// Merging an empty partial (0, -inf) is the identity, both ways round, bit for bit; two empty
// rows give (0, -inf).
TEST_P(Merge, EmptyPartialIsIdentity) {
    Device d(2);
    ASSERT_EQ(d.st, CTXPAR_OK);
    FwdResult a = RunFwd(p, 2);
    std::vector<float> zero(p.OutSize(), 0.0f), ninf(p.LseSize(), -INFINITY);
    std::vector<float> out = a.out, lse = a.lse;
    ASSERT_EQ(ctxpar_dev_attn_merge(d.dev, out.data(), lse.data(), zero.data(), ninf.data(), p.B,
                                    p.Sq(), p.Hq, p.D, nullptr),
              CTXPAR_OK);
    EXPECT_EQ(BitDiff(out, a.out), 0u);
    EXPECT_EQ(BitDiff(lse, a.lse), 0u);
    std::vector<float> out2 = zero, lse2 = ninf;
    ASSERT_EQ(ctxpar_dev_attn_merge(d.dev, out2.data(), lse2.data(), a.out.data(), a.lse.data(),
                                    p.B, p.Sq(), p.Hq, p.D, nullptr),
              CTXPAR_OK);
    EXPECT_EQ(BitDiff(out2, a.out), 0u);
    EXPECT_EQ(BitDiff(lse2, a.lse), 0u);
    std::vector<float> out3 = zero, lse3 = ninf;
    ASSERT_EQ(ctxpar_dev_attn_merge(d.dev, out3.data(), lse3.data(), zero.data(), ninf.data(), p.B,
                                    p.Sq(), p.Hq, p.D, nullptr),
              CTXPAR_OK);
    EXPECT_EQ(BitDiff(out3, zero), 0u);
    EXPECT_EQ(BitDiff(lse3, ninf), 0u);

    // The forward merging a block pair that is masked as a whole changes nothing either.
    Problem m;
    m.dtype = p.dtype;
    m.qs = {{0, 50, 1}};
    m.ks = {{100, 60, 1}};
    m.causal = 1;
    m.Make();
    FwdResult before = RunFwd(m, 2);
    std::vector<float> o = before.out, l = before.lse;
    for (size_t i = 0; i < l.size(); i++) // give every row a finite partial to keep
        l[i] = 0.5f, o[i] = 1.0f;
    std::vector<float> o0 = o, l0 = l;
    ctxpar_attn_block blk = m.Block();
    ASSERT_EQ(ctxpar_dev_attn_block_fwd(d.dev, &blk, o.data(), l.data(), 1, nullptr), CTXPAR_OK);
    EXPECT_EQ(BitDiff(o, o0), 0u);
    EXPECT_EQ(BitDiff(l, l0), 0u);
}

// Three partials merged in two orders agree up to rounding.
TEST_P(Merge, OrderOnlyChangesRounding) {
    Device d(1);
    ASSERT_EQ(d.st, CTXPAR_OK);
    const int64_t cut[4] = {0, 64, 140, 200};
    std::vector<std::vector<float>> o(3, std::vector<float>(p.OutSize()));
    std::vector<std::vector<float>> l(3, std::vector<float>(p.LseSize()));
    for (int i = 0; i < 3; i++)
        FwdPart(d.dev, p, cut[i], cut[i + 1] - cut[i], o[i].data(), l[i].data(), 0);
    auto merge_in = [&](const std::vector<int> &order, std::vector<float> *out,
                        std::vector<float> *lse) {
        *out = o[(size_t)order[0]];
        *lse = l[(size_t)order[0]];
        for (size_t i = 1; i < order.size(); i++)
            ASSERT_EQ(ctxpar_dev_attn_merge(d.dev, out->data(), lse->data(),
                                            o[(size_t)order[i]].data(), l[(size_t)order[i]].data(),
                                            p.B, p.Sq(), p.Hq, p.D, nullptr),
                      CTXPAR_OK);
    };
    std::vector<float> oa, la, ob, lb;
    merge_in({0, 1, 2}, &oa, &la);
    merge_in({2, 1, 0}, &ob, &lb);
    ExpectClose(oa, ref_out, kTolFwd, "order 012");
    ExpectClose(ob, ref_out, kTolFwd, "order 210");
    std::vector<double> od(oa.begin(), oa.end()), ld(la.begin(), la.end());
    ExpectClose(ob, od, kTolMerge, "012 vs 210 out");
    ExpectClose(lb, ld, kTolMerge, "012 vs 210 lse");
}

INSTANTIATE_TEST_SUITE_P(Dtypes, Merge,
                         ::testing::Values(CTXPAR_DTYPE_F32, CTXPAR_DTYPE_BF16, CTXPAR_DTYPE_F16),
                         [](const ::testing::TestParamInfo<ctxpar_dtype> &i) {
                             return std::string(DtypeName(i.param));
                         });

// ---------------------------------------------------------------- backward vs oracle

struct BwdParam {
    MaskCase mask;
    PosCase pos;
    ctxpar_dtype dtype;
    int64_t hkv;
};

class BwdOracle : public ::testing::TestWithParam<BwdParam> {};

void CheckBwd(const Problem &p, const BwdResult &r) {
    std::vector<double> dq, dk, dv;
    p.OracleBwd(&dq, &dk, &dv);
    ExpectClose(r.dq, dq, kTolBwd, "dq");
    ExpectClose(r.dk, dk, kTolBwd, "dk");
    ExpectClose(r.dv, dv, kTolBwd, "dv");
}

TEST_P(BwdOracle, MatchesOracle) {
    const BwdParam &prm = GetParam();
    Problem p;
    p.dtype = prm.dtype;
    p.Hkv = prm.hkv;
    p.qs = prm.pos.q;
    p.ks = prm.pos.k;
    SetMask(&p, prm.mask);
    p.pad = prm.hkv == 1 ? 3 : 0;
    p.Make();
    for (const char *schedule : kSchedules) {
        SCOPED_TRACE(schedule);
        CheckBwd(p, RunBwd(p, 0, nullptr, schedule));
    }
}

// Every mask x position x dtype; the GQA ratio cycles through 1, 2, Hq.
std::vector<BwdParam> BwdParams() {
    std::vector<BwdParam> v;
    int i = 0;
    const int64_t hkv[3] = {4, 2, 1};
    for (const MaskCase &m : MaskCases())
        for (const PosCase &pc : PosCases())
            for (ctxpar_dtype dt : {CTXPAR_DTYPE_F32, CTXPAR_DTYPE_BF16, CTXPAR_DTYPE_F16})
                v.push_back({m, pc, dt, hkv[i++ % 3]});
    return v;
}

std::string BwdName(const ::testing::TestParamInfo<BwdParam> &info) {
    const BwdParam &p = info.param;
    return std::string(p.mask.name) + "_" + p.pos.name + "_" + DtypeName(p.dtype) + "_gqa" +
           std::to_string(4 / p.hkv);
}

void PrintTo(const BwdParam &p, std::ostream *os) {
    *os << p.mask.name << "/" << p.pos.name << "/" << DtypeName(p.dtype) << "/hkv" << p.hkv;
}

INSTANTIATE_TEST_SUITE_P(All, BwdOracle, ::testing::ValuesIn(BwdParams()), BwdName);

class BwdHeadDim : public ::testing::TestWithParam<int64_t> {};

TEST_P(BwdHeadDim, MatchesOracle) {
    Problem p;
    p.B = 1;
    p.Hkv = 1;
    p.D = GetParam();
    p.qs = {{10, 67, 1}};
    p.ks = {{0, 77, 1}};
    p.causal = 1;
    p.Make();
    for (const char *schedule : kSchedules) {
        SCOPED_TRACE(schedule);
        CheckBwd(p, RunBwd(p, 0, nullptr, schedule));
    }
}

INSTANTIATE_TEST_SUITE_P(Dims, BwdHeadDim, ::testing::Values(1, 3, 17, 64, 128, 256, 300));

// Accumulators are added to, and a NULL one is simply not computed: the others keep their bits.
class BwdSchedule : public ::testing::TestWithParam<const char *> {};

TEST_P(BwdSchedule, AccumulatesAndSkipsNullOutputs) {
    Problem p;
    p.qs = {{0, 100, 1}};
    p.ks = {{0, 300, 1}};
    p.causal = 1;
    p.Make();
    BwdResult all = RunBwd(p, 2, nullptr, GetParam());
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
    BwdResult all = RunBwd(p, 2, nullptr, GetParam());
    Device d(2, nullptr, GetParam());
    ASSERT_EQ(d.st, CTXPAR_OK);
    ctxpar_attn_block blk = p.Block();
    std::vector<float> dq(p.OutSize(), 0.0f), dk(p.KvSize(), 0.0f), dv(p.KvSize(), 0.0f);
    ASSERT_EQ(ctxpar_dev_attn_block_bwd(d.dev, &blk, &p.dout->t, all.fwd.lse.data(),
                                        all.delta.data(), dq.data(), dk.data(), dv.data(), nullptr),
              CTXPAR_OK);
    EXPECT_EQ(d.dev->mem_current, d.dev->scratch_bytes);
    if (std::string(GetParam()) == "fused")
        EXPECT_GE(d.dev->mem_peak, p.OutSize() * sizeof(float)) << "one dQ-sized partial sum";
    else
        EXPECT_EQ(d.dev->mem_peak, 0u);
    EXPECT_EQ(BitDiff(dq, all.dq), 0u);
    const uint64_t allocs = d.dev->alloc_count;
    ASSERT_EQ(ctxpar_dev_attn_block_bwd(d.dev, &blk, &p.dout->t, all.fwd.lse.data(),
                                        all.delta.data(), dq.data(), dk.data(), dv.data(), nullptr),
              CTXPAR_OK);
    EXPECT_EQ(d.dev->alloc_count, allocs) << "the second call reuses the scratch";
    EXPECT_EQ(ctxpar_dev_scratch_release(d.dev), CTXPAR_OK);
    EXPECT_EQ(d.dev->mem_current, 0u);
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
        BwdResult chosen = RunBwd(p, 2), forced = RunBwd(p, 2, nullptr, c.want);
        EXPECT_EQ(BitDiff(chosen.dq, forced.dq), 0u) << c.want;
        EXPECT_EQ(BitDiff(chosen.dk, forced.dk), 0u) << c.want;
        EXPECT_EQ(BitDiff(chosen.dv, forced.dv), 0u) << c.want;
        CheckBwd(p, chosen);
    }
}

TEST(BwdPrep, MatchesFloat64) {
    for (ctxpar_dtype dt_out : {CTXPAR_DTYPE_F32, CTXPAR_DTYPE_BF16, CTXPAR_DTYPE_F16})
        for (ctxpar_dtype dt_dout : {CTXPAR_DTYPE_F32, CTXPAR_DTYPE_BF16}) {
            const int64_t B = 2, S = 33, H = 3, D = 300; // D > the kernel's 256-element chunks
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
            Device dev(2);
            ASSERT_EQ(dev.st, CTXPAR_OK);
            std::vector<float> delta(ref.size(), NAN);
            ASSERT_EQ(ctxpar_dev_attn_bwd_prep(dev.dev, &out.t, &dout.t, delta.data(), nullptr),
                      CTXPAR_OK)
                << ctxpar_last_error();
            ExpectClose(delta, ref, kTolPrep, "delta");
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
    p->cu = kDocs;
    p->Make();
    return p;
}

// Identical bits run to run and for 1, 2 and 3 threads: forward, merge, prep, backward.
TEST(Determinism, ThreadCountsGiveIdenticalBits) {
    for (ctxpar_dtype dt : {CTXPAR_DTYPE_F32, CTXPAR_DTYPE_BF16}) {
        Problem *p = DeterminismProblem(dt);
        for (const char *schedule : kSchedules) {
            BwdResult ref = RunBwd(*p, 1, nullptr, schedule);
            for (int threads : {2, 3}) {
                BwdResult r = RunBwd(*p, threads, nullptr, schedule);
                EXPECT_EQ(BitDiff(r.dq, ref.dq), 0u) << schedule << ", threads " << threads;
                EXPECT_EQ(BitDiff(r.dk, ref.dk), 0u) << schedule << ", threads " << threads;
                EXPECT_EQ(BitDiff(r.dv, ref.dv), 0u) << schedule << ", threads " << threads;
            }
        }
        BwdResult ref = RunBwd(*p, 1);
        std::vector<float> ref_o, ref_l; // the two-part merge on one thread
        for (int threads : {1, 2, 3}) {
            BwdResult r = RunBwd(*p, threads);
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

// A query row's bits depend only on that row, not on the other rows of the call nor on where it
// sits in a tile: the all-gather algorithm computes subsets of rows against the whole K/V and
// must match one rank computing them all.
void CheckRowIndependence(ctxpar_dtype dt, int64_t hkv, const MaskCase &mask, const char *kernels) {
    Problem full;
    full.dtype = dt;
    full.Hkv = hkv;
    full.D = 48;
    full.qs = {{0, 400, 1}};
    full.ks = {{0, 400, 1}};
    SetMask(&full, mask);
    full.Make();
    FwdResult whole = RunFwd(full, 2, kernels);
    const std::vector<std::vector<ctxpar_span>> subsets = {
        {{1, 100, 4}},              // striped, stride 4
        {{37, 150, 1}},             // contiguous, not tile-aligned
        {{0, 50, 1}, {350, 50, 1}}, // zigzag
        {{399, 1, 1}},              // one row
    };
    for (const auto &qs : subsets) {
        Problem sub;
        sub.dtype = dt;
        sub.Hkv = hkv;
        sub.D = 48;
        sub.qs = qs;
        sub.ks = full.ks;
        SetMask(&sub, mask);
        sub.pad = 2; // a different layout in memory must not matter either
        sub.Make();
        FwdResult r = RunFwd(sub, 1, kernels);
        size_t bad = 0;
        for (int64_t b = 0; b < sub.B; b++)
            for (int64_t h = 0; h < sub.Hq; h++)
                for (int64_t s = 0; s < sub.Sq(); s++) {
                    int64_t g = sub.qpos[(size_t)s];
                    const float *got = &r.out[(size_t)(((b * sub.Sq() + s) * sub.Hq + h) * sub.D)];
                    const float *want = &whole.out[(size_t)(((b * 400 + g) * sub.Hq + h) * sub.D)];
                    bad += std::memcmp(got, want, (size_t)sub.D * sizeof(float)) != 0;
                    float lg = r.lse[(size_t)((b * sub.Hq + h) * sub.Sq() + s)];
                    float lw = whole.lse[(size_t)((b * sub.Hq + h) * 400 + g)];
                    bad += std::memcmp(&lg, &lw, sizeof lg) != 0;
                }
        EXPECT_EQ(bad, 0u) << "subset starting at " << qs[0].start << " stride " << qs[0].stride;
    }
}

TEST(RowIndependence, SubsetsOfRowsGiveTheSameBits) {
    for (const MaskCase &m : MaskCases())
        CheckRowIndependence(CTXPAR_DTYPE_F32, 2, m, nullptr);
    CheckRowIndependence(CTXPAR_DTYPE_BF16, 1, MaskCases()[5], nullptr);
    CheckRowIndependence(CTXPAR_DTYPE_F16, 4, MaskCases()[2], nullptr);
}

// ---------------------------------------------------------------- every kernel table

class KernelTables : public ::testing::TestWithParam<const char *> {
  protected:
    void SetUp() override {
        if (!KernelsAvailable(GetParam()))
            GTEST_SKIP() << "this CPU cannot run the " << GetParam() << " kernels";
    }
};

TEST_P(KernelTables, ForwardMatchesOracle) {
    Device d(1, GetParam());
    ASSERT_EQ(d.st, CTXPAR_OK);
    EXPECT_STREQ(ctxpar_cpu_kernels_name(d.dev), GetParam());
    for (const MaskCase &m : MaskCases())
        for (ctxpar_dtype dt : {CTXPAR_DTYPE_F32, CTXPAR_DTYPE_BF16, CTXPAR_DTYPE_F16}) {
            Problem p;
            p.dtype = dt;
            p.D = 37;
            p.qs = {{40, 90, 1}, {300, 40, 1}};
            p.ks = {{0, 150, 1}};
            SetMask(&p, m);
            p.Make();
            std::vector<double> ref_out, ref_lse;
            p.OracleFwd(&ref_out, &ref_lse);
            FwdResult r = RunFwd(p, 2, GetParam());
            ExpectClose(r.out, ref_out, kTolFwd, "out");
            ExpectClose(r.lse, ref_lse, kTolFwd, "lse");
            ExpectEmptyRows(p, r, ref_lse);
        }
}

TEST_P(KernelTables, BackwardMatchesOracle) {
    for (const MaskCase &m : MaskCases()) {
        Problem p;
        p.dtype = CTXPAR_DTYPE_F16;
        p.Hkv = 1;
        p.D = 37;
        p.qs = {{40, 90, 1}, {300, 40, 1}};
        p.ks = {{0, 150, 1}};
        SetMask(&p, m);
        p.Make();
        CheckBwd(p, RunBwd(p, 2, GetParam()));
    }
}

TEST_P(KernelTables, RowIndependenceAndDeterminism) {
    CheckRowIndependence(CTXPAR_DTYPE_F32, 2, MaskCases()[5], GetParam());
    Problem *p = DeterminismProblem(CTXPAR_DTYPE_F32);
    BwdResult a = RunBwd(*p, 1, GetParam()), b = RunBwd(*p, 3, GetParam());
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
            EXPECT_EQ(bad, 0u) << DtypeName(from) << " -> " << DtypeName(to);
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
        EXPECT_EQ(bad, 0u) << DtypeName(dt);
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

TEST(Elementwise, AddAndFill) {
    for (size_t n : {(size_t)1, (size_t)1000, (size_t)100003}) {
        Device d(2);
        ASSERT_EQ(d.st, CTXPAR_OK);
        std::vector<float> a(n), b(n);
        for (size_t i = 0; i < n; i++) {
            a[i] = (float)i;
            b[i] = 0.5f * (float)(n - i);
        }
        ASSERT_EQ(ctxpar_dev_add(d.dev, a.data(), b.data(), n, nullptr), CTXPAR_OK);
        for (size_t i = 0; i < n; i++)
            ASSERT_EQ(a[i], (float)i + 0.5f * (float)(n - i)) << i;
        ASSERT_EQ(ctxpar_dev_fill(d.dev, a.data(), -INFINITY, n, nullptr), CTXPAR_OK);
        for (size_t i = 0; i < n; i++)
            ASSERT_EQ(a[i], -INFINITY) << i;
    }
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
    EXPECT_EQ(d.dev->mem_current, 0u);
}

// ---------------------------------------------------------------- errors

TEST(Errors, BadArgumentsAreReportedAndOutputsUntouched) {
    Device d(1);
    ASSERT_EQ(d.st, CTXPAR_OK);
    Problem p;
    p.qs = {{0, 20, 1}};
    p.ks = {{0, 20, 1}};
    p.Make();
    std::vector<float> out(p.OutSize(), 42.0f), lse(p.LseSize(), 42.0f);
    auto fwd = [&](const ctxpar_attn_block &blk) {
        ctxpar_clear_error();
        return ctxpar_dev_attn_block_fwd(d.dev, &blk, out.data(), lse.data(), 0, nullptr);
    };
    ctxpar_attn_block blk = p.Block();
    // 3: not a dtype, yet inside the enum's value range (C++ forbids values outside it)
    blk.q.dtype = blk.k.dtype = blk.v.dtype = (ctxpar_dtype)3;
    EXPECT_EQ(fwd(blk), CTXPAR_ERR_NOT_SUPPORTED);
    EXPECT_NE(std::string(ctxpar_last_error()).find("dtype"), std::string::npos)
        << ctxpar_last_error();
    blk = p.Block();
    blk.k.dtype = blk.v.dtype = CTXPAR_DTYPE_BF16;
    EXPECT_EQ(fwd(blk), CTXPAR_ERR_INVALID_ARG);
    blk = p.Block();
    blk.q.shape[2] = 3; // 3 query heads over 2 K/V heads
    EXPECT_EQ(fwd(blk), CTXPAR_ERR_INVALID_ARG);
    EXPECT_NE(std::string(ctxpar_last_error()).find("multiple"), std::string::npos);
    blk = p.Block();
    blk.q.shape[3] = blk.k.shape[3] = blk.v.shape[3] = 0;
    EXPECT_EQ(fwd(blk), CTXPAR_ERR_INVALID_ARG);
    blk = p.Block();
    ctxpar_span short_span = {0, 19, 1};
    blk.k_pos = {&short_span, 1};
    EXPECT_EQ(fwd(blk), CTXPAR_ERR_INVALID_ARG);
    EXPECT_NE(std::string(ctxpar_last_error()).find("k_pos"), std::string::npos);
    blk = p.Block();
    blk.q.stride[3] = 2;
    EXPECT_EQ(fwd(blk), CTXPAR_ERR_INVALID_ARG);
    blk = p.Block();
    EXPECT_EQ(ctxpar_dev_attn_block_fwd(d.dev, &blk, out.data(), lse.data(), 2, nullptr),
              CTXPAR_ERR_INVALID_ARG);
    for (float x : out)
        ASSERT_EQ(x, 42.0f);
    for (float x : lse)
        ASSERT_EQ(x, 42.0f);

    std::vector<float> g(p.OutSize(), 0.0f);
    ctxpar_tensor bad_dout = p.dout->t;
    bad_dout.dtype = CTXPAR_DTYPE_F16;
    EXPECT_EQ(ctxpar_dev_attn_block_bwd(d.dev, &blk, &bad_dout, lse.data(), lse.data(), g.data(),
                                        nullptr, nullptr, nullptr),
              CTXPAR_ERR_INVALID_ARG);
    HostTensor small(CTXPAR_DTYPE_F32, 1, 1, 1, 3), other(CTXPAR_DTYPE_F32, 1, 1, 1, 4);
    EXPECT_EQ(ctxpar_dev_cast(d.dev, &small.t, &other.t, nullptr), CTXPAR_ERR_INVALID_ARG);
    EXPECT_EQ(ctxpar_dev_attn_bwd_prep(d.dev, &small.t, &other.t, g.data(), nullptr),
              CTXPAR_ERR_INVALID_ARG);
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
