// End to end: the hybrid algorithm (all-to-all in groups of u ranks, ring across r groups)
// forward and backward through the public API with P = u x r in-process ranks, against the fp64
// oracle of the whole sequence (the per-element bound) and against P = 1.
#include <gtest/gtest.h>

#include <string>

#include "e2e_expect.h"
#include "runner.h"
#include "tolerance.h"

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
