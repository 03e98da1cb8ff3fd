// End to end with the attention features of current models (issue 17): MLA (v's head_dim 128
// beside q/k's 192, with MHA, GQA and MQA), attention sinks (with their gradient), logit
// soft-capping, sinks with soft-capping under a sliding window and documents, and MLA with sinks
// and documents per batch row (each batch row is computed on its own there). Every
// algorithm and layout, F32, BF16 and F16, P in {1, 2, 3, 4, 8} (all-to-all at P = 3 with 6 query
// heads), forward and backward, against the fp64 oracle (which implements each feature itself)
// with the per-element bound, and against P = 1 (error ratio; all-gather's bits). Then each
// feature (sinks, soft-capping, a two-sided window, MLA, empty documents, documents per row)
// with each irregular sharding (uneven S, fewer tokens than ranks, a custom assignment) over
// every algorithm, the hybrid included.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "reference/data.h"
#include "e2e_expect.h"
#include "reference/oracle.h"
#include "reference/runner.h"
#include "reference/tolerance.h"

namespace {

enum Feature {
    kMla,
    kMlaGqa,
    kMlaMqa,
    kSinks,
    kSoftcap,
    kSinksSoftcapWindow,
    kMlaSinksRowDocs,
    kFeatures
};
const char *const kFeatureName[] = {"mla",   "mla_gqa", "mla_mqa",
                                    "sinks", "softcap", "sinks_softcap_window_docs",
                                    "mla_sinks_row_docs"};

// Sink logits of 8 heads, in score units: from below every row's lse (little effect) to well
// above it (the sink takes most of the mass).
const float kSinkLogits[8] = {-2.0f, 0.5f, 3.0f, 6.5f, -0.25f, 1.75f, 4.0f, 9.0f};
// Documents over seq 96 with an empty one (as in e2e_test).
const int32_t kDocs[] = {0, 17, 50, 50, 51, 96};
// Three documents in each of two batch rows, different per row (one empty).
const int32_t kRowDocs[] = {0, 30, 61, 96, 0, 5, 5, 96};

struct Case {
    int ranks;
    ctxpar_algo algo;
    ctxpar_layout layout;
    Feature feature;
    ctxpar_dtype dtype;
};

std::string CaseName(const testing::TestParamInfo<Case> &info) {
    const Case &c = info.param;
    return std::string(ctxpar_algo_name(c.algo)) + "_P" + std::to_string(c.ranks) + "_" +
           ctxpar_layout_name(c.layout) + "_" + kFeatureName[c.feature] + "_" +
           ctxpar_dtype_name(c.dtype);
}

cpt_run_config Config(const Case &c) {
    cpt_run_config cfg;
    cpt_run_config_default(&cfg);
    cfg.ranks = c.ranks;
    cfg.seq = 96; // divides by 2P for every P here
    cfg.heads = 8;
    cfg.dtype = c.dtype;
    cfg.params.algo = c.algo;
    cfg.params.layout = c.layout;
    cfg.params.mask = CTXPAR_MASK_CAUSAL;
    cfg.backward = 1;
    cfg.threads = 1;
    cfg.seed = 2000 + c.ranks;
    cfg.kv_heads = 2;
    cfg.head_dim = 64;
    switch (c.feature) {
    case kMla: // DeepSeek's shapes: q/k 192, v 128
    case kMlaGqa:
    case kMlaMqa:
        cfg.head_dim = 192;
        cfg.head_dim_v = 128;
        cfg.kv_heads = c.feature == kMla ? 8 : c.feature == kMlaGqa ? 2 : 1;
        cfg.params.mask = c.feature == kMlaGqa ? CTXPAR_MASK_NONE : CTXPAR_MASK_CAUSAL;
        break;
    case kSinks:
        cfg.params.sinks = kSinkLogits;
        cfg.params.mask = CTXPAR_MASK_NONE;
        break;
    case kSoftcap: // scores of a few units against a cap of 1.5: tanh well off its linear part
        cfg.params.softcap = 1.5f;
        cfg.params.softmax_scale = 0.5f;
        break;
    case kSinksSoftcapWindow:
        cfg.params.sinks = kSinkLogits;
        cfg.params.softcap = 2.0f;
        cfg.params.softmax_scale = 0.4f;
        cfg.params.window_left = 20;
        cfg.params.cu_seqlens = kDocs;
        cfg.params.num_docs = 5;
        break;
    case kMlaSinksRowDocs: // v's head_dim below q's: the per-row outputs are Dv wide
        cfg.head_dim_v = 32;
        cfg.batch = 2;
        cfg.params.sinks = kSinkLogits;
        cfg.params.cu_seqlens = kRowDocs;
        cfg.params.num_docs = 3;
        cfg.params.cu_seqlens_rows = 2;
        break;
    default:
        break;
    }
    // All-to-all needs the query heads to divide by P, and its K/V heads to divide by P or P by
    // them: at P = 3, 6 query heads with MHA (6), GQA (3, groups of 2) or MQA (1) K/V heads.
    if (c.algo == CTXPAR_ALGO_ALLTOALL && c.ranks == 3) {
        cfg.heads = 6;
        cfg.kv_heads = cfg.kv_heads == 8 ? 6 : cfg.kv_heads == 1 ? 1 : 3;
    }
    return cfg;
}

// Every tensor (and dsinks, with sinks) against the oracle and P = 1, the bitwise promises and
// the run's own verdict.
void ExpectFeatureRun(const cpt_run_config &cfg, const cpt_run_result &r, int ranks,
                      ctxpar_algo algo) {
    CptExpectTensorsMatch(r, ranks);
    const bool sinks = cfg.params.sinks != nullptr;
    ASSERT_EQ(r.has_dsinks, sinks ? 1 : 0);
    if (sinks) {
        // Every rank returned the same bits (else they are NaN here) within the bound.
        EXPECT_LE(r.dsinks_bound_ratio, 1.0) << "dsinks error " << r.dsinks_error;
        if (ranks > 1) {
            EXPECT_TRUE(r.dsinks_ratio_ok) << "dsinks error " << r.dsinks_error << " at P=" << ranks
                                           << " vs " << r.dsinks_error_1 << " at P=1";
        }
        // The sinks matter: a gradient of exactly zero would mean they were never folded in.
        for (int h = 0; h < cfg.heads; h++)
            EXPECT_NE(r.outputs.dsinks[h], 0.0f) << "head " << h;
    }
    CptExpectBitwisePromises(r, ranks, algo);
    EXPECT_TRUE(r.ok);
}

class Features : public testing::TestWithParam<Case> {};

TEST_P(Features, MatchOracleAndSingleRank) {
    const Case &c = GetParam();
    cpt_run_config cfg = Config(c);
    cpt_run_result r;
    ASSERT_EQ(cpt_run(&cfg, &r), CTXPAR_OK) << ctxpar_last_error();
    ASSERT_EQ(r.status, CTXPAR_OK) << r.message;
    ExpectFeatureRun(cfg, r, c.ranks, c.algo);
    cpt_run_result_free(&r);
}

std::vector<Case> AllCases() {
    std::vector<Case> cases;
    const int ranks[] = {1, 2, 3, 4, 8};
    const ctxpar_algo algos[] = {CTXPAR_ALGO_RING, CTXPAR_ALGO_ALLGATHER, CTXPAR_ALGO_ALLTOALL};
    const ctxpar_layout layouts[] = {CTXPAR_LAYOUT_CONTIGUOUS, CTXPAR_LAYOUT_ZIGZAG,
                                     CTXPAR_LAYOUT_STRIPED};
    const ctxpar_dtype dtypes[] = {CTXPAR_DTYPE_F32, CTXPAR_DTYPE_BF16, CTXPAR_DTYPE_F16};
    int block = 0;
    for (int p : ranks)
        for (ctxpar_algo a : algos)
            for (ctxpar_layout l : layouts) {
                block++;
                for (int f = 0; f < kFeatures; f++) {
                    // Every dtype for every feature, rotating over the grid (keeps CI short).
                    cases.push_back({p, a, l, static_cast<Feature>(f), dtypes[(block + f) % 3]});
                }
            }
    return cases;
}

INSTANTIATE_TEST_SUITE_P(All, Features, testing::ValuesIn(AllCases()), CaseName);

// Every feature with every kind of irregular sharding: S that no P or 2P divides, fewer tokens
// than ranks (some ranks hold none), and a custom assignment of tokens to ranks, each over every
// algorithm (the hybrid at P = 4, 6 and 8). Tiny problems (at most 53 tokens, head_dim 16), each
// against the fp64 oracle and P = 1; P, the built-in layout and the dtype rotate over the grid.
enum ShardFeature {
    kSfSinks,     // sinks (and dsinks), causal
    kSfSoftcap,   // soft-capping well off tanh's linear part, causal
    kSfTwoSided,  // a two-sided window, no causal mask
    kSfMla,       // v's head_dim (8) below q/k's (16), causal
    kSfEmptyDocs, // documents with empty ones among them, causal
    kSfRowDocs,   // documents per batch row (2 rows, empty documents too), no causal mask
    kShardFeatures
};
const char *const kShardFeatureName[] = {"sinks", "softcap",    "two_sided_window",
                                         "mla",   "empty_docs", "row_docs"};
enum Sharding { kUnevenS, kFewerThanRanks, kCustomAssign, kShardings };
const char *const kShardingName[] = {"uneven", "fewer_than_ranks", "custom"};

struct ShardCase {
    ShardFeature feature;
    Sharding sharding;
    ctxpar_algo algo;
    int ranks;
    ctxpar_layout layout; // of kUnevenS and kFewerThanRanks; CUSTOM for kCustomAssign
    ctxpar_dtype dtype;
};

std::string ShardCaseName(const testing::TestParamInfo<ShardCase> &info) {
    const ShardCase &c = info.param;
    return std::string(ctxpar_algo_name(c.algo)) + "_P" + std::to_string(c.ranks) + "_" +
           kShardingName[c.sharding] + "_" +
           (c.sharding == kCustomAssign ? "" : std::string(ctxpar_layout_name(c.layout)) + "_") +
           kShardFeatureName[c.feature] + "_" + ctxpar_dtype_name(c.dtype);
}

// 53 is prime: no P or 2P > 1 divides it. Fewer than ranks: P / 2 + 1 tokens (P >= 3). The
// custom assignment covers 41 tokens.
int64_t ShardSeq(const ShardCase &c) {
    return c.sharding == kUnevenS ? 53 : c.sharding == kFewerThanRanks ? c.ranks / 2 + 1 : 41;
}

void MakeShardProblem(const ShardCase &c, CptShardedRun *s) {
    cpt_run_config &cfg = s->cfg;
    cpt_run_config_default(&cfg);
    cfg.ranks = c.ranks;
    cfg.seq = ShardSeq(c);
    // All-to-all (and the hybrid's groups) need the query heads to divide by P (u) and the K/V
    // heads to divide by it or it by them.
    const bool three = c.ranks % 3 == 0;
    cfg.heads = three ? 6 : 8;
    cfg.kv_heads = three ? 3 : 2;
    cfg.head_dim = 16;
    cfg.dtype = c.dtype;
    cfg.params.algo = c.algo;
    if (c.algo == CTXPAR_ALGO_HYBRID) // groups of u, a ring of 2 groups across them
        cfg.params.ulysses = c.ranks / 2;
    cfg.params.layout = c.layout;
    cfg.params.mask = CTXPAR_MASK_CAUSAL;
    cfg.backward = 1;
    cfg.threads = 1;
    cfg.seed = 3000 + 10 * c.ranks + c.feature;
    s->cu.resize(10);
    CptTestDocs(cfg.seq, 0, &s->cu[0]);
    CptTestDocs(cfg.seq, 1, &s->cu[5]);
    switch (c.feature) {
    case kSfSinks:
        cfg.params.sinks = kSinkLogits;
        break;
    case kSfSoftcap:
        cfg.params.softcap = 1.5f;
        cfg.params.softmax_scale = 0.5f;
        break;
    case kSfTwoSided: // the band q - L < k <= q + R, narrower than most shards
        cfg.params.mask = CTXPAR_MASK_NONE;
        cfg.params.window_left = cfg.seq > 8 ? 9 : 2;
        cfg.params.window_right = cfg.seq > 8 ? 5 : 1;
        break;
    case kSfMla:
        cfg.head_dim_v = 8;
        break;
    case kSfEmptyDocs:
        cfg.params.cu_seqlens = s->cu.data();
        cfg.params.num_docs = 4;
        break;
    case kSfRowDocs:
        cfg.batch = 2;
        cfg.params.mask = CTXPAR_MASK_NONE;
        cfg.params.cu_seqlens = s->cu.data();
        cfg.params.num_docs = 4;
        cfg.params.cu_seqlens_rows = 2;
        break;
    default:
        break;
    }
    if (c.sharding == kCustomAssign) { // any token on any rank (the same on every rank)
        s->assign.resize(static_cast<size_t>(cfg.seq));
        uint64_t x = 0x9e3779b97f4a7c15ull * static_cast<uint64_t>(c.ranks * 131 + c.feature + 1);
        for (auto &a : s->assign) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            a = static_cast<int32_t>(x % static_cast<uint64_t>(c.ranks));
        }
        cfg.params.assignment = s->assign.data();
    }
}

