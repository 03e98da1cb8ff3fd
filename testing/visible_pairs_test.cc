// The work statistics' count of visible (query, key) pairs of a block (ctxpar_block_account,
// closed form per document for runs of consecutive positions, per query otherwise, from the dry
// run's count cache for whole residue classes of keys) against the fp64 oracle's own mask
// predicate, pair by pair, on random masks (causal, both windows, documents with empty ones) and
// random spans (consecutive and strided) and lists of them as the layouts make them.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "algorithms.h"
#include "random_mask.h"
#include "reference/oracle.h"

namespace {

using cpt_mask::Positions;
using cpt_mask::RandomMask;
using cpt_mask::RandomSpan;

TEST(VisiblePairs, EqualTheOraclesMaskPairByPair) {
    std::mt19937 rng(2026);
    int compared = 0, partial = 0;
    for (int it = 0; it < 20000; it++) {
        int64_t S = 0;
        std::vector<int32_t> cu;
        const ctxpar_mask_desc m = RandomMask(rng, 70, &S, &cu);
        const ctxpar_span q = RandomSpan(rng, S);
        const ctxpar_span k = RandomSpan(rng, S);

        // The library's count: FLOPs of one head, one batch row, D = Dv = 1 are 4 per pair.
        ctxpar_work_stats work = {};
        ctxpar_run run = {};
        run.work = &work;
        ctxpar_problem pb = {};
        pb.mask = m;
        pb.batch = 1;
        pb.heads_q = 1;
        pb.head_dim = 1;
        pb.head_dim_v = 1;
        pb.seq_global = S;
        ctxpar_block_account(&run, &pb, ctxpar_spans{&q, 1}, ctxpar_spans{&k, 1});

        // The oracle's: its mask predicate on every pair.
        const std::vector<int64_t> qp = Positions(q), kp = Positions(k);
        const cpt_oracle_shape sh = {1, q.len, k.len, 1, 1, 1};
        std::vector<uint8_t> vis(static_cast<size_t>(q.len * k.len));
        ASSERT_EQ(cpt_oracle_visibility(&sh, qp.data(), kp.data(), &m, vis.data()), CTXPAR_OK);
        int64_t want = 0;
        for (uint8_t v : vis)
            want += v;
        partial += want > 0 && want < q.len * k.len;
        ASSERT_EQ(work.flops, 4.0 * static_cast<double>(want))
            << "S " << S << " causal " << m.causal << " window " << m.window_left << "/"
            << m.window_right << " docs " << m.num_docs << " q [" << q.start << " +" << q.len
            << " x" << q.stride << "] k [" << k.start << " +" << k.len << " x" << k.stride << "]";
        compared++;
    }
    EXPECT_EQ(compared, 20000);
    EXPECT_GT(partial, 5000); // most blocks are partly visible: the count is exercised
}

// Key spans as the layouts make them: whole residue classes of one stride (striped ranks, a
// hybrid group of them), or runs in increasing order (a custom layout).
std::vector<ctxpar_span> RandomKeySpans(std::mt19937 &rng, int64_t S) {
    std::vector<ctxpar_span> k;
    if (rng() % 2) {
        const int64_t d = 2 + static_cast<int64_t>(rng() % 9);
        for (int64_t b = 0; b < d && b < S; b++)
            if (rng() % 2)
                k.push_back({b, (S - b + d - 1) / d, d});
    } else {
        for (int64_t t = static_cast<int64_t>(rng() % 4); t < S;) {
            const int64_t len = std::min<int64_t>(S - t, 1 + static_cast<int64_t>(rng() % 6));
            k.push_back({t, len, 1});
            t += len + 1 + static_cast<int64_t>(rng() % 8);
        }
    }
    if (k.empty())
        k.push_back({0, 1, 1});
    return k;
}

// Lists of spans, with the dry run's count cache and without: the FLOPs equal the oracle's
// count; every (q span, k span) pair is a block computed or skipped, skipped exactly when
// ctxpar_mask_classify calls it SKIP (the key spans beyond a query span's reach are not
// classified one by one), and the block is live when any pair is.
TEST(VisiblePairs, SpanListsWithAndWithoutCountCache) {
    std::mt19937 rng(31);
    ctxpar_count_cache *cache = nullptr;
    ASSERT_EQ(ctxpar_count_cache_create(&cache), CTXPAR_OK);
    int cached = 0;
    for (int it = 0; it < 4000; it++) {
        const int64_t S = 1 + static_cast<int64_t>(rng() % 90);
        std::vector<int32_t> cu;
        const ctxpar_mask_desc m = RandomMask(rng, S, cpt_mask::DocsDraw{4, 12, 4}, &cu);
        std::vector<ctxpar_span> q;
        for (int n = 1 + static_cast<int>(rng() % 3); n > 0; n--)
            q.push_back(RandomSpan(rng, S, rng() % 2 ? 1 : 1 + static_cast<int64_t>(rng() % 6)));
        const std::vector<ctxpar_span> k = RandomKeySpans(rng, S);
        const ctxpar_spans qs = {q.data(), static_cast<int>(q.size())};
        const ctxpar_spans ks = {k.data(), static_cast<int>(k.size())};
        ctxpar_problem pb = {};
        pb.mask = m;
        pb.batch = 1;
        pb.heads_q = 1;
        pb.head_dim = 1;
        pb.head_dim_v = 1;
        pb.seq_global = S;
        ctxpar_work_stats plain = {}, with_cache = {};
        ctxpar_run run = {};
        run.work = &plain;
        const int live = ctxpar_block_account(&run, &pb, qs, ks);
        run.work = &with_cache;
        run.counts = cache;
        EXPECT_EQ(ctxpar_block_account(&run, &pb, qs, ks), live);

        int64_t want = 0, skip = 0;
        for (const ctxpar_span &a : q)
            for (const ctxpar_span &b : k) {
                const std::vector<int64_t> qp = Positions(a), kp = Positions(b);
                const cpt_oracle_shape sh = {1, a.len, b.len, 1, 1, 1};
                std::vector<uint8_t> vis(static_cast<size_t>(a.len * b.len));
                ASSERT_EQ(cpt_oracle_visibility(&sh, qp.data(), kp.data(), &m, vis.data()),
                          CTXPAR_OK);
                for (uint8_t v : vis)
                    want += v;
                int64_t amin, amax, bmin, bmax;
                ctxpar_spans_range(ctxpar_spans{&a, 1}, &amin, &amax);
                ctxpar_spans_range(ctxpar_spans{&b, 1}, &bmin, &bmax);
                skip += ctxpar_mask_classify(&m, amin, amax, bmin, bmax) == CTXPAR_BLOCK_SKIP;
            }
        cached += ctxpar_span_whole_class(&k[0], S);
        const int64_t pairs = static_cast<int64_t>(q.size() * k.size());
        ASSERT_EQ(plain.flops, 4.0 * static_cast<double>(want)) << "iteration " << it;
        ASSERT_EQ(with_cache.flops, plain.flops) << "iteration " << it;
        if (pairs <= 256) { // classified pair by pair
            EXPECT_EQ(static_cast<int64_t>(plain.blocks_skipped), skip) << "iteration " << it;
            EXPECT_EQ(static_cast<int64_t>(plain.blocks_computed), pairs - skip);
            EXPECT_EQ(live, skip < pairs);
            EXPECT_EQ(with_cache.blocks_skipped, plain.blocks_skipped);
        }
    }
    EXPECT_GT(cached, 1000); // the cache's classes were counted often
    ctxpar_count_cache_destroy(cache);
}

} // namespace
