// End to end under MPI: the hybrid algorithm with one MPI process per rank (mpi_run.sh runs it
// with -np 4, 6 and 8: the grids u x r = 2x2, 3x2, 2x3, 4x2, 2x4), forward and backward against
// the fp64 oracle (the per-element bound) and P = 1; rank 0 checks, every rank learns the verdict.
// The sub-comms are MPI_Comm_split's (comm/mpi).
#include <gtest/gtest.h>
#include <mpi.h>

#include <string>
#include <vector>

#include "runner.h"
#include "runner_mpi.h"
#include "tolerance.h"

namespace {

int Size() {
    int p = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &p);
    return p;
}

const int32_t kDocs[] = {0, 50, 51, 200, 336}; // lengths 50, 1, 149, 136

struct MpiHybridCase {
    int u;
    ctxpar_layout layout;
    int mask; // 0 causal, 1 causal + window, 2 documents + causal
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
    cfg.params.mask = CTXPAR_MASK_CAUSAL;
    cfg.params.window_left = c.mask == 1 ? 30 : 0;
    if (c.mask == 2) {
        cfg.params.cu_seqlens = kDocs;
        cfg.params.num_docs = 4;
    }
    cfg.backward = 1;
    cfg.threads = 1;
    cpt_run_result r;
    ASSERT_EQ(cpt_run_mpi(&cfg, &r), CTXPAR_OK) << ctxpar_last_error();
    ASSERT_EQ(r.status, CTXPAR_OK) << r.message;
    EXPECT_TRUE(r.ok);
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (rank == 0)
        for (int i = 0; i < CPT_RUN_TENSORS; i++) {
            const char *name = cpt_run_tensor_name(static_cast<cpt_run_tensor>(i));
            EXPECT_LE(r.bound_ratio[i], 1.0) << name << ": worst at position "
                                             << r.bound_worst[i].position << ", head "
                                             << r.bound_worst[i].head;
            EXPECT_TRUE(cpt_error_ratio_ok(r.error[i], r.error_1[i])) << name;
        }
    cpt_run_result_free(&r);
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
            for (int m = 0; m < 3; m++) {
                v.push_back({u, l, m, n % 2 ? CTXPAR_DTYPE_BF16 : CTXPAR_DTYPE_F32, kv[n % 3]});
                n++;
            }
    }
    return v;
}

std::string Name(const testing::TestParamInfo<MpiHybridCase> &info) {
    const MpiHybridCase &c = info.param;
    const char *mask[] = {"causal", "causal_window", "docs_causal"};
    return "u" + std::to_string(c.u) + "_" + ctxpar_layout_name(c.layout) + "_" + mask[c.mask] +
           "_" + ctxpar_dtype_name(c.dtype) + "_KV" + std::to_string(c.kv_heads);
}

INSTANTIATE_TEST_SUITE_P(Grids, HybridMpi, testing::ValuesIn(Cases()), Name);

} // namespace
