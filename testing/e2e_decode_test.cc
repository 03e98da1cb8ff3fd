// End to end: queries shorter than the keys (params.q_len = N): the N queries at the last N
// positions of S keys, the same on every rank, over K/V sharded by every layout (contiguous,
// zigzag, striped, a random custom assignment; S even and uneven), with the decode and all-gather
// algorithms, P in 1..8 and N in {1, 4, 64, S/4}, masks and features in rotation (causal, none,
// windows, documents the new tokens extend, GQA, MLA, sinks, soft-capping, BF16). Each run's out
// and lse against the fp64 reference of the N queries (global positions S - N .. S - 1) and
// against P = 1; every rank must return the same bits (the runner marks a difference NaN).
// Algorithms that do not take such queries, and the backward, refuse them before running.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "ctxpar_local.h"
#include "e2e_expect.h"
#include "reference/runner.h"

namespace {

enum LayoutKind { kContiguous, kZigzag, kStriped, kCustomRandom };
const char *const kLayoutName[] = {"contiguous", "zigzag", "striped", "custom_random"};
enum Feature {
    kCausal,
    kNone,
    kCausalWindow,
    kDocsCausal,
    kSinksSoftcap,
    kMlaTwoSidedWindow,
    kBf16Causal,
    kFeatureCount
};
const char *const kFeatureName[] = {"causal",      "none",          "causal_window",
                                    "docs_causal", "sinks_softcap", "mla_two_sided_window",
                                    "bf16_causal"};
const float kSinkLogits[4] = {0.5f, -1.0f, 2.0f, 0.0f};

struct Case {
    ctxpar_algo algo;
    LayoutKind layout;
    bool uneven;
    int ranks;
    int n_kind; // 0..3: N = 1, 4, 64, S/4
    Feature feature;
};

int64_t SeqOf(const Case &c) {
    return c.uneven ? 389 : 384; // 389 is prime: no P or 2P > 1 divides it
}

int64_t QLenOf(const Case &c) {
    const int64_t n[4] = {1, 4, 64, SeqOf(c) / 4};
    return n[c.n_kind];
}

std::string CaseName(const testing::TestParamInfo<Case> &info) {
    const Case &c = info.param;
    return std::string(ctxpar_algo_name(c.algo)) + "_" + kLayoutName[c.layout] +
           (c.uneven ? "_uneven" : "_even") + "_P" + std::to_string(c.ranks) + "_N" +
           std::to_string(QLenOf(c)) + "_" + kFeatureName[c.feature];
}

void Make(const Case &c, CptShardedRun *s) {
    cpt_run_config &cfg = s->cfg;
    cpt_run_config_default(&cfg);
    cfg.ranks = c.ranks;
    cfg.seq = SeqOf(c);
    cfg.batch = 2;
    cfg.heads = 4;
    cfg.kv_heads = 2; // GQA throughout
    cfg.head_dim = 32;
    cfg.threads = 1;
    cfg.seed = 91 + c.ranks;
    cfg.params.algo = c.algo;
    cfg.params.q_len = QLenOf(c);
    cfg.params.mask = CTXPAR_MASK_CAUSAL;
    switch (c.feature) {
    case kNone:
        cfg.params.mask = CTXPAR_MASK_NONE;
        break;
    case kCausalWindow:
        cfg.params.window_left = 50; // narrower than S/P at small P: some slices see nothing
        break;
    case kDocsCausal: // the new tokens extend the last document; row 1 has its own
        s->cu.resize(10);
        CptTestDocs(cfg.seq, 0, &s->cu[0]);
        CptTestDocs(cfg.seq, 1, &s->cu[5]);
        cfg.params.cu_seqlens = s->cu.data();
        cfg.params.num_docs = 4;
        cfg.params.cu_seqlens_rows = cfg.batch;
        break;
    case kSinksSoftcap:
        cfg.params.sinks = kSinkLogits;
        cfg.params.softcap = 5.0f;
        break;
    case kMlaTwoSidedWindow:
        cfg.params.mask = CTXPAR_MASK_NONE;
        cfg.params.window_left = 40;
        cfg.params.window_right = 3;
        cfg.head_dim_v = 48;
        break;
    case kBf16Causal:
        cfg.dtype = CTXPAR_DTYPE_BF16;
        break;
    default:
        break;
    }
    const ctxpar_layout builtin[3] = {CTXPAR_LAYOUT_CONTIGUOUS, CTXPAR_LAYOUT_ZIGZAG,
                                      CTXPAR_LAYOUT_STRIPED};
    if (c.layout != kCustomRandom) {
        cfg.params.layout = builtin[c.layout];
        return;
    }
    s->assign.resize(static_cast<size_t>(cfg.seq));
    uint64_t x = 0x9e3779b97f4a7c15ull * static_cast<uint64_t>(c.ranks * 131 + c.n_kind + 1);
    for (auto &a : s->assign) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        a = static_cast<int32_t>(x % static_cast<uint64_t>(c.ranks));
    }
    cfg.params.layout = CTXPAR_LAYOUT_CUSTOM;
    cfg.params.assignment = s->assign.data();
}

