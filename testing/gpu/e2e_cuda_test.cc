// e2e_cuda_test: context-parallel attention through the public API on CUDA devices: P ranks as
// threads, each with its own CUDA device on GPU 0 (so that one GPU is enough) and the local
// comm copying through that device. Forward and backward against the float64 oracle of the
// whole sequence; all-gather bitwise equal to P = 1. Skipped, visibly, without a GPU.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "testing/gpu/gpu_rule.h"

#ifdef CTXPAR_TEST_NO_CUDA

namespace {
TEST(EndToEndCuda, NotBuilt) {
    std::printf("e2e_cuda_test: skipped: no CUDA device (built without the CUDA toolkit)\n");
    GTEST_SKIP() << "skipped: " << cpt_gpu::Unavailable("built without the CUDA toolkit");
}
} // namespace

#else

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstring>
#include <thread>
#include <vector>

#include "ctxpar.h"
#include "dispatch.h"
#include "ctxpar_cuda.h"
#include "ctxpar_local.h"
#include "reference/data.h"
#include "reference/metrics.h"
#include "reference/oracle.h"
#include "reference/tolerance.h"

namespace {

// Bounds on max |got - oracle| / max |oracle| of the gathered global tensors: the project's
// table (reference/tolerance.c), measured with GPU-style kernels (P rounded to BF16 before P V).
double Tol(ctxpar_dtype dt, const char *name) {
    return cpt_tolerance(dt, name);
}

struct Case {
    int ranks;
    ctxpar_algo algo;
    ctxpar_layout layout;
    ctxpar_mask mask;
    ctxpar_dtype dtype;
};

// Global problem: B=1, S=256, Hq=4, Hkv=2, D=64.
constexpr int64_t B = 1, S = 256, Hq = 4, Hkv = 2, D = 64;

struct Global {
    std::vector<double> out, lse, dq, dk, dv;      // results gathered on the host, as double
    std::vector<unsigned char> out_bits, lse_bits; // for bitwise comparisons
};

size_t Sz(ctxpar_dtype dt) {
    return dt == CTXPAR_DTYPE_F32 ? 4 : 2;
}

typedef std::vector<std::pair<void *, size_t>> Owned;

// Uploads a host tensor (dense) to the device; returns the device tensor.
ctxpar_tensor Upload(ctxpar_device *dev, const ctxpar_tensor &h, Owned *owned) {
    size_t bytes = (size_t)(h.shape[0] * h.shape[1] * h.shape[2] * h.shape[3]) * Sz(h.dtype);
    void *p = nullptr;
    EXPECT_EQ(ctxpar_dev_alloc(dev, bytes, CTXPAR_MEM_DEVICE, &p), CTXPAR_OK);
    EXPECT_EQ(ctxpar_dev_copy(dev, p, h.data, bytes, CTXPAR_COPY_H2D, nullptr), CTXPAR_OK);
    owned->push_back({p, bytes});
    ctxpar_tensor d = h;
    d.data = p;
    return d;
}

void Download(ctxpar_device *dev, const ctxpar_tensor &d, void *host) {
    size_t bytes = (size_t)(d.shape[0] * d.shape[1] * d.shape[2] * d.shape[3]) * Sz(d.dtype);
    ASSERT_EQ(ctxpar_dev_copy(dev, host, d.data, bytes, CTXPAR_COPY_D2H, nullptr), CTXPAR_OK);
    ASSERT_EQ(ctxpar_dev_stream_sync(dev, nullptr), CTXPAR_OK);
}

// One rank: its shard of Q, K, V, dO, forward and backward, results scattered into g.
void RankBody(const Case &c, int rank, ctxpar_local_group *group, Global *g) {
    const int P = c.ranks;
    const int64_t Sl = S / P;
    ctxpar_cuda_options opt = CTXPAR_CUDA_OPTIONS_INIT;
    opt.use_cudnn = CTXPAR_CUDA_CUDNN_OFF;
    ctxpar_device *dev = nullptr;
    ASSERT_EQ(ctxpar_device_create_cuda(&opt, &dev), CTXPAR_OK) << ctxpar_last_error();
    ctxpar_comm *comm = nullptr;
    ASSERT_EQ(ctxpar_comm_create_local(group, rank, dev, &comm), CTXPAR_OK) << ctxpar_last_error();
    ctxpar_context *ctx = nullptr;
    ASSERT_EQ(ctxpar_context_create(dev, comm, nullptr, &ctx), CTXPAR_OK) << ctxpar_last_error();

    std::vector<int64_t> pos((size_t)Sl);
    ASSERT_EQ(ctxpar_positions(c.layout, S, rank, P, pos.data()), CTXPAR_OK);
    const size_t eq = (size_t)(B * Sl * Hq * D) * Sz(c.dtype),
                 ek = (size_t)(B * Sl * Hkv * D) * Sz(c.dtype);
    std::vector<unsigned char> hq(eq), hk(ek), hv(ek), hdo(eq), hout(eq), hdq(eq), hdk(ek), hdv(ek);
    ctxpar_tensor tq = ctxpar_tensor_bshd(hq.data(), c.dtype, B, Sl, Hq, D);
    ctxpar_tensor tk = ctxpar_tensor_bshd(hk.data(), c.dtype, B, Sl, Hkv, D);
    ctxpar_tensor tv = ctxpar_tensor_bshd(hv.data(), c.dtype, B, Sl, Hkv, D);
    ctxpar_tensor tdo = ctxpar_tensor_bshd(hdo.data(), c.dtype, B, Sl, Hq, D);
    cpt_test_fill(&tq, 5, 1, S, pos.data());
    cpt_test_fill(&tk, 5, 2, S, pos.data());
    cpt_test_fill(&tv, 5, 3, S, pos.data());
    cpt_test_fill(&tdo, 5, 4, S, pos.data());

    Owned owned;
    ctxpar_tensor q = Upload(dev, tq, &owned), k = Upload(dev, tk, &owned);
    ctxpar_tensor v = Upload(dev, tv, &owned), dout = Upload(dev, tdo, &owned);
    ctxpar_tensor out = Upload(dev, ctxpar_tensor_bshd(hout.data(), c.dtype, B, Sl, Hq, D), &owned);
    ctxpar_tensor dq = Upload(dev, ctxpar_tensor_bshd(hdq.data(), c.dtype, B, Sl, Hq, D), &owned);
    ctxpar_tensor dk = Upload(dev, ctxpar_tensor_bshd(hdk.data(), c.dtype, B, Sl, Hkv, D), &owned);
    ctxpar_tensor dv = Upload(dev, ctxpar_tensor_bshd(hdv.data(), c.dtype, B, Sl, Hkv, D), &owned);
    void *lse = nullptr;
    const size_t lse_bytes = (size_t)(B * Hq * Sl) * sizeof(float);
    ASSERT_EQ(ctxpar_dev_alloc(dev, lse_bytes, CTXPAR_MEM_DEVICE, &lse), CTXPAR_OK);
    owned.push_back({lse, lse_bytes});

    ctxpar_attn_params params = CTXPAR_ATTN_PARAMS_INIT;
    params.algo = c.algo;
    params.layout = c.layout;
    params.mask = c.mask;
    ASSERT_EQ(ctxpar_attn_fwd(ctx, &params, &q, &k, &v, &out, (float *)lse, nullptr), CTXPAR_OK)
        << "rank " << rank << ": " << ctxpar_last_error();
    ASSERT_EQ(ctxpar_attn_bwd(ctx, &params, &q, &k, &v, &out, (float *)lse, &dout, &dq, &dk, &dv,
                              nullptr),
              CTXPAR_OK)
        << "rank " << rank << ": " << ctxpar_last_error();
    Download(dev, out, hout.data());
    Download(dev, dq, hdq.data());
    Download(dev, dk, hdk.data());
    Download(dev, dv, hdv.data());
    std::vector<unsigned char> hl(lse_bytes);
    ASSERT_EQ(ctxpar_dev_copy(dev, hl.data(), lse, lse_bytes, CTXPAR_COPY_D2H, nullptr), CTXPAR_OK);
    ASSERT_EQ(ctxpar_dev_stream_sync(dev, nullptr), CTXPAR_OK);

    // Scatter into global order: local row s is global row pos[s].
    ctxpar_tensor hot = ctxpar_tensor_bshd(hout.data(), c.dtype, B, Sl, Hq, D);
    ctxpar_tensor hqt = ctxpar_tensor_bshd(hdq.data(), c.dtype, B, Sl, Hq, D);
    ctxpar_tensor hkt = ctxpar_tensor_bshd(hdk.data(), c.dtype, B, Sl, Hkv, D);
    ctxpar_tensor hvt = ctxpar_tensor_bshd(hdv.data(), c.dtype, B, Sl, Hkv, D);
    for (int64_t s = 0; s < Sl; s++) {
        const int64_t gs = pos[(size_t)s];
        for (int64_t h = 0; h < Hq; h++) {
            for (int64_t d = 0; d < D; d++) {
                g->out[(size_t)((gs * Hq + h) * D + d)] = cpt_test_get(&hot, 0, s, h, d);
                g->dq[(size_t)((gs * Hq + h) * D + d)] = cpt_test_get(&hqt, 0, s, h, d);
            }
            float l;
            std::memcpy(&l, &hl[(size_t)(h * Sl + s) * 4], 4);
            g->lse[(size_t)(h * S + gs)] = l;
            std::memcpy(&g->lse_bits[(size_t)(h * S + gs) * 4], &l, 4);
            std::memcpy(&g->out_bits[(size_t)((gs * Hq + h) * D) * Sz(c.dtype)],
                        &hout[(size_t)((s * Hq + h) * D) * Sz(c.dtype)], (size_t)D * Sz(c.dtype));
        }
        for (int64_t h = 0; h < Hkv; h++)
            for (int64_t d = 0; d < D; d++) {
                g->dk[(size_t)((gs * Hkv + h) * D + d)] = cpt_test_get(&hkt, 0, s, h, d);
                g->dv[(size_t)((gs * Hkv + h) * D + d)] = cpt_test_get(&hvt, 0, s, h, d);
            }
    }
    for (auto &p : owned)
        ctxpar_dev_free(dev, p.first, p.second, CTXPAR_MEM_DEVICE);
    ctxpar_context_destroy(ctx);
    ctxpar_comm_destroy(comm);
    ctxpar_device_destroy(dev);
}

Global RunCase(const Case &c) {
    Global g;
    g.out.assign((size_t)(B * S * Hq * D), NAN);
    g.dq = g.out;
    g.lse.assign((size_t)(B * Hq * S), NAN);
    g.dk.assign((size_t)(B * S * Hkv * D), NAN);
    g.dv = g.dk;
    g.out_bits.assign(g.out.size() * Sz(c.dtype), 0);
    g.lse_bits.assign(g.lse.size() * 4, 0);
    ctxpar_local_group *group = nullptr;
    EXPECT_EQ(ctxpar_local_group_create(c.ranks, &group), CTXPAR_OK);
    std::vector<std::thread> threads;
    for (int r = 0; r < c.ranks; r++)
        threads.emplace_back([&, r] { RankBody(c, r, group, &g); });
    for (std::thread &t : threads)
        t.join();
    ctxpar_local_group_destroy(group);
    return g;
}

class EndToEndCuda : public ::testing::TestWithParam<Case> {
  protected:
    void SetUp() override {
        CPT_SKIP_WITHOUT_GPU();
    }
};

void Expect(const std::vector<double> &got, const std::vector<double> &ref, double tol,
            const char *what) {
    std::vector<float> f(got.begin(), got.end());
    cpt_error_stats e = cpt_compare_f32(f.data(), ref.data(), f.size());
    EXPECT_EQ(e.nonfinite, 0) << what;
    EXPECT_LE(e.rel, tol) << what << " (worst element " << e.worst << ")";
}

TEST_P(EndToEndCuda, MatchesOracleAndSingleRank) {
    const Case &c = GetParam();
    Global g = RunCase(c);
    // The oracle sees exactly the stored inputs.
    std::vector<double> q((size_t)(B * S * Hq * D)), k((size_t)(B * S * Hkv * D)), v(k.size()),
        dout(q.size());
    cpt_test_fill_global_f64(q.data(), c.dtype, 5, 1, B, S, Hq, D);
    cpt_test_fill_global_f64(k.data(), c.dtype, 5, 2, B, S, Hkv, D);
    cpt_test_fill_global_f64(v.data(), c.dtype, 5, 3, B, S, Hkv, D);
    cpt_test_fill_global_f64(dout.data(), c.dtype, 5, 4, B, S, Hq, D);
    std::vector<int64_t> pos((size_t)S);
    for (int64_t i = 0; i < S; i++)
        pos[(size_t)i] = i;
    cpt_oracle_shape sh = {B, S, S, Hq, Hkv, D};
    ctxpar_mask_desc m = {c.mask == CTXPAR_MASK_CAUSAL, 0, nullptr, 0, 0, 0};
    std::vector<double> out(q.size()), lse((size_t)(B * Hq * S)), dq(q.size()), dk(k.size()),
        dv(k.size());
    const double scale = (double)(1.0f / std::sqrt((float)D)); // the library's default, in F32
    cpt_oracle_fwd(&sh, q.data(), k.data(), v.data(), pos.data(), pos.data(), &m, scale,
                      out.data(), lse.data());
    cpt_oracle_bwd(&sh, q.data(), k.data(), v.data(), pos.data(), pos.data(), &m, scale,
                      dout.data(), dq.data(), dk.data(), dv.data());
    Expect(g.out, out, Tol(c.dtype, "out"), "out");
    Expect(g.lse, lse, Tol(c.dtype, "lse"), "lse");
    Expect(g.dq, dq, Tol(c.dtype, "dq"), "dq");
    Expect(g.dk, dk, Tol(c.dtype, "dk"), "dk");
    Expect(g.dv, dv, Tol(c.dtype, "dv"), "dv");
    if (c.algo == CTXPAR_ALGO_ALLGATHER && c.ranks > 1) {
        Case one = c;
        one.ranks = 1;
        Global g1 = RunCase(one);
        EXPECT_EQ(g.out_bits, g1.out_bits) << "all-gather must give the bits of one rank";
        EXPECT_EQ(g.lse_bits, g1.lse_bits) << "all-gather must give the bits of one rank";
    }
}

std::vector<Case> Cases() {
    std::vector<Case> v;
    for (int p : {1, 2, 4})
        for (ctxpar_algo a : {CTXPAR_ALGO_RING, CTXPAR_ALGO_ALLGATHER})
            for (ctxpar_layout l :
                 {CTXPAR_LAYOUT_CONTIGUOUS, CTXPAR_LAYOUT_ZIGZAG, CTXPAR_LAYOUT_STRIPED})
                for (ctxpar_mask m : {CTXPAR_MASK_NONE, CTXPAR_MASK_CAUSAL})
                    for (ctxpar_dtype dt : {CTXPAR_DTYPE_F32, CTXPAR_DTYPE_BF16})
                        v.push_back({p, a, l, m, dt});
    return v;
}

INSTANTIATE_TEST_SUITE_P(All, EndToEndCuda, ::testing::ValuesIn(Cases()),
                         [](const ::testing::TestParamInfo<Case> &i) {
                             const Case &c = i.param;
                             return std::string(ctxpar_algo_name(c.algo)) + "_P" +
                                    std::to_string(c.ranks) + "_" + ctxpar_layout_name(c.layout) +
                                    "_" + ctxpar_mask_name(c.mask) + "_" +
                                    ctxpar_dtype_name(c.dtype);
                         });

} // namespace

#endif
