// Random masks and spans over a short sequence, for checking a mask pair by pair against the
// oracle's own predicate (cpt_oracle_visibility): the work statistics' count (visible_pairs_test)
// and each device's block ops (device_conformance.cc) draw from the same generator.
#ifndef CPT_TESTING_RANDOM_MASK_H
#define CPT_TESTING_RANDOM_MASK_H

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "ctxpar_backend.h"

namespace cpt_mask {

// Positions of a span, as the oracle takes them.
inline std::vector<int64_t> Positions(const ctxpar_span &s) {
    std::vector<int64_t> p(static_cast<size_t>(s.len));
    for (int64_t i = 0; i < s.len; i++)
        p[static_cast<size_t>(i)] = s.start + i * s.stride;
    return p;
}

// A span of `len` positions with `stride` inside [0, S).
inline ctxpar_span RandomSpan(std::mt19937 &rng, int64_t S, int64_t stride) {
    const int64_t max_len = (S - 1) / stride + 1;
    const int64_t len = 1 + static_cast<int64_t>(rng() % static_cast<uint32_t>(max_len));
    const int64_t room = S - ((len - 1) * stride + 1);
    const int64_t start = static_cast<int64_t>(rng() % static_cast<uint32_t>(room + 1));
    return ctxpar_span{start, len, stride};
}

// A span inside [0, S), consecutive three times in four, else with a stride of 1 to 4.
inline ctxpar_span RandomSpan(std::mt19937 &rng, int64_t S) {
    return RandomSpan(rng, S, rng() % 4 ? 1 : 1 + static_cast<int64_t>(rng() % 4));
}

// How documents are drawn: none one time in none_one_in, else 1..max_docs of them, each
// boundary 0..S / spread_div past the last (non-decreasing: some documents empty).
struct DocsDraw {
    uint32_t none_one_in;
    int max_docs;
    int64_t spread_div;
};

// A random mask over [0, S): causal or not, a left window, a right one (without causal), and
// documents as `docs` says, whose boundaries live in *cu (which must outlive the mask).
inline ctxpar_mask_desc RandomMask(std::mt19937 &rng, int64_t S, const DocsDraw &docs,
                                   std::vector<int32_t> *cu) {
    ctxpar_mask_desc m = {};
    m.causal = rng() % 2;
    m.window_left = rng() % 3 ? 0 : 1 + static_cast<int64_t>(rng() % 12);
    m.window_right = m.causal || rng() % 3 ? 0 : 1 + static_cast<int64_t>(rng() % 12);
    cu->clear();
    if (rng() % docs.none_one_in) {
        const int n = 1 + static_cast<int>(rng() % static_cast<uint32_t>(docs.max_docs));
        cu->push_back(0);
        for (int d = 1; d < n; d++)
            cu->push_back(std::min<int32_t>(
                static_cast<int32_t>(S),
                cu->back() +
                    static_cast<int32_t>(rng() % static_cast<uint32_t>(S / docs.spread_div + 1))));
        cu->push_back(static_cast<int32_t>(S));
        m.cu_seqlens = cu->data();
        m.num_docs = n;
    }
    return m;
}

// The same over a sequence of 1..max_s positions (its length in *S), documents one time in two,
// up to 6 of them.
inline ctxpar_mask_desc RandomMask(std::mt19937 &rng, int64_t max_s, int64_t *S,
                                   std::vector<int32_t> *cu) {
    *S = 1 + static_cast<int64_t>(rng() % static_cast<uint32_t>(max_s));
    return RandomMask(rng, *S, DocsDraw{2, 6, 2}, cu);
}

// Span s (its stride kept, shortened where it is too long) at a random place inside [lo, hi],
// with its last row at `last`, or with its first row at `first`.
inline void PlaceInside(std::mt19937 &rng, int64_t lo, int64_t hi, ctxpar_span *s) {
    s->len = std::min(s->len, (hi - lo) / s->stride + 1);
    const int64_t ext = (s->len - 1) * s->stride;
    s->start = lo + static_cast<int64_t>(rng() % static_cast<uint32_t>(hi - ext - lo + 1));
}
inline void EndAt(int64_t last, int64_t lo, ctxpar_span *s) {
    s->len = std::min(s->len, (last - lo) / s->stride + 1);
    s->start = last - (s->len - 1) * s->stride;
}
inline void StartAt(int64_t first, int64_t hi, ctxpar_span *s) {
    s->len = std::min(s->len, (hi - first) / s->stride + 1);
    s->start = first;
}

// With documents: one span (q or k) ends on a boundary or starts on it, or crosses it by one
// row. Three times in four both spans are then cut to the documents beside the boundary (the
// other inside the one on that side): the pairs that decide whether a tile is FULL; else the
// span keeps its rows in other documents. False where the mask has no boundary inside (0, S).
inline bool ShiftToADocumentEdge(std::mt19937 &rng, int64_t S, const ctxpar_mask_desc &m,
                                 ctxpar_span *q, ctxpar_span *k) {
    std::vector<int64_t> inner; // boundaries with positions on both sides
    for (int64_t d = 1; m.cu_seqlens && d < m.num_docs; d++)
        if (m.cu_seqlens[d] > 0 && m.cu_seqlens[d] < S)
            inner.push_back(m.cu_seqlens[d]);
    if (inner.empty())
        return false;
    const int64_t c = inner[rng() % inner.size()];
    int64_t lo = 0, hi = S - 1; // the documents of positions c - 1 and c: [lo, c), [c, hi]
    for (int64_t d = 0; d <= m.num_docs; d++) {
        const int64_t b = m.cu_seqlens[d];
        lo = b < c ? std::max(lo, b) : lo;
        hi = b > c ? std::min(hi, b - 1) : hi;
    }
    const bool move_k = rng() % 2, before = rng() % 2, tight = rng() % 4 != 0;
    const int64_t off = static_cast<int64_t>(rng() % 2); // on the boundary, or one row across
    ctxpar_span *edge = move_k ? k : q, *inside = move_k ? q : k;
    if (before) { // its last row at c - 1, or at c (across)
        EndAt(c - 1 + off, tight ? lo : 0, edge);
        if (tight)
            PlaceInside(rng, lo, c - 1, inside);
    } else { // its first row at c, or at c - 1 (across)
        StartAt(c - off, tight ? hi : S - 1, edge);
        if (tight)
            PlaceInside(rng, c, hi, inside);
    }
    return true;
}

// Moves the spans so that a corner pair of the block sits on a limit of the mask or one past
// it, where a tile's FULL or SKIP claim is decided: the edges random spans seldom hit. With
// documents a document's edge (ShiftToADocumentEdge); else, or where that fits nowhere, a causal
// or window limit: span k moved, or else span q (lengths and strides kept). Leaves both as they
// are where no move fits in [0, S) or the mask has no limit: returns whether it moved one.
inline bool ShiftToAnEdge(std::mt19937 &rng, int64_t S, const ctxpar_mask_desc &m, ctxpar_span *q,
                          ctxpar_span *k) {
    const int64_t qmin = q->start, qmax = q->start + (q->len - 1) * q->stride;
    const int64_t qext = qmax - qmin, kext = (k->len - 1) * k->stride;
    const int64_t off = static_cast<int64_t>(rng() % 2); // on the limit, or one past it
    std::vector<int64_t> kmin;                           // candidate starts of k
    if (m.causal) {
        kmin.push_back(qmin + off - kext); // kmax = qmin (+1): every pair visible, or not
        kmin.push_back(qmax + off);        // kmin = qmax (+1): some pair visible, or none
    }
    if (m.window_left > 0) {
        kmin.push_back(qmax - m.window_left + 1 - off);        // qmax - kmin = W - 1 (W)
        kmin.push_back(qmin - m.window_left + 1 - off - kext); // qmin - kmax = W - 1 (W)
    }
    if (m.window_right > 0) {
        kmin.push_back(qmin + m.window_right + off - kext); // kmax - qmin = R (R + 1)
        kmin.push_back(qmax + m.window_right + off);        // kmin - qmax = R (R + 1)
    }
    if (m.cu_seqlens && ShiftToADocumentEdge(rng, S, m, q, k))
        return true;
    // From a random candidate on, the first that fits: k moved, or else q the other way (with
    // documents only k, whose boundaries do not move with q).
    const size_t first = kmin.empty() ? 0 : rng() % kmin.size();
    for (size_t c = 0; c < kmin.size(); c++) {
        const int64_t start = kmin[(first + c) % kmin.size()];
        if (start >= 0 && start + kext < S) {
            k->start = start;
            return true;
        }
        const int64_t qstart = q->start - (start - k->start);
        if (!m.cu_seqlens && qstart >= 0 && qstart + qext < S) {
            q->start = qstart;
            return true;
        }
    }
    return false;
}

} // namespace cpt_mask

#endif // CPT_TESTING_RANDOM_MASK_H
