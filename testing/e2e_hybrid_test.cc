// End to end: the hybrid algorithm (all-to-all in groups of u ranks, ring across r groups)
// forward and backward through the public API with P = u x r in-process ranks, against the fp64
// oracle of the whole sequence (the per-element bound) and against P = 1: every mask and layout,
// and what the ring supports besides (uneven and empty shards, custom assignments, MLA, sinks
// with soft-capping, the LSE's low part).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <thread>
#include <vector>

#include "accuracy.h"
#include "ctxpar_cpu.h"
#include "ctxpar_local.h"
#include "reference/oracle.h"

#include "e2e_expect.h"
#include "reference/runner.h"
#include "reference/tolerance.h"

namespace {

enum MaskKind { kNone, kCausal, kCausalWindow, kDocsCausal, kTwoSidedDocs };
const char *const kMaskName[] = {"none", "causal", "causal_window", "docs_causal",
                                 "two_sided_docs"};

// Documents of uneven lengths over seq 96, one empty and one a single token (as e2e_test.cc).
const int32_t kDocs[] = {0, 17, 50, 50, 51, 96};

struct Case {
    int u, r;
    ctxpar_layout layout;
    MaskKind mask;
    ctxpar_dtype dtype;
    int64_t kv_heads; // of 12 query heads
    int64_t batch;
};

std::string CaseName(const testing::TestParamInfo<Case> &info) {
    const Case &c = info.param;
    return "u" + std::to_string(c.u) + "_r" + std::to_string(c.r) + "_" +
           ctxpar_layout_name(c.layout) + "_" + kMaskName[c.mask] + "_" +
           ctxpar_dtype_name(c.dtype) + "_KV" + std::to_string(c.kv_heads) + "_B" +
           std::to_string(c.batch);
}

cpt_run_config Config(const Case &c) {
    cpt_run_config cfg;
    cpt_run_config_default(&cfg);
    cfg.ranks = c.u * c.r;
    cfg.batch = c.batch;
    cfg.heads = 12;
    cfg.kv_heads = c.kv_heads;
    cfg.head_dim = 32;
    cfg.seq = 96; // divides by 2P for P = 4, 6, 8
    cfg.dtype = c.dtype;
    cfg.params.algo = CTXPAR_ALGO_HYBRID;
    cfg.params.ulysses = c.u;
    cfg.params.layout = c.layout;
    cfg.params.mask = c.mask == kNone || c.mask == kTwoSidedDocs ? CTXPAR_MASK_NONE
                                                                 : CTXPAR_MASK_CAUSAL;
    if (c.mask == kCausalWindow)
        cfg.params.window_left = 20; // narrower than a group's rows: ring steps are skipped
    if (c.mask == kTwoSidedDocs) {
        cfg.params.window_left = 30;
        cfg.params.window_right = 17;
    }
    if (c.mask == kDocsCausal || c.mask == kTwoSidedDocs) {
        cfg.params.cu_seqlens = kDocs;
        cfg.params.num_docs = 5;
    }
    cfg.backward = 1;
    cfg.threads = 1;
    cfg.seed = 2000 + (uint64_t)(c.u * 10 + c.r);
    return cfg;
}

class Hybrid : public testing::TestWithParam<Case> {};

TEST_P(Hybrid, MatchesOracleAndSingleRank) {
    const Case &c = GetParam();
    cpt_run_config cfg = Config(c);
    cpt_run_result r;
    ASSERT_EQ(cpt_run(&cfg, &r), CTXPAR_OK) << ctxpar_last_error();
    ASSERT_EQ(r.status, CTXPAR_OK) << r.message;
    EXPECT_EQ(r.algo, CTXPAR_ALGO_HYBRID);
    CptExpectTensorsMatch(r, c.u * c.r);
    EXPECT_TRUE(r.ok);
    cpt_run_result_free(&r);
}

std::vector<Case> AllCases() {
    std::vector<Case> cases;
    const int grids[][2] = {{2, 2}, {3, 2}, {2, 3}, {2, 4}, {4, 2}};
    const ctxpar_layout layouts[] = {CTXPAR_LAYOUT_CONTIGUOUS, CTXPAR_LAYOUT_ZIGZAG,
                                     CTXPAR_LAYOUT_STRIPED};
    const MaskKind masks[] = {kCausal, kCausalWindow, kDocsCausal, kNone, kTwoSidedDocs};
    int n = 0;
    for (const auto &g : grids)
        for (ctxpar_layout l : layouts)
            for (MaskKind m : masks) {
                const int u = g[0];
                // MHA, K/V heads shared by the group (Hkv = u), and one K/V head replicated to
                // every member (Hkv = 1 < u), rotating.
                const int64_t kv[] = {12, u, 1};
                cases.push_back({u, g[1], l, m, n % 2 ? CTXPAR_DTYPE_BF16 : CTXPAR_DTYPE_F32,
                                 kv[n % 3], 1 + (n / 3) % 2});
                n++;
            }
    return cases;
}

INSTANTIATE_TEST_SUITE_P(Grids, Hybrid, testing::ValuesIn(AllCases()), CaseName);

// What the ring supports besides masks and layouts, on every grid.
enum Feature {
    kUnevenContiguous, // 97 tokens (prime): shards and groups of different sizes
    kUnevenZigzag,
    kUnevenStriped,
    kFewerThanRanks,   // P / 2 + 1 tokens: some ranks, and some whole groups, hold none
    kCustomRandom,     // params.assignment: any token on any rank
    kCustomHeadTail,   // per-document head-tail (PyTorch's packed-document balancing)
    kMla,              // v's head_dim of its own
    kSinksSoftcap,     // sinks (and dsinks) with soft-capping, a window and documents
    kFeatures
};
const char *const kFeatureName[] = {"uneven_contiguous", "uneven_zigzag", "uneven_striped",
                                    "fewer_than_ranks",  "custom_random", "custom_headtail",
                                    "mla",               "sinks_softcap"};
// Sink logits of 12 heads, from below every row's lse to well above it (as e2e_features_test).
const float kSinkLogits[12] = {-2.0f, 0.5f, 3.0f, 6.5f, -0.25f, 1.75f,
                               4.0f,  9.0f, 1.0f, -1.0f, 2.5f,  5.0f};

struct FeatureCase {
    int u, r;
    Feature feature;
    ctxpar_dtype dtype;
    int64_t kv_heads;
};

std::string FeatureCaseName(const testing::TestParamInfo<FeatureCase> &info) {
    const FeatureCase &c = info.param;
    return "u" + std::to_string(c.u) + "_r" + std::to_string(c.r) + "_" +
           kFeatureName[c.feature] + "_" + ctxpar_dtype_name(c.dtype) + "_KV" +
           std::to_string(c.kv_heads);
}

// Per-document head-tail: each document cut into 2P chunks, rank p taking chunks p and 2P-1-p.
std::vector<int32_t> HeadTail(const int32_t *cu, int docs, int P) {
    std::vector<int32_t> a(static_cast<size_t>(cu[docs]));
    for (int d = 0; d < docs; d++) {
        const int64_t n = cu[d + 1] - cu[d];
        for (int64_t t = 0; t < n; t++) {
            const int64_t chunk = t * 2 * P / n;
            a[static_cast<size_t>(cu[d] + t)] =
                static_cast<int32_t>(chunk < P ? chunk : 2 * P - 1 - chunk);
        }
    }
    return a;
}

class HybridFeatures : public testing::TestWithParam<FeatureCase> {};

TEST_P(HybridFeatures, MatchOracleAndSingleRank) {
    const FeatureCase &c = GetParam();
    const int P = c.u * c.r;
    cpt_run_config cfg = Config({c.u, c.r, CTXPAR_LAYOUT_ZIGZAG, kCausal, c.dtype, c.kv_heads, 2});
    std::vector<int32_t> assign;
    switch (c.feature) {
    case kUnevenContiguous:
    case kUnevenZigzag:
    case kUnevenStriped: {
        const ctxpar_layout l[] = {CTXPAR_LAYOUT_CONTIGUOUS, CTXPAR_LAYOUT_ZIGZAG,
                                   CTXPAR_LAYOUT_STRIPED};
        cfg.seq = 97;
        cfg.params.layout = l[c.feature - kUnevenContiguous];
        break;
    }
    case kFewerThanRanks:
        cfg.seq = P / 2 + 1;
        cfg.params.layout = CTXPAR_LAYOUT_CONTIGUOUS;
        break;
    case kCustomRandom: {
        cfg.seq = 97;
        uint64_t x = 0x9e3779b97f4a7c15ull * static_cast<uint64_t>(P * 131 + c.u);
        for (int64_t t = 0; t < cfg.seq; t++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            assign.push_back(static_cast<int32_t>(x % static_cast<uint64_t>(P)));
        }
        break;
    }
    case kCustomHeadTail:
        cfg.params.cu_seqlens = kDocs;
        cfg.params.num_docs = 5;
        assign = HeadTail(kDocs, 5, P);
        break;
    case kMla:
        cfg.head_dim = 48;
        cfg.head_dim_v = 32;
        cfg.params.mask = c.kv_heads == 1 ? CTXPAR_MASK_NONE : CTXPAR_MASK_CAUSAL;
        break;
    case kSinksSoftcap:
        cfg.params.sinks = kSinkLogits;
        cfg.params.softcap = 2.0f;
        cfg.params.softmax_scale = 0.4f;
        cfg.params.window_left = 20;
        cfg.params.cu_seqlens = kDocs;
        cfg.params.num_docs = 5;
        break;
    default:
        break;
    }
    if (!assign.empty()) {
        cfg.params.layout = CTXPAR_LAYOUT_CUSTOM;
        cfg.params.assignment = assign.data();
    }
    cpt_run_result r;
    ASSERT_EQ(cpt_run(&cfg, &r), CTXPAR_OK) << ctxpar_last_error();
    ASSERT_EQ(r.status, CTXPAR_OK) << r.message;
    EXPECT_EQ(r.algo, CTXPAR_ALGO_HYBRID);
    CptExpectTensorsMatch(r, P);
    ASSERT_EQ(r.has_dsinks, c.feature == kSinksSoftcap ? 1 : 0);
    if (r.has_dsinks) {
        // Every rank returned the same bits (else NaN here), within the bound, no worse than
        // P = 1 by more than the ratio rule; never exactly 0 (the sinks were folded in).
        EXPECT_LE(r.dsinks_bound_ratio, 1.0) << "dsinks error " << r.dsinks_error;
        EXPECT_TRUE(r.dsinks_ratio_ok) << "dsinks error " << r.dsinks_error << " vs "
                                       << r.dsinks_error_1 << " at P=1";
        for (int h = 0; h < cfg.heads; h++)
            EXPECT_NE(r.outputs.dsinks[h], 0.0f) << "head " << h;
    }
    EXPECT_TRUE(r.ok);
    cpt_run_result_free(&r);
}

std::vector<FeatureCase> FeatureCases() {
    std::vector<FeatureCase> cases;
    const int grids[][2] = {{2, 2}, {3, 2}, {2, 3}, {2, 4}, {4, 2}};
    int n = 0;
    for (const auto &g : grids)
        for (int f = 0; f < kFeatures; f++) {
            const int64_t kv[] = {12, g[0], 1}; // MHA, shared by the group, replicated
            cases.push_back({g[0], g[1], static_cast<Feature>(f),
                             n % 2 ? CTXPAR_DTYPE_BF16 : CTXPAR_DTYPE_F32, kv[n % 3]});
            n++;
        }
    return cases;
}

INSTANTIATE_TEST_SUITE_P(Grids, HybridFeatures, testing::ValuesIn(FeatureCases()),
                         FeatureCaseName);

// params.lse_lo through the hybrid (u = 2, r = 2): the forward brings every rank the low part
// of its rows' LSE from the ring of its group's rows, and the backward takes it there. A sharp
// softmax (|lse| ~ 30, where the F32 rounding of the LSE scales a row's P by up to 2e-6): the low
// part is within half an ulp of lse and mostly nonzero, lse + lse_lo is nearer the oracle's LSE
// than lse alone (summed over rows: the kernels' own F32 error remains), and dv's error is smaller with the low part
// than without it (as accuracy_test's one-rank case).
TEST(HybridLseLo, IsTheRemainderAndTheBackwardUsesIt) {
    constexpr int kU = 2, kP = 4;
    constexpr int64_t kS = 512, kH = 4, kD = 64, kRows = kS / kP;
    const cpt_oracle_shape sh{1, kS, kS, kH, kH, kD};
    const size_t n = static_cast<size_t>(kS * kH * kD), local = n / kP;
    std::vector<float> in[4];
    std::vector<double> in64[4];
    for (int i = 0; i < 4; i++)
        for (size_t x = 0; x < n; x++) {
            in[i].push_back(cpt_acc_input(CPT_DIST_SHARP, 0, 23, i + 1, x));
            in64[i].push_back(in[i].back());
        }
    // Rank p holds rows [p S/P, (p + 1) S/P) (contiguous, batch 1): views into the globals.
    std::vector<float> out(n), dq(n), dk(n), dv[2] = {std::vector<float>(n), std::vector<float>(n)};
    std::vector<float> lse(static_cast<size_t>(kS * kH)), lo(lse.size(), NAN);
    ctxpar_local_group *group = nullptr;
    ASSERT_EQ(ctxpar_local_group_create(kP, &group), CTXPAR_OK);
    ctxpar_status st[kP];
    auto rank_main = [&](int p) {
        ctxpar_cpu_options co = CTXPAR_CPU_OPTIONS_INIT;
        co.num_threads = 1;
        ctxpar_device *dev = nullptr;
        ctxpar_comm *comm = nullptr;
        ctxpar_context *ctx = nullptr;
        st[p] = ctxpar_device_create_cpu(&co, &dev);
        if (st[p] == CTXPAR_OK)
            st[p] = ctxpar_comm_create_local(group, p, nullptr, &comm);
        if (st[p] == CTXPAR_OK)
            st[p] = ctxpar_context_create(dev, comm, nullptr, &ctx);
        auto T = [&](std::vector<float> &x) {
            return ctxpar_tensor_bshd(x.data() + p * local, CTXPAR_DTYPE_F32, 1, kRows, kH, kD);
        };
        ctxpar_tensor q = T(in[0]), k = T(in[1]), v = T(in[2]), dout = T(in[3]), o = T(out);
        ctxpar_tensor tdq = T(dq), tdk = T(dk);
        float *my_lse = lse.data() + p * kH * kRows, *my_lo = lo.data() + p * kH * kRows;
        ctxpar_attn_params prm = CTXPAR_ATTN_PARAMS_INIT;
        prm.algo = CTXPAR_ALGO_HYBRID;
        prm.ulysses = kU;
        prm.layout = CTXPAR_LAYOUT_CONTIGUOUS;
        prm.mask = CTXPAR_MASK_CAUSAL;
        prm.lse_lo = my_lo;
        if (st[p] == CTXPAR_OK)
            st[p] = ctxpar_attn_fwd(ctx, &prm, &q, &k, &v, &o, my_lse, nullptr);
        for (int with = 0; with < 2 && st[p] == CTXPAR_OK; with++) {
            ctxpar_tensor tdv = T(dv[with]);
            prm.lse_lo = with ? my_lo : nullptr;
            st[p] = ctxpar_attn_bwd(ctx, &prm, &q, &k, &v, &o, my_lse, &dout, &tdq, &tdk, &tdv,
                                    nullptr);
        }
        ctxpar_context_destroy(ctx);
        ctxpar_comm_destroy(comm);
        ctxpar_device_destroy(dev);
    };
    std::vector<std::thread> threads;
    for (int p = 0; p < kP; p++)
        threads.emplace_back(rank_main, p);
    for (auto &t : threads)
        t.join();
    ctxpar_local_group_destroy(group);
    for (int p = 0; p < kP; p++)
        ASSERT_EQ(st[p], CTXPAR_OK) << "rank " << p;

    std::vector<double> ref_out(n), ref_lse(lse.size()), rdq(n), rdk(n), rdv(n);
    const ctxpar_mask_desc causal = {1, 0, nullptr, 0, 0, 0};
    const double scale = 1.0 / std::sqrt(static_cast<double>(kD));
    cpt_oracle_fwd(&sh, in64[0].data(), in64[1].data(), in64[2].data(), nullptr, nullptr, &causal,
                   scale, ref_out.data(), ref_lse.data());
    cpt_oracle_bwd(&sh, in64[0].data(), in64[1].data(), in64[2].data(), nullptr, nullptr, &causal,
                   scale, in64[3].data(), rdq.data(), rdk.data(), rdv.data());
    int nonzero = 0;
    double err_hi = 0, err_both = 0;
    for (int p = 0; p < kP; p++)
        for (int64_t h = 0; h < kH; h++)
            for (int64_t i = 0; i < kRows; i++) {
                const size_t at = static_cast<size_t>((p * kH + h) * kRows + i);
                const double ref = ref_lse[static_cast<size_t>(h * kS + p * kRows + i)];
                const float hi = lse[at];
                ASSERT_LE(std::fabs(lo[at]),
                          0.5 * (std::nextafter(std::fabs(hi), INFINITY) - std::fabs(hi)))
                    << "rank " << p << " head " << h << " row " << i;
                nonzero += lo[at] != 0.0f;
                err_hi += std::fabs(hi - ref);
                err_both += std::fabs(static_cast<double>(hi) + lo[at] - ref);
            }
    EXPECT_GT(nonzero, static_cast<int>(lse.size()) / 2);
    EXPECT_LT(err_both, err_hi) << "sum of |lse error|: " << err_both << " with lse_lo, "
                                      << err_hi << " without";
    double err[2] = {0, 0};
    for (int with = 0; with < 2; with++)
        for (size_t x = 0; x < n; x++)
            err[with] = std::fmax(err[with], std::fabs(dv[with][x] - rdv[x]));
    EXPECT_LT(err[1], err[0]) << "dv error with lse_lo " << err[1] << ", without " << err[0];
}

// ulysses = 0: the library chooses a group size that divides P and the heads; the answer is
// still the oracle's. And the FLOPs the ranks report add up to the ring's for the same problem
// (the same pairs, computed once).
TEST(HybridChoice, ChosenGroupSizeAndSameWorkAsTheRing) {
    cpt_run_config cfg = Config({2, 3, CTXPAR_LAYOUT_ZIGZAG, kCausal, CTXPAR_DTYPE_F32, 2, 1});
    cfg.params.ulysses = 0;
    cpt_run_result r;
    ASSERT_EQ(cpt_run(&cfg, &r), CTXPAR_OK) << ctxpar_last_error();
    ASSERT_EQ(r.status, CTXPAR_OK) << r.message;
    EXPECT_TRUE(r.ok);
    double hybrid_flops = 0;
    for (int i = 0; i < cfg.ranks; i++)
        hybrid_flops += r.rank[i].work.flops;
    cpt_run_result_free(&r);
    cfg.params.algo = CTXPAR_ALGO_RING;
    cfg.compare_single = 0;
    ASSERT_EQ(cpt_run(&cfg, &r), CTXPAR_OK) << ctxpar_last_error();
    ASSERT_EQ(r.status, CTXPAR_OK) << r.message;
    double ring_flops = 0;
    for (int i = 0; i < cfg.ranks; i++)
        ring_flops += r.rank[i].work.flops;
    EXPECT_GT(ring_flops, 0);
    EXPECT_EQ(hybrid_flops, ring_flops);
    cpt_run_result_free(&r);
}

// The hybrid's ring skips the steps no window reaches. P = 8 in groups of u = 2 (a ring of 4
// groups), 96 tokens in 8 chunks of 12 whose groups along the sequence are 0 1 3 2 2 3 1 0
// (each group a front and a back chunk, like zigzag, with groups 2 and 3 swapped on the ring),
// each chunk's first half on the group's first member. A window narrower than a chunk lets a
// group see only its neighbours' chunks, so every block stops short of going all the way round
// and every ring rank passes on fewer K/V blocks than without the window (on a contiguous or
// zigzag layout some ring rank passes on as many either way). The all-to-alls move the same
// with and without a window, so the bytes each rank sends differ by exactly the K/V blocks its
// ring rank no longer passes on, counted here from the geometry: block j travels j -> j+1 ...
// up to the farthest ring rank whose queries see any of its keys (brute force over positions).
TEST(HybridWindow, RingStepsNoWindowReachesMoveNothing) {
    constexpr int kU = 2, kP = 8, kGroups = kP / kU;
    constexpr int64_t kS = 96, kChunk = 12;
    const int chunk_group[kS / kChunk] = {0, 1, 3, 2, 2, 3, 1, 0};
    std::vector<int32_t> assign;
    for (int64_t t = 0; t < kS; t++)
        assign.push_back(
            static_cast<int32_t>(chunk_group[t / kChunk] * kU + (t % kChunk) / (kChunk / 2)));
    struct Window {
        const char *name;
        ctxpar_mask mask;
        int64_t left, right; // 0: no limit on that side
    };
    const Window windows[] = {{"causal, window_left 8", CTXPAR_MASK_CAUSAL, 8, 0},
                              {"no mask, window 8 left and 5 right", CTXPAR_MASK_NONE, 8, 5}};
    // K/V blocks ring rank g passes on for the mask (windowed or not), from the positions alone.
    auto kv_blocks = [&](const Window &w, bool windowed) {
        auto visible = [&](int64_t q, int64_t k) {
            if (w.mask == CTXPAR_MASK_CAUSAL && k > q)
                return false;
            return !windowed ||
                   ((w.left == 0 || q - k < w.left) && (w.right == 0 || k - q <= w.right));
        };
        auto dist = [](int from, int to) { return ((to - from) % kGroups + kGroups) % kGroups; };
        std::vector<int> reach(kGroups, 0); // block j's farthest user along its path
        for (int64_t q = 0; q < kS; q++)
            for (int64_t k = 0; k < kS; k++)
                if (visible(q, k)) {
                    const int j = chunk_group[k / kChunk], g = chunk_group[q / kChunk];
                    reach[j] = std::max(reach[j], dist(j, g));
                }
        std::vector<uint64_t> n(kGroups, 0);
        for (int g = 0; g < kGroups; g++)
            for (int j = 0; j < kGroups; j++)
                n[g] += dist(j, g) < reach[j];
        return n;
    };
    for (const Window &w : windows) {
        SCOPED_TRACE(w.name);
        // The premise: without the window every ring rank passes on 3 blocks, with it 2.
        EXPECT_EQ(kv_blocks(w, false), std::vector<uint64_t>(kGroups, 3));
        EXPECT_EQ(kv_blocks(w, true), std::vector<uint64_t>(kGroups, 2));
        cpt_run_config cfg;
        cpt_run_config_default(&cfg);
        cfg.ranks = kP;
        cfg.seq = kS;
        cfg.heads = 4;
        cfg.kv_heads = 2; // 1 per group member
        cfg.head_dim = 16;
        cfg.params.algo = CTXPAR_ALGO_HYBRID;
        cfg.params.ulysses = kU;
        cfg.params.layout = CTXPAR_LAYOUT_CUSTOM;
        cfg.params.assignment = assign.data();
        cfg.params.mask = w.mask;
        cfg.threads = 1;
        cfg.compare_single = 0;
        cfg.seed = 2100;
        // One hop of a block: K and V of a group's rows (u x 12), the member's K/V heads, F32.
        const int64_t member_kv_heads = cfg.kv_heads / kU;
        const uint64_t block =
            2ull * cfg.batch * kU * (kS / kP) * member_kv_heads * cfg.head_dim * 4;
        const std::vector<uint64_t> all_round = kv_blocks(w, false), stopped = kv_blocks(w, true);
        for (int backward = 0; backward < 2; backward++) {
            cfg.backward = backward;
            uint64_t sent[2][kP]; // [windowed][rank]
            for (int windowed = 0; windowed < 2; windowed++) {
                cfg.params.window_left = windowed ? w.left : 0;
                cfg.params.window_right = windowed ? w.right : 0;
                cpt_run_result r;
                ASSERT_EQ(cpt_run(&cfg, &r), CTXPAR_OK) << ctxpar_last_error();
                ASSERT_EQ(r.status, CTXPAR_OK) << r.message;
                EXPECT_EQ(r.algo, CTXPAR_ALGO_HYBRID);
                for (int i = 0; i < CPT_RUN_TENSORS; i++) {
                    if (r.has[i]) {
                        EXPECT_LE(r.bound_ratio[i], 1.0)
                            << cpt_run_tensor_name((cpt_run_tensor)i) << " backward " << backward
                            << " windowed " << windowed;
                    }
                }
                EXPECT_EQ(r.has[CPT_T_DQ], backward);
                for (int p = 0; p < kP; p++)
                    sent[windowed][p] = r.rank[p].bytes_sent;
                cpt_run_result_free(&r);
            }
            for (int p = 0; p < kP; p++) {
                EXPECT_LT(sent[1][p], sent[0][p]) << "rank " << p << " backward " << backward;
                if (!backward) { // forward: exactly the K/V hops saved
                    EXPECT_EQ(sent[0][p] - sent[1][p],
                              (all_round[p / kU] - stopped[p / kU]) * block)
                        << "rank " << p << ": " << sent[0][p] << " bytes without the window, "
                        << sent[1][p] << " with it";
                }
            }
        }
    }
}

// Group sizes that cannot work are refused before any rank communicates, naming the field.
TEST(HybridChoice, BadGroupSizesAreRefused) {
    struct Bad {
        int64_t ulysses;
        ctxpar_algo algo;
        ctxpar_status want;
        const char *says;
    } bad[] = {
        {4, CTXPAR_ALGO_HYBRID, CTXPAR_ERR_INVALID_ARG, "ulysses"}, // 4 does not divide 6 ranks
        {5, CTXPAR_ALGO_HYBRID, CTXPAR_ERR_INVALID_ARG, "ulysses"},
        {-1, CTXPAR_ALGO_HYBRID, CTXPAR_ERR_INVALID_ARG, "params.ulysses"},
        {2, CTXPAR_ALGO_RING, CTXPAR_ERR_INVALID_ARG, "params.ulysses"},
        {32, CTXPAR_ALGO_HYBRID, CTXPAR_ERR_NOT_SUPPORTED, "ulysses"},
    };
    for (const Bad &b : bad) {
        cpt_run_config cfg = Config({2, 3, CTXPAR_LAYOUT_CONTIGUOUS, kCausal, CTXPAR_DTYPE_F32,
                                     12, 1});
        cfg.params.ulysses = b.ulysses;
        cfg.params.algo = b.algo;
        cfg.compare_single = 0;
        cfg.compare_oracle = 0;
        cpt_run_result r;
        ASSERT_EQ(cpt_run(&cfg, &r), CTXPAR_OK) << ctxpar_last_error();
        EXPECT_EQ(r.status, b.want) << "ulysses " << b.ulysses << ": " << r.message;
        EXPECT_NE(std::string(r.message).find(b.says), std::string::npos) << r.message;
        cpt_run_result_free(&r);
    }
}

} // namespace