class EndToEndDecode : public testing::TestWithParam<Case> {};

TEST_P(EndToEndDecode, MatchesReferenceAndSingleRank) {
    const Case &c = GetParam();
    CptShardedRun s;
    Make(c, &s);
    cpt_run_result r;
    ASSERT_EQ(cpt_run(&s.cfg, &r), CTXPAR_OK) << ctxpar_last_error();
    ASSERT_EQ(r.status, CTXPAR_OK) << r.message;
    EXPECT_EQ(r.algo, c.algo);
    CptExpectTensorsMatch(r, c.ranks, CPT_T_LSE + 1);
    CptExpectBitwisePromises(r, c.ranks, c.algo, CPT_T_LSE + 1);
    EXPECT_TRUE(r.ok);
    cpt_run_result_free(&r);
}

std::vector<Case> AllCases() {
    std::vector<Case> cases;
    int n = 0;
    for (ctxpar_algo a : {CTXPAR_ALGO_DECODE, CTXPAR_ALGO_ALLGATHER})
        for (LayoutKind l : {kContiguous, kZigzag, kStriped, kCustomRandom})
            for (bool uneven : {false, true})
                for (int p = 1; p <= 8; p++)
                    for (int nk = 0; nk < 4; nk++) {
                        // Every feature, rotating (its period is coprime to N's).
                        cases.push_back({a, l, uneven, p, nk, static_cast<Feature>(n % 7)});
                        n++;
                    }
    return cases;
}

INSTANTIATE_TEST_SUITE_P(Decode, EndToEndDecode, testing::ValuesIn(AllCases()), CaseName);

// A small problem with q_len.
cpt_run_config ShortConfig(ctxpar_algo algo, int ranks, int64_t q_len) {
    cpt_run_config cfg;
    cpt_run_config_default(&cfg);
    cfg.ranks = ranks;
    cfg.seq = 64;
    cfg.heads = 4;
    cfg.kv_heads = 4;
    cfg.head_dim = 16;
    cfg.threads = 1;
    cfg.params.algo = algo;
    cfg.params.q_len = q_len;
    return cfg;
}

// One run of it; returns its result (status and message).
cpt_run_result RunShort(ctxpar_algo algo, int ranks, int64_t q_len, int backward) {
    cpt_run_config cfg = ShortConfig(algo, ranks, q_len);
    cfg.backward = backward;
    cpt_run_result r;
    EXPECT_EQ(cpt_run(&cfg, &r), CTXPAR_OK) << ctxpar_last_error();
    return r;
}

// What does not run is refused before the ranks agree, with NOT_SUPPORTED and a message naming
// it: the algorithms without short queries, decode without them, and every backward with them.
TEST(Decode, RefusesWhatItDoesNotRun) {
    struct Refused {
        ctxpar_algo algo;
        int64_t q_len;
        int backward;
        const char *says;
    } cases[] = {
        {CTXPAR_ALGO_RING, 4, 0, "q_len"},          {CTXPAR_ALGO_ALLTOALL, 4, 0, "q_len"},
        {CTXPAR_ALGO_HYBRID, 4, 0, "q_len"},        {CTXPAR_ALGO_DECODE, 0, 0, "q_len"},
        {CTXPAR_ALGO_DECODE, 4, 1, "forward only"}, {CTXPAR_ALGO_ALLGATHER, 4, 1, "forward only"},
        {CTXPAR_ALGO_AUTO, 4, 1, "forward only"}};
    for (const Refused &c : cases) {
        cpt_run_result r = RunShort(c.algo, 2, c.q_len, c.backward);
        EXPECT_EQ(r.status, CTXPAR_ERR_NOT_SUPPORTED) << ctxpar_algo_name(c.algo);
        EXPECT_NE(std::string(r.message).find(c.says), std::string::npos) << r.message;
        cpt_run_result_free(&r);
    }
}

// AUTO: decode for a few queries (its partials are far smaller than the gathered K/V), and the
// result is still judged against the reference.
TEST(Decode, AutoPicksDecodeForFewQueries) {
    for (int p : {2, 4}) {
        cpt_run_result r = RunShort(CTXPAR_ALGO_AUTO, p, 1, 0);
        ASSERT_EQ(r.status, CTXPAR_OK) << r.message;
        EXPECT_EQ(r.algo, CTXPAR_ALGO_DECODE);
        EXPECT_TRUE(r.ok);
        cpt_run_result_free(&r);
    }
}

