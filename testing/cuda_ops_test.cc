// cuda_ops_test: what only the CUDA device has, against the float64 oracle (reference/oracle.h)
// and against the CPU device (backends/cpu, an independent implementation run on the same
// inputs): cuDNN, long spans, casts and merges bit for bit as the CPU's, its checksum, streams,
// memory pools and options. The ops and contracts every device shares (fully masked rows, merge
// algebra, determinism, a row's bits independent of the other rows, non-finite values) are the
// device conformance suite's (device_conformance.cc: its cuda and cuda_native factories).
//
// Without a GPU every test is skipped, visibly ("skipped: no CUDA device"), except the one that
// checks the constructor's error for that case.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "testing/gpu/gpu_rule.h"

#ifdef CTXPAR_TEST_NO_CUDA

namespace {
TEST(CudaOps, NotBuilt) {
    std::printf("cuda_ops_test: skipped: no CUDA device (built without the CUDA toolkit)\n");
    GTEST_SKIP() << "skipped: " << cpt_gpu::Unavailable("built without the CUDA toolkit");
}
} // namespace

#else

#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "dispatch.h"
#include "ctxpar_bins.h"
#include "ctxpar_cpu.h"
#include "ctxpar_cuda.h"
#include "ctxpar_half.h"
#include "backends/cuda/ctxpar_cuda_diag.h"
#ifndef CTXPAR_TEST_NO_CUDNN
#include "backends/cuda/cudnn_graph.h"
#endif
#include "reference/data.h"
#include "testing/device_conformance.h"
#include "reference/metrics.h"
#include "reference/oracle.h"
#include "reference/tolerance.h"

