// The mask rule of api/ctxpar_backend.h (ctxpar_mask_interval, and ctxpar_mask_keys_of,
// ctxpar_mask_visible, ctxpar_mask_classify built on it) against the fp64 oracle's own mask
// predicate (cpt_oracle_visibility), pair by pair, on random small problems: causal, windows on
// both sides, documents with empty ones, documents per batch row, positions a little outside the
// sequence. And ctxpar_mask_classify against its form before it was built on the rule, kept here
// only: its decisions steer which blocks run and on which kernel path, so they must not move.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "ctxpar_backend.h"
#include "reference/oracle.h"

namespace {

// ---------------------------------------------------------------- the classify before the rule

// ctxpar_mask_classify's body before it was built on the rule (ctxpar_mask_doc_of and
// ctxpar_mask_row are unchanged since).
ctxpar_block_class ClassifyBefore(const ctxpar_mask_desc *m, int64_t qmin, int64_t qmax,
                                  int64_t kmin, int64_t kmax) {
    if (m->causal && kmin > qmax)
        return CTXPAR_BLOCK_SKIP;
    if (m->window_left > 0 && qmin - kmax >= m->window_left)
        return CTXPAR_BLOCK_SKIP;
    if (m->window_right > 0 && kmin - qmax > m->window_right)
        return CTXPAR_BLOCK_SKIP;
    int full = 1;
    if (m->causal && kmax > qmin)
        full = 0;
    if (m->window_left > 0 && qmax - kmin >= m->window_left)
        full = 0;
    if (m->window_right > 0 && kmax - qmin > m->window_right)
        full = 0;
    if (m->cu_seqlens) {
        int any = 0;
        for (int64_t b = 0; b < (m->doc_rows > 0 ? m->doc_rows : 1); b++) {
            ctxpar_mask_desc r = ctxpar_mask_row(m, b);
            int64_t qd0 = ctxpar_mask_doc_of(&r, qmin), qd1 = ctxpar_mask_doc_of(&r, qmax);
            int64_t kd0 = ctxpar_mask_doc_of(&r, kmin), kd1 = ctxpar_mask_doc_of(&r, kmax);
            if (qd1 < kd0 || kd1 < qd0) {
                full = 0;
                continue;
            }
            any = 1;
            if (!(qd0 == qd1 && kd0 == kd1 && qd0 == kd0))
                full = 0;
        }
        if (!any)
            return CTXPAR_BLOCK_SKIP;
    }
    return full ? CTXPAR_BLOCK_FULL : CTXPAR_BLOCK_PARTIAL;
}

// ---------------------------------------------------------------- random problems

constexpr int64_t kMargin = 3; // positions [-kMargin, S + kMargin): outside the documents too

struct Problem {
    int64_t S = 0, rows = 1; // sequence; batch rows (of documents, when per row)
    std::vector<int32_t> cu;
    ctxpar_mask_desc m = {};
    std::vector<uint8_t> vis; // [rows][P][P], the oracle's, P = S + 2 kMargin
    int64_t P() const { return S + 2 * kMargin; }
    bool Sees(int64_t b, int64_t q, int64_t k) const {
        return vis[static_cast<size_t>((b * P() + q + kMargin) * P() + k + kMargin)] != 0;
    }
};

int64_t Below(std::mt19937 &rng, int64_t n) {
    return static_cast<int64_t>(rng() % n);
}

Problem RandomProblem(std::mt19937 &rng) {
    Problem p;
    p.S = 1 + Below(rng, 40);
    p.m.causal = static_cast<int>(Below(rng, 2));
    p.m.window_left = Below(rng, 3) ? 0 : 1 + Below(rng, p.S + 2);
    p.m.window_right = Below(rng, 3) ? 0 : 1 + Below(rng, p.S + 2); // with causal too
    const int64_t kind = Below(rng, 3); // no documents, one set, one set per batch row
    if (kind > 0) {
        const int64_t docs = 1 + Below(rng, 6);
        p.rows = kind == 2 ? 1 + Below(rng, 3) : 1;
        for (int64_t b = 0; b < p.rows; b++) {
            p.cu.push_back(0);
            for (int64_t d = 1; d < docs; d++) // non-decreasing: some documents empty
                p.cu.push_back(static_cast<int32_t>(
                    std::min<int64_t>(p.S, p.cu.back() + Below(rng, p.S / 2 + 1))));
            p.cu.push_back(static_cast<int32_t>(p.S));
        }
        p.m.cu_seqlens = p.cu.data();
        p.m.num_docs = docs;
        p.m.doc_rows = kind == 2 ? p.rows : 0;
    }
    // The oracle, one batch row at a time (it reads one set of documents).
    std::vector<int64_t> pos(static_cast<size_t>(p.P()));
    for (int64_t i = 0; i < p.P(); i++)
        pos[static_cast<size_t>(i)] = i - kMargin;
    const cpt_oracle_shape shape = {1, p.P(), p.P(), 1, 1, 1};
    p.vis.resize(static_cast<size_t>(p.rows * p.P() * p.P()));
    for (int64_t b = 0; b < p.rows; b++) {
        const ctxpar_mask_desc r = ctxpar_mask_row(&p.m, b);
        EXPECT_EQ(cpt_oracle_visibility(&shape, pos.data(), pos.data(), &r,
                                        p.vis.data() + b * p.P() * p.P()),
                  CTXPAR_OK);
    }
    return p;
}

// ---------------------------------------------------------------- tests

// Every row's interval is exactly the keys the oracle lets it see: each pair, both ends, the row
// itself inside, and the ends non-decreasing in the query (what ctxpar_mask_classify_keys uses).
TEST(MaskRule, IntervalsAreTheOraclesVisibleKeys) {
    std::mt19937 rng(31);
    int64_t pairs = 0, seen = 0;
    for (int it = 0; it < 3000; it++) {
        const Problem p = RandomProblem(rng);
        for (int64_t b = 0; b < p.rows; b++) {
            const ctxpar_mask_desc r = ctxpar_mask_row(&p.m, b);
            int64_t prev_lo = INT64_MIN, prev_hi = INT64_MIN;
            for (int64_t q = -kMargin; q < p.S + kMargin; q++) {
                int64_t lo, hi;
                ctxpar_mask_keys_of(&r, q, &lo, &hi);
                ASSERT_LE(lo, q) << it << " " << b << " " << q;
                ASSERT_GE(hi, q) << it << " " << b << " " << q;
                ASSERT_GE(lo, prev_lo) << it << " " << b << " " << q;
                ASSERT_GE(hi, prev_hi) << it << " " << b << " " << q;
                prev_lo = lo;
                prev_hi = hi;
                int64_t first = INT64_MAX, last = INT64_MIN;
                for (int64_t k = -kMargin; k < p.S + kMargin; k++) {
                    const bool oracle = p.Sees(b, q, k);
                    ASSERT_EQ(ctxpar_mask_visible(&r, q, k) != 0, oracle)
                        << it << " " << b << " " << q << " " << k;
                    if (oracle) {
                        first = std::min(first, k);
                        last = std::max(last, k);
                    }
                    pairs++;
                    seen += oracle;
                }
                // The positions tested end at the margin; the interval may reach beyond.
                ASSERT_EQ(std::max(lo, -kMargin), first) << it << " " << b << " " << q;
                ASSERT_EQ(std::min(hi, p.S + kMargin - 1), last) << it << " " << b << " " << q;
            }
        }
    }
    EXPECT_GT(seen, pairs / 10);
    EXPECT_LT(seen, pairs - pairs / 10);
}

// ctxpar_mask_classify on random rectangles: SKIP means the oracle sees no pair in any batch row,
// FULL every pair in every one, and the decision is the one it made before, every time.
TEST(MaskRule, ClassifyIsSoundAndUnchanged) {
    std::mt19937 rng(2031);
    int64_t count[3] = {0, 0, 0}, exact_partial = 0, per_row = 0;
    for (int it = 0; it < 3000; it++) {
        const Problem p = RandomProblem(rng);
        for (int t = 0; t < 60; t++) {
            const int64_t n = p.P();
            int64_t qmin = Below(rng, n) - kMargin, qmax = Below(rng, n) - kMargin;
            int64_t kmin = Below(rng, n) - kMargin, kmax = Below(rng, n) - kMargin;
            if (qmin > qmax)
                std::swap(qmin, qmax);
            if (kmin > kmax)
                std::swap(kmin, kmax);
            const ctxpar_block_class c = ctxpar_mask_classify(&p.m, qmin, qmax, kmin, kmax);
            ASSERT_EQ(c, ClassifyBefore(&p.m, qmin, qmax, kmin, kmax))
                << it << " " << qmin << ".." << qmax << " x " << kmin << ".." << kmax;
            bool any = false, all = true;
            for (int64_t b = 0; b < p.rows; b++)
                for (int64_t q = qmin; q <= qmax; q++)
                    for (int64_t k = kmin; k <= kmax; k++) {
                        const bool v = p.Sees(b, q, k);
                        any = any || v;
                        all = all && v;
                    }
            if (c == CTXPAR_BLOCK_SKIP) {
                ASSERT_FALSE(any) << it << " " << qmin << ".." << qmax << " x " << kmin << ".."
                                  << kmax;
            }
            if (c == CTXPAR_BLOCK_FULL) {
                ASSERT_TRUE(all) << it << " " << qmin << ".." << qmax << " x " << kmin << ".."
                                 << kmax;
            }
            count[c]++;
            exact_partial += c == CTXPAR_BLOCK_PARTIAL && any && !all;
            per_row += p.m.doc_rows > 1;
        }
    }
    // Every class and documents per batch row came up often.
    EXPECT_GT(count[CTXPAR_BLOCK_SKIP], 10000);
    EXPECT_GT(count[CTXPAR_BLOCK_FULL], 10000);
    EXPECT_GT(exact_partial, 10000);
    EXPECT_GT(per_row, 10000);
}

} // namespace
