// End to end: reproducible mode (params.reproducible). Every tensor (out, lse, dq, dk, dv,
// dsinks) of ring, all-gather, all-to-all and the hybrid at P ranks must have exactly the bits of
// the same algorithm at P = 1 and of every other algorithm, for chunk-aligned layouts (contiguous, zigzag,
// a random custom assignment of whole chunks with a short last chunk and ranks that may hold
// nothing), masks and features in rotation, F32/BF16/F16 and 1 or 3 threads; each run is also
// judged against the fp64 oracle's per-element bound. Problems the mode does not run are refused
// before the ranks agree, with NOT_SUPPORTED naming why.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "e2e_expect.h"
#include "reference/runner.h"

namespace {

constexpr int64_t kChunk = 256; // algorithms/repro.h's CTXPAR_REPRO_CHUNK

enum LayoutKind { kContiguous, kZigzag, kCustomChunks };
const char *const kLayoutName[] = {"contiguous", "zigzag", "custom_chunks"};
enum Feature {
    kCausal,
    kNone,
    kCausalWindow,
    kDocsCausal,
    kSinksSoftcap,
    kMlaTwoSidedWindow,
    kGqaCausal,
    kFeatureCount
};
const char *const kFeatureName[] = {"causal",      "none",          "causal_window",
                                    "docs_causal", "sinks_softcap", "mla_two_sided_window",
                                    "gqa_causal"};
const float kSinkLogits[4] = {0.5f, -1.0f, 2.0f, 0.0f};
const ctxpar_dtype kDtypes[3] = {CTXPAR_DTYPE_F32, CTXPAR_DTYPE_BF16, CTXPAR_DTYPE_F16};

struct Case {
    LayoutKind layout;
    int ranks;
    Feature feature;
    int dtype;   // index into kDtypes
    int threads; // per rank
};

// The sequence: whole chunks per shard for the built-in layouts; for the custom one a short last
// chunk (S not a multiple of 64).
int64_t SeqOf(const Case &c) {
    if (c.layout == kContiguous)
        return kChunk * c.ranks;
    if (c.layout == kZigzag)
        return kChunk * c.ranks * 2;
    return kChunk * 3 + 37;
}

std::string CaseName(const testing::TestParamInfo<Case> &info) {
    const Case &c = info.param;
    const char *dt[3] = {"f32", "bf16", "f16"};
    return std::string(kLayoutName[c.layout]) + "_P" + std::to_string(c.ranks) + "_" +
           kFeatureName[c.feature] + "_" + dt[c.dtype] + "_t" + std::to_string(c.threads);
}

void Make(const Case &c, ctxpar_algo algo, CptShardedRun *s) {
    cpt_run_config &cfg = s->cfg;
    cpt_run_config_default(&cfg);
    cfg.ranks = c.ranks;
    cfg.seq = SeqOf(c);
    cfg.batch = cfg.seq >= 1024 ? 1 : 2;
    cfg.heads = 8; // divisible by every P the all-to-all runs at
    cfg.kv_heads = 8;
    cfg.head_dim = 32;
    cfg.dtype = kDtypes[c.dtype];
    cfg.threads = c.threads;
    cfg.backward = 1;
    cfg.seed = 17 + static_cast<uint64_t>(c.ranks);
    cfg.params.algo = algo;
    cfg.params.reproducible = 1;
    cfg.params.mask = CTXPAR_MASK_CAUSAL;
    switch (c.feature) {
    case kNone:
        cfg.params.mask = CTXPAR_MASK_NONE;
        break;
    case kCausalWindow:
        cfg.params.window_left = 300; // across a chunk edge
        break;
    case kDocsCausal: // documents per batch row, an empty one among them
        s->cu.resize(10);
        CptTestDocs(cfg.seq, 0, &s->cu[0]);
        CptTestDocs(cfg.seq, 1, &s->cu[5]);
        cfg.params.cu_seqlens = s->cu.data();
        cfg.params.num_docs = 4;
        cfg.params.cu_seqlens_rows = cfg.batch;
        break;
    case kSinksSoftcap:
        cfg.heads = cfg.kv_heads = 4;
        cfg.params.sinks = kSinkLogits;
        cfg.params.softcap = 5.0f;
        break;
    case kMlaTwoSidedWindow:
        cfg.params.mask = CTXPAR_MASK_NONE;
        cfg.params.window_left = 290;
        cfg.params.window_right = 40;
        cfg.head_dim_v = 48;
        break;
    case kGqaCausal:
        cfg.kv_heads = c.ranks <= 4 && 4 % c.ranks == 0 ? 4 : 8; // fewer K/V heads than Q heads
        break;
    default:
        break;
    }
    if (c.layout != kCustomChunks) {
        cfg.params.layout =
            c.layout == kContiguous ? CTXPAR_LAYOUT_CONTIGUOUS : CTXPAR_LAYOUT_ZIGZAG;
        return;
    }
    // Whole chunks to random ranks (some may get none).
    s->assign.resize(static_cast<size_t>(cfg.seq));
    uint64_t x = 0x9e3779b97f4a7c15ull * static_cast<uint64_t>(c.ranks * 131 + c.feature + 1);
    for (int64_t chunk = 0; chunk * kChunk < cfg.seq; chunk++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        const int32_t r = static_cast<int32_t>(x % static_cast<uint64_t>(c.ranks));
        for (int64_t i = chunk * kChunk; i < cfg.seq && i < (chunk + 1) * kChunk; i++)
            s->assign[static_cast<size_t>(i)] = r;
    }
    cfg.params.layout = CTXPAR_LAYOUT_CUSTOM;
    cfg.params.assignment = s->assign.data();
}

size_t ElementSize(const cpt_run_config &cfg, int t) {
    return t == CPT_T_LSE ? sizeof(float) : cfg.dtype == CTXPAR_DTYPE_F32 ? 4 : 2;
}

size_t Elements(const cpt_run_config &cfg, int t) {
    const int64_t dv = cfg.head_dim_v ? cfg.head_dim_v : cfg.head_dim;
    const int64_t rows = cfg.batch * cfg.seq;
    switch (t) {
    case CPT_T_OUT:
        return static_cast<size_t>(rows * cfg.heads * dv);
    case CPT_T_LSE:
        return static_cast<size_t>(rows * cfg.heads);
    case CPT_T_DQ:
        return static_cast<size_t>(rows * cfg.heads * cfg.head_dim);
    case CPT_T_DK:
        return static_cast<size_t>(rows * cfg.kv_heads * cfg.head_dim);
    default:
        return static_cast<size_t>(rows * cfg.kv_heads * dv);
    }
}

// Whether two runs of the same problem hold the same bits in every tensor (dsinks included).
void ExpectSameBits(const cpt_run_config &cfg, const cpt_run_result &a, const cpt_run_result &b,
                    const std::string &what) {
    for (int t = 0; t < CPT_RUN_TENSORS; t++) {
        ASSERT_TRUE(a.outputs.t[t] && b.outputs.t[t]) << what;
        EXPECT_EQ(
            std::memcmp(a.outputs.t[t], b.outputs.t[t], Elements(cfg, t) * ElementSize(cfg, t)), 0)
            << what << ": " << cpt_run_tensor_name(static_cast<cpt_run_tensor>(t));
    }
    if (cfg.params.sinks) {
        ASSERT_TRUE(a.outputs.dsinks && b.outputs.dsinks) << what;
        EXPECT_EQ(std::memcmp(a.outputs.dsinks, b.outputs.dsinks,
                              static_cast<size_t>(cfg.heads) * sizeof(float)),
                  0)
            << what << ": dsinks";
    }
}

class Reproducible : public testing::TestWithParam<Case> {};

// The first algorithm against the oracle and bit for bit against itself at P = 1 (the runner
// runs that), then every other one bit for bit against the first: what the first showed holds
// for them, so they borrow its reference and run no P = 1 of their own.
TEST_P(Reproducible, SameBitsForEveryRankCountAndAlgorithm) {
    const Case &c = GetParam();
    std::vector<ctxpar_algo> algos = {CTXPAR_ALGO_RING, CTXPAR_ALGO_ALLGATHER};
    CptShardedRun probe;
    Make(c, CTXPAR_ALGO_ALLTOALL, &probe);
    if (probe.cfg.heads % c.ranks == 0 && probe.cfg.kv_heads % c.ranks == 0)
        algos.push_back(CTXPAR_ALGO_ALLTOALL);
    if (c.ranks % 2 == 0 && c.ranks > 2) // groups of 2 (the library's choice or not), rings of P/2
        algos.push_back(CTXPAR_ALGO_HYBRID);
    std::vector<cpt_run_result> results(algos.size());
    CptShardedRun s;
    for (size_t i = 0; i < algos.size(); i++) {
        Make(c, algos[i], &s);
        if (algos[i] == CTXPAR_ALGO_HYBRID)
            s.cfg.params.ulysses = 2;
        if (i == 0) {
            s.cfg.keep_oracle = 1;
        } else {
            s.cfg.reference_from = &results[0];
            s.cfg.compare_single = 0;
        }
        cpt_run_result &r = results[i];
        ASSERT_EQ(cpt_run(&s.cfg, &r), CTXPAR_OK) << ctxpar_last_error();
        ASSERT_EQ(r.status, CTXPAR_OK) << ctxpar_algo_name(algos[i]) << ": " << r.message;
        if (i > 0) {
            for (int t = 0; t < CPT_RUN_TENSORS; t++)
                EXPECT_LE(r.bound_ratio[t], 1.0)
                    << ctxpar_algo_name(algos[i]) << ": "
                    << cpt_run_tensor_name(static_cast<cpt_run_tensor>(t));
            continue;
        }
        for (int t = 0; t < CPT_RUN_TENSORS; t++)
            EXPECT_TRUE(r.bitwise_single[t])
                << ctxpar_algo_name(algos[i]) << ": "
                << cpt_run_tensor_name(static_cast<cpt_run_tensor>(t)) << " differs from P=1";
        CptExpectTensorsMatch(r, c.ranks);
    }
    for (size_t i = 1; i < algos.size(); i++)
        ExpectSameBits(s.cfg, results[0], results[i],
                       std::string(ctxpar_algo_name(algos[0])) + " vs " +
                           ctxpar_algo_name(algos[i]));
    for (auto &r : results)
        cpt_run_result_free(&r);
}

// Contiguous shards at every P to 8 and at 16 (S = 256 P), zigzag ones to P = 4 (S = 512 P) and
// random whole chunks with a short last one (S = 805) at four P, two feature/dtype/thread draws
// each (one at 16). Under
// AddressSanitizer (about 4x slower) the cases with P <= 4 run; the plain suite runs them all.
std::vector<Case> AllCases() {
#if defined(__SANITIZE_ADDRESS__)
    const int max_p = 4;
#else
    const int max_p = 16;
#endif
    std::vector<Case> cases;
    int n = 0;
    auto add = [&](LayoutKind l, int p, int draws = 2) {
        for (int k = 0; k < draws && p <= max_p; k++, n++)
            cases.push_back(
                {l, p, static_cast<Feature>(n % kFeatureCount), n % 3, 1 + 2 * (n % 2)});
    };
    for (int p : {1, 2, 3, 4, 5, 6, 8})
        add(kContiguous, p);
    add(kContiguous, 16, 1);
    for (int p : {1, 2, 3, 4})
        add(kZigzag, p);
    for (int p : {2, 3, 5, 8})
        add(kCustomChunks, p);
    return cases;
}

INSTANTIATE_TEST_SUITE_P(Repro, Reproducible, testing::ValuesIn(AllCases()), CaseName);

// The same problem at different thread counts and rank counts: one set of bits.
TEST(Reproducible, ThreadCountsGiveTheSameBits) {
    CptShardedRun a, b;
    Make({kZigzag, 2, kCausal, 0, 1}, CTXPAR_ALGO_RING, &a);
    Make({kZigzag, 2, kCausal, 0, 3}, CTXPAR_ALGO_RING, &b);
    a.cfg.compare_oracle = b.cfg.compare_oracle = 0;
    cpt_run_result ra, rb;
    ASSERT_EQ(cpt_run(&a.cfg, &ra), CTXPAR_OK);
    ASSERT_EQ(cpt_run(&b.cfg, &rb), CTXPAR_OK);
    ASSERT_EQ(ra.status, CTXPAR_OK) << ra.message;
    ASSERT_EQ(rb.status, CTXPAR_OK) << rb.message;
    ExpectSameBits(a.cfg, ra, rb, "1 vs 3 threads");
    cpt_run_result_free(&ra);
    cpt_run_result_free(&rb);
}

// Not run in this mode: refused before the ranks agree, naming why.
TEST(Reproducible, RefusesWhatItDoesNotRun) {
    struct Refused {
        ctxpar_algo algo;
        ctxpar_layout layout;
        int64_t seq, kv_heads, ulysses, q_len;
        const char *says;
    } cases[] = {
        {CTXPAR_ALGO_DECODE, CTXPAR_LAYOUT_CONTIGUOUS, 1024, 8, 0, 64, "no reproducible mode"},
        {CTXPAR_ALGO_ALLGATHER, CTXPAR_LAYOUT_CONTIGUOUS, 1024, 8, 0, 64, "q_len"},
        {CTXPAR_ALGO_RING, CTXPAR_LAYOUT_STRIPED, 1024, 8, 0, 0, "whole chunks"},
        {CTXPAR_ALGO_ALLGATHER, CTXPAR_LAYOUT_CONTIGUOUS, 1000, 8, 0, 0, "whole chunks"},
        {CTXPAR_ALGO_HYBRID, CTXPAR_LAYOUT_ZIGZAG, 1024, 8, 2, 0, "whole chunks"},
        {CTXPAR_ALGO_ALLTOALL, CTXPAR_LAYOUT_CONTIGUOUS, 1024, 2, 0, 0, "k/v heads"},
        {CTXPAR_ALGO_HYBRID, CTXPAR_LAYOUT_CONTIGUOUS, 1024, 1, 2, 0, "k/v head's gradient"},
    };
    for (const Refused &c : cases) {
        cpt_run_config cfg;
        cpt_run_config_default(&cfg);
        cfg.ranks = 4;
        cfg.seq = c.seq;
        cfg.heads = 8;
        cfg.kv_heads = c.kv_heads;
        cfg.head_dim = 16;
        cfg.threads = 1;
        cfg.params.algo = c.algo;
        cfg.params.layout = c.layout;
        cfg.params.ulysses = c.ulysses;
        cfg.params.q_len = c.q_len;
        cfg.params.reproducible = 1;
        cpt_run_result r;
        ASSERT_EQ(cpt_run(&cfg, &r), CTXPAR_OK) << ctxpar_last_error();
        EXPECT_EQ(r.status, CTXPAR_ERR_NOT_SUPPORTED) << ctxpar_algo_name(c.algo);
        EXPECT_NE(std::string(r.message).find(c.says), std::string::npos) << r.message;
        cpt_run_result_free(&r);
    }
}

} // namespace
