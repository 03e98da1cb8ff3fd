// The work statistics' count of visible (query, key) pairs of a block (ctxpar_block_account,
// closed form per document for runs of consecutive positions, per query otherwise) against the
// fp64 oracle's own mask predicate, pair by pair, on random masks (causal, both windows,
// documents with empty ones) and random spans (consecutive and strided).
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "algorithms.h"
#include "reference/oracle.h"

namespace {

// Positions of a span, as the oracle takes them.
std::vector<int64_t> Positions(const ctxpar_span &s) {
    std::vector<int64_t> p(static_cast<size_t>(s.len));
    for (int64_t i = 0; i < s.len; i++)
        p[static_cast<size_t>(i)] = s.start + i * s.stride;
    return p;
}

// A span of `len` positions with `stride` inside [0, S).
ctxpar_span RandomSpan(std::mt19937 &rng, int64_t S, int64_t stride) {
    const int64_t max_len = (S - 1) / stride + 1;
    const int64_t len = 1 + static_cast<int64_t>(rng() % static_cast<uint32_t>(max_len));
    const int64_t room = S - ((len - 1) * stride + 1);
    const int64_t start = static_cast<int64_t>(rng() % static_cast<uint32_t>(room + 1));
    return ctxpar_span{start, len, stride};
}

TEST(VisiblePairs, EqualTheOraclesMaskPairByPair) {
    std::mt19937 rng(2026);
    int compared = 0, partial = 0;
    for (int it = 0; it < 20000; it++) {
        const int64_t S = 1 + static_cast<int64_t>(rng() % 70);
        ctxpar_mask_desc m = {};
        m.causal = rng() % 2;
        m.window_left = rng() % 3 ? 0 : 1 + static_cast<int64_t>(rng() % 12);
        m.window_right = m.causal || rng() % 3 ? 0 : 1 + static_cast<int64_t>(rng() % 12);
        std::vector<int32_t> cu;
        if (rng() % 2) {
            const int docs = 1 + static_cast<int>(rng() % 6);
            cu.push_back(0);
            for (int d = 1; d < docs; d++) // non-decreasing: some documents empty
                cu.push_back(std::min<int32_t>(static_cast<int32_t>(S),
                                               cu.back() + static_cast<int32_t>(rng() % (S / 2 + 1))));
            cu.push_back(static_cast<int32_t>(S));
            m.cu_seqlens = cu.data();
            m.num_docs = docs;
        }
        const ctxpar_span q = RandomSpan(rng, S, rng() % 4 ? 1 : 1 + static_cast<int64_t>(rng() % 4));
        const ctxpar_span k = RandomSpan(rng, S, rng() % 4 ? 1 : 1 + static_cast<int64_t>(rng() % 4));

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

} // namespace
