// The fp64 oracle against hand-computed cases, and its backward against finite differences.
#include "reference/oracle.h"

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "reference/data.h"

namespace {

using Vec = std::vector<double>;

struct Result {
    Vec out, lse;
};

Result Fwd(const cpt_oracle_shape &sh, const Vec &q, const Vec &k, const Vec &v,
           const int64_t *q_pos = nullptr, const int64_t *k_pos = nullptr,
           const ctxpar_mask_desc *mask = nullptr, double scale = 1.0) {
    Result r;
    r.out.assign(sh.batch * sh.seq_q * sh.heads_q * sh.head_dim, -7.0);
    r.lse.assign(sh.batch * sh.heads_q * sh.seq_q, -7.0);
    cpt_oracle_fwd(&sh, q.data(), k.data(), v.data(), q_pos, k_pos, mask, scale, r.out.data(),
                      r.lse.data());
    return r;
}

Vec Random(uint64_t id, size_t n) {
    Vec x(n);
    for (size_t i = 0; i < n; i++)
        x[i] = cpt_test_value(42, id, i);
    return x;
}

TEST(OracleFwd, OneKeyGivesItsValueAndScore) {
    cpt_oracle_shape sh = {1, 1, 1, 1, 1, 3};
    Vec q = {0.5, -1.0, 2.0}, k = {1.0, 2.0, 0.25}, v = {3.0, -4.0, 5.0};
    Result r = Fwd(sh, q, k, v, nullptr, nullptr, nullptr, 0.5);
    EXPECT_DOUBLE_EQ(r.out[0], 3.0);
    EXPECT_DOUBLE_EQ(r.out[1], -4.0);
    EXPECT_DOUBLE_EQ(r.out[2], 5.0);
    EXPECT_DOUBLE_EQ(r.lse[0], 0.5 * (0.5 - 2.0 + 0.5)); // scale * q.k
}

TEST(OracleFwd, TwoKeysKnownSoftmax) {
    // Scores 1 and 0: weights e/(e+1) and 1/(e+1), lse = log(e + 1).
    cpt_oracle_shape sh = {1, 1, 2, 1, 1, 2};
    Vec q = {1.0, 0.0}, k = {1.0, 7.0, 0.0, 3.0}, v = {2.0, 0.0, 0.0, 4.0};
    Result r = Fwd(sh, q, k, v);
    const double e = std::exp(1.0);
    EXPECT_NEAR(r.out[0], 2.0 * e / (e + 1.0), 1e-15);
    EXPECT_NEAR(r.out[1], 4.0 / (e + 1.0), 1e-15);
    EXPECT_NEAR(r.lse[0], std::log(e + 1.0), 1e-15);
}

TEST(OracleFwd, HugeScoresDoNotOverflow) {
    // Scores 1000 and 999: exp would overflow without subtracting the row maximum.
    cpt_oracle_shape sh = {1, 1, 2, 1, 1, 1};
    Vec q = {1000.0}, k = {1.0, 0.999}, v = {1.0, -1.0};
    Result r = Fwd(sh, q, k, v);
    const double w0 = 1.0 / (1.0 + std::exp(-1.0));
    EXPECT_NEAR(r.out[0], w0 - (1.0 - w0), 1e-12);
    EXPECT_NEAR(r.lse[0], 1000.0 + std::log1p(std::exp(-1.0)), 1e-12);
}

TEST(OracleFwd, CausalFirstRowSeesOnlyItselfLastRowSeesAll) {
    const int64_t S = 4, D = 2;
    cpt_oracle_shape sh = {1, S, S, 1, 1, D};
    Vec q = Random(0, S * D), k = Random(1, S * D), v = Random(2, S * D);
    ctxpar_mask_desc causal = {1, 0, nullptr, 0, 0, 0};
    Result r = Fwd(sh, q, k, v, nullptr, nullptr, &causal, 0.7);
    EXPECT_DOUBLE_EQ(r.out[0], v[0]);
    EXPECT_DOUBLE_EQ(r.out[1], v[1]);
    EXPECT_NEAR(r.lse[0], 0.7 * (q[0] * k[0] + q[1] * k[1]), 1e-15);
    // The last row: a softmax over all four keys, computed here directly.
    const double *ql = &q[(S - 1) * D];
    double w[S], sum = 0.0;
    for (int j = 0; j < S; j++) {
        w[j] = std::exp(0.7 * (ql[0] * k[j * D] + ql[1] * k[j * D + 1]));
        sum += w[j];
    }
    for (int d = 0; d < D; d++) {
        double o = 0.0;
        for (int j = 0; j < S; j++)
            o += w[j] / sum * v[j * D + d];
        EXPECT_NEAR(r.out[(S - 1) * D + d], o, 1e-14);
    }
    EXPECT_NEAR(r.lse[S - 1], std::log(sum), 1e-14);
}

TEST(OracleFwd, FullyMaskedRowIsZeroWithMinusInfLse) {
    // A query at position 0 against keys at 5 and 6 under the causal mask sees nothing.
    cpt_oracle_shape sh = {1, 1, 2, 1, 1, 2};
    Vec q = {1.0, 2.0}, k = {1.0, 1.0, 2.0, 2.0}, v = {3.0, 3.0, 4.0, 4.0};
    int64_t qp[] = {0}, kp[] = {5, 6};
    ctxpar_mask_desc causal = {1, 0, nullptr, 0, 0, 0};
    Result r = Fwd(sh, q, k, v, qp, kp, &causal);
    EXPECT_EQ(r.out[0], 0.0);
    EXPECT_EQ(r.out[1], 0.0);
    EXPECT_EQ(r.lse[0], -INFINITY);
    // The backward gives no gradient anywhere.
    Vec dout = {1.0, -1.0}, dq(2, 9.0), dk(4, 9.0), dv(4, 9.0);
    cpt_oracle_bwd(&sh, q.data(), k.data(), v.data(), qp, kp, &causal, 1.0, dout.data(),
                      dq.data(), dk.data(), dv.data());
    for (double x : dq)
        EXPECT_EQ(x, 0.0);
    for (size_t i = 0; i < dk.size(); i++) {
        EXPECT_EQ(dk[i], 0.0);
        EXPECT_EQ(dv[i], 0.0);
    }
}

TEST(OracleFwd, SlidingWindowKeepsTheLastWKeys) {
    // Window 2: query 4 sees keys 3 and 4 only: equal scores (q = 0) average their values.
    const int64_t S = 5;
    cpt_oracle_shape sh = {1, S, S, 1, 1, 1};
    Vec q(S, 0.0), k = Random(1, S), v = {1.0, 2.0, 4.0, 8.0, 16.0};
    ctxpar_mask_desc win = {1, 2, nullptr, 0, 0, 0};
    Result r = Fwd(sh, q, k, v, nullptr, nullptr, &win);
    EXPECT_DOUBLE_EQ(r.out[4], 12.0);
    EXPECT_NEAR(r.lse[4], std::log(2.0), 1e-15);
    EXPECT_DOUBLE_EQ(r.out[0], 1.0);
    // Without causal the window still cuts keys far in the past, but not the future.
    ctxpar_mask_desc win_only = {0, 2, nullptr, 0, 0, 0};
    r = Fwd(sh, q, k, v, nullptr, nullptr, &win_only);
    EXPECT_NEAR(r.out[2], (2.0 + 4.0 + 8.0 + 16.0) / 4.0, 1e-14);
}

TEST(OracleFwd, DocumentsDoNotSeeEachOther) {
    // Documents [0, 2) and [2, 5), no causal mask; q = 0 makes every visible weight equal.
    const int64_t S = 5;
    cpt_oracle_shape sh = {1, S, S, 1, 1, 1};
    Vec q(S, 0.0), k = Random(1, S), v = {1.0, 2.0, 4.0, 8.0, 16.0};
    int32_t cu[] = {0, 2, 5};
    ctxpar_mask_desc docs = {0, 0, cu, 2, 0, 0};
    Result r = Fwd(sh, q, k, v, nullptr, nullptr, &docs);
    EXPECT_NEAR(r.out[0], 1.5, 1e-15);
    EXPECT_NEAR(r.out[1], 1.5, 1e-15);
    for (int i = 2; i < 5; i++) {
        EXPECT_NEAR(r.out[i], 28.0 / 3.0, 1e-14);
        EXPECT_NEAR(r.lse[i], std::log(3.0), 1e-15);
    }
}

TEST(OracleFwd, GqaEqualsExpandedHeads) {
    // Hq = 4, Hkv = 2: head h uses K/V head h/2, the same as copying K/V heads 0,0,1,1.
    const int64_t B = 2, S = 5, Hq = 4, Hk = 2, D = 3;
    cpt_oracle_shape sh = {B, S, S, Hq, Hk, D};
    Vec q = Random(0, B * S * Hq * D), k = Random(1, B * S * Hk * D), v = Random(2, B * S * Hk * D);
    Vec ke(B * S * Hq * D), ve(B * S * Hq * D);
    for (int64_t b = 0; b < B; b++)
        for (int64_t s = 0; s < S; s++)
            for (int64_t h = 0; h < Hq; h++)
                for (int64_t d = 0; d < D; d++) {
                    ke[((b * S + s) * Hq + h) * D + d] = k[((b * S + s) * Hk + h / 2) * D + d];
                    ve[((b * S + s) * Hq + h) * D + d] = v[((b * S + s) * Hk + h / 2) * D + d];
                }
    ctxpar_mask_desc causal = {1, 0, nullptr, 0, 0, 0};
    Result g = Fwd(sh, q, k, v, nullptr, nullptr, &causal, 0.5);
    cpt_oracle_shape mha = {B, S, S, Hq, Hq, D};
    Result e = Fwd(mha, q, ke, ve, nullptr, nullptr, &causal, 0.5);
    EXPECT_EQ(g.out, e.out);
    EXPECT_EQ(g.lse, e.lse);
    // And the heads really differ (a wrong head index would not go unnoticed).
    EXPECT_NE(g.out[0], g.out[D * 2]);
}

TEST(OracleFwd, BadShapeFillsNaNAndSaysWhy) {
    cpt_oracle_shape sh = {1, 1, 1, 3, 2, 1}; // 3 query heads on 2 K/V heads
    Vec q(3, 1.0), k(2, 1.0), v(2, 1.0);
    Result r = Fwd(sh, q, k, v);
    for (double x : r.out)
        EXPECT_TRUE(std::isnan(x));
    for (double x : r.lse)
        EXPECT_TRUE(std::isnan(x));
    EXPECT_NE(std::strstr(ctxpar_last_error(), "heads_q 3"), nullptr) << ctxpar_last_error();
    Vec dout(3, 1.0), dq(3, 0.0), dk(2, 0.0), dv(2, 0.0);
    cpt_oracle_bwd(&sh, q.data(), k.data(), v.data(), nullptr, nullptr, nullptr, 1.0,
                      dout.data(), dq.data(), dk.data(), dv.data());
    for (double x : dq)
        EXPECT_TRUE(std::isnan(x));
    for (size_t i = 0; i < dk.size(); i++) {
        EXPECT_TRUE(std::isnan(dk[i]));
        EXPECT_TRUE(std::isnan(dv[i]));
    }
}

// Backward against central differences of L = sum(out * W), in float64: every element of q, k
// and v (and of the sinks), with GQA, a causal sliding window, documents, cross positions, fully
// masked rows, and the features (MLA, right windows, soft-capping, sinks, per-row documents).
struct FdCase {
    cpt_oracle_shape sh;
    std::vector<int64_t> q_pos, k_pos;
    ctxpar_mask_desc mask;
    cpt_oracle_features f = {};
    Vec sinks; // [Hq] when the case has sinks
};

int64_t DimV(const FdCase &c) {
    return c.f.head_dim_v > 0 ? c.f.head_dim_v : c.sh.head_dim;
}

double Loss(const FdCase &c, const Vec &q, const Vec &k, const Vec &v, const Vec &w,
            const Vec &sinks) {
    cpt_oracle_features f = c.f;
    f.sinks = sinks.empty() ? nullptr : sinks.data();
    Vec out(w.size()), lse(c.sh.batch * c.sh.heads_q * c.sh.seq_q);
    cpt_oracle_fwd_ex(&c.sh, q.data(), k.data(), v.data(), c.q_pos.data(), c.k_pos.data(),
                      &c.mask, &f, 0.6, out.data(), lse.data());
    double l = 0.0;
    for (size_t i = 0; i < w.size(); i++)
        l += out[i] * w[i];
    return l;
}

void CheckAgainstFiniteDifferences(const FdCase &c) {
    const cpt_oracle_shape &sh = c.sh;
    const int64_t dv_dim = DimV(c);
    const size_t nq = sh.batch * sh.seq_q * sh.heads_q * sh.head_dim;
    const size_t nk = sh.batch * sh.seq_k * sh.heads_kv * sh.head_dim;
    const size_t no = sh.batch * sh.seq_q * sh.heads_q * dv_dim;
    const size_t nv = sh.batch * sh.seq_k * sh.heads_kv * dv_dim;
    Vec q = Random(10, nq), k = Random(11, nk), v = Random(12, nv), w = Random(13, no);
    Vec sinks = c.sinks;
    for (double &x : q)
        x *= 2.0; // sharper softmax, so the gradients are not all alike
    Vec dq(nq), dk(nk), dv(nv), dsinks(sh.heads_q, -7.0);
    cpt_oracle_features f = c.f;
    f.sinks = sinks.empty() ? nullptr : sinks.data();
    cpt_oracle_bwd_ex(&sh, q.data(), k.data(), v.data(), c.q_pos.data(), c.k_pos.data(), &c.mask,
                      &f, 0.6, w.data(), dq.data(), dk.data(), dv.data(), dsinks.data());
    const double h = 1e-5;
    double max_grad = 0.0;
    struct Param {
        Vec *x;
        const Vec *g;
        const char *name;
    } params[] = {{&q, &dq, "dq"}, {&k, &dk, "dk"}, {&v, &dv, "dv"}, {&sinks, &dsinks, "dsinks"}};
    for (const Param &p : params) {
        for (size_t i = 0; i < p.x->size(); i++) {
            const double x0 = (*p.x)[i];
            (*p.x)[i] = x0 + h;
            double lp = Loss(c, q, k, v, w, sinks);
            (*p.x)[i] = x0 - h;
            double lm = Loss(c, q, k, v, w, sinks);
            (*p.x)[i] = x0;
            double fd = (lp - lm) / (2.0 * h);
            // Truncation ~h^2 and cancellation ~1e-16/h are both near 1e-10.
            EXPECT_NEAR((*p.g)[i], fd, 1e-8) << p.name << "[" << i << "]";
            max_grad = std::fmax(max_grad, std::fabs(fd));
        }
    }
    if (c.sinks.empty()) {
        for (double g : dsinks)
            EXPECT_EQ(g, 0.0); // no sinks: zero gradients, written
    }
    EXPECT_GT(max_grad, 0.1); // the check compared real gradients, not zeros
}

TEST(OracleBwd, MatchesFiniteDifferencesGqaCausalWindowDocs) {
    FdCase c;
    c.sh = {2, 6, 6, 4, 2, 3};
    c.q_pos = {0, 1, 2, 3, 4, 5};
    c.k_pos = c.q_pos;
    static const int32_t cu[] = {0, 2, 6};
    c.mask = {1, 3, cu, 2, 0, 0};
    CheckAgainstFiniteDifferences(c);
}

TEST(OracleBwd, MatchesFiniteDifferencesCrossBlockWithMaskedRows) {
    // Queries at 0..1 see no key (keys start at 2): their rows and gradients are zero.
    FdCase c;
    c.sh = {1, 4, 5, 2, 1, 4};
    c.q_pos = {0, 1, 5, 6};
    c.k_pos = {2, 3, 4, 5, 6};
    c.mask = {1, 0, nullptr, 0, 0, 0};
    CheckAgainstFiniteDifferences(c);
}

TEST(OracleBwd, MatchesFiniteDifferencesNoMask) {
    FdCase c;
    c.sh = {1, 3, 7, 3, 3, 2};
    c.q_pos = {0, 1, 2};
    c.k_pos = {0, 1, 2, 3, 4, 5, 6};
    c.mask = {0, 0, nullptr, 0, 0, 0};
    CheckAgainstFiniteDifferences(c);
}

TEST(OracleBwd, MatchesFiniteDifferencesMlaSoftcapSinks) {
    // V, out, dO and dV with their own head_dim (3 against q/k's 5), soft-capping at 0.7 (below
    // the scores' size, so tanh is far from linear), a sink per head, causal with one query
    // that sees no key (its row has only the sink).
    FdCase c;
    c.sh = {1, 4, 4, 4, 2, 5};
    c.q_pos = {0, 2, 3, 5};
    c.k_pos = {1, 2, 3, 4};
    c.mask = {1, 0, nullptr, 0, 0, 0};
    c.f.head_dim_v = 3;
    c.f.softcap = 0.7;
    c.sinks = {0.3, -1.2, 2.0, 0.0};
    CheckAgainstFiniteDifferences(c);
}

TEST(OracleBwd, MatchesFiniteDifferencesTwoSidedWindowPerRowDocs) {
    // Non-causal, left window 2 and right window 1; documents differ per batch row and include
    // empty ones (a repeated boundary).
    FdCase c;
    c.sh = {2, 6, 6, 2, 1, 3};
    c.q_pos = {0, 1, 2, 3, 4, 5};
    c.k_pos = c.q_pos;
    c.mask = {0, 2, nullptr, 0, 1, 0};
    static const int32_t cu[] = {0, 0, 4, 6, 6, /* row 1 */ 0, 1, 1, 1, 6};
    c.f.row_cu_seqlens = cu;
    c.f.row_num_docs = 4;
    CheckAgainstFiniteDifferences(c);
}

// The features by hand: one query, two keys.
TEST(OracleFwd, SinkAddsOnceToTheDenominator) {
    cpt_oracle_shape sh = {1, 1, 2, 1, 1, 1};
    Vec q = {1.0}, k = {1.0, 0.0}, v = {2.0, 4.0}, sink = {0.5};
    cpt_oracle_features f = {};
    f.sinks = sink.data();
    Vec out(1), lse(1);
    cpt_oracle_fwd_ex(&sh, q.data(), k.data(), v.data(), nullptr, nullptr, nullptr, &f, 1.0,
                      out.data(), lse.data());
    const double z = std::exp(1.0) + 1.0 + std::exp(0.5);
    EXPECT_NEAR(out[0], (2.0 * std::exp(1.0) + 4.0) / z, 1e-15);
    EXPECT_NEAR(lse[0], std::log(z), 1e-15);
    // Nothing visible: out 0 and lse = the sink (a row is never empty with a sink).
    ctxpar_mask_desc causal = {1, 0, nullptr, 0, 0, 0};
    const int64_t qp[] = {0}, kp[] = {1, 2};
    cpt_oracle_fwd_ex(&sh, q.data(), k.data(), v.data(), qp, kp, &causal, &f, 1.0, out.data(),
                      lse.data());
    EXPECT_EQ(out[0], 0.0);
    EXPECT_DOUBLE_EQ(lse[0], 0.5);
}

TEST(OracleFwd, SoftcapIsTanhOfTheScaledScore) {
    cpt_oracle_shape sh = {1, 1, 2, 1, 1, 1};
    Vec q = {2.0}, k = {3.0, -1.0}, v = {1.0, 0.0};
    cpt_oracle_features f = {};
    f.softcap = 2.0;
    Vec out(1), lse(1);
    cpt_oracle_fwd_ex(&sh, q.data(), k.data(), v.data(), nullptr, nullptr, nullptr, &f, 0.5,
                      out.data(), lse.data());
    const double s0 = 2.0 * std::tanh(3.0 / 2.0), s1 = 2.0 * std::tanh(-1.0 / 2.0);
    EXPECT_NEAR(lse[0], std::log(std::exp(s0) + std::exp(s1)), 1e-15);
    EXPECT_NEAR(out[0], std::exp(s0) / (std::exp(s0) + std::exp(s1)), 1e-15);
}

TEST(OracleFwd, RightWindowAndPerRowEmptyDocuments) {
    cpt_oracle_shape sh = {2, 4, 4, 1, 1, 1};
    static const int32_t cu[] = {0, 2, 2, 4, /* row 1 */ 0, 0, 3, 4};
    cpt_oracle_features f = {};
    f.row_cu_seqlens = cu;
    f.row_num_docs = 3;
    const ctxpar_mask_desc right = {0, 0, nullptr, 0, 1, 0};
    Vec q(8, 0.0), k(8, 0.0), v(8); // equal scores: out is the mean of the visible values
    for (int i = 0; i < 8; i++)
        v[i] = i % 4;
    Vec out(8), lse(8);
    cpt_oracle_fwd_ex(&sh, q.data(), k.data(), v.data(), nullptr, nullptr, &right, &f, 1.0,
                      out.data(), lse.data());
    // Row 0 documents {0,1}, {}, {2,3}; row 1 {}, {0,1,2}, {3}. Query i sees keys <= i + 1.
    const double want[8] = {0.5, 0.5, 2.5, 2.5, /* row 1 */ 0.5, 1.0, 1.0, 3.0};
    for (int i = 0; i < 8; i++)
        EXPECT_DOUBLE_EQ(out[i], want[i]) << i;
}

TEST(OracleFwd, BadFeaturesFillNaN) {
    cpt_oracle_shape sh = {1, 1, 1, 1, 1, 1};
    Vec q = {1.0}, k = {1.0}, v = {1.0}, out(1), lse(1);
    cpt_oracle_features f = {};
    f.softcap = NAN;
    cpt_oracle_fwd_ex(&sh, q.data(), k.data(), v.data(), nullptr, nullptr, nullptr, &f, 1.0,
                      out.data(), lse.data());
    EXPECT_TRUE(std::isnan(out[0]));
    EXPECT_NE(std::string(ctxpar_last_error()).find("softcap"), std::string::npos);
}

} // namespace
