// Non-finite inputs: a NaN or an infinity in Q, K, V or dO propagates exactly as the float64
// oracle says, element by element, through the public API with P in-process ranks. A NaN a row
// sees makes that row NaN (never silently dropped); a NaN in a key the row does not see (the
// causal future, another document, outside the window) must not reach it, nor its gradients,
// whichever rank or ring step holds that key.
//
// Through the public API every query sees at least its own key, so no whole row is ever masked;
// the (row, K/V block) pairs that are fully masked on a ring step are exactly what the masked
// scenarios exercise: their partial result is out 0 / lse -inf and must merge as nothing.
// The same contract on one block, for every device (each CPU kernel table and backward schedule,
// CUDA), is the device conformance suite's (device_conformance.cc); here it is the algorithms'.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <ostream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "ctxpar.h"
#include "ctxpar_backend.h"
#include "ctxpar_cpu.h"
#include "ctxpar_local.h"
#include "reference/data.h"
#include "expect_nonfinite.h"
#include "nonfinite_oracle.h"
#include "reference/oracle.h"
#include "reference/tolerance.h"

namespace {

constexpr int64_t B = 1, S = 32, HQ = 4, HKV = 2, D = 16;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

enum Which { kQ = 0, kK = 1, kV = 2, kDout = 3 };
const char *const kWhichName[] = {"q", "k", "v", "dout"};

// Documents of 12, 8 and 12 tokens.
const int32_t kDocs[] = {0, 12, 20, 32};

// By the documented convention (docs/numerics.md) a score of -inf acts as a mask entry: a row
// whose visible scores are all -inf is a fully masked row (out 0, lse -inf, zero gradients), where
// the oracle's literal softmax gives 0/0 = NaN. Such rows are found here from the inputs and the
// reference for them is built from the oracle with the rows left out (ConventionOracle).
struct Scenario {
    const char *name;
    ctxpar_mask mask;
    int64_t window;
    bool docs;
    ctxpar_layout layout;
    Which which; // the tensor that gets the value
    int64_t pos, head, dim;
    double value;
    bool positive_q_row; // make every element of q at `pos` positive (for an exact -inf score)
    bool minus_inf_rows; // some query rows see only -inf scores (the convention applies)
};

const Scenario kScenarios[] = {
    // Every row of the K/V head's query heads sees key 5.
    {"nan_k_visible", CTXPAR_MASK_NONE, 0, false, CTXPAR_LAYOUT_CONTIGUOUS, kK, 5, 0, 3, kNaN,
     false, false},
    // Only rows >= 20 see key 20; rows before it must stay finite.
    {"nan_k_causal_future", CTXPAR_MASK_CAUSAL, 0, false, CTXPAR_LAYOUT_ZIGZAG, kK, 20, 1, 0, kNaN,
     false, false},
    // A masked NaN value: 0 x NaN in a kernel that multiplies masked probabilities would leak.
    {"nan_v_causal_future", CTXPAR_MASK_CAUSAL, 0, false, CTXPAR_LAYOUT_STRIPED, kV, 27, 0, 5, kNaN,
     false, false},
    {"inf_v_causal_future", CTXPAR_MASK_CAUSAL, 0, false, CTXPAR_LAYOUT_CONTIGUOUS, kV, 29, 1, 2,
     kInf, false, false},
    // Key 14 lies in document 1 (tokens 12..19): documents 0 and 2 must not see it.
    {"nan_k_other_document", CTXPAR_MASK_NONE, 0, true, CTXPAR_LAYOUT_CONTIGUOUS, kK, 14, 0, 7,
     kNaN, false, false},
    {"nan_v_other_document_causal", CTXPAR_MASK_CAUSAL, 0, true, CTXPAR_LAYOUT_ZIGZAG, kV, 3, 1, 1,
     kNaN, false, false},
    // Window 5: key 8 is seen by rows 8..12 only.
    {"nan_v_window", CTXPAR_MASK_CAUSAL, 5, false, CTXPAR_LAYOUT_ZIGZAG, kV, 8, 0, 4, kNaN, false,
     false},
    {"nan_k_window_no_causal", CTXPAR_MASK_NONE, 4, false, CTXPAR_LAYOUT_STRIPED, kK, 17, 1, 9,
     kNaN, false, false},
    // A query row with NaN: that row, and the gradients of the keys it sees.
    {"nan_q_causal", CTXPAR_MASK_CAUSAL, 0, false, CTXPAR_LAYOUT_ZIGZAG, kQ, 30, 3, 7, kNaN, false,
     false},
    // +inf in a query: each score of the row is +inf, -inf or NaN by the sign of the key.
    {"inf_q", CTXPAR_MASK_NONE, 0, false, CTXPAR_LAYOUT_ZIGZAG, kQ, 9, 1, 2, kInf, false, false},
    // +inf in a key: rows whose q[1] is positive get a +inf score (NaN row), the others -inf.
    {"inf_k_causal", CTXPAR_MASK_CAUSAL, 0, false, CTXPAR_LAYOUT_CONTIGUOUS, kK, 3, 0, 1, kInf,
     false, false},
    {"neg_inf_v_visible", CTXPAR_MASK_NONE, 0, false, CTXPAR_LAYOUT_STRIPED, kV, 4, 1, 0, -kInf,
     false, false},
    // Row 0 sees only key 0, whose score is exactly -inf: 0/0 in the oracle's softmax.
    {"neg_inf_only_score", CTXPAR_MASK_CAUSAL, 0, false, CTXPAR_LAYOUT_CONTIGUOUS, kK, 0, 0, 0,
     -kInf, true, true},
    // NaN in dO: the forward is finite; the row's dq and the dk, dv of the keys it sees are NaN.
    {"nan_dout_causal", CTXPAR_MASK_CAUSAL, 0, false, CTXPAR_LAYOUT_ZIGZAG, kDout, 6, 0, 0, kNaN,
     false, false},
    {"nan_dout_docs", CTXPAR_MASK_NONE, 0, true, CTXPAR_LAYOUT_STRIPED, kDout, 13, 2, 3, kNaN,
     false, false},
};

// Named in test output; without this GoogleTest prints the struct's bytes, padding included.
void PrintTo(const Scenario &sc, std::ostream *os) {
    *os << sc.name;
}

// Global BSHD doubles (F32 values) for q, k, v, dout, with the scenario's value placed.
struct Inputs {
    std::vector<double> t[4];
};

Inputs MakeInputs(const Scenario &sc) {
    Inputs in;
    const int64_t heads[4] = {HQ, HKV, HKV, HQ};
    for (int i = 0; i < 4; i++) {
        in.t[i].resize(B * S * heads[i] * D);
        cpt_test_fill_global_f64(in.t[i].data(), CTXPAR_DTYPE_F32, 31, i + 1, B, S, heads[i], D);
    }
    if (sc.positive_q_row)
        for (int64_t h = 0; h < HQ; h++)
            for (int64_t d = 0; d < D; d++) {
                double &x = in.t[kQ][(sc.pos * HQ + h) * D + d];
                x = std::fabs(x) + 0.25;
            }
    in.t[sc.which][(sc.pos * heads[sc.which] + sc.head) * D + sc.dim] = sc.value;
    return in;
}

struct Outputs {
    ctxpar_status status = CTXPAR_OK;
    std::string message;
    std::vector<float> t[5]; // out, lse [B, HQ, S], dq, dk, dv: global order
};

// Runs forward and backward on P threads (one rank each) and gathers the results by position.
Outputs RunRanks(const Scenario &sc, const Inputs &in, ctxpar_algo algo, int P,
                 int reproducible) {
    Outputs res;
    const int64_t s = S / P;
    res.t[0].assign(B * S * HQ * D, 0.0f);
    res.t[1].assign(B * HQ * S, 0.0f);
    res.t[2].assign(B * S * HQ * D, 0.0f);
    res.t[3].assign(B * S * HKV * D, 0.0f);
    res.t[4].assign(B * S * HKV * D, 0.0f);
    std::vector<ctxpar_status> status(P, CTXPAR_OK);
    std::vector<std::string> message(P);
    ctxpar_local_group *group = nullptr;
    EXPECT_EQ(ctxpar_local_group_create(P, &group), CTXPAR_OK);

    auto rank_main = [&](int r) {
        std::vector<int64_t> pos(s);
        ctxpar_status st = ctxpar_positions(sc.layout, S, r, P, pos.data());
        // Local rows of a global tensor with `h` heads, as floats.
        auto local = [&](const std::vector<double> &g, int64_t h) {
            std::vector<float> x(B * s * h * D);
            for (int64_t i = 0; i < s; i++)
                for (int64_t e = 0; e < h * D; e++)
                    x[i * h * D + e] = static_cast<float>(g[pos[i] * h * D + e]);
            return x;
        };
        std::vector<float> q = local(in.t[kQ], HQ), k = local(in.t[kK], HKV),
                           v = local(in.t[kV], HKV), dout = local(in.t[kDout], HQ);
        std::vector<float> out(q.size()), dq(q.size()), dk(k.size()), dv(k.size());
        std::vector<float> lse(B * HQ * s);
        auto T = [&](std::vector<float> &x, int64_t h) {
            return ctxpar_tensor_bshd(x.data(), CTXPAR_DTYPE_F32, B, s, h, D);
        };
        ctxpar_tensor tq = T(q, HQ), tk = T(k, HKV), tv = T(v, HKV), tout = T(out, HQ),
                      tdout = T(dout, HQ), tdq = T(dq, HQ), tdk = T(dk, HKV), tdv = T(dv, HKV);
        ctxpar_attn_params p = CTXPAR_ATTN_PARAMS_INIT;
        p.algo = algo;
        p.layout = sc.layout;
        p.reproducible = reproducible;
        p.mask = sc.mask;
        p.window_left = sc.window;
        if (sc.docs) {
            p.cu_seqlens = kDocs;
            p.num_docs = 3;
        }
        ctxpar_cpu_options co = CTXPAR_CPU_OPTIONS_INIT;
        co.num_threads = 1;
        ctxpar_device *dev = nullptr;
        ctxpar_comm *comm = nullptr;
        ctxpar_context *ctx = nullptr;
        if (st == CTXPAR_OK)
            st = ctxpar_device_create_cpu(&co, &dev);
        if (st == CTXPAR_OK)
            st = ctxpar_comm_create_local(group, r, nullptr, &comm);
        if (st == CTXPAR_OK)
            st = ctxpar_context_create(dev, comm, nullptr, &ctx);
        if (st == CTXPAR_OK)
            st = ctxpar_attn_fwd(ctx, &p, &tq, &tk, &tv, &tout, lse.data(), nullptr);
        if (st == CTXPAR_OK)
            st = ctxpar_attn_bwd(ctx, &p, &tq, &tk, &tv, &tout, lse.data(), &tdout, &tdq, &tdk,
                                 &tdv, nullptr);
        status[r] = st;
        message[r] = ctxpar_last_error();
        ctxpar_context_destroy(ctx);
        ctxpar_comm_destroy(comm);
        ctxpar_device_destroy(dev);
        if (st != CTXPAR_OK)
            return;
        // Each rank writes only its own global rows: no two threads touch one element.
        for (int64_t i = 0; i < s; i++) {
            for (int64_t e = 0; e < HQ * D; e++) {
                res.t[0][pos[i] * HQ * D + e] = out[i * HQ * D + e];
                res.t[2][pos[i] * HQ * D + e] = dq[i * HQ * D + e];
            }
            for (int64_t e = 0; e < HKV * D; e++) {
                res.t[3][pos[i] * HKV * D + e] = dk[i * HKV * D + e];
                res.t[4][pos[i] * HKV * D + e] = dv[i * HKV * D + e];
            }
            for (int64_t h = 0; h < HQ; h++)
                res.t[1][h * S + pos[i]] = lse[h * s + i];
        }
    };
    std::vector<std::thread> threads;
    for (int r = 0; r < P; r++)
        threads.emplace_back(rank_main, r);
    for (auto &t : threads)
        t.join();
    ctxpar_local_group_destroy(group);
    for (int r = 0; r < P; r++)
        if (status[r] != CTXPAR_OK && res.status == CTXPAR_OK) {
            res.status = status[r];
            res.message = "rank " + std::to_string(r) + ": " + message[r];
        }
    return res;
}

struct Reference {
    std::vector<double> t[5];
};

// The problem as the convention's oracle takes it: global rows, positions 0..S-1.
cpt_nonfinite::Inputs OracleInputs(const Inputs &in, const ctxpar_mask_desc *mask) {
    // The scale the library resolves: 1/sqrt(D) in float.
    const double scale = 1.0f / std::sqrt(static_cast<float>(D));
    return {{B, S, S, HQ, HKV, D},
            in.t[kQ].data(),
            in.t[kK].data(),
            in.t[kV].data(),
            in.t[kDout].data(),
            nullptr,
            nullptr,
            mask,
            scale};
}

ctxpar_mask_desc Mask(const Scenario &sc) {
    return {
        sc.mask == CTXPAR_MASK_CAUSAL, sc.window, sc.docs ? kDocs : nullptr, sc.docs ? 3 : 0, 0, 0};
}

const char *const kTensorName[5] = {"out", "lse", "dq", "dk", "dv"};

// NaN exactly where the oracle has NaN, the same infinity where it has one, and finite values
// within the F32 tolerance of the largest finite reference value.
void ExpectSameNonFinite(const std::vector<float> &got, const std::vector<double> &ref,
                         const char *name) {
    ::ExpectSameNonFinite(got, ref, cpt_tolerance(CTXPAR_DTYPE_F32, name), name);
}

int64_t CountNonFinite(const std::vector<double> &x) {
    int64_t n = 0;
    for (double e : x)
        n += !std::isfinite(e);
    return n;
}

using Param = std::tuple<Scenario, ctxpar_algo, int, int>; // ..., P, reproducible

std::string ParamName(const testing::TestParamInfo<Param> &info) {
    return std::string(std::get<0>(info.param).name) + "_" +
           ctxpar_algo_name(std::get<1>(info.param)) + "_P" +
           std::to_string(std::get<2>(info.param)) +
           (std::get<3>(info.param) ? "_reproducible" : "");
}

// The same bits, every NaN counting as one value (reproducible mode's NaN is canonical; the
// bits of the finite elements must agree exactly).
void ExpectSameBits(const std::vector<float> &a, const std::vector<float> &b, const char *name) {
    ASSERT_EQ(a.size(), b.size()) << name;
    int64_t differ = 0, first = -1;
    for (size_t i = 0; i < a.size(); i++) {
        const bool same = (a[i] != a[i] && b[i] != b[i]) || std::memcmp(&a[i], &b[i], 4) == 0;
        if (!same && differ++ == 0)
            first = static_cast<int64_t>(i);
    }
    EXPECT_EQ(differ, 0) << name << ": first at " << first;
}

class NonFinite : public testing::TestWithParam<Param> {
  protected:
    // Runs the scenario and compares tensors [first, last) of out, lse, dq, dk, dv.
    void Check(int first, int last) {
        const Scenario &sc = std::get<0>(GetParam());
        Inputs in = MakeInputs(sc);
        const ctxpar_mask_desc mask = Mask(sc);
        const cpt_nonfinite::Inputs oin = OracleInputs(in, &mask);
        const std::vector<cpt_nonfinite::Row> minus_inf = cpt_nonfinite::MinusInfRows(oin);
        ASSERT_EQ(!minus_inf.empty(), sc.minus_inf_rows)
            << minus_inf.size() << " rows see only -inf scores";
        Reference ref;
        cpt_nonfinite::Oracle(oin, minus_inf, &ref.t[0], &ref.t[1], &ref.t[2], &ref.t[3],
                              &ref.t[4]);
        // The scenario means something: some values become non-finite and some stay finite.
        int64_t bad = 0, total = 0;
        for (const auto &t : ref.t) {
            bad += CountNonFinite(t);
            total += static_cast<int64_t>(t.size());
        }
        ASSERT_GT(bad, 0) << "the oracle is finite: the scenario tests nothing";
        ASSERT_LT(bad, total) << "the oracle is all non-finite: the scenario tests nothing";

        const int repro = std::get<3>(GetParam());
        Outputs got =
            RunRanks(sc, in, std::get<1>(GetParam()), std::get<2>(GetParam()), repro);
        ASSERT_EQ(got.status, CTXPAR_OK) << got.message;
        if (repro) { // and the bits of one rank's ring in the mode
            Scenario whole = sc; // one rank holds the sequence in order
            whole.layout = CTXPAR_LAYOUT_CONTIGUOUS;
            Outputs one = RunRanks(whole, in, CTXPAR_ALGO_RING, 1, 1);
            ASSERT_EQ(one.status, CTXPAR_OK) << one.message;
            for (int i = first; i < last; i++)
                ExpectSameBits(got.t[i], one.t[i], kTensorName[i]);
        }
        SCOPED_TRACE(std::string(kWhichName[sc.which]) + "[" + std::to_string(sc.pos) +
                     "] = " + std::to_string(sc.value));
        for (int i = first; i < last; i++)
            ExpectSameNonFinite(got.t[i], ref.t[i], kTensorName[i]);
        // The convention's rows exactly: out 0 and lse -inf forward, dq 0 backward.
        for (const cpt_nonfinite::Row &row : minus_inf)
            for (int64_t d = 0; d < D; d++) {
                const int64_t pos = row.i, h = row.h;
                const int64_t e = (pos * HQ + h) * D + d;
                if (first == 0) {
                    EXPECT_EQ(got.t[0][e], 0.0f) << "out row " << pos << " head " << h;
                    EXPECT_EQ(got.t[1][h * S + pos], -std::numeric_limits<float>::infinity())
                        << "lse row " << pos << " head " << h;
                } else {
                    EXPECT_EQ(got.t[2][e], 0.0f) << "dq row " << pos << " head " << h;
                }
            }
    }
};

TEST_P(NonFinite, ForwardPropagatesAsTheOracleSays) {
    Check(0, 2); // out, lse
}

// Each backward schedule of the CPU device, on one block, is the device conformance suite's
// (its two-pass factory); here the algorithms around the device's default.
TEST_P(NonFinite, BackwardPropagatesAsTheOracleSays) {
    Check(2, 5); // dq, dk, dv
}

INSTANTIATE_TEST_SUITE_P(All, NonFinite,
                         testing::Combine(testing::ValuesIn(kScenarios),
                                          testing::Values(CTXPAR_ALGO_RING, CTXPAR_ALGO_ALLGATHER),
                                          testing::Values(1, 2, 4), testing::Values(0)),
                         ParamName);

// Reproducible mode (docs/numerics.md): the same non-finite outputs as the oracle, and the bits
// of one rank's ring in the mode, from all-to-all over 2 ranks (any layout) and all-gather on
// one in the scenario's layout (at S = 32 a shard of 2 or 4 ranks is not whole chunks of 256:
// the ring and all-gather refuse it).
INSTANTIATE_TEST_SUITE_P(Reproducible, NonFinite,
                         testing::Combine(testing::ValuesIn(kScenarios),
                                          testing::Values(CTXPAR_ALGO_ALLTOALL),
                                          testing::Values(2), testing::Values(1)),
                         ParamName);
INSTANTIATE_TEST_SUITE_P(ReproducibleOneRank, NonFinite,
                         testing::Combine(testing::ValuesIn(kScenarios),
                                          testing::Values(CTXPAR_ALGO_ALLGATHER),
                                          testing::Values(1), testing::Values(1)),
                         ParamName);

} // namespace
