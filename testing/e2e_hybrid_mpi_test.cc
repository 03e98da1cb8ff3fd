// End to end under MPI: the hybrid algorithm with one MPI process per rank (mpi_run.sh runs it
// with -np 4, 6 and 8: the grids u x r = 2x2, 3x2, 2x3, 4x2, 2x4), forward and backward against
// the fp64 oracle (the per-element bound) and P = 1; rank 0 checks, every rank learns the verdict.
// The sub-comms are MPI_Comm_split's (comm/mpi). Beside every layout and mask (none, causal,
// causal with a window, documents, a two-sided window): uneven shards, a custom assignment, MLA
// and sinks with soft-capping.
#include <gtest/gtest.h>
#include <mpi.h>

#include <string>
#include <vector>

#include "reference/runner.h"
#include "reference/runner_mpi.h"
#include "reference/tolerance.h"

namespace {

int Size() {
    int p = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &p);
    return p;
}

const int32_t kDocs[] = {0, 50, 51, 200, 336}; // lengths 50, 1, 149, 136

// Runs cfg forward and backward on every rank; rank 0 judges every tensor against the oracle
// (the per-element bound) and P = 1 (the error ratio), and dsinks where there are sinks.
void RunAndCheck(cpt_run_config *cfg) {
    cfg->backward = 1;
    cfg->threads = 1;
    cpt_run_result r;
    ASSERT_EQ(cpt_run_mpi(cfg, &r), CTXPAR_OK) << ctxpar_last_error();
    ASSERT_EQ(r.status, CTXPAR_OK) << r.message;
    EXPECT_TRUE(r.ok);
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (rank == 0) {
        for (int i = 0; i < CPT_RUN_TENSORS; i++) {
            const char *name = cpt_run_tensor_name(static_cast<cpt_run_tensor>(i));
            EXPECT_TRUE(r.has[i]) << name;
            EXPECT_LE(r.bound_ratio[i], 1.0) << name << ": worst at position "
                                             << r.bound_worst[i].position << ", head "
                                             << r.bound_worst[i].head;
            EXPECT_TRUE(cpt_error_ratio_ok(r.error[i], r.error_1[i])) << name;
        }
        EXPECT_EQ(r.has_dsinks, cfg->params.sinks ? 1 : 0);
        if (r.has_dsinks) {
            EXPECT_LE(r.dsinks_bound_ratio, 1.0) << "dsinks error " << r.dsinks_error;
            EXPECT_TRUE(r.dsinks_ratio_ok) << r.dsinks_error << " vs " << r.dsinks_error_1;
        }
    }
    cpt_run_result_free(&r);
}

struct MpiHybridCase {
    int u;
    ctxpar_layout layout;
    int mask; // 0 causal, 1 causal + window, 2 documents + causal, 3 none, 4 two-sided window
    ctxpar_dtype dtype;
    int64_t kv_heads; // of 12 query heads
};

class HybridMpi : public testing::TestWithParam<MpiHybridCase> {};

TEST_P(HybridMpi, MatchesOracleAndSingleRank) {
    const MpiHybridCase &c = GetParam();
    cpt_run_config cfg;
    cpt_run_config_default(&cfg);
    cfg.ranks = Size();
    cfg.seq = 336; // divides by 2P for P in {4, 6, 8}
    cfg.heads = 12;
    cfg.kv_heads = c.kv_heads;
    cfg.head_dim = 32;
    cfg.dtype = c.dtype;
    cfg.params.algo = CTXPAR_ALGO_HYBRID;
    cfg.params.ulysses = c.u;
    cfg.params.layout = c.layout;
    cfg.params.mask = c.mask >= 3 ? CTXPAR_MASK_NONE : CTXPAR_MASK_CAUSAL;
    cfg.params.window_left = c.mask == 1 || c.mask == 4 ? 30 : 0;
    // The band q - 30 < k <= q + 17: narrower than a group's rows, so ring steps are skipped.
    cfg.params.window_right = c.mask == 4 ? 17 : 0;
    if (c.mask == 2) {
        cfg.params.cu_seqlens = kDocs;
        cfg.params.num_docs = 4;
    }
    RunAndCheck(&cfg);
}

