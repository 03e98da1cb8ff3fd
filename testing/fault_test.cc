// Faults between ranks: a delay changes nothing; a dropped message, a dead rank or a corrupted
// transfer becomes an error on every rank within the timeout (never a hang or a crash); nothing
// leaks (run under ASan); and afterwards new comms and contexts work again.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "ctxpar.h"
#include "ctxpar_cpu.h"
#include "ctxpar_local.h"
#include "reference/data.h"
#include "fault_comm.h"

namespace {

constexpr int P = 4;
constexpr int64_t B = 1, S = 256, H = 2, D = 16;

struct RankResult {
    ctxpar_status status = CTXPAR_OK;
    std::string message;
    std::vector<float> out, dq, dk, dv;
};

struct FaultRun {
    RankResult rank[P];
    double seconds = 0;
};

// Ring forward + backward on P threads, each rank's comm wrapped in the fault decorator.
FaultRun RunRanks(const cpt_fault &fault, int verify, double timeout_s,
             ctxpar_algo algo = CTXPAR_ALGO_RING) {
    FaultRun run;
    ctxpar_local_group *group = nullptr;
    EXPECT_EQ(ctxpar_local_group_create(P, &group), CTXPAR_OK);
    auto rank_main = [&](int r) {
        RankResult &res = run.rank[r];
        ctxpar_device *dev = nullptr;
        ctxpar_comm *local = nullptr, *comm = nullptr;
        ctxpar_context *ctx = nullptr;
        ctxpar_cpu_options co = CTXPAR_CPU_OPTIONS_INIT;
        co.num_threads = 1;
        ctxpar_context_options opts = CTXPAR_CONTEXT_OPTIONS_INIT;
        opts.verify_transfers = verify;
        const int64_t s = S / P;
        std::vector<float> q(B * s * H * D), k(q.size()), v(q.size()), dout(q.size());
        res.out.assign(q.size(), 0);
        res.dq.assign(q.size(), 0);
        res.dk.assign(q.size(), 0);
        res.dv.assign(q.size(), 0);
        std::vector<float> lse(B * H * s);
        std::vector<int64_t> pos(s);
        auto T = [&](std::vector<float> &x) {
            return ctxpar_tensor_bshd(x.data(), CTXPAR_DTYPE_F32, B, s, H, D);
        };
        ctxpar_tensor tq = T(q), tk = T(k), tv = T(v), tdout = T(dout), tout = T(res.out),
                      tdq = T(res.dq), tdk = T(res.dk), tdv = T(res.dv);
        ctxpar_attn_params p = CTXPAR_ATTN_PARAMS_INIT;
        p.algo = algo;
        p.layout = CTXPAR_LAYOUT_ZIGZAG;
        p.mask = CTXPAR_MASK_CAUSAL;
        ctxpar_status st = ctxpar_device_create_cpu(&co, &dev);
        if (st == CTXPAR_OK)
            st = ctxpar_comm_create_local(group, r, nullptr, &local);
        if (st == CTXPAR_OK)
            st = cpt_comm_create_fault(local, &fault, &comm);
        if (st == CTXPAR_OK)
            st = ctxpar_comm_set_timeout(comm, timeout_s);
        if (st == CTXPAR_OK)
            st = ctxpar_context_create(dev, comm, &opts, &ctx);
        if (st == CTXPAR_OK)
            st = ctxpar_positions(p.layout, S, r, P, pos.data());
        if (st == CTXPAR_OK) {
            cpt_test_fill(&tq, 7, 1, S, pos.data());
            cpt_test_fill(&tk, 7, 2, S, pos.data());
            cpt_test_fill(&tv, 7, 3, S, pos.data());
            cpt_test_fill(&tdout, 7, 4, S, pos.data());
            st = ctxpar_attn_fwd(ctx, &p, &tq, &tk, &tv, &tout, lse.data(), nullptr);
        }
        if (st == CTXPAR_OK)
            st = ctxpar_attn_bwd(ctx, &p, &tq, &tk, &tv, &tout, lse.data(), &tdout, &tdq, &tdk,
                                 &tdv, nullptr);
        res.status = st;
        res.message = ctxpar_last_error();
        ctxpar_context_destroy(ctx);
        ctxpar_comm_destroy(comm);
        ctxpar_comm_destroy(local);
        ctxpar_device_destroy(dev);
    };
    auto t0 = std::chrono::steady_clock::now();
    std::vector<std::thread> threads;
    for (int r = 0; r < P; r++)
        threads.emplace_back(rank_main, r);
    for (auto &t : threads)
        t.join();
    run.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ctxpar_local_group_destroy(group);
    return run;
}

bool SameBits(const RankResult &a, const RankResult &b) {
    auto eq = [](const std::vector<float> &x, const std::vector<float> &y) {
        return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * 4) == 0;
    };
    return eq(a.out, b.out) && eq(a.dq, b.dq) && eq(a.dk, b.dk) && eq(a.dv, b.dv);
}

const cpt_fault kNoFault = {CPT_FAULT_NONE, 0, 0, 0, 0};