class FeaturesSharding : public testing::TestWithParam<ShardCase> {};

TEST_P(FeaturesSharding, MatchOracleAndSingleRank) {
    const ShardCase &c = GetParam();
    CptShardedRun s;
    MakeShardProblem(c, &s);
    const cpt_run_config &cfg = s.cfg;
    if (c.sharding == kFewerThanRanks) { // the premise: some rank holds no token
        ASSERT_LT(cfg.seq, c.ranks);
    }
    if (c.sharding == kUnevenS) { // and here: the shards cannot all be equal
        ASSERT_NE(cfg.seq % (c.layout == CTXPAR_LAYOUT_ZIGZAG ? 2 * c.ranks : c.ranks), 0);
    }
    cpt_run_result r;
    ASSERT_EQ(cpt_run(&cfg, &r), CTXPAR_OK) << ctxpar_last_error();
    ASSERT_EQ(r.status, CTXPAR_OK) << r.message;
    EXPECT_EQ(r.algo, c.algo);
    ExpectFeatureRun(cfg, r, c.ranks, c.algo);
    cpt_run_result_free(&r);
}

std::vector<ShardCase> ShardCases() {
    std::vector<ShardCase> cases;
    const ctxpar_algo algos[] = {CTXPAR_ALGO_RING, CTXPAR_ALGO_ALLGATHER, CTXPAR_ALGO_ALLTOALL,
                                 CTXPAR_ALGO_HYBRID};
    const ctxpar_layout builtin[] = {CTXPAR_LAYOUT_CONTIGUOUS, CTXPAR_LAYOUT_ZIGZAG,
                                     CTXPAR_LAYOUT_STRIPED};
    const int flat_ranks[] = {2, 3, 4, 8}, few_ranks[] = {3, 4, 8}, hybrid_ranks[] = {4, 6, 8};
    const ctxpar_dtype dtypes[] = {CTXPAR_DTYPE_F32, CTXPAR_DTYPE_BF16, CTXPAR_DTYPE_F16};
    for (int f = 0; f < kShardFeatures; f++)
        for (int sh = 0; sh < kShardings; sh++)
            for (int a = 0; a < 4; a++) {
                const ctxpar_algo algo = algos[a];
                const int k = f + a + sh; // rotates P over the features of each algorithm
                const int p = algo == CTXPAR_ALGO_HYBRID ? hybrid_ranks[k % 3]
                              : sh == kFewerThanRanks    ? few_ranks[k % 3]
                                                         : flat_ranks[k % 4];
                const ctxpar_layout l =
                    sh == kCustomAssign ? CTXPAR_LAYOUT_CUSTOM : builtin[(f + 2 * a) % 3];
                // Every dtype for each feature with each sharding and with each algorithm.
                cases.push_back({static_cast<ShardFeature>(f), static_cast<Sharding>(sh), algo, p,
                                 l, dtypes[(f / 2 + a + sh) % 3]});
            }
    return cases;
}

