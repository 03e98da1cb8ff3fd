// The rows a sampled check judges (cpt_run_sample_rows): every boundary a distributed run can
// get wrong first (each rank's first and last row, each layout chunk's), then random rows; and
// a sampled check's verdict against the whole one's.
#include <algorithm>
#include <set>
#include <vector>

#include <gtest/gtest.h>

#include "ctxpar.h"
#include "reference/runner.h"

namespace {

cpt_run_config Config(ctxpar_layout layout, int ranks, int64_t seq, int64_t rows) {
    cpt_run_config c;
    cpt_run_config_default(&c);
    c.params.layout = layout;
    c.ranks = ranks;
    c.seq = seq;
    c.rows = rows;
    return c;
}

// Every position that starts or ends a run of consecutive positions on some rank.
std::set<int64_t> Boundaries(const cpt_run_config &c) {
    std::set<int64_t> b;
    for (int r = 0; r < c.ranks; r++) {
        std::vector<int64_t> pos(c.seq + 1);
        int64_t n = 0;
        EXPECT_EQ(ctxpar_shard_count(c.params.layout, nullptr, c.seq, r, c.ranks, &n), CTXPAR_OK);
        EXPECT_EQ(ctxpar_positions(c.params.layout, c.seq, r, c.ranks, pos.data()), CTXPAR_OK);
        for (int64_t s = 0; s < n; s++)
            if (s == 0 || s == n - 1 || pos[s] != pos[s - 1] + 1 || pos[s + 1] != pos[s] + 1)
                b.insert(pos[s]);
    }
    return b;
}

TEST(RunSample, HoldsEveryBoundaryThenRandomRows) {
    for (ctxpar_layout layout : {CTXPAR_LAYOUT_CONTIGUOUS, CTXPAR_LAYOUT_ZIGZAG}) {
        cpt_run_config c = Config(layout, 4, 1001, 64); // uneven shards
        cpt_run_sample s;
        ASSERT_EQ(cpt_run_sample_rows(&c, &s), CTXPAR_OK) << ctxpar_last_error();
        ASSERT_EQ(s.n, 64);
        std::vector<int64_t> rows(s.rows, s.rows + s.n);
        EXPECT_TRUE(std::is_sorted(rows.begin(), rows.end()));
        EXPECT_EQ(std::set<int64_t>(rows.begin(), rows.end()).size(), rows.size());
        const std::set<int64_t> b = Boundaries(c);
        EXPECT_EQ(s.boundaries, int64_t(b.size()));
        EXPECT_GE(b.size(), 8u); // 4 ranks: first and last of each, more with zigzag's chunks
        for (int64_t x : b)
            EXPECT_TRUE(std::binary_search(rows.begin(), rows.end(), x)) << x;
        for (int64_t x : rows)
            EXPECT_TRUE(x >= 0 && x < c.seq);
        // The same seed gives the same rows; another seed other random rows.
        cpt_run_sample again, other;
        ASSERT_EQ(cpt_run_sample_rows(&c, &again), CTXPAR_OK);
        c.seed = 43;
        ASSERT_EQ(cpt_run_sample_rows(&c, &other), CTXPAR_OK);
        EXPECT_TRUE(std::equal(rows.begin(), rows.end(), again.rows));
        EXPECT_FALSE(std::equal(rows.begin(), rows.end(), other.rows));
        cpt_run_sample_free(&s);
        cpt_run_sample_free(&again);
        cpt_run_sample_free(&other);
    }
}

TEST(RunSample, MoreBoundariesThanRowsSpreadsThem) {
    // Striped: every token is its own chunk, so every row is a boundary; 100 of 1000 are kept,
    // spread over the whole sequence.
    cpt_run_config c = Config(CTXPAR_LAYOUT_STRIPED, 4, 1000, 100);
    cpt_run_sample s;
    ASSERT_EQ(cpt_run_sample_rows(&c, &s), CTXPAR_OK);
    EXPECT_EQ(s.n, 100);
    EXPECT_EQ(s.boundaries, 100);
    EXPECT_LT(s.rows[0], 20);
    EXPECT_GT(s.rows[s.n - 1], 980);
    cpt_run_sample_free(&s);
    // rows 0 or >= seq: every row, no list.
    c.rows = 1000;
    ASSERT_EQ(cpt_run_sample_rows(&c, &s), CTXPAR_OK);
    EXPECT_EQ(s.rows, nullptr);
}

TEST(RunSample, SampledCheckJudgesTheSameRowsAsTheWholeOne) {
    // The sampled verdict's largest error/bound cannot exceed the whole one's (a subset of the
    // elements; the relative error can, as its max |ref| is the subset's), its worst position is
    // one of the sampled rows, and both pass.
    cpt_run_config c = Config(CTXPAR_LAYOUT_ZIGZAG, 3, 700, 0);
    c.heads = 2;
    c.kv_heads = 1;
    c.head_dim = 32;
    c.backward = 1;
    cpt_run_result whole, part;
    ASSERT_EQ(cpt_run(&c, &whole), CTXPAR_OK) << ctxpar_last_error();
    c.rows = 40;
    ASSERT_EQ(cpt_run(&c, &part), CTXPAR_OK) << ctxpar_last_error();
    EXPECT_TRUE(whole.ok);
    EXPECT_TRUE(part.ok);
    ASSERT_EQ(part.sample.n, 40);
    for (int i = 0; i < CPT_RUN_TENSORS; i++) {
        EXPECT_LE(part.bound_ratio[i], whole.bound_ratio[i] * (1 + 1e-9)) << i;
        EXPECT_GT(part.bound_ratio[i], 0.0) << i;
        const int64_t p = part.bound_worst[i].position;
        EXPECT_TRUE(std::binary_search(part.sample.rows, part.sample.rows + part.sample.n, p));
        EXPECT_GE(part.bound_worst[i].rank, 0);
        EXPECT_EQ(part.bitwise_single[i], whole.bitwise_single[i]);
    }
    cpt_run_result_free(&whole);
    cpt_run_result_free(&part);
}

} // namespace

namespace {

TEST(RunReferenceFrom, OtherAlgorithmsAreJudgedAgainstAKeptReference) {
    // The ring keeps its reference; the all-gather borrows it and gets the verdict it would get
    // computing its own; a run of other rows cannot borrow it.
    cpt_run_config c = Config(CTXPAR_LAYOUT_ZIGZAG, 2, 300, 50);
    c.backward = 1;
    c.keep_oracle = 1;
    cpt_run_result ring, own, borrowed, refused;
    ASSERT_EQ(cpt_run(&c, &ring), CTXPAR_OK) << ctxpar_last_error();
    c.keep_oracle = 0;
    c.params.algo = CTXPAR_ALGO_ALLGATHER;
    ASSERT_EQ(cpt_run(&c, &own), CTXPAR_OK);
    c.reference_from = &ring;
    ASSERT_EQ(cpt_run(&c, &borrowed), CTXPAR_OK) << ctxpar_last_error();
    EXPECT_EQ(borrowed.reference_time_s, 0.0); // nothing computed again
    for (int i = 0; i < CPT_RUN_TENSORS; i++) {
        EXPECT_EQ(borrowed.error[i], own.error[i]) << i;
        EXPECT_EQ(borrowed.bound_ratio[i], own.bound_ratio[i]) << i;
    }
    c.rows = 60;
    EXPECT_EQ(cpt_run(&c, &refused), CTXPAR_ERR_INVALID_ARG);
    cpt_run_result_free(&ring);
    cpt_run_result_free(&own);
    cpt_run_result_free(&borrowed);
}

} // namespace
