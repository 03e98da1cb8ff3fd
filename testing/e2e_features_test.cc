// End to end with the attention features of current models (issue 17): MLA (v's head_dim 128
// beside q/k's 192, with MHA, GQA and MQA), attention sinks (with their gradient), logit
// soft-capping, sinks with soft-capping under a sliding window and documents, and MLA with sinks
// and documents per batch row (each batch row is computed on its own there). Every
// algorithm and layout, F32 and BF16, P in {1, 2, 3, 4, 8}, forward and backward, against the
// fp64 oracle (which implements each feature itself) with the per-element bound, and against
// P = 1 (error ratio; all-gather's bits).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "e2e_expect.h"
#include "runner.h"
#include "tolerance.h"

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
    return cfg;
}

class Features : public testing::TestWithParam<Case> {};

TEST_P(Features, MatchOracleAndSingleRank) {
    const Case &c = GetParam();
    cpt_run_config cfg = Config(c);
    cpt_run_result r;
    ASSERT_EQ(cpt_run(&cfg, &r), CTXPAR_OK) << ctxpar_last_error();
    ASSERT_EQ(r.status, CTXPAR_OK) << r.message;
    CptExpectTensorsMatch(r, c.ranks);
    const bool sinks = cfg.params.sinks != nullptr;
    ASSERT_EQ(r.has_dsinks, sinks ? 1 : 0);
    if (sinks) {
        // Every rank returned the same bits (else they are NaN here) within the bound.
        EXPECT_LE(r.dsinks_bound_ratio, 1.0) << "dsinks error " << r.dsinks_error;
        if (c.ranks > 1) {
            EXPECT_TRUE(r.dsinks_ratio_ok)
                << "dsinks error " << r.dsinks_error << " at P=" << c.ranks << " vs "
                << r.dsinks_error_1 << " at P=1";
        }
        // The sinks matter: a gradient of exactly zero would mean they were never folded in.
        for (int h = 0; h < cfg.heads; h++)
            EXPECT_NE(r.outputs.dsinks[h], 0.0f) << "head " << h;
    }
    CptExpectBitwisePromises(r, c.ranks, c.algo);
    EXPECT_TRUE(r.ok);
    cpt_run_result_free(&r);
}

std::vector<Case> AllCases() {
    std::vector<Case> cases;
    const int ranks[] = {1, 2, 3, 4, 8};
    const ctxpar_algo algos[] = {CTXPAR_ALGO_RING, CTXPAR_ALGO_ALLGATHER, CTXPAR_ALGO_ALLTOALL};
    const ctxpar_layout layouts[] = {CTXPAR_LAYOUT_CONTIGUOUS, CTXPAR_LAYOUT_ZIGZAG,
                                     CTXPAR_LAYOUT_STRIPED};
    const ctxpar_dtype dtypes[] = {CTXPAR_DTYPE_F32, CTXPAR_DTYPE_BF16};
    int block = 0;
    for (int p : ranks)
        for (ctxpar_algo a : algos)
            for (ctxpar_layout l : layouts) {
                block++;
                for (int f = 0; f < kFeatures; f++) {
                    // All-to-all needs the 8 query heads to divide by P, and its K/V heads to
                    // divide by P or P by them.
                    if (a == CTXPAR_ALGO_ALLTOALL && 8 % p != 0)
                        continue;
                    // Both dtypes for every feature, rotating over the grid (keeps CI short).
                    cases.push_back({p, a, l, static_cast<Feature>(f), dtypes[(block + f) % 2]});
                }
            }
    return cases;
}

INSTANTIATE_TEST_SUITE_P(All, Features, testing::ValuesIn(AllCases()), CaseName);

} // namespace