INSTANTIATE_TEST_SUITE_P(All, FeaturesSharding, testing::ValuesIn(ShardCases()), ShardCaseName);

// A row that sees no key, with sinks. No mask can hide a query's own key from it, so the row is
// made by the convention of docs/numerics.md: token 9 is a one-token document whose key scores
// exactly -inf (k = -inf, q > 0), which counts as fully masked. With sinks its out is 0, its lse
// the head's sink and its gradients (dq, and dk, dv of key 9) 0; it adds nothing to dsinks. The
// reference is the fp64 oracle asked directly for that row with key 9 left out of the keys.
struct MaskedCase {
    int ranks;
    ctxpar_algo algo;
};

class MaskedRowSinks : public testing::TestWithParam<MaskedCase> {};

void RunMaskedRowSinks(const MaskedCase &c) {
    const int64_t S = 24, HQ = 4, HKV = 2, D = 8, P9 = 9;
    const int64_t heads[4] = {HQ, HKV, HKV, HQ};
    std::vector<double> in64[4];
    std::vector<float> in32[4];
    for (int i = 0; i < 4; i++) {
        in64[i].resize(S * heads[i] * D);
        cpt_test_fill_global_f64(in64[i].data(), CTXPAR_DTYPE_F32, 77, i + 1, 1, S, heads[i], D);
    }
    for (int64_t h = 0; h < HQ; h++)
        for (int64_t d = 0; d < D; d++)
            in64[0][(P9 * HQ + h) * D + d] = std::fabs(in64[0][(P9 * HQ + h) * D + d]) + 0.25;
    for (int i = 0; i < 4; i++)
        in32[i].assign(in64[i].begin(), in64[i].end());
    for (int64_t h = 0; h < HKV; h++)
        for (int64_t d = 0; d < D; d++)
            in32[1][(P9 * HKV + h) * D + d] = -INFINITY;
    static const int32_t cu[] = {0, 9, 10, 24};
    static const float sinks[4] = {0.5f, -1.0f, 2.0f, 0.25f};
    cpt_run_config cfg;
    cpt_run_config_default(&cfg);
    cfg.ranks = c.ranks;
    cfg.seq = S;
    cfg.heads = HQ;
    cfg.kv_heads = HKV;
    cfg.head_dim = D;
    cfg.params.algo = c.algo;
    cfg.params.layout = CTXPAR_LAYOUT_ZIGZAG;
    cfg.params.mask = CTXPAR_MASK_NONE;
    cfg.params.cu_seqlens = cu;
    cfg.params.num_docs = 3;
    cfg.params.sinks = sinks;
    cfg.backward = 1;
    cfg.threads = 1;
    cfg.compare_oracle = 0; // its literal softmax has -inf * 0 in row 9's dq: asked below
    cfg.compare_single = 0;
    cpt_run_inputs inputs = {in32[0].data(), in32[1].data(), in32[2].data(), in32[3].data()};
    cfg.inputs = &inputs;
    cpt_run_result r;
    ASSERT_EQ(cpt_run(&cfg, &r), CTXPAR_OK) << ctxpar_last_error();
    ASSERT_EQ(r.status, CTXPAR_OK) << r.message;

    // The oracle: every query, every key but 9 (whose document then holds no key).
    std::vector<int64_t> q_pos(S), k_pos;
    for (int64_t i = 0; i < S; i++) {
        q_pos[i] = i;
        if (i != P9)
            k_pos.push_back(i);
    }
    std::vector<double> k_kept, v_kept;
    for (int64_t j : k_pos)
        for (int64_t x = 0; x < HKV * D; x++) {
            k_kept.push_back(in64[1][j * HKV * D + x]);
            v_kept.push_back(in64[2][j * HKV * D + x]);
        }
    cpt_oracle_shape sh = {1, S, S - 1, HQ, HKV, D};
    const ctxpar_mask_desc mask = cpt_oracle_mask(&cfg.params);
    const double sinks64[4] = {sinks[0], sinks[1], sinks[2], sinks[3]};
    cpt_oracle_features f = {};
    f.sinks = sinks64;
    const double scale = 1.0 / std::sqrt((double)D);
    std::vector<double> out(S * HQ * D), lse(HQ * S), dq(S * HQ * D), dk((S - 1) * HKV * D),
        dv((S - 1) * HKV * D), dsinks(HQ);
    cpt_oracle_fwd_ex(&sh, in64[0].data(), k_kept.data(), v_kept.data(), q_pos.data(), k_pos.data(),
                      &mask, &f, scale, out.data(), lse.data());
    cpt_oracle_bwd_ex(&sh, in64[0].data(), k_kept.data(), v_kept.data(), q_pos.data(), k_pos.data(),
                      &mask, &f, scale, in64[3].data(), dq.data(), dk.data(), dv.data(),
                      dsinks.data());
    for (int64_t h = 0; h < HQ; h++) // the oracle itself says: the sink, out 0
        ASSERT_EQ(lse[h * S + P9], (double)sinks[h]);

    // Inputs are O(1) and S small: F32 results within 1e-5 of the oracle (errors ~1e-7).
    const double tol = 1e-5;
    auto F = [&](cpt_run_tensor t) { return static_cast<const float *>(r.outputs.t[t]); };
    for (int64_t x = 0; x < S * HQ * D; x++) {
        ASSERT_NEAR(F(CPT_T_OUT)[x], out[x], tol) << "out " << x;
        ASSERT_NEAR(F(CPT_T_DQ)[x], dq[x], tol) << "dq " << x;
    }
    for (int64_t h = 0; h < HQ; h++)
        for (int64_t i = 0; i < S; i++)
            ASSERT_NEAR(F(CPT_T_LSE)[h * S + i], lse[h * S + i], tol) << "lse " << h << "," << i;
    for (int64_t j = 0, kept = 0; j < S; j++) {
        for (int64_t x = 0; x < HKV * D; x++) {
            const double rk = j == P9 ? 0.0 : dk[kept * HKV * D + x];
            const double rv = j == P9 ? 0.0 : dv[kept * HKV * D + x];
            ASSERT_NEAR(F(CPT_T_DK)[j * HKV * D + x], rk, tol) << "dk " << j;
            ASSERT_NEAR(F(CPT_T_DV)[j * HKV * D + x], rv, tol) << "dv " << j;
        }
        kept += j != P9;
    }
    ASSERT_NE(r.outputs.dsinks, nullptr);
    for (int64_t h = 0; h < HQ; h++)
        EXPECT_NEAR(r.outputs.dsinks[h], dsinks[h], tol) << "dsinks " << h;
    for (int64_t h = 0; h < HQ; h++) { // exactly, by the convention
        EXPECT_EQ(F(CPT_T_LSE)[h * S + P9], sinks[h]);
        for (int64_t d = 0; d < D; d++) {
            EXPECT_EQ(F(CPT_T_OUT)[(P9 * HQ + h) * D + d], 0.0f);
            EXPECT_EQ(F(CPT_T_DQ)[(P9 * HQ + h) * D + d], 0.0f);
        }
    }
    cpt_run_result_free(&r);
}