// The grids of this run's P (called after MPI_Init, when GoogleTest registers the cases).
std::vector<MpiHybridCase> Cases() {
    const int P = Size();
    std::vector<MpiHybridCase> v;
    int n = 0;
    for (int u : {2, 3, 4}) {
        if (P % u != 0 || P / u < 2)
            continue;
        const int64_t kv[] = {12, u, 1};
        for (ctxpar_layout l :
             {CTXPAR_LAYOUT_CONTIGUOUS, CTXPAR_LAYOUT_ZIGZAG, CTXPAR_LAYOUT_STRIPED})
            for (int m = 0; m < 5; m++) {
                v.push_back({u, l, m, n % 2 ? CTXPAR_DTYPE_BF16 : CTXPAR_DTYPE_F32, kv[n % 3]});
                n++;
            }
    }
    return v;
}

std::string Name(const testing::TestParamInfo<MpiHybridCase> &info) {
    const MpiHybridCase &c = info.param;
    const char *mask[] = {"causal", "causal_window", "docs_causal", "none", "two_sided_window"};
    return "u" + std::to_string(c.u) + "_" + ctxpar_layout_name(c.layout) + "_" + mask[c.mask] +
           "_" + ctxpar_dtype_name(c.dtype) + "_KV" + std::to_string(c.kv_heads);
}

INSTANTIATE_TEST_SUITE_P(Grids, HybridMpi, testing::ValuesIn(Cases()), Name);

// What the ring supports besides masks and layouts, in groups of 2 (every P here).
enum Feature { kUneven, kCustom, kMla, kSinksSoftcap };
const char *const kFeatureName[] = {"uneven_zigzag", "custom_random", "mla", "sinks_softcap"};
const float kSinkLogits[12] = {-2.0f, 0.5f, 3.0f, 6.5f, -0.25f, 1.75f,
                               4.0f,  9.0f, 1.0f, -1.0f, 2.5f,  5.0f};

class HybridMpiFeatures : public testing::TestWithParam<int> {};

TEST_P(HybridMpiFeatures, MatchOracleAndSingleRank) {
    const Feature f = static_cast<Feature>(GetParam());
    const int P = Size();
    cpt_run_config cfg;
    cpt_run_config_default(&cfg);
    cfg.ranks = P;
    cfg.seq = 336;
    cfg.heads = 12;
    cfg.kv_heads = f == kMla ? 1 : 2; // replicated to both members, or one each
    cfg.head_dim = 32;
    cfg.dtype = f == kCustom || f == kSinksSoftcap ? CTXPAR_DTYPE_BF16 : CTXPAR_DTYPE_F32;
    cfg.params.algo = CTXPAR_ALGO_HYBRID;
    cfg.params.ulysses = 2;
    cfg.params.layout = CTXPAR_LAYOUT_ZIGZAG;
    cfg.params.mask = CTXPAR_MASK_CAUSAL;
    std::vector<int32_t> assign;
    switch (f) {
    case kUneven:
        cfg.seq = 331; // prime: shards and groups of different sizes
        break;
    case kCustom: {
        cfg.seq = 331;
        uint64_t x = 0x9e3779b97f4a7c15ull;
        for (int64_t t = 0; t < cfg.seq; t++) { // the same on every rank
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            assign.push_back(static_cast<int32_t>(x % static_cast<uint64_t>(P)));
        }
        cfg.params.layout = CTXPAR_LAYOUT_CUSTOM;
        cfg.params.assignment = assign.data();
        break;
    }
    case kMla:
        cfg.head_dim = 48;
        cfg.head_dim_v = 32;
        break;
    case kSinksSoftcap:
        cfg.params.sinks = kSinkLogits;
        cfg.params.softcap = 2.0f;
        cfg.params.softmax_scale = 0.4f;
        cfg.params.cu_seqlens = kDocs;
        cfg.params.num_docs = 4;
        break;
    }
    RunAndCheck(&cfg);
}

INSTANTIATE_TEST_SUITE_P(All, HybridMpiFeatures, testing::Range(0, 4),
                         [](const testing::TestParamInfo<int> &info) {
                             return std::string(kFeatureName[info.param]);
                         });

} // namespace