// What decode moves per call is its partials, B x N x Hq x (Dv + 1) floats to each other rank
// (docs/algorithms.md), never K/V; after the first call it allocates nothing.
TEST(Decode, SendsOnlyThePartialsAndAllocatesNothing) {
    for (int p : {2, 4, 5}) {
        cpt_run_config cfg = ShortConfig(CTXPAR_ALGO_DECODE, p, 3);
        cfg.seq = 301;
        cfg.kv_heads = 2;
        cfg.head_dim_v = 24;
        cfg.batch = 2;
        cfg.warmup = 1;
        cfg.repeat = 2;
        cfg.compare_single = 0;
        cfg.params.layout = CTXPAR_LAYOUT_STRIPED;
        cpt_run_result r;
        ASSERT_EQ(cpt_run(&cfg, &r), CTXPAR_OK) << ctxpar_last_error();
        ASSERT_EQ(r.status, CTXPAR_OK) << r.message;
        EXPECT_TRUE(r.ok);
        const uint64_t part = 2 * 3 * 4 * (24 + 1) * sizeof(float);
        for (int i = 0; i < p; i++) {
            EXPECT_EQ(r.rank[i].bytes_sent, part * static_cast<uint64_t>(p - 1)) << "rank " << i;
            EXPECT_EQ(r.rank[i].allocations, 0u) << "rank " << i;
        }
        cpt_run_result_free(&r);
    }
}

// The front door's checks of q_len, on one rank: each a clear INVALID_ARG naming the field, and
// the caller's out and lse untouched; then the calls that only look (choose, supported, reserve).
TEST(Decode, FrontDoorOnOneRank) {
    ctxpar_device *dev = nullptr;
    ctxpar_local_group *group = nullptr;
    ctxpar_comm *comm = nullptr;
    ctxpar_context *ctx = nullptr;
    ASSERT_EQ(ctxpar_device_create_by_name("cpu", 1, &dev), CTXPAR_OK);
    ASSERT_EQ(ctxpar_local_group_create(1, &group), CTXPAR_OK);
    ASSERT_EQ(ctxpar_comm_create_local(group, 0, nullptr, &comm), CTXPAR_OK);
    ASSERT_EQ(ctxpar_context_create(dev, comm, nullptr, &ctx), CTXPAR_OK);
    const int64_t S = 16, H = 2, D = 8;
    std::vector<float> q(S * H * D, 0.5f), k(S * H * D, 0.25f), v(S * H * D, 1.0f);
    std::vector<float> out(S * H * D, 7.0f), lse(S * H, 7.0f);
    struct Bad {
        int64_t q_len, q_rows;
        const char *says;
    } bads[] = {{-1, 4, "q_len"}, {S + 1, S + 1, "q_len"}, {4, 5, "q.shape[1] (5)"}};
    for (const Bad &b : bads) {
        ctxpar_attn_params p = CTXPAR_ATTN_PARAMS_INIT;
        p.algo = CTXPAR_ALGO_DECODE;
        p.mask = CTXPAR_MASK_CAUSAL;
        p.q_len = b.q_len;
        ctxpar_tensor tq = ctxpar_tensor_bshd(q.data(), CTXPAR_DTYPE_F32, 1, b.q_rows, H, D);
        ctxpar_tensor tk = ctxpar_tensor_bshd(k.data(), CTXPAR_DTYPE_F32, 1, S, H, D);
        ctxpar_tensor tv = ctxpar_tensor_bshd(v.data(), CTXPAR_DTYPE_F32, 1, S, H, D);
        ctxpar_tensor to = ctxpar_tensor_bshd(out.data(), CTXPAR_DTYPE_F32, 1, b.q_rows, H, D);
        EXPECT_EQ(ctxpar_attn_fwd(ctx, &p, &tq, &tk, &tv, &to, lse.data(), nullptr),
                  CTXPAR_ERR_INVALID_ARG)
            << b.q_len;
        EXPECT_NE(std::string(ctxpar_last_error()).find(b.says), std::string::npos)
            << ctxpar_last_error();
    }
    for (float x : out)
        ASSERT_EQ(x, 7.0f);
    for (float x : lse)
        ASSERT_EQ(x, 7.0f);
    // The queries without a call: what AUTO takes, whether it can run, its workspace.
    ctxpar_attn_params p = CTXPAR_ATTN_PARAMS_INIT;
    p.mask = CTXPAR_MASK_CAUSAL;
    p.q_len = 2;
    ctxpar_tensor tq = ctxpar_tensor_bshd(q.data(), CTXPAR_DTYPE_F32, 1, 2, H, D);
    ctxpar_tensor tk = ctxpar_tensor_bshd(k.data(), CTXPAR_DTYPE_F32, 1, S, H, D);
    ctxpar_algo algo = CTXPAR_ALGO_AUTO;
    ASSERT_EQ(ctxpar_attn_choose_algo(ctx, &p, &tq, &tk, &algo), CTXPAR_OK) << ctxpar_last_error();
    EXPECT_EQ(algo, CTXPAR_ALGO_DECODE);
    EXPECT_EQ(ctxpar_attn_supported(ctx, &p, &tq, &tk, &tk), CTXPAR_OK) << ctxpar_last_error();
    EXPECT_EQ(ctxpar_context_reserve(ctx, &p, &tq, &tk, &tk), CTXPAR_OK) << ctxpar_last_error();
    p.algo = CTXPAR_ALGO_RING;
    EXPECT_EQ(ctxpar_attn_supported(ctx, &p, &tq, &tk, &tk), CTXPAR_ERR_NOT_SUPPORTED);
    ctxpar_context_destroy(ctx);
    ctxpar_comm_destroy(comm);
    ctxpar_local_group_destroy(group);
    ctxpar_device_destroy(dev);
}

} // namespace