// The row's dq is 0, not 0 x (-inf) = NaN: with sinks its lse is the sink, so the CPU backward
// recognises it by its scores (ctxpar_bwd_row_sees_only_neg_inf), not by lse = -inf.
TEST_P(MaskedRowSinks, OutZeroLseIsTheSinkGradientsZero) {
    RunMaskedRowSinks(GetParam());
}

INSTANTIATE_TEST_SUITE_P(All, MaskedRowSinks,
                         testing::Values(MaskedCase{1, CTXPAR_ALGO_RING},
                                         MaskedCase{3, CTXPAR_ALGO_RING},
                                         MaskedCase{3, CTXPAR_ALGO_ALLGATHER},
                                         MaskedCase{2, CTXPAR_ALGO_ALLTOALL},
                                         MaskedCase{4, CTXPAR_ALGO_ALLTOALL}),
                         [](const testing::TestParamInfo<MaskedCase> &info) {
                             return std::string(ctxpar_algo_name(info.param.algo)) + "_P" +
                                    std::to_string(info.param.ranks);
                         });

// Regression found through the Python bindings: documents per batch row with MLA (the forward
// stepped its per-row accumulators by q's head_dim). All-to-all's uneven backward reading stale
// workspace, found the same way, needs a reused context to show: context_reuse_test.
struct RegressionCase {
    const char *name;
    int ranks;
    ctxpar_algo algo;
    int64_t seq, head_dim_v;
    bool per_row_docs;
};

