// The planner against real runs: for every algorithm, rank count up to 8 and layout, the mask
// kinds (none, causal, window, documents) in turn,
// the per-rank FLOPs and bytes `ctxpar plan` predicts equal what the library's work statistics
// and comm counted in a real run (in-process ranks, CPU device) - exactly, both being counts;
// the coverage proof holds, and a problem the library refuses is refused by the plan too. Any
// length: uneven shards (a prime length) and fewer tokens than ranks as well.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "algorithms.h"
#include "plan_device.h"
#include "plan_run.h"
#include "testing/runner.h"

namespace {

const int32_t kDocs[] = {0, 30, 31, 100, 100, 192}; // lengths 30, 1, 69, 0, 92
const int32_t kDocsUneven[] = {0, 30, 31, 100, 100, 197};

struct PlanCase {
    ctxpar_algo algo;
    int ranks;
    ctxpar_layout layout;
    int mask; // 0 none, 1 causal, 2 causal + window, 3 documents + causal
    int64_t kv_heads;
    int64_t ulysses;
    int64_t seq = 192;
};

std::string Name(const testing::TestParamInfo<PlanCase> &info) {
    const PlanCase &c = info.param;
    const char *mask[] = {"none", "causal", "window", "docs"};
    return std::string(ctxpar_algo_name(c.algo)) + "_P" + std::to_string(c.ranks) + "_" +
           ctxpar_layout_name(c.layout) + "_" + mask[c.mask] + "_KV" + std::to_string(c.kv_heads) +
           "_U" + std::to_string(c.ulysses) + (c.seq == 192 ? "" : "_S" + std::to_string(c.seq));
}

ctxpar_attn_params Params(const PlanCase &c) {
    ctxpar_attn_params p = CTXPAR_ATTN_PARAMS_INIT;
    p.algo = c.algo;
    p.layout = c.layout;
    p.mask = c.mask ? CTXPAR_MASK_CAUSAL : CTXPAR_MASK_NONE;
    p.window_left = c.mask == 2 ? 40 : 0;
    if (c.mask == 3 && (c.seq == 192 || c.seq == 197)) {
        p.cu_seqlens = c.seq == 192 ? kDocs : kDocsUneven;
        p.num_docs = 5;
    }
    p.ulysses = c.ulysses;
    return p;
}

class PlanMatchesRun : public testing::TestWithParam<PlanCase> {};

TEST_P(PlanMatchesRun, FlopsAndBytesPerRank) {
    const PlanCase &c = GetParam();
    cpt_run_config cfg;
    cpt_run_config_default(&cfg);
    cfg.ranks = c.ranks;
    cfg.batch = 2;
    cfg.seq = c.seq;
    cfg.heads = 12;
    cfg.kv_heads = c.kv_heads;
    cfg.head_dim = 16;
    cfg.dtype = CTXPAR_DTYPE_BF16;
    cfg.params = Params(c);
    cfg.backward = 1;
    cfg.threads = 1;
    cfg.compare_oracle = 0;
    cfg.compare_single = 0;
    cpt_run_result run;
    ASSERT_EQ(cpt_run(&cfg, &run), CTXPAR_OK) << ctxpar_last_error();

    cpt_plan_config pc = {};
    pc.ranks = c.ranks;
    pc.batch = cfg.batch;
    pc.seq = cfg.seq;
    pc.heads = cfg.heads;
    pc.kv_heads = cfg.kv_heads;
    pc.head_dim = cfg.head_dim;
    pc.dtype = cfg.dtype;
    pc.params = cfg.params;
    pc.backward = 1;
    pc.group_size = 2;
    pc.coverage = 1;
    cpt_plan_result plan;
    const ctxpar_status st = cpt_plan_run(&pc, &plan);
    // Any length runs: only the head rules of all-to-all and of the hybrid's groups refuse.
    const bool head_rule = c.algo == CTXPAR_ALGO_ALLTOALL ||
                           (c.algo == CTXPAR_ALGO_HYBRID && c.ulysses > 0 &&
                            c.kv_heads % c.ulysses != 0 && c.ulysses % c.kv_heads != 0);
    if (!head_rule) {
        EXPECT_EQ(st, CTXPAR_OK) << ctxpar_last_error();
    }
    EXPECT_EQ(st, run.status) << "plan: " << ctxpar_last_error() << "; run: " << run.message;
    if (st == CTXPAR_OK && run.status == CTXPAR_OK) {
        EXPECT_EQ(plan.algo, run.algo);
        EXPECT_TRUE(plan.coverage_ok) << "first bad position " << plan.coverage_bad_position;
        EXPECT_GT(plan.pairs_visible, 0);
        for (int r = 0; r < c.ranks; r++) {
            SCOPED_TRACE("rank " + std::to_string(r));
            EXPECT_EQ(plan.rank[r].flops_fwd + plan.rank[r].flops_bwd, run.rank[r].work.flops);
            EXPECT_EQ(plan.rank[r].bytes_sent, run.rank[r].bytes_sent);
            const cpt_plan_traffic &t = plan.rank[r].traffic;
            EXPECT_EQ(t.p2p_bytes[0] + t.p2p_bytes[1] + t.coll_bytes[0] + t.coll_bytes[1],
                      plan.rank[r].bytes_sent)
                << "every byte has a link class";
        }
    }
    if (st == CTXPAR_OK)
        cpt_plan_result_free(&plan);
    cpt_run_result_free(&run);
}

std::vector<PlanCase> Cases() {
    std::vector<PlanCase> v;
    int n = 0;
    for (ctxpar_algo a : {CTXPAR_ALGO_RING, CTXPAR_ALGO_ALLGATHER, CTXPAR_ALGO_ALLTOALL,
                          CTXPAR_ALGO_HYBRID, CTXPAR_ALGO_AUTO})
        for (int p : {1, 2, 3, 4, 6, 8})
            for (ctxpar_layout l :
                 {CTXPAR_LAYOUT_CONTIGUOUS, CTXPAR_LAYOUT_ZIGZAG, CTXPAR_LAYOUT_STRIPED}) {
                // Every mask kind and GQA ratio in turn (periods 4 and 5, coprime with the 3
                // layouts), so that each algorithm meets each of them.
                const int64_t kv[] = {12, 3, 1, 2, 6};
                // The hybrid: groups of 2 where they fit, else the library's choice.
                const int64_t u = a == CTXPAR_ALGO_HYBRID && p % 2 == 0 ? 2 : 0;
                v.push_back({a, p, l, n % 4, kv[n % 5], u});
                n++;
            }
    return v;
}

INSTANTIATE_TEST_SUITE_P(All, PlanMatchesRun, testing::ValuesIn(Cases()), Name);

// Any length: 197 tokens (prime: every layout's shards differ, and so do the hybrid's groups), and
// fewer tokens than ranks (some hold none).
std::vector<PlanCase> UnevenCases() {
    std::vector<PlanCase> v;
    int n = 0;
    for (ctxpar_algo a : {CTXPAR_ALGO_RING, CTXPAR_ALGO_ALLGATHER, CTXPAR_ALGO_ALLTOALL,
                          CTXPAR_ALGO_HYBRID, CTXPAR_ALGO_AUTO})
        for (int p : {3, 4, 8})
            for (ctxpar_layout l :
                 {CTXPAR_LAYOUT_CONTIGUOUS, CTXPAR_LAYOUT_ZIGZAG, CTXPAR_LAYOUT_STRIPED}) {
                const int64_t kv[] = {12, 3, 1, 2, 6};
                const int64_t u = a == CTXPAR_ALGO_HYBRID && p % 2 == 0 ? 2 : 0;
                v.push_back({a, p, l, n % 4, kv[n % 5], u, n % 7 == 6 ? p / 2 + 1 : 197});
                n++;
            }
    return v;
}

INSTANTIATE_TEST_SUITE_P(Uneven, PlanMatchesRun, testing::ValuesIn(UnevenCases()), Name);

// The hybrid's ring positions (ctxpar_layout_map_group): each group holds exactly its members'
// positions, in increasing order, and each member span's first row in the group's rows
// (span_row) holds that span's positions; a zigzag group of any size is at most two spans (what
// keeps the hybrid's plans as fast as the ring's).
TEST(GroupMap, PositionOrderAndEachSpansRows) {
    for (ctxpar_layout l : {CTXPAR_LAYOUT_CONTIGUOUS, CTXPAR_LAYOUT_ZIGZAG, CTXPAR_LAYOUT_STRIPED})
        for (int64_t S : {96, 97, 5})
            for (int u : {1, 2, 4}) {
                SCOPED_TRACE(std::string(ctxpar_layout_name(l)) + " S " + std::to_string(S) +
                             " u " + std::to_string(u));
                const int P = 8;
                ctxpar_layout_map m = {}, g = {};
                ASSERT_EQ(ctxpar_layout_map_make(l, nullptr, S, P, &m), CTXPAR_OK);
                std::vector<int64_t> span_row(static_cast<size_t>(m.first[P]), -1);
                ASSERT_EQ(ctxpar_layout_map_group(&m, u, &g, span_row.data()), CTXPAR_OK);
                ASSERT_EQ(g.nranks, P / u);
                for (int i = 0; i < P / u; i++) {
                    std::vector<int64_t> rows; // the group's positions, row by row
                    const ctxpar_spans gs = ctxpar_layout_map_spans(&g, i);
                    for (int x = 0; x < gs.count; x++)
                        for (int64_t t = 0; t < gs.span[x].len; t++)
                            rows.push_back(gs.span[x].start + t * gs.span[x].stride);
                    ASSERT_EQ(static_cast<int64_t>(rows.size()), g.count[i]);
                    EXPECT_TRUE(std::is_sorted(rows.begin(), rows.end()) ||
                                l == CTXPAR_LAYOUT_STRIPED);
                    int64_t members = 0;
                    for (int j = i * u; j < (i + 1) * u; j++) {
                        members += m.count[j];
                        for (int64_t k = m.first[j]; k < m.first[j + 1]; k++)
                            for (int64_t t = 0; t < m.span[k].len; t++)
                                ASSERT_EQ(rows.at(static_cast<size_t>(span_row[k] + t)),
                                          m.span[k].start + t * m.span[k].stride)
                                    << "rank " << j << " span " << k;
                    }
                    EXPECT_EQ(members, g.count[i]);
                    if (l == CTXPAR_LAYOUT_ZIGZAG && S == 96) {
                        EXPECT_LE(gs.count, 2) << "group " << i; // one where the chunks meet
                    }
                }
                ctxpar_layout_map_free(&g);
                ctxpar_layout_map_free(&m);
            }
}

// The coverage count can fail: a block computed twice shows in its query rows.
TEST(PlanCoverage, CountsABlockComputedTwice) {
    ctxpar_device *dev = nullptr;
    ASSERT_EQ(cpt_plan_device_create(&dev), CTXPAR_OK);
    cpt_plan_cover cover;
    ASSERT_EQ(cpt_plan_cover_init(&cover, 64), CTXPAR_OK);
    cpt_plan_device_record(dev, &cover);
    const ctxpar_span q = {16, 16, 1}, k = {0, 32, 1};
    ctxpar_mask_desc mask = {1, 0, nullptr, 0, 0, 0};
    ctxpar_tensor t =
        ctxpar_tensor_bshd(reinterpret_cast<void *>(4096), CTXPAR_DTYPE_F32, 1, 16, 2, 8);
    ctxpar_tensor tk =
        ctxpar_tensor_bshd(reinterpret_cast<void *>(4096), CTXPAR_DTYPE_F32, 1, 32, 2, 8);
    ctxpar_attn_block blk = {t, tk, tk, {&q, 1}, {&k, 1}, mask, 1.0f, 0.0f, nullptr};
    float *acc = reinterpret_cast<float *>(8192); // never touched by the planner's device
    ASSERT_EQ(ctxpar_dev_attn_block_fwd(dev, &blk, acc, acc, 0, nullptr), CTXPAR_OK);
    cpt_plan_cover_settle(&cover);
    for (int64_t pos = 16; pos < 32; pos++) // causal: keys 0..pos, 2 heads
        EXPECT_EQ(cover.count[pos], 2 * (pos + 1)) << pos;
    ASSERT_EQ(ctxpar_dev_attn_block_fwd(dev, &blk, acc, acc, 0, nullptr), CTXPAR_OK);
    cpt_plan_cover_settle(&cover);
    EXPECT_EQ(cover.count[20], 4 * 21);
    EXPECT_EQ(cover.count[40], 0);
    cpt_plan_cover_free(&cover);
    ctxpar_device_destroy(dev);
}

} // namespace