namespace {

using namespace cpt_devconf;

// ---------------------------------------------------------------- tolerances
// Relative errors max |got - ref| / max |ref| (metrics.h), against the float64 oracle, from the
// project's table (reference/tolerance.c, which was measured with "GPU-style" kernels that round P
// to BF16 before P V); the CUDA results are held to the same bound against the CPU device,
// itself within 1e-5 of the oracle (cpu_ops_test).
//  - F32 math throughout (the SIMT kernels: F32 inputs, 16-bit inputs with head_dim % 8 != 0;
//    the whole backward): the F32 row of the table, 1e-5. The backward gets the oracle's out
//    and lse, so only its own F32 sums count.
//  - Tensor-core forward (F16/BF16, head_dim % 8 == 0): P is rounded to the input type before
//    P V; the table's F16/BF16 rows (2e-3, 1e-2) bound that with room to spare, and a wrong mask
//    element, tile or head costs 1e-1 or more.
//  - cuDNN: the same, plus O stored in the input type before the merge into F32: one storage
//    rounding, which is what the table's 16-bit rows were measured for.
//  - lse: the table's 16-bit lse bound (1e-5: approximate exp2/log2 on GPUs) for every dtype.
//  - delta and merges: a handful of F32 roundings per element (cpu_ops_test uses the same).

// Bound for the forward output of a block on the native kernels (or cuDNN: same table row).
double OutTol(ctxpar_dtype dt, int64_t head_dim) {
    if (dt == CTXPAR_DTYPE_F32 || head_dim % 8 != 0)
        return kTolF32;
    return cpt_tolerance(dt, "out");
}

// ---------------------------------------------------------------- the GPU, or why not

class Banner : public ::testing::Environment {
  public:
    void SetUp() override {
        if (!cpt_gpu::CudaReason().empty())
            std::printf("cuda_ops_test: no CUDA device (%s): %s\n", cpt_gpu::CudaReason().c_str(),
                        cpt_gpu::Visible() ? "FAILS, a GPU is visible" : "skipped");
    }
};
[[maybe_unused]] ::testing::Environment *const kBanner =
    ::testing::AddGlobalTestEnvironment(new Banner);

class Gpu : public ::testing::Test {
  protected:
    void SetUp() override { CPT_SKIP_WITHOUT_GPU(); }
};
template <class P> class GpuP : public ::testing::TestWithParam<P> {
  protected:
    void SetUp() override { CPT_SKIP_WITHOUT_GPU(); }
};

// ---------------------------------------------------------------- devices and memory

struct Device {
    ctxpar_device *dev = nullptr;
    ctxpar_status st = CTXPAR_OK;
    bool gpu;
    explicit Device(bool on_gpu, ctxpar_cuda_cudnn cudnn = CTXPAR_CUDA_CUDNN_OFF) : gpu(on_gpu) {
        if (gpu) {
            ctxpar_cuda_options opt = CTXPAR_CUDA_OPTIONS_INIT;
            opt.use_cudnn = cudnn;
            st = ctxpar_device_create_cuda(&opt, &dev);
        } else {
            st = ctxpar_device_create_cpu(nullptr, &dev);
        }
    }
    ~Device() { ctxpar_device_destroy(dev); }
    Device(const Device &) = delete;
    Device &operator=(const Device &) = delete;
};

// ---------------------------------------------------------------- running ops (the harness of
// testing/device_conformance.h, on a test's Device)

FwdResult RunFwd(Device *d, const Problem &p, int merge = 0, const FwdResult *init = nullptr) {
    EXPECT_EQ(d->st, CTXPAR_OK) << ctxpar_last_error();
    if (d->st != CTXPAR_OK)
        return FwdResult();
    return cpt_devconf::RunFwd(d->dev, p, merge, init);
}

BwdResult RunBwd(Device *d, const Problem &p, const std::vector<double> &ref_out,
                 const std::vector<double> &ref_lse) {
    EXPECT_EQ(d->st, CTXPAR_OK) << ctxpar_last_error();
    if (d->st != CTXPAR_OK)
        return BwdResult();
    return cpt_devconf::RunBwd(d->dev, p, ref_out, ref_lse);
}

FwdResult RunFwd(bool gpu, const Problem &p) {
    Device d(gpu);
    return RunFwd(&d, p);
}

// ---------------------------------------------------------------- checks

// The forward on the GPU against the oracle and the CPU device.
void CheckFwd(const Problem &p, double out_tol, double lse_tol = kTolF32) {
    std::vector<double> ref_out, ref_lse;
    p.OracleFwd(&ref_out, &ref_lse);
    FwdResult gpu = RunFwd(true, p), cpu = RunFwd(false, p);
    ExpectClose(gpu.out, ref_out, out_tol, "out vs oracle");
    ExpectClose(gpu.lse, ref_lse, lse_tol, "lse vs oracle");
    ExpectClose(gpu.out, F64(cpu.out), out_tol, "out vs cpu");
    ExpectClose(gpu.lse, F64(cpu.lse), lse_tol, "lse vs cpu");
    ExpectEmptyRows(p, gpu, ref_lse);
}

const char *Name(ctxpar_dtype dt) {
    return ctxpar_dtype_name(dt);
}

// ---------------------------------------------------------------- construction

// Without a GPU the constructor fails with a device error that says why; with one, an ordinal
// past the last GPU does. Runs on every machine.
TEST(Construct, ClearErrorWithoutAUsableGpu) {
    ctxpar_device *dev = nullptr;
    ctxpar_cuda_options opt = CTXPAR_CUDA_OPTIONS_INIT;
    if (cpt_gpu::CudaReason().empty())
        opt.device_ordinal = 1 << 20;
    ctxpar_clear_error();
    EXPECT_EQ(ctxpar_device_create_cuda(&opt, &dev), CTXPAR_ERR_DEVICE);
    EXPECT_EQ(dev, nullptr);
    std::string msg = ctxpar_last_error();
    EXPECT_NE(msg.find("CUDA"), std::string::npos) << msg;
    if (!cpt_gpu::CudaReason().empty())
        std::printf("cuda_ops_test: the constructor reports: %s\n", msg.c_str());
}

TEST(Construct, BadOptions) {
    ctxpar_device *dev = nullptr;
    ctxpar_cuda_options opt = CTXPAR_CUDA_OPTIONS_INIT;
    opt.struct_size = 0;
    EXPECT_EQ(ctxpar_device_create_cuda(&opt, &dev), CTXPAR_ERR_INVALID_ARG);
    opt = CTXPAR_CUDA_OPTIONS_INIT;
    opt.use_cudnn = (ctxpar_cuda_cudnn)7;
    EXPECT_EQ(ctxpar_device_create_cuda(&opt, &dev), CTXPAR_ERR_INVALID_ARG);
    EXPECT_EQ(ctxpar_device_create_cuda(nullptr, nullptr), CTXPAR_ERR_INVALID_ARG);
    EXPECT_EQ(dev, nullptr);
    ctxpar_device_destroy(nullptr);
    // The queries refuse a device that is not a CUDA one.
    Device cpu(false);
    ASSERT_EQ(cpu.st, CTXPAR_OK);
    int x = 0;
    EXPECT_EQ(ctxpar_cuda_device_ordinal(cpu.dev, &x), CTXPAR_ERR_INVALID_ARG);
    EXPECT_EQ(ctxpar_cuda_device_uses_cudnn(cpu.dev, &x), CTXPAR_ERR_INVALID_ARG);
}

TEST_F(Gpu, QueriesAndCudnnChoice) {
    Device off(true, CTXPAR_CUDA_CUDNN_OFF);
    ASSERT_EQ(off.st, CTXPAR_OK) << ctxpar_last_error();
    int uses = -1, ordinal = -1;
    ASSERT_EQ(ctxpar_cuda_device_uses_cudnn(off.dev, &uses), CTXPAR_OK);
    EXPECT_EQ(uses, 0);
    ASSERT_EQ(ctxpar_cuda_device_ordinal(off.dev, &ordinal), CTXPAR_OK);
    EXPECT_EQ(ordinal, 0);
    EXPECT_EQ(ctxpar_dev_has_streams(off.dev), 1);
    Device on(true, CTXPAR_CUDA_CUDNN_ON);
    ASSERT_EQ(on.st, CTXPAR_OK) << "cuDNN is part of this build: " << ctxpar_last_error();
    ASSERT_EQ(ctxpar_cuda_device_uses_cudnn(on.dev, &uses), CTXPAR_OK);
    EXPECT_EQ(uses, 1);
}

// ---------------------------------------------------------------- forward

TEST_F(Gpu, FwdScaleAndLongSequences) {
    for (ctxpar_dtype dt : {CTXPAR_DTYPE_BF16, CTXPAR_DTYPE_F32}) {
        Problem p;
        p.B = 1;
        p.Hq = 4;
        p.Hkv = 1;
        p.D = 128;
        p.dtype = dt;
        p.seq_global = 1500;
        p.qs = {{0, 1500, 1}};
        p.ks = {{0, 1500, 1}};
        p.causal = 1;
        p.scale = 0.07f;
        p.Make();
        CheckFwd(p, OutTol(dt, p.D));
    }
}

// More spans and documents than travel in the kernel arguments: the uploaded lists.
TEST_F(Gpu, FwdLongSpanAndDocumentLists) {
    Problem p;
    p.dtype = CTXPAR_DTYPE_BF16;
    p.seq_global = 600;
    for (int i = 0; i < 12; i++) // 12 query spans, 10 key spans
        p.qs.push_back({(int64_t)i * 50, 20, 1});
    for (int i = 0; i < 10; i++)
        p.ks.push_back({(int64_t)i * 60 + 5, 30, 1});
    p.causal = 1;
    for (int32_t b = 0; b <= 600; b += 15) // 40 documents
        p.cu.push_back(b);
    p.Make();
    CheckFwd(p, OutTol(p.dtype, p.D));
    p.cu = {0, 600};
    p.window = 100;
    CheckFwd(p, OutTol(p.dtype, p.D));
}
// ---------------------------------------------------------------- merge

// p against keys [k0, k0 + n) of its K/V.
Problem Part(const Problem &p, int64_t k0, int64_t n) {
    Problem part;
    part.B = p.B, part.Hq = p.Hq, part.Hkv = p.Hkv, part.D = p.D, part.dtype = p.dtype;
    part.seq_global = p.seq_global, part.causal = p.causal, part.window = p.window;
    part.cu = p.cu, part.seed = p.seed, part.qs = p.qs;
    part.ks = {{p.kpos[(size_t)k0], n, 1}};
    part.Make();
    return part;
}
// ---------------------------------------------------------------- cuDNN

// "cuDNN <version> (<graph form>)" when the latest forward block ran on cuDNN, else
// "native (cuDNN: <why>)": what the tests print and what they report on a failure.
std::string CudnnOutcome(ctxpar_device *dev) {
    ctxpar_cuda_diag dg;
    if (ctxpar_cuda_device_diag(dev, &dg) != CTXPAR_OK)
        return std::string("diag failed: ") + ctxpar_last_error();
    if (dg.cudnn_reason[0])
        return std::string("native (cuDNN: ") + dg.cudnn_reason + ")";
    return "cuDNN " + std::to_string(dg.cudnn_version) + " (" + dg.cudnn_graph + ")";
}

struct CudnnParam {
    ctxpar_dtype dtype;
    int64_t d, hkv;
    bool causal;
};

class Cudnn : public GpuP<CudnnParam> {};

// Blocks cuDNN takes (no mask, or a causal diagonal block) run on it when it is ON, overwrite
// and merge like the native kernels, and blocks it cannot take still run natively.
TEST_P(Cudnn, RunsWhereItAppliesAndMatchesOracle) {
    const CudnnParam &prm = GetParam();
    Device d(true, CTXPAR_CUDA_CUDNN_ON);
    ASSERT_EQ(d.st, CTXPAR_OK) << ctxpar_last_error();
    Problem p;
    p.dtype = prm.dtype;
    p.D = prm.d;
    p.Hkv = prm.hkv;
    p.seq_global = 600;
    p.qs = {{0, 333, 1}};
    p.ks = {{0, 333, 1}};
    p.causal = prm.causal;
    p.Make();
    std::vector<double> ref_out, ref_lse;
    p.OracleFwd(&ref_out, &ref_lse);
    const double tol = cpt_tolerance(prm.dtype, "out");
    const double tol_lse = cpt_tolerance(prm.dtype, "lse");
    uint64_t n_cudnn = 0, n_native = 0;
    FwdResult r = RunFwd(&d, p);
    ASSERT_EQ(ctxpar_cuda_device_fwd_counts(d.dev, &n_cudnn, &n_native), CTXPAR_OK);
    const std::string how = CudnnOutcome(d.dev);
    std::printf("cuda_ops_test: %s %s d=%lld: %s\n", Name(prm.dtype),
                prm.causal ? "causal" : "full", (long long)prm.d, how.c_str());
    EXPECT_EQ(n_cudnn, 1u) << "cuDNN did not take the block: " << how;
    ExpectClose(r.out, ref_out, tol, "cudnn out");
    ExpectClose(r.lse, ref_lse, tol_lse, "cudnn lse");

    // merge = 1: a second key block (after the first) merged onto the first.
    Problem whole;
    whole.dtype = p.dtype, whole.D = p.D, whole.Hkv = p.Hkv, whole.seq_global = 600;
    whole.qs = {{333, 200, 1}};
    whole.ks = {{0, 533, 1}};
    whole.causal = p.causal;
    whole.Make();
    std::vector<double> wout, wlse;
    whole.OracleFwd(&wout, &wlse);
    Problem first = Part(whole, 0, 333), diag = Part(whole, 333, 200);
    FwdResult acc = RunFwd(&d, first);          // a full block (keys before every query): cuDNN
    FwdResult both = RunFwd(&d, diag, 1, &acc); // the diagonal block
    ExpectClose(both.out, wout, tol, "cudnn merged out");
    ExpectClose(both.lse, wlse, tol_lse, "cudnn merged lse");
    ASSERT_EQ(ctxpar_cuda_device_fwd_counts(d.dev, &n_cudnn, &n_native), CTXPAR_OK);
    EXPECT_EQ(n_cudnn, 3u);

    // A striped block is not one cuDNN can mask: the native kernel runs it.
    Problem striped;
    striped.dtype = p.dtype, striped.D = p.D, striped.Hkv = p.Hkv;
    striped.qs = {{1, 100, 4}};
    striped.ks = {{0, 100, 4}};
    striped.causal = 1;
    striped.Make();
    std::vector<double> sout, slse;
    striped.OracleFwd(&sout, &slse);
    FwdResult rs = RunFwd(&d, striped);
    ExpectClose(rs.out, sout, OutTol(p.dtype, p.D), "striped out");
    ASSERT_EQ(ctxpar_cuda_device_fwd_counts(d.dev, &n_cudnn, &n_native), CTXPAR_OK);
    EXPECT_EQ(n_cudnn, 3u);
    EXPECT_EQ(n_native, 1u);
}

INSTANTIATE_TEST_SUITE_P(Shapes, Cudnn,
                         ::testing::Values(CudnnParam{CTXPAR_DTYPE_BF16, 64, 4, false},
                                           CudnnParam{CTXPAR_DTYPE_BF16, 128, 1, true},
                                           CudnnParam{CTXPAR_DTYPE_F16, 128, 2, false},
                                           CudnnParam{CTXPAR_DTYPE_F16, 64, 4, true}),
                         [](const ::testing::TestParamInfo<CudnnParam> &i) {
                             return std::string(Name(i.param.dtype)) + "_d" +
                                    std::to_string(i.param.d) + "_gqa" +
                                    std::to_string(4 / i.param.hkv) +
                                    (i.param.causal ? "_causal" : "_full");
                         });

// ---------------------------------------------------------------- elementwise

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

// Every dtype pair, strided on both sides: the GPU's bits equal the CPU device's bits (both must
// equal the ctxpar_half.h conversions, which cpu_ops_test checks), NaN payloads included.
TEST_F(Gpu, CastEveryPairBitwiseAsCpu) {
    const int64_t B = 2, S = 9, H = 3, D = 300;
    const ctxpar_dtype all[3] = {CTXPAR_DTYPE_F32, CTXPAR_DTYPE_F16, CTXPAR_DTYPE_BF16};
    std::vector<float> vals = CastValues((size_t)(B * S * H * D));
    for (ctxpar_dtype from : all)
        for (ctxpar_dtype to : all) {
            HostTensor src(from, B, S, H, D, 3);
            size_t i = 0;
            for (int64_t b = 0; b < B; b++)
                for (int64_t s = 0; s < S; s++)
                    for (int64_t h = 0; h < H; h++)
                        for (int64_t e = 0; e < D; e++, i++) {
                            int64_t off =
                                b * src.t.stride[0] + s * src.t.stride[1] + h * src.t.stride[2] + e;
                            if (from == CTXPAR_DTYPE_F32)
                                ((float *)src.t.data)[off] = vals[i];
                            else
                                ((uint16_t *)src.t.data)[off] = from == CTXPAR_DTYPE_F16
                                                                    ? ctxpar_f32_to_f16(vals[i])
                                                                    : ctxpar_f32_to_bf16(vals[i]);
                        }
            std::vector<unsigned char> got[2];
            for (int gpu = 0; gpu < 2; gpu++) {
                Device d(gpu != 0);
                Space sp(d.dev);
                HostTensor dst(to, B, S, H, D, 11);
                ctxpar_tensor ts = src.On(&sp), td = dst.On(&sp);
                ASSERT_EQ(ctxpar_dev_cast(d.dev, &ts, &td, nullptr), CTXPAR_OK)
                    << ctxpar_last_error();
                got[gpu].resize(dst.mem.size());
                sp.Get(got[gpu].data(), td.data, dst.mem.size());
            }
            EXPECT_EQ(got[0], got[1]) << Name(from) << " -> " << Name(to);
        }
}

TEST_F(Gpu, ChecksumIsDeterministicAndSensitive) {
    Device d(true);
    ASSERT_EQ(d.st, CTXPAR_OK);
    std::vector<unsigned char> bytes(100007);
    for (size_t i = 0; i < bytes.size(); i++)
        bytes[i] = (unsigned char)(cpt_test_value(5, 1, i) * 127.0 + 128.0);
    Space sp(d.dev);
    auto sum = [&](const std::vector<unsigned char> &b, size_t offset, size_t n) {
        unsigned char *p = (unsigned char *)sp.Put(b.data(), b.size());
        uint64_t s = 0;
        EXPECT_EQ(ctxpar_dev_checksum(d.dev, p + offset, n, nullptr, &s), CTXPAR_OK)
            << ctxpar_last_error();
        return s;
    };
    const uint64_t base = sum(bytes, 0, bytes.size());
    EXPECT_EQ(sum(bytes, 0, bytes.size()), base);
    std::vector<unsigned char> flipped = bytes;
    flipped[54321] ^= 1;
    EXPECT_NE(sum(flipped, 0, bytes.size()), base);
    std::vector<unsigned char> swapped = bytes;
    std::swap_ranges(swapped.begin(), swapped.begin() + 8, swapped.begin() + 800);
    EXPECT_NE(sum(swapped, 0, bytes.size()), base);
    EXPECT_NE(sum(bytes, 0, bytes.size() - 1), base);
    // Misaligned starts give the checksum of the bytes, whatever their address.
    std::vector<unsigned char> shifted(bytes.size() + 3);
    std::memcpy(shifted.data() + 3, bytes.data(), bytes.size());
    EXPECT_EQ(sum(shifted, 3, bytes.size()), base);
    EXPECT_EQ(sum(bytes, 0, 0), sum(flipped, 0, 0));
}

// ---------------------------------------------------------------- streams and events

// Work on two streams ordered only by an event comes out right; a wrapped cudaStream_t works
// like a ctxpar stream.
TEST_F(Gpu, StreamsAndEventsOrderWork) {
    Device d(true);
    ASSERT_EQ(d.st, CTXPAR_OK);
    const size_t n = 1 << 24; // large enough that the fill is still running when add is issued
    Space sp(d.dev);
    float *a = static_cast<float *>(sp.Put(nullptr, n * sizeof(float)));
    float *b = static_cast<float *>(sp.Put(nullptr, n * sizeof(float)));
    ctxpar_stream *s1 = nullptr, *s2 = nullptr, *wrapped = nullptr;
    ctxpar_event *ev = nullptr;
    ASSERT_EQ(ctxpar_dev_stream_create(d.dev, &s1), CTXPAR_OK);
    ASSERT_EQ(ctxpar_dev_stream_create(d.dev, &s2), CTXPAR_OK);
    ASSERT_EQ(ctxpar_dev_event_create(d.dev, &ev), CTXPAR_OK);
    for (int round = 0; round < 3; round++) {
        ASSERT_EQ(ctxpar_dev_fill(d.dev, b, 1.0f, n, s2), CTXPAR_OK);
        ASSERT_EQ(ctxpar_dev_fill(d.dev, a, (float)round, n, s1), CTXPAR_OK);
        ASSERT_EQ(ctxpar_dev_event_record(d.dev, ev, s1), CTXPAR_OK);
        ASSERT_EQ(ctxpar_dev_stream_wait_event(d.dev, s2, ev), CTXPAR_OK);
        ASSERT_EQ(ctxpar_dev_add(d.dev, b, a, n, s2), CTXPAR_OK);
        ASSERT_EQ(ctxpar_dev_stream_sync(d.dev, s2), CTXPAR_OK);
        std::vector<float> r = sp.Get(b, n);
        size_t bad = 0;
        for (float x : r)
            bad += x != 1.0f + (float)round;
        EXPECT_EQ(bad, 0u) << "round " << round;
    }
    cudaStream_t raw = nullptr;
    ASSERT_EQ(cudaStreamCreate(&raw), cudaSuccess);
    ASSERT_EQ(ctxpar_cuda_stream_wrap(d.dev, raw, &wrapped), CTXPAR_OK);
    ASSERT_EQ(ctxpar_dev_fill(d.dev, a, 3.0f, n, wrapped), CTXPAR_OK);
    ASSERT_EQ(cudaStreamSynchronize(raw), cudaSuccess);
    EXPECT_EQ(sp.Get(a, 1)[0], 3.0f);
    ctxpar_cuda_stream_release(wrapped);
    EXPECT_EQ(cudaStreamDestroy(raw), cudaSuccess);
    ctxpar_dev_event_destroy(d.dev, ev);
    ctxpar_dev_stream_destroy(d.dev, s1);
    ctxpar_dev_stream_destroy(d.dev, s2);
}

// ---------------------------------------------------------------- cuDNN plan logic (no GPU)

#ifndef CTXPAR_TEST_NO_CUDNN
// The graph forms tried for a shape follow the cuDNN version running: the decomposed graph
// first before 9.21 (the SDPA operation, from 9.13, as the fallback), the operation first from
// 9.21 on; causal blocks only in the decomposed form (the operation's mask subgraph is not
// built). Host logic: runs everywhere.
TEST(CudnnPlanLogic, FormsFollowTheRunningVersion) {
    ctxpar_cudnn_form f[2];
    const bool op_in_headers = CUDNN_VERSION >= CTXPAR_CUDNN_SDPA_OP_VERSION;
    ASSERT_EQ(ctxpar_cudnn_forms(91200, 0, f), 1);
    EXPECT_EQ(f[0], CTXPAR_CUDNN_DECOMPOSED);
    ASSERT_EQ(ctxpar_cudnn_forms(91900, 0, f), op_in_headers ? 2 : 1);
    EXPECT_EQ(f[0], CTXPAR_CUDNN_DECOMPOSED);
    if (op_in_headers) {
        EXPECT_EQ(f[1], CTXPAR_CUDNN_SDPA_OP);
    }
    ASSERT_EQ(ctxpar_cudnn_forms(92800, 0, f), op_in_headers ? 2 : 1);
    EXPECT_EQ(f[0], op_in_headers ? CTXPAR_CUDNN_SDPA_OP : CTXPAR_CUDNN_DECOMPOSED);
    for (size_t v : {90800u, 91900u, 92100u, 92800u}) {
        ASSERT_EQ(ctxpar_cudnn_forms(v, 1, f), 1) << v;
        EXPECT_EQ(f[0], CTXPAR_CUDNN_DECOMPOSED) << v;
    }
    EXPECT_STREQ(ctxpar_cudnn_form_name(CTXPAR_CUDNN_SDPA_OP), "sdpa operation");
    EXPECT_STREQ(ctxpar_cudnn_form_name(CTXPAR_CUDNN_DECOMPOSED), "decomposed");
}

// cuDNN reports how many engine configs it has, which may exceed the descriptors made for them:
// only those are read.
TEST(CudnnPlanLogic, EngineConfigCountIsClamped) {
    EXPECT_EQ(ctxpar_cudnn_configs_to_try(0), 0);
    EXPECT_EQ(ctxpar_cudnn_configs_to_try(-3), 0);
    EXPECT_EQ(ctxpar_cudnn_configs_to_try(3), 3);
    EXPECT_EQ(ctxpar_cudnn_configs_to_try(CTXPAR_CUDNN_MAX_ENGINE_CFGS),
              CTXPAR_CUDNN_MAX_ENGINE_CFGS);
    EXPECT_EQ(ctxpar_cudnn_configs_to_try(CTXPAR_CUDNN_MAX_ENGINE_CFGS + 40),
              CTXPAR_CUDNN_MAX_ENGINE_CFGS);
}
#endif

// ---------------------------------------------------------------- device plumbing

// The reason a block does not run on cuDNN is kept and reported: a block cuDNN takes leaves it
// empty and names the graph form; F32, a mask it cannot express, or cuDNN off each say so.
TEST_F(Gpu, CudnnReasonIsKeptAndReported) {
    Device off(true, CTXPAR_CUDA_CUDNN_OFF);
    ASSERT_EQ(off.st, CTXPAR_OK) << ctxpar_last_error();
    EXPECT_NE(CudnnOutcome(off.dev).find("native (cuDNN: off"), std::string::npos)
        << CudnnOutcome(off.dev);
    Device on(true, CTXPAR_CUDA_CUDNN_ON);
    ASSERT_EQ(on.st, CTXPAR_OK) << ctxpar_last_error();
    Problem p;
    p.dtype = CTXPAR_DTYPE_BF16;
    p.D = 128;
    p.qs = {{0, 256, 1}};
    p.ks = {{0, 256, 1}};
    p.Make();
    std::vector<double> ref_out, ref_lse;
    p.OracleFwd(&ref_out, &ref_lse);
    FwdResult r = RunFwd(&on, p);
    const std::string how = CudnnOutcome(on.dev);
    std::printf("cuda_ops_test: bf16 d=128 unmasked block: %s\n", how.c_str());
    EXPECT_EQ(how.find("native"), std::string::npos) << how;
    ExpectClose(r.out, ref_out, cpt_tolerance(p.dtype, "out"), "out");
    ctxpar_cuda_diag dg;
    ASSERT_EQ(ctxpar_cuda_device_diag(on.dev, &dg), CTXPAR_OK);
    EXPECT_GE(dg.cudnn_version, 90800);

    Problem f32;
    f32.dtype = CTXPAR_DTYPE_F32;
    f32.D = 128;
    f32.qs = p.qs;
    f32.ks = p.ks;
    f32.Make();
    RunFwd(&on, f32);
    EXPECT_NE(CudnnOutcome(on.dev).find("F32"), std::string::npos) << CudnnOutcome(on.dev);
    Problem striped;
    striped.dtype = CTXPAR_DTYPE_BF16;
    striped.D = 128;
    striped.qs = {{1, 100, 4}};
    striped.ks = {{0, 100, 4}};
    striped.causal = 1;
    striped.Make();
    RunFwd(&on, striped);
    EXPECT_NE(CudnnOutcome(on.dev).find("mask"), std::string::npos) << CudnnOutcome(on.dev);
    ctxpar_cuda_diag bad;
    EXPECT_EQ(ctxpar_cuda_device_diag(on.dev, nullptr), CTXPAR_ERR_INVALID_ARG);
    Device cpu(false);
    EXPECT_EQ(ctxpar_cuda_device_diag(cpu.dev, &bad), CTXPAR_ERR_INVALID_ARG);
}

// The pool is used where the GPU supports it and grants access to every peer that can reach
// this GPU; CTXPAR_CUDA_POOL=0 (and GPUs without pools) use cudaMalloc, with the same results.
TEST_F(Gpu, PoolSupportPeersAndFallback) {
    int supported = 0, count = 0, peers = 0;
    ASSERT_EQ(cudaDeviceGetAttribute(&supported, cudaDevAttrMemoryPoolsSupported, 0), cudaSuccess);
    ASSERT_EQ(cudaGetDeviceCount(&count), cudaSuccess);
    for (int other = 1; other < count; other++) {
        int can = 0;
        ASSERT_EQ(cudaDeviceCanAccessPeer(&can, other, 0), cudaSuccess);
        peers += can;
    }
    Problem p;
    p.qs = {{0, 90, 1}};
    p.ks = {{0, 120, 1}};
    p.causal = 1;
    p.Make();
    std::vector<double> ref_out, ref_lse;
    p.OracleFwd(&ref_out, &ref_lse);
    {
        Device d(true);
        ASSERT_EQ(d.st, CTXPAR_OK) << ctxpar_last_error();
        ctxpar_cuda_diag dg;
        ASSERT_EQ(ctxpar_cuda_device_diag(d.dev, &dg), CTXPAR_OK);
        EXPECT_EQ(dg.uses_pool, supported);
        EXPECT_EQ(dg.peers_granted, supported ? peers : 0);
        std::printf("cuda_ops_test: pool %d, %d of %d other GPUs granted access\n", dg.uses_pool,
                    dg.peers_granted, count - 1);
        ExpectClose(RunFwd(&d, p).out, ref_out, kTolF32, "out with the pool");
    }
    ASSERT_EQ(setenv("CTXPAR_CUDA_POOL", "0", 1), 0);
    {
        Device d(true);
        ASSERT_EQ(d.st, CTXPAR_OK) << ctxpar_last_error();
        ctxpar_cuda_diag dg;
        ASSERT_EQ(ctxpar_cuda_device_diag(d.dev, &dg), CTXPAR_OK);
        EXPECT_EQ(dg.uses_pool, 0);
        EXPECT_EQ(dg.peers_granted, 0);
        ExpectClose(RunFwd(&d, p).out, ref_out, kTolF32, "out without the pool");
        BwdResult b = RunBwd(&d, p, ref_out, ref_lse);
        std::vector<double> dq, dk, dv;
        p.OracleBwd(&dq, &dk, &dv);
        ExpectClose(b.dq, dq, kTolF32, "dq without the pool");
    }
    unsetenv("CTXPAR_CUDA_POOL");
}

// The SIMT kernels' shared-memory limit is set once, at creation, for the largest head_dim (or
// the GPU's opt-in limit): what the kernels report equals it, and launches with small head
// dims do not lower it (they used to set it before every launch, process-wide).
TEST_F(Gpu, SharedMemoryLimitIsSetOnceAtCreation) {
    Device d(true);
    ASSERT_EQ(d.st, CTXPAR_OK) << ctxpar_last_error();
    ctxpar_cuda_diag dg;
    ASSERT_EQ(ctxpar_cuda_device_diag(d.dev, &dg), CTXPAR_OK);
    EXPECT_EQ(dg.smem_fwd_set, std::min(dg.smem_fwd_need_max, dg.smem_optin));
    EXPECT_EQ(dg.smem_bwd_set, std::min(dg.smem_bwd_need_max, dg.smem_optin));
    EXPECT_EQ(dg.smem_fwd_allowed, dg.smem_fwd_set);
    EXPECT_EQ(dg.smem_bwd_allowed, dg.smem_bwd_set);
    for (int64_t dim : {8, 256}) {
        Problem p;
        p.B = 1;
        p.D = dim;
        p.qs = {{0, 40, 1}};
        p.ks = {{0, 50, 1}};
        p.causal = 1;
        p.Make();
        std::vector<double> ref_out, ref_lse, dq, dk, dv;
        p.OracleFwd(&ref_out, &ref_lse);
        p.OracleBwd(&dq, &dk, &dv);
        ExpectClose(RunFwd(&d, p).out, ref_out, kTolF32, "F32 out d=" + std::to_string(dim));
        ExpectClose(RunBwd(&d, p, ref_out, ref_lse).dk, dk, kTolF32,
                    "dk d=" + std::to_string(dim));
        ctxpar_cuda_diag after;
        ASSERT_EQ(ctxpar_cuda_device_diag(d.dev, &after), CTXPAR_OK);
        EXPECT_EQ(after.smem_fwd_allowed, dg.smem_fwd_set) << "after d=" << dim;
        EXPECT_EQ(after.smem_bwd_allowed, dg.smem_bwd_set) << "after d=" << dim;
    }
    // A second device on the same GPU (a second rank) leaves the limits as they are.
    Device second(true);
    ASSERT_EQ(second.st, CTXPAR_OK) << ctxpar_last_error();
    ctxpar_cuda_diag again;
    ASSERT_EQ(ctxpar_cuda_device_diag(d.dev, &again), CTXPAR_OK);
    EXPECT_EQ(again.smem_fwd_allowed, dg.smem_fwd_set);
}

// Merging two empty rows (lse -inf on both sides) gives out 0 and lse -inf whatever the
// accumulator held, on the GPU as on the CPU (the fp64 oracle's empty row): through attn_merge,
// and through a forward block with merge = 1 whose first rows see no key.
TEST_F(Gpu, MergeOfTwoEmptyRowsZeroesLikeTheCpu) {
    Device g(true), c(false);
    ASSERT_EQ(g.st, CTXPAR_OK) << ctxpar_last_error();
    const int64_t B = 1, S = 7, H = 2, D = 24;
    const size_t n = (size_t)(B * S * H * D), rows = (size_t)(B * H * S);
    std::vector<float> acc(n, 3.5f), acc_lse(rows, -INFINITY), part(n, -1.25f),
        part_lse(rows, -INFINITY);
    acc_lse[1] = 0.25f; // one row with something in it: merging an empty row keeps it
    Space sp(g.dev);
    float *o = sp.Put(acc), *l = sp.Put(acc_lse), *ob = sp.Put(part), *lb = sp.Put(part_lse);
    ASSERT_EQ(ctxpar_dev_attn_merge(g.dev, o, l, ob, lb, B, S, H, D, nullptr), CTXPAR_OK)
        << ctxpar_last_error();
    std::vector<float> go = sp.Get(o, n), gl = sp.Get(l, rows);
    std::vector<float> co = acc, cl = acc_lse;
    ASSERT_EQ(ctxpar_dev_attn_merge(c.dev, co.data(), cl.data(), part.data(), part_lse.data(), B,
                                    S, H, D, nullptr),
              CTXPAR_OK);
    EXPECT_EQ(BitDiff(go, co), 0u) << "GPU and CPU merges differ";
    EXPECT_EQ(BitDiff(gl, cl), 0u);
    for (int64_t s = 0; s < S; s++)
        for (int64_t h = 0; h < H; h++) {
            const size_t li = (size_t)(h * S + s);
            const float want = li == 1 ? 3.5f : 0.0f; // [b, s, h, d] row of lse index li
            for (int64_t d = 0; d < D; d++)
                ASSERT_EQ(go[(size_t)((s * H + h) * D + d)], want) << "s" << s << " h" << h;
            ASSERT_EQ(gl[li], li == 1 ? 0.25f : -INFINITY);
        }

    // Forward with merge = 1: queries 0..39, keys 20..59, causal: rows 0..19 see no key.
    Problem p;
    p.qs = {{0, 40, 1}};
    p.ks = {{20, 40, 1}};
    p.causal = 1;
    p.Make();
    std::vector<double> ref_out, ref_lse;
    p.OracleFwd(&ref_out, &ref_lse);
    FwdResult stale;
    stale.out.assign(p.OutSize(), 9.0f);
    stale.lse.assign(p.LseSize(), -INFINITY);
    FwdResult gr = RunFwd(&g, p, 1, &stale), cr = RunFwd(&c, p, 1, &stale);
    ExpectClose(gr.out, ref_out, kTolF32, "merged forward out vs oracle");
    ExpectEmptyRows(p, gr, ref_lse);
    ExpectClose(gr.out, F64(cr.out), kTolF32, "merged forward out vs cpu");
}

// A device free neither blocks the host nor releases memory still in use: with a stream held
// up (a host function waiting for the test) after a fill of buffer `a`, freeing `a` returns at
// once, and a buffer allocated next is not overwritten when the held fill finally runs. On a
// caller's non-blocking stream, on the legacy (NULL) stream, and on a stream whose wrapper was
// released before the free (its pending work still counts).
struct Gate {
    std::atomic<int> open{0};
    std::atomic<int> saw_open{0};
};

void CUDART_CB WaitForGate(void *arg) {
    Gate *g = static_cast<Gate *>(arg);
    for (int i = 0; i < 20000 && !g->open.load(); i++)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    g->saw_open.store(g->open.load());
}

TEST_F(Gpu, FreeIsStreamOrderedAndNeverBlocks) {
    Device d(true);
    ASSERT_EQ(d.st, CTXPAR_OK) << ctxpar_last_error();
    ctxpar_cuda_diag dg;
    ASSERT_EQ(ctxpar_cuda_device_diag(d.dev, &dg), CTXPAR_OK);
    if (!dg.uses_pool)
        GTEST_SKIP() << "skipped: this GPU has no memory pools (frees are cudaFree)";
    cudaStream_t held_raw = nullptr, other_raw = nullptr;
    ASSERT_EQ(cudaStreamCreateWithFlags(&held_raw, cudaStreamNonBlocking), cudaSuccess);
    ASSERT_EQ(cudaStreamCreateWithFlags(&other_raw, cudaStreamNonBlocking), cudaSuccess);
    ctxpar_stream *held = nullptr, *other = nullptr;
    ASSERT_EQ(ctxpar_cuda_stream_wrap(d.dev, held_raw, &held), CTXPAR_OK);
    ASSERT_EQ(ctxpar_cuda_stream_wrap(d.dev, other_raw, &other), CTXPAR_OK);
    cudaStream_t gone_raw = nullptr;
    ASSERT_EQ(cudaStreamCreateWithFlags(&gone_raw, cudaStreamNonBlocking), cudaSuccess);
    const size_t n = 1 << 22, bytes = n * sizeof(float);
    const char *modes[3] = {"caller's non-blocking stream held", "legacy stream held",
                            "released wrapper's stream held"};
    for (int mode = 0; mode < 3; mode++) {
        SCOPED_TRACE(modes[mode]);
        ctxpar_stream *s = held;
        cudaStream_t raw = held_raw;
        if (mode == 1) {
            s = nullptr;
            raw = cudaStreamLegacy;
        } else if (mode == 2) {
            ASSERT_EQ(ctxpar_cuda_stream_wrap(d.dev, gone_raw, &s), CTXPAR_OK);
            raw = gone_raw;
        }
        void *a = nullptr, *b = nullptr;
        ASSERT_EQ(ctxpar_dev_alloc(d.dev, bytes, CTXPAR_MEM_DEVICE, &a), CTXPAR_OK);
        Gate gate;
        ASSERT_EQ(cudaLaunchHostFunc(raw, WaitForGate, &gate), cudaSuccess);
        ASSERT_EQ(ctxpar_dev_fill(d.dev, (float *)a, 1.0f, n, s), CTXPAR_OK);
        if (mode == 2)
            ctxpar_cuda_stream_release(s); // the stream leaves the device's list, work pending
        ctxpar_dev_free(d.dev, a, bytes, CTXPAR_MEM_DEVICE); // must return with the gate shut
        ASSERT_EQ(ctxpar_dev_alloc(d.dev, bytes, CTXPAR_MEM_DEVICE, &b), CTXPAR_OK);
        ASSERT_EQ(ctxpar_dev_fill(d.dev, (float *)b, 2.0f, n, other), CTXPAR_OK);
        ASSERT_EQ(cudaStreamSynchronize(other_raw), cudaSuccess);
        gate.open.store(1);
        ASSERT_EQ(cudaStreamSynchronize(raw), cudaSuccess);
        EXPECT_EQ(gate.saw_open.load(), 1) << "the free (or the alloc after it) waited for the "
                                              "held stream";
        std::vector<float> got(n);
        ASSERT_EQ(cudaMemcpy(got.data(), b, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
        size_t bad = 0;
        for (float x : got)
            bad += x != 2.0f;
        EXPECT_EQ(bad, 0u) << "the held fill of the freed buffer landed in the new one";
        ctxpar_dev_free(d.dev, b, bytes, CTXPAR_MEM_DEVICE);
    }
    ASSERT_EQ(ctxpar_dev_stream_sync(d.dev, nullptr), CTXPAR_OK);
    ctxpar_cuda_stream_release(held);
    ctxpar_cuda_stream_release(other);
    EXPECT_EQ(cudaStreamDestroy(held_raw), cudaSuccess);
    EXPECT_EQ(cudaStreamDestroy(other_raw), cudaSuccess);
    EXPECT_EQ(cudaStreamDestroy(gone_raw), cudaSuccess);
}

// ---------------------------------------------------------------- binned accumulators
// The six bins ops of reproducible mode (api/ctxpar_bins.h) on the GPU against the SDK's own
// functions run here on the host (not the CPU device): raw blocks (top, hi, mid, lo, special)
// compared byte for byte after every step, finished floats bit for bit (any NaN equals any NaN:
// the specials are canonical in the block, but a NaN converted float -> double -> float on the
// GPU need not keep the host's payload).

// The host's copy of a block, through the SDK's functions.
struct HostBins {
    int64_t rows, width;
    std::vector<unsigned char> mem;
    HostBins(int64_t r, int64_t w) : rows(r), width(w), mem(ctxpar_bins_bytes(r, w)) {
        for (int64_t i = 0; i < r * w; i++)
            ctxpar_bins_clear_value(View(), i);
    }
    ctxpar_bins_view View() { return ctxpar_bins_at(mem.data(), rows, width); }
};

// Source row r of [B, len, H] lands at block row (b*seq + off + s)*H + h; li indexes [B, H, len].
int64_t BinsRow(const ctxpar_bins_shape &sh, int64_t r, int64_t *li) {
    const int64_t h = r % sh.heads, s = (r / sh.heads) % sh.len, b = r / (sh.heads * sh.len);
    *li = (b * sh.heads + h) * sh.len + s;
    return (b * sh.seq + sh.off + s) * sh.heads + h;
}

// A term for the bins: zeros of both signs, subnormals, every normal exponent (or those within
// `spread` of 2^0, so that values share bins and carry), the largest floats, and now and then
// (nonfinite) an infinity or a NaN with a payload.
float BinsTerm(std::mt19937_64 &g, int spread, bool nonfinite) {
    const uint64_t r = g();
    const uint32_t sign = (uint32_t)(r >> 63) << 31, mant = (uint32_t)(r >> 8) & 0x7fffffu;
    uint32_t bits;
    switch (r % 64) {
    case 0:
    case 1:
        bits = nonfinite ? sign | 0x7f800000u : sign; // +-inf
        break;
    case 2:
        bits = nonfinite ? sign | 0x7f800000u | (mant ? mant : 1u) : 0u; // NaN
        break;
    case 3:
    case 4:
        bits = sign; // +-0
        break;
    case 5:
    case 6:
    case 7:
        bits = sign | mant; // subnormal
        break;
    case 8:
        bits = sign | (254u << 23) | mant; // near FLT_MAX
        break;
    default: {
        const int lo = spread >= 126 ? 1 : 127 - spread, hi = spread >= 126 ? 254 : 127 + spread;
        const uint32_t e = (uint32_t)(lo + (int)((r >> 32) % (uint64_t)(hi - lo + 1)));
        bits = sign | (e << 23) | mant;
    }
    }
    float x;
    std::memcpy(&x, &bits, sizeof x);
    return x;
}

// Where two raw blocks first differ: the array and the value.
std::string BinsDiff(const std::vector<unsigned char> &want, const std::vector<unsigned char> &got,
                     int64_t rows, int64_t width) {
    if (want.size() != got.size())
        return "sizes differ";
    if (std::memcmp(want.data(), got.data(), want.size()) == 0)
        return "";
    const int64_t n = rows * width;
    static const char *const names[5] = {"top", "hi", "mid", "lo", "special"};
    size_t count = 0, first = SIZE_MAX;
    int first_arr = 0;
    for (int a = 0; a < 5; a++) {
        const size_t size = a < 4 ? 8 : 4, base = (size_t)a * 8 * (size_t)n;
        for (int64_t i = 0; i < n; i++)
            if (std::memcmp(want.data() + base + (size_t)i * size,
                            got.data() + base + (size_t)i * size, size) != 0) {
                if (first == SIZE_MAX) {
                    first = (size_t)i;
                    first_arr = a;
                }
                count++;
            }
    }
    if (first == SIZE_MAX)
        return "padding differs";
    char buf[256];
    std::snprintf(buf, sizeof buf, "%zu value slots differ; first: %s[%zu] (row %zu, value %zu)",
                  count, names[first_arr], first, first / (size_t)width, first % (size_t)width);
    return buf;
}

// Floats equal bit for bit, or both NaN; the count of those that are not.
size_t BinsFloatDiff(const std::vector<float> &want, const std::vector<float> &got,
                     size_t *first = nullptr) {
    if (want.size() != got.size())
        return SIZE_MAX;
    size_t bad = 0;
    for (size_t i = 0; i < want.size(); i++) {
        const bool same = std::memcmp(&want[i], &got[i], sizeof(float)) == 0 ||
                          (std::isnan(want[i]) && std::isnan(got[i]));
        if (!same && bad++ == 0 && first)
            *first = i;
        if (!same && bad == 1) {
            uint32_t w, g;
            std::memcpy(&w, &want[i], sizeof w);
            std::memcpy(&g, &got[i], sizeof g);
            std::printf("bins: first float difference at %zu: want %a (0x%08x), got %a (0x%08x)\n",
                        i, (double)want[i], w, (double)got[i], g);
        }
    }
    return bad;
}

// A block on the GPU.
struct DevBins {
    Space *sp;
    int64_t rows, width;
    void *p;
    DevBins(Space *s, int64_t r, int64_t w)
        : sp(s), rows(r), width(w), p(s->Put(nullptr, ctxpar_bins_bytes(r, w))) {}
    std::vector<unsigned char> Get() {
        std::vector<unsigned char> v(ctxpar_bins_bytes(rows, width));
        sp->Get(v.data(), p, v.size());
        return v;
    }
};

TEST_F(Gpu, BinsAddMergeFinishBitwiseAsSdk) {
    Device d(true);
    ASSERT_EQ(d.st, CTXPAR_OK) << ctxpar_last_error();
    ASSERT_TRUE(ctxpar_dev_has_bins(d.dev));
    const int64_t B = 2, S = 11, H = 3, W = 37, rows = B * S * H;
    // (off, len) of each add: slices and single rows; row s = S - 1 stays empty.
    const int64_t parts[][2] = {{0, S - 1}, {3, 5}, {9, 1}, {0, S - 1}, {2, 8}, {0, 4}};
    for (int spread : {126, 20, 3}) {
        std::mt19937_64 g(0x5eed0000u + (unsigned)spread);
        Space sp(d.dev);
        HostBins ha(rows, W), hb(rows, W);
        DevBins da(&sp, rows, W), db(&sp, rows, W);
        ASSERT_EQ(ctxpar_dev_bins_clear(d.dev, da.p, rows, W, nullptr), CTXPAR_OK)
            << ctxpar_last_error();
        ASSERT_EQ(ctxpar_dev_bins_clear(d.dev, db.p, rows, W, nullptr), CTXPAR_OK);
        ASSERT_EQ(BinsDiff(ha.mem, da.Get(), rows, W), "") << "clear";
        int step = 0;
        for (HostBins *hx : {&ha, &hb}) {
            DevBins *dx = hx == &ha ? &da : &db;
            for (const auto &pt : parts) {
                const ctxpar_bins_shape sh = {B, S, H, W, pt[0], pt[1]};
                // The second block sees only finite terms through its first adds.
                const bool nonfinite = hx == &ha || step % 3 == 2;
                std::vector<float> src((size_t)(B * pt[1] * H * W));
                for (float &x : src)
                    x = BinsTerm(g, spread, nonfinite);
                for (int64_t r = 0; r < B * pt[1] * H; r++) {
                    int64_t li;
                    ctxpar_bins_add_row(hx->View(), BinsRow(sh, r, &li) * W, src.data() + r * W, W,
                                        0);
                }
                ASSERT_EQ(ctxpar_dev_bins_add(d.dev, dx->p, sp.Put(src), &sh, nullptr), CTXPAR_OK)
                    << ctxpar_last_error();
                ASSERT_EQ(BinsDiff(hx->mem, dx->Get(), rows, W), "")
                    << "add " << step << " (spread " << spread << ")";
                step++;
            }
        }
        // finish of each block, then a += b (and b += a's earlier state via a third block).
        for (HostBins *hx : {&ha, &hb}) {
            DevBins *dx = hx == &ha ? &da : &db;
            std::vector<float> want((size_t)(rows * W));
            for (int64_t i = 0; i < rows * W; i++)
                want[(size_t)i] = (float)ctxpar_bins_value(hx->View(), i);
            float *out = (float *)sp.Put(nullptr, want.size() * sizeof(float));
            ASSERT_EQ(ctxpar_dev_bins_finish(d.dev, dx->p, rows, W, out, nullptr), CTXPAR_OK)
                << ctxpar_last_error();
            size_t first = 0;
            EXPECT_EQ(BinsFloatDiff(want, sp.Get(out, want.size()), &first), 0u)
                << "finish (spread " << spread << "), first at " << first;
        }
        const ctxpar_bins_view hav = ha.View(), hbv = hb.View();
        for (int64_t i = 0; i < rows * W; i++)
            ctxpar_bins_merge_value(hbv, i, hav, i);
        ASSERT_EQ(ctxpar_dev_bins_merge(d.dev, db.p, da.p, rows, W, nullptr), CTXPAR_OK)
            << ctxpar_last_error();
        ASSERT_EQ(BinsDiff(hb.mem, db.Get(), rows, W), "") << "merge (spread " << spread << ")";
        // Into an empty block, and an empty one into a full one.
        HostBins he(rows, W);
        DevBins de(&sp, rows, W);
        ASSERT_EQ(ctxpar_dev_bins_clear(d.dev, de.p, rows, W, nullptr), CTXPAR_OK);
        ASSERT_EQ(ctxpar_dev_bins_merge(d.dev, db.p, de.p, rows, W, nullptr), CTXPAR_OK);
        ASSERT_EQ(BinsDiff(hb.mem, db.Get(), rows, W), "") << "merge of an empty block";
        for (int64_t i = 0; i < rows * W; i++)
            ctxpar_bins_merge_value(he.View(), i, hbv, i);
        ASSERT_EQ(ctxpar_dev_bins_merge(d.dev, de.p, db.p, rows, W, nullptr), CTXPAR_OK);
        ASSERT_EQ(BinsDiff(he.mem, de.Get(), rows, W), "") << "merge into an empty block";
        std::vector<float> want((size_t)(rows * W));
        for (int64_t i = 0; i < rows * W; i++)
            want[(size_t)i] = (float)ctxpar_bins_value(hbv, i);
        float *out = (float *)sp.Put(nullptr, want.size() * sizeof(float));
        ASSERT_EQ(ctxpar_dev_bins_finish(d.dev, db.p, rows, W, out, nullptr), CTXPAR_OK);
        size_t first = 0;
        EXPECT_EQ(BinsFloatDiff(want, sp.Get(out, want.size()), &first), 0u)
            << "finish after merge (spread " << spread << "), first at " << first;
    }
}

// One attention partial per add: out_b values as BinsTerm's (finite mostly), lse in [-50, 50]
// with rows at -inf and a few at +inf or NaN, lse_lo small or absent.
struct AttnPart {
    std::vector<float> out, lse, lse_lo;
};

AttnPart MakeAttnPart(std::mt19937_64 &g, int64_t rows, int64_t dv, bool nonfinite) {
    AttnPart p;
    p.out.resize((size_t)(rows * dv));
    for (float &x : p.out)
        x = g() % 4 ? (float)std::ldexp((double)(int64_t)(g() >> 40) - (double)(1 << 23), -22)
                    : BinsTerm(g, 126, nonfinite);
    p.lse.resize((size_t)rows);
    p.lse_lo.resize((size_t)rows);
    for (size_t i = 0; i < (size_t)rows; i++) {
        const uint64_t r = g();
        const double u = (double)(r >> 11) * 0x1p-53; // [0, 1)
        float l = (float)(-50.0 + 100.0 * u);
        if (r % 11 == 0)
            l = -INFINITY;
        else if (nonfinite && r % 29 == 1)
            l = (r >> 8) % 2 ? INFINITY : NAN;
        p.lse[i] = l;
        p.lse_lo[i] = std::isfinite(l) ? (float)std::ldexp(u - 0.5, -24) * std::fabs(l) : 0.0f;
    }
    return p;
}

TEST_F(Gpu, BinsAttnAddMergeFinishBitwiseAsSdk) {
    Device d(true);
    ASSERT_EQ(d.st, CTXPAR_OK) << ctxpar_last_error();
    ASSERT_TRUE(ctxpar_dev_has_bins(d.dev));
    const int64_t B = 2, S = 13, H = 3;
    // Row s = S - 1 stays empty (as do rows whose every partial has lse -inf).
    const int64_t parts[][2] = {{0, S - 1}, {4, 6}, {11, 1}, {0, S - 1}, {1, 10}};
    for (int64_t dv : {1, 24, 64}) {
        const int64_t W = dv + 1, rows = B * S * H;
        std::mt19937_64 g(0xa77e0000u + (unsigned)dv);
        Space sp(d.dev);
        HostBins ha(rows, W), hb(rows, W);
        DevBins da(&sp, rows, W), db(&sp, rows, W);
        ASSERT_EQ(ctxpar_dev_bins_clear(d.dev, da.p, rows, W, nullptr), CTXPAR_OK)
            << ctxpar_last_error();
        ASSERT_EQ(ctxpar_dev_bins_clear(d.dev, db.p, rows, W, nullptr), CTXPAR_OK);
        std::vector<float> tmp((size_t)(3 * dv));
        int step = 0;
        for (HostBins *hx : {&ha, &hb}) {
            DevBins *dx = hx == &ha ? &da : &db;
            for (const auto &pt : parts) {
                const ctxpar_bins_shape sh = {B, S, H, W, pt[0], pt[1]};
                const int64_t src_rows = B * pt[1] * H;
                AttnPart p = MakeAttnPart(g, src_rows, dv, hx == &hb && step % 2 == 1);
                const bool with_lo = step % 3 != 1;
                for (int64_t r = 0; r < src_rows; r++) {
                    int64_t li;
                    const int64_t row = BinsRow(sh, r, &li);
                    const double L =
                        (double)p.lse[(size_t)li] + (with_lo ? (double)p.lse_lo[(size_t)li] : 0.0);
                    ctxpar_bins_add_attn_row(hx->View(), row * W, W, p.out.data() + r * dv, 1, L,
                                             tmp.data());
                }
                ASSERT_EQ(ctxpar_dev_bins_add_attn(d.dev, dx->p, sp.Put(p.out), sp.Put(p.lse),
                                                   with_lo ? sp.Put(p.lse_lo) : nullptr, &sh,
                                                   nullptr),
                          CTXPAR_OK)
                    << ctxpar_last_error();
                ASSERT_EQ(BinsDiff(hx->mem, dx->Get(), rows, W), "")
                    << "add_attn " << step << " (dv " << dv << (with_lo ? ", lse_lo" : "") << ")";
                step++;
            }
        }
        const ctxpar_bins_view hav = ha.View(), hbv = hb.View();
        for (int64_t i = 0; i < rows * W; i++)
            ctxpar_bins_merge_value(hbv, i, hav, i);
        ASSERT_EQ(ctxpar_dev_bins_merge(d.dev, db.p, da.p, rows, W, nullptr), CTXPAR_OK)
            << ctxpar_last_error();
        ASSERT_EQ(BinsDiff(hb.mem, db.Get(), rows, W), "") << "merge (dv " << dv << ")";
        // finish_attn of both blocks, with and without lse_lo.
        for (HostBins *hx : {&ha, &hb}) {
            DevBins *dx = hx == &ha ? &da : &db;
            std::vector<float> out((size_t)(rows * dv)), lse((size_t)rows), lo((size_t)rows);
            for (int64_t r = 0; r < rows; r++) {
                const int64_t h = r % H, s = (r / H) % S, b = r / (H * S);
                const size_t li = (size_t)((b * H + h) * S + s);
                const double L =
                    ctxpar_bins_finish_attn_row(hx->View(), r * W, W, out.data() + r * dv, 1);
                lse[li] = (float)L; // as the CPU's ctxpar_cpu_store_lse
                lo[li] = std::isinf(lse[li]) ? 0.0f : (float)(L - (double)lse[li]);
            }
            for (int with_lo = 0; with_lo < 2; with_lo++) {
                const ctxpar_bins_shape sh = {B, S, H, W, 0, S};
                float *o = (float *)sp.Put(nullptr, out.size() * sizeof(float));
                float *l = (float *)sp.Put(nullptr, lse.size() * sizeof(float));
                float *ll = with_lo ? (float *)sp.Put(nullptr, lo.size() * sizeof(float)) : nullptr;
                ASSERT_EQ(ctxpar_dev_bins_finish_attn(d.dev, dx->p, &sh, o, l, ll, nullptr),
                          CTXPAR_OK)
                    << ctxpar_last_error();
                size_t first = 0;
                EXPECT_EQ(BinsFloatDiff(out, sp.Get(o, out.size()), &first), 0u)
                    << "finish_attn out (dv " << dv << "), first at " << first;
                EXPECT_EQ(BinsFloatDiff(lse, sp.Get(l, lse.size()), &first), 0u)
                    << "finish_attn lse (dv " << dv << "), first at " << first;
                if (with_lo) {
                    EXPECT_EQ(BinsFloatDiff(lo, sp.Get(ll, lo.size()), &first), 0u)
                        << "finish_attn lse_lo (dv " << dv << "), first at " << first;
                }
            }
            // The block is only read.
            ASSERT_EQ(BinsDiff(hx->mem, dx->Get(), rows, W), "") << "finish_attn wrote the block";
        }
    }
}

} // namespace

#endif // CTXPAR_TEST_NO_CUDA