class Regressions : public testing::TestWithParam<RegressionCase> {};

TEST_P(Regressions, MatchOracle) {
    const RegressionCase &c = GetParam();
    static const int32_t cu[2][4] = {{0, 0, 11, 25}, {0, 7, 19, 25}};
    cpt_run_config cfg;
    cpt_run_config_default(&cfg);
    cfg.ranks = c.ranks;
    cfg.batch = 2;
    cfg.seq = c.seq;
    cfg.heads = 4;
    cfg.kv_heads = 2;
    cfg.head_dim = 16;
    cfg.head_dim_v = c.head_dim_v;
    cfg.params.algo = c.algo;
    cfg.params.layout = CTXPAR_LAYOUT_CONTIGUOUS;
    if (c.per_row_docs) {
        cfg.params.cu_seqlens = &cu[0][0];
        cfg.params.num_docs = 3;
        cfg.params.cu_seqlens_rows = 2;
    }
    cfg.backward = 1;
    cfg.threads = 1;
    cfg.seed = 1700;
    cpt_run_result r;
    ASSERT_EQ(cpt_run(&cfg, &r), CTXPAR_OK) << ctxpar_last_error();
    ASSERT_EQ(r.status, CTXPAR_OK) << r.message;
    CptExpectTensorsMatch(r, c.ranks);
    EXPECT_TRUE(r.ok);
    cpt_run_result_free(&r);
}

INSTANTIATE_TEST_SUITE_P(
    All, Regressions,
    testing::Values(RegressionCase{"mla_per_row_docs_P1", 1, CTXPAR_ALGO_RING, 25, 8, true},
                    RegressionCase{"mla_per_row_docs_P3", 3, CTXPAR_ALGO_RING, 25, 8, true}),
    [](const testing::TestParamInfo<RegressionCase> &info) { return info.param.name; });

} // namespace