TEST(Fault, DelayChangesNothing) {
    FaultRun clean = RunRanks(kNoFault, 0, 30);
    for (int transfer : {0, 2, 5}) {
        cpt_fault f = {CPT_FAULT_DELAY, 1, transfer, 0.2, 0};
        FaultRun slow = RunRanks(f, 0, 30);
        for (int r = 0; r < P; r++) {
            ASSERT_EQ(slow.rank[r].status, CTXPAR_OK) << slow.rank[r].message;
            EXPECT_TRUE(SameBits(slow.rank[r], clean.rank[r])) << "rank " << r;
        }
    }
}

// Every rank fails with one of `allowed`, and the whole run ends within a few timeouts.
void ExpectAllFail(const FaultRun &run, double timeout_s, const std::string &what) {
    for (int r = 0; r < P; r++) {
        ctxpar_status st = run.rank[r].status;
        EXPECT_TRUE(st == CTXPAR_ERR_TIMEOUT || st == CTXPAR_ERR_REMOTE || st == CTXPAR_ERR_COMM)
            << what << ": rank " << r << " returned " << ctxpar_status_string(st) << ": "
            << run.rank[r].message;
    }
    // Bounded, not timed: a hang would exceed this by far.
    EXPECT_LT(run.seconds, 4 * timeout_s + 10) << what;
}

TEST(Fault, DroppedMessageTimesOutEverywhereAndNewCommsWork) {
    const double timeout = 0.5;
    for (int transfer : {0, 3}) {
        cpt_fault f = {CPT_FAULT_DROP, 2, transfer, 0, 0};
        FaultRun run = RunRanks(f, 0, timeout);
        ExpectAllFail(run, timeout, "drop #" + std::to_string(transfer));
        // The receiver of the dropped message sees the next one arrive under another tag (a comm
        // error naming both), or, if nothing else comes, times out.
        bool someone_detected = false;
        for (int r = 0; r < P; r++)
            someone_detected |= run.rank[r].status == CTXPAR_ERR_TIMEOUT ||
                                run.rank[r].status == CTXPAR_ERR_COMM;
        EXPECT_TRUE(someone_detected) << "the receiver of the dropped message must notice";
    }
    FaultRun again = RunRanks(kNoFault, 0, 30);
    FaultRun clean = RunRanks(kNoFault, 0, 30);
    for (int r = 0; r < P; r++) {
        ASSERT_EQ(again.rank[r].status, CTXPAR_OK) << again.rank[r].message;
        EXPECT_TRUE(SameBits(again.rank[r], clean.rank[r]));
    }
}

TEST(Fault, DeadRankIsReportedAsRemoteWhenItAnnouncesAndTimeoutWhenSilent) {
    const double timeout = 0.5;
    cpt_fault loud = {CPT_FAULT_DEAD, 3, 1, 0, 1};
    FaultRun a = RunRanks(loud, 0, 30); // a long timeout: peers must learn from the abort, not time out
    for (int r = 0; r < P; r++)
        EXPECT_EQ(a.rank[r].status, CTXPAR_ERR_REMOTE) << "rank " << r << ": " << a.rank[r].message;
    EXPECT_LT(a.seconds, 20.0);
    cpt_fault silent = {CPT_FAULT_DEAD, 3, 1, 0, 0};
    FaultRun b = RunRanks(silent, 0, timeout);
    ExpectAllFail(b, timeout, "silent death");
}

TEST(Fault, CorruptionIsCaughtByTransferChecksums) {
    cpt_fault f = {CPT_FAULT_CORRUPT, 0, 1, 0, 0};
    FaultRun run = RunRanks(f, /*verify=*/1, 30);
    // Rank 0's second transfer goes to rank 1: it detects the corruption and names it.
    EXPECT_EQ(run.rank[1].status, CTXPAR_ERR_COMM) << run.rank[1].message;
    EXPECT_NE(run.rank[1].message.find("corrupted transfer"), std::string::npos);
    EXPECT_NE(run.rank[1].message.find("from rank 0"), std::string::npos);
    EXPECT_NE(run.rank[1].message.find("step"), std::string::npos);
    ExpectAllFail(run, 30, "corruption");

    // Without checksums the same fault silently changes the result: why the option exists.
    FaultRun unchecked = RunRanks(f, 0, 30);
    FaultRun clean = RunRanks(kNoFault, 0, 30);
    bool any_diff = false;
    for (int r = 0; r < P; r++) {
        ASSERT_EQ(unchecked.rank[r].status, CTXPAR_OK);
        any_diff |= !SameBits(unchecked.rank[r], clean.rank[r]);
    }
    EXPECT_TRUE(any_diff);
}

TEST(Fault, ChecksumsChangeNothingWhenTransfersAreClean) {
    FaultRun clean = RunRanks(kNoFault, 0, 30);
    FaultRun verified = RunRanks(kNoFault, 1, 30);
    for (int r = 0; r < P; r++) {
        ASSERT_EQ(verified.rank[r].status, CTXPAR_OK) << verified.rank[r].message;
        EXPECT_TRUE(SameBits(verified.rank[r], clean.rank[r]));
    }
}

} // namespace
