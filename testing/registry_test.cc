// The algorithm table: every ctxpar_algo has a complete entry, and AUTO picks through the
// table's checks and costs, which reproduce the rule docs/algorithms.md states.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "limited_device.h"
#include "registry.h"

namespace {

const ctxpar_algo kAll[] = {CTXPAR_ALGO_RING, CTXPAR_ALGO_ALLGATHER, CTXPAR_ALGO_ALLTOALL,
                            CTXPAR_ALGO_HYBRID, CTXPAR_ALGO_DECODE};

TEST(Registry, EveryAlgorithmHasACompleteEntry) {
    int n = 0;
    const ctxpar_algorithm *const *table = ctxpar_algorithms(&n);
    ASSERT_EQ(n, (int)(sizeof kAll / sizeof kAll[0]));
    std::set<int> ids;
    std::set<std::string> names;
    for (int i = 0; i < n; i++) {
        const ctxpar_algorithm *a = table[i];
        ASSERT_NE(a, nullptr);
        SCOPED_TRACE(i);
        ASSERT_NE(a->name, nullptr);
        EXPECT_NE(a->check, nullptr);
        EXPECT_NE(a->forward, nullptr);
        EXPECT_NE(a->backward, nullptr);
        EXPECT_NE(a->cost, nullptr);
        EXPECT_NE(a->blocks, nullptr);
        EXPECT_NE(a->workspace_bytes, nullptr);
        EXPECT_EQ(a->id, kAll[i]) << "entries are in ctxpar_algo order";
        EXPECT_EQ(ctxpar_algorithm_find(a->id), a);
        EXPECT_STREQ(ctxpar_algo_name(a->id), a->name);
        ids.insert(a->id);
        names.insert(a->name);
    }
    EXPECT_EQ(ids.size(), (size_t)n);
    EXPECT_EQ(names.size(), (size_t)n);
    for (ctxpar_algo a : kAll)
        EXPECT_NE(ctxpar_algorithm_find(a), nullptr) << ctxpar_algo_name(a);
    EXPECT_EQ(ctxpar_algorithm_find(CTXPAR_ALGO_AUTO), nullptr);
    EXPECT_EQ(ctxpar_algorithm_find((ctxpar_algo)99), nullptr);
    EXPECT_STREQ(ctxpar_algo_name(CTXPAR_ALGO_AUTO), "auto");
    EXPECT_STREQ(ctxpar_algo_name((ctxpar_algo)99), "?");
}

ctxpar_problem Problem(int P, int64_t hq, int64_t hkv) {
    ctxpar_problem pb = {};
    pb.rank = 0;
    pb.nranks = P;
    pb.dtype = CTXPAR_DTYPE_F32;
    pb.batch = 1;
    pb.seq_local = 8;
    pb.seq_global = 8 * P;
    pb.heads_q = hq;
    pb.heads_kv = hkv;
    pb.head_dim = 16;
    pb.head_dim_v = 16;
    pb.seq_max = 8;
    pb.scale = 0.25f;
    pb.comm_splits = 1;
    return pb;
}

// The hybrid's cost for groups of u as docs/algorithms.md states it: the all-to-all part
// 4·(Hq + u·hk)·(u-1)/u and the ring part 2·u·hk·(r-1), both x P/(P-1); hk = Hkv/u, or 1 when
// the group replicates one K/V head.
double DocumentedHybridCost(int P, int64_t hq, int64_t hkv, int u) {
    const double hk = hkv % u == 0 ? (double)(hkv / u) : 1.0, c = (double)P / (P - 1);
    return c * (4.0 * ((double)hq + u * hk) * (u - 1) / u + 2.0 * u * hk * (P / u - 1));
}

// The rule as docs/algorithms.md states it, written out independently of the table.
ctxpar_algo DocumentedRule(int P, int64_t hq, int64_t hkv) {
    const bool a2a_fits = hq % P == 0 && (hkv % P == 0 || P % hkv == 0);
    if (a2a_fits && 2 * (hq + hkv) < P * hkv)
        return CTXPAR_ALGO_ALLTOALL;
    // The hybrid when all-to-all cannot run and a group of 1 < u < P ranks moves less than the
    // ring (all-gather's rule below then never holds).
    double best = 2.0 * (double)hkv * P;
    bool hybrid = false;
    for (int u = 2; u < P && u <= 16 && !a2a_fits; u++)
        if (P % u == 0 && hq % u == 0 && (hkv % u == 0 || u % hkv == 0) &&
            DocumentedHybridCost(P, hq, hkv, u) + 0.5 < best) {
            best = DocumentedHybridCost(P, hq, hkv, u) + 0.5;
            hybrid = true;
        }
    if (hybrid)
        return CTXPAR_ALGO_HYBRID;
    if (hkv * P <= hq)
        return CTXPAR_ALGO_ALLGATHER;
    return CTXPAR_ALGO_RING;
}

// With queries shorter than the keys (q_len of S = 8P, head_dim 16 = Dv): decode unless its
// partials cost more than all-gather in the table's unit, whose Q and out beside the gathered
// K/V are q_len rows (docs/algorithms.md).
ctxpar_algo DocumentedShortRule(int P, int64_t hq, int64_t hkv, int64_t q_len) {
    const double decode = (double)hq * P * P * q_len / (8.0 * P) * 17.0 / 16.0;
    const double allgather = 3.0 * hkv * P - (double)hq * q_len / 8.0 - 0.5;
    return decode <= allgather ? CTXPAR_ALGO_DECODE : CTXPAR_ALGO_ALLGATHER;
}

TEST(Registry, AutoPicksTheCheapestAcceptedEntry) {
    int n = 0;
    const ctxpar_algorithm *const *table = ctxpar_algorithms(&n);
    int cases = 0;
    std::set<int> seen;
    for (int P = 1; P <= 16; P++)
        for (int64_t hkv = 1; hkv <= 16; hkv++)
            for (int64_t g = 1; g <= 8; g++)
                for (int64_t q_len : {0, 1, 4 * P, 8 * P}) {
                    const int64_t hq = hkv * g;
                    ctxpar_problem pb = Problem(P, hq, hkv);
                    pb.q_len = q_len;
                    const ctxpar_algorithm *best = nullptr;
                    for (int i = 0; i < n; i++) {
                        if ((q_len && !table[i]->short_queries) ||
                            table[i]->check(&pb) != CTXPAR_OK)
                            continue;
                        if (!best || table[i]->cost(&pb) < best->cost(&pb))
                            best = table[i];
                    }
                    ctxpar_clear_error();
                    const ctxpar_algorithm *got =
                        ctxpar_algorithm_choose(CTXPAR_ALGO_AUTO, &pb, nullptr, 0);
                    ASSERT_EQ(got, best) << "P=" << P << " hq=" << hq << " hkv=" << hkv;
                    ASSERT_EQ(got->id, q_len ? DocumentedShortRule(P, hq, hkv, q_len)
                                             : DocumentedRule(P, hq, hkv))
                        << "P=" << P << " hq=" << hq << " hkv=" << hkv << " q_len=" << q_len;
                    EXPECT_STREQ(ctxpar_last_error(), "") << "a rejecting check leaks its message";
                    seen.insert(got->id);
                    cases++;
                }
    EXPECT_EQ(seen.size(), (size_t)n) << "the sweep reaches every algorithm";
    EXPECT_GT(cases, 1000);
}

TEST(Registry, AnExplicitChoiceIsKept) {
    const ctxpar_problem pb = Problem(4, 6, 3); // all-to-all's check rejects these heads
    for (ctxpar_algo a : kAll)
        EXPECT_EQ(ctxpar_algorithm_choose(a, &pb, nullptr, 0)->id, a);
    EXPECT_EQ(ctxpar_algorithm_find(CTXPAR_ALGO_ALLTOALL)->check(&pb), CTXPAR_ERR_INVALID_ARG);
    EXPECT_NE(std::string(ctxpar_last_error()).find("heads"), std::string::npos);
}

// The device's capability takes part in the choice: a device that refuses blocks of more than
// S/P keys leaves only the ring, whatever the costs prefer, and an explicit choice it cannot run
// is refused with NOT_SUPPORTED and the device's reason.
TEST(Registry, AutoTakesOnlyWhatTheDeviceRuns) {
    for (int P : {2, 4}) {
        // Hq = 8·Hkv: all-gather is the cheapest, and needs blocks of all S keys.
        const ctxpar_problem pb = Problem(P, 8, 1);
        ASSERT_EQ(DocumentedRule(P, 8, 1), CTXPAR_ALGO_ALLGATHER);
        ctxpar_device *full = nullptr, *limited = nullptr;
        ASSERT_EQ(cpt_test_limited_device_create(0, 0, &full), CTXPAR_OK);
        ASSERT_EQ(cpt_test_limited_device_create(0, pb.seq_local, &limited), CTXPAR_OK);
        for (int backward : {0, 1}) {
            SCOPED_TRACE(testing::Message() << "P=" << P << " backward=" << backward);
            EXPECT_EQ(ctxpar_algorithm_choose(CTXPAR_ALGO_AUTO, &pb, full, backward)->id,
                      CTXPAR_ALGO_ALLGATHER);
            EXPECT_EQ(ctxpar_algorithm_choose(CTXPAR_ALGO_AUTO, &pb, limited, backward)->id,
                      CTXPAR_ALGO_RING);
            EXPECT_STREQ(ctxpar_last_error(), "");
            const ctxpar_algorithm *ag = ctxpar_algorithm_find(CTXPAR_ALGO_ALLGATHER);
            EXPECT_EQ(ctxpar_algorithm_check(ag, &pb, full, backward), CTXPAR_OK);
            EXPECT_EQ(ctxpar_algorithm_check(ag, &pb, limited, backward),
                      CTXPAR_ERR_NOT_SUPPORTED);
            EXPECT_STRNE(ctxpar_last_error(), "");
            EXPECT_EQ(ctxpar_algorithm_check(ctxpar_algorithm_find(CTXPAR_ALGO_RING), &pb,
                                             limited, backward),
                      CTXPAR_OK);
        }
        ctxpar_device_destroy(full);
        ctxpar_device_destroy(limited);
    }
}

} // namespace
