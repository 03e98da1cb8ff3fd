// The local comm (ranks = threads), what only it has: barriers among threads, back-to-back
// collectives, progress while the poster computes, timeouts, abort, cancel, device copies, its
// group's usage rules. Every op's results, for P in {1,2,3,4,8}, are in the comm conformance
// suite (comm_conformance.cc).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <functional>
#include <mutex>
#include <sched.h>
#include <string>
#include <thread>
#include <vector>

#include "dispatch.h"
#include "ctxpar_local.h"
#include "testing/comm_conformance.h"

namespace {

using namespace cpt_commconf;


// A barrier for the test's own threads, independent of the comm under test.
class Rendezvous {
  public:
    explicit Rendezvous(int n) : n_(n) {}
    void Arrive() {
        std::unique_lock<std::mutex> lock(mu_);
        uint64_t gen = gen_;
        if (++count_ == n_) {
            count_ = 0;
            gen_++;
            cv_.notify_all();
            return;
        }
        cv_.wait(lock, [&] { return gen_ != gen; });
    }

  private:
    std::mutex mu_;
    std::condition_variable cv_;
    int n_, count_ = 0;
    uint64_t gen_ = 0;
};

// Spins (yielding) until flag is set; false after `limit_s` so that a bug fails instead of hanging.
bool AwaitFlag(const std::atomic<int> &flag, double limit_s = 30) {
    double end = ctxpar_now() + limit_s;
    while (!flag.load()) {
        if (ctxpar_now() > end)
            return false;
        sched_yield();
    }
    return true;
}


using Body = std::function<void(int rank, ctxpar_comm *&comm)>;

// Runs body on P threads, each with the comm of its rank in one group, then destroys the comms
// (a body may destroy its own comm early and set it to nullptr).
void RunRanks(int nranks, const Body &body, double timeout_s = 30,
              const std::vector<ctxpar_device *> &devs = {}) {
    ctxpar_local_group *group = nullptr;
    ASSERT_EQ(ctxpar_local_group_create(nranks, &group), CTXPAR_OK) << ctxpar_last_error();
    std::vector<std::thread> threads;
    for (int r = 0; r < nranks; r++) {
        threads.emplace_back([&, r] {
            ctxpar_comm *comm = nullptr;
            ctxpar_device *dev = devs.empty() ? nullptr : devs[(size_t)r];
            ctxpar_status st = ctxpar_comm_create_local(group, r, dev, &comm);
            EXPECT_EQ(st, CTXPAR_OK) << ctxpar_last_error();
            if (st != CTXPAR_OK)
                return;
            EXPECT_OK(ctxpar_comm_set_timeout(comm, timeout_s));
            body(r, comm);
            ctxpar_comm_destroy(comm);
        });
    }
    for (auto &t : threads)
        t.join();
    ctxpar_local_group_destroy(group);
}

class LocalComm : public ::testing::TestWithParam<int> {
  protected:
    int P() const { return GetParam(); }
};

TEST_P(LocalComm, BarrierWaitsForEveryRank) {
    int p = P();
    std::atomic<int> arrived{0};
    RunRanks(p, [&](int r, ctxpar_comm *&comm) {
        for (int it = 0; it < 20; it++) {
            arrived++;
            EXPECT_OK(ctxpar_comm_barrier(comm));
            EXPECT_GE(arrived.load(), p * (it + 1)) << "rank " << r << " iteration " << it;
        }
    });
}

TEST_P(LocalComm, BackToBackCollectives) {
    int p = P();
    const size_t bytes = 1000, count = 300;
    RunRanks(p, [&](int r, ctxpar_comm *&comm) {
        for (int it = 0; it < 30; it++) {
            uint64_t seed = 5000 + (uint64_t)it;
            std::vector<uint8_t> ag_send = Pattern(seed, r, bytes), ag_recv(bytes * (size_t)p);
            std::vector<uint8_t> a2a_send(bytes * (size_t)p), a2a_recv(bytes * (size_t)p);
            for (size_t i = 0; i < a2a_send.size(); i++)
                a2a_send[i] = ByteAt(seed + 1, r, i);
            std::vector<float> rs_send(count * (size_t)p), rs_recv(count);
            for (size_t i = 0; i < rs_send.size(); i++)
                rs_send[i] = (float)(it + r + (int)i % 5);
            int dst = (r + 1) % p, src = (r - 1 + p) % p;
            std::vector<uint8_t> sr_send = Pattern(seed + 2, r, bytes), sr_recv(bytes);
            // Four ops in flight at once, retired in a different order than posted.
            ctxpar_request *ag = nullptr, *a2a = nullptr, *rs = nullptr, *sr = nullptr;
            EXPECT_OK(
                ctxpar_comm_allgather(comm, ag_send.data(), ag_recv.data(), bytes, nullptr, &ag));
            EXPECT_OK(
                ctxpar_comm_alltoall(comm, a2a_send.data(), a2a_recv.data(), bytes, nullptr, &a2a));
            EXPECT_OK(ctxpar_comm_reduce_scatter(comm, rs_send.data(), rs_recv.data(), count,
                                                 nullptr, &rs));
            EXPECT_OK(ctxpar_comm_sendrecv(comm, sr_send.data(), bytes, dst, sr_recv.data(), bytes,
                                           src, 0, nullptr, &sr));
            EXPECT_OK(ctxpar_comm_wait(comm, sr, nullptr));
            EXPECT_OK(ctxpar_comm_wait(comm, rs, nullptr));
            EXPECT_OK(ctxpar_comm_wait(comm, ag, nullptr));
            EXPECT_OK(ctxpar_comm_wait(comm, a2a, nullptr));
            int64_t total = it;
            EXPECT_OK(ctxpar_comm_allreduce_i64(comm, &total, 1, CTXPAR_REDUCE_SUM));
            EXPECT_EQ(total, (int64_t)it * p);
            for (int j = 0; j < p; j++) {
                std::vector<uint8_t> want = Pattern(seed, j, bytes);
                EXPECT_EQ(FirstDiff(ag_recv.data() + (size_t)j * bytes, want.data(), bytes), -1);
                for (size_t i = 0; i < bytes; i++) {
                    if (a2a_recv[(size_t)j * bytes + i] !=
                        ByteAt(seed + 1, j, (size_t)r * bytes + i)) {
                        ADD_FAILURE() << "alltoall: rank " << r << " block " << j << " i " << i;
                        break;
                    }
                }
            }
            std::vector<uint8_t> want = Pattern(seed + 2, src, bytes);
            EXPECT_EQ(FirstDiff(sr_recv.data(), want.data(), bytes), -1);
            for (size_t i = 0; i < count; i++) {
                double w = 0;
                for (int s = 0; s < p; s++)
                    w += (double)(it + s + (int)((size_t)r * count + i) % 5);
                if ((double)rs_recv[i] != w) {
                    ADD_FAILURE() << "reduce_scatter: rank " << r << " i " << i;
                    break;
                }
            }
        }
    });
}

TEST_P(LocalComm, TestEventuallyReportsDone) {
    int p = P();
    const size_t bytes = 3000, count = 500;
    RunRanks(p, [&](int r, ctxpar_comm *&comm) {
        int dst = (r + 1) % p, src = (r - 1 + p) % p;
        std::vector<uint8_t> send = Pattern(11, r, bytes), recv(bytes);
        std::vector<float> rs_send(count * (size_t)p, 1.0f), rs_recv(count);
        ctxpar_request *sr = nullptr, *rs = nullptr;
        EXPECT_OK(ctxpar_comm_sendrecv(comm, send.data(), bytes, dst, recv.data(), bytes, src, 0,
                                       nullptr, &sr));
        EXPECT_OK(
            ctxpar_comm_reduce_scatter(comm, rs_send.data(), rs_recv.data(), count, nullptr, &rs));
        // Only test() until both are done: it must also drive this rank's reduce_scatter sum,
        // which the other ranks' requests wait for.
        int sr_done = 0, rs_done = 0;
        double end = ctxpar_now() + 30;
        while ((!sr_done || !rs_done) && ctxpar_now() < end) {
            EXPECT_OK(ctxpar_comm_test(comm, sr, &sr_done));
            EXPECT_OK(ctxpar_comm_test(comm, rs, &rs_done));
            sched_yield();
        }
        EXPECT_TRUE(sr_done && rs_done) << "rank " << r;
        EXPECT_OK(ctxpar_comm_wait(comm, sr, nullptr));
        EXPECT_OK(ctxpar_comm_wait(comm, rs, nullptr));
        std::vector<uint8_t> want = Pattern(11, src, bytes);
        EXPECT_EQ(FirstDiff(recv.data(), want.data(), bytes), -1);
        for (size_t i = 0; i < count; i++)
            EXPECT_EQ(rs_recv[i], (float)p);
    });
}

// A receiver that posts and then computes (no comm call) has its data once the sender arrives;
// a sender that posts and computes has its data taken once the receiver arrives.
TEST_P(LocalComm, TransfersProgressWhileThePosterComputes) {
    int p = P();
    if (p < 2)
        GTEST_SKIP() << "needs two ranks";
    const size_t bytes = 100000;
    for (int receiver_first = 0; receiver_first < 2; receiver_first++) {
        std::atomic<int> posted{0}, other_done{0};
        RunRanks(p, [&](int r, ctxpar_comm *&comm) {
            if (r > 1)
                return;
            std::vector<uint8_t> send = Pattern(3, 0, bytes), recv(bytes, 0);
            bool first = (r == 1) == (receiver_first != 0);
            ctxpar_request *req = nullptr;
            if (!first) {
                ASSERT_TRUE(AwaitFlag(posted));
            }
            if (r == 0)
                EXPECT_OK(ctxpar_comm_sendrecv(comm, send.data(), bytes, 1, nullptr, 0, -1, 0, nullptr,
                                               &req));
            else
                EXPECT_OK(ctxpar_comm_sendrecv(comm, nullptr, 0, -1, recv.data(), bytes, 0, 0, nullptr,
                                               &req));
            if (first) {
                posted = 1;
                ASSERT_TRUE(AwaitFlag(other_done)); // "compute" until the peer has finished
                if (r == 1) {                       // the data is already here, before wait
                    EXPECT_EQ(FirstDiff(recv.data(), send.data(), bytes), -1);
                }
                EXPECT_OK(ctxpar_comm_wait(comm, req, nullptr));
            } else {
                EXPECT_OK(ctxpar_comm_wait(comm, req, nullptr));
                other_done = 1;
            }
            if (r == 1) {
                EXPECT_EQ(FirstDiff(recv.data(), send.data(), bytes), -1);
            }
        });
    }
}

TEST_P(LocalComm, MissingRankTimesOutThenRecovers) {
    int p = P();
    if (p < 2)
        GTEST_SKIP() << "needs two ranks";
    Rendezvous all(p);
    const size_t bytes = 64;
    RunRanks(
        p,
        [&](int r, ctxpar_comm *&comm) {
            std::vector<uint8_t> send(bytes, (uint8_t)r), recv(bytes * (size_t)p);
            ctxpar_request *req = nullptr;
            all.Arrive();     // the others post together, so only rank p-1 can be missing
            if (r != p - 1) { // rank p-1 does not arrive in time
                EXPECT_OK(
                    ctxpar_comm_allgather(comm, send.data(), recv.data(), bytes, nullptr, &req));
                ctxpar_status st = ctxpar_comm_wait(comm, req, nullptr);
                EXPECT_EQ(st, CTXPAR_ERR_TIMEOUT) << ctxpar_last_error();
                std::string msg = ctxpar_last_error();
                EXPECT_NE(msg.find("allgather"), std::string::npos) << msg;
                EXPECT_NE(msg.find("timed out after 0.2 s"), std::string::npos) << msg;
            }
            all.Arrive();
            if (r == p - 1) { // arriving late: the others gave up on this op, and it learns so
                EXPECT_OK(
                    ctxpar_comm_allgather(comm, send.data(), recv.data(), bytes, nullptr, &req));
                ctxpar_status st = ctxpar_comm_wait(comm, req, nullptr);
                EXPECT_EQ(st, CTXPAR_ERR_REMOTE) << ctxpar_last_error();
            }
            // The channels are consistent again: the next op works on every rank.
            EXPECT_OK(ctxpar_comm_barrier(comm));
            EXPECT_OK(ctxpar_comm_allgather(comm, send.data(), recv.data(), bytes, nullptr, &req));
            EXPECT_OK(ctxpar_comm_wait(comm, req, nullptr));
            for (int j = 0; j < p; j++)
                EXPECT_EQ(recv[(size_t)j * bytes], (uint8_t)j);
        },
        0.2);
}

TEST_P(LocalComm, SendrecvTimeoutNamesThePeer) {
    int p = P();
    if (p < 2)
        GTEST_SKIP() << "needs two ranks";
    Rendezvous all(p);
    RunRanks(
        p,
        [&](int r, ctxpar_comm *&comm) {
            if (r == 0) {
                uint8_t buf[16];
                ctxpar_request *req = nullptr;
                EXPECT_OK(
                    ctxpar_comm_sendrecv(comm, nullptr, 0, -1, buf, sizeof buf, 1, 0, nullptr, &req));
                EXPECT_EQ(ctxpar_comm_wait(comm, req, nullptr), CTXPAR_ERR_TIMEOUT);
                std::string msg = ctxpar_last_error();
                EXPECT_NE(msg.find("sendrecv"), std::string::npos) << msg;
                EXPECT_NE(msg.find("rank 0 waited for rank 1"), std::string::npos) << msg;
            }
            all.Arrive(); // rank 1 never sends: it waits here until rank 0 gave up
        },
        0.2);
}

TEST_P(LocalComm, RankWithoutCommMakesPeersTimeOut) {
    int p = P();
    if (p < 2)
        GTEST_SKIP() << "needs two ranks";
    ctxpar_local_group *group = nullptr;
    ASSERT_EQ(ctxpar_local_group_create(p, &group), CTXPAR_OK);
    std::vector<std::thread> threads;
    for (int r = 0; r < p - 1; r++) { // rank p-1 never creates its comm
        threads.emplace_back([&, r] {
            ctxpar_comm *comm = nullptr;
            ASSERT_EQ(ctxpar_comm_create_local(group, r, nullptr, &comm), CTXPAR_OK);
            EXPECT_OK(ctxpar_comm_set_timeout(comm, 0.2));
            EXPECT_EQ(ctxpar_comm_barrier(comm), CTXPAR_ERR_TIMEOUT);
            // What to do about it: every rank calls; how many did.
            std::string msg = ctxpar_last_error(), want = std::to_string(p - 1) + " of " +
                                                          std::to_string(p) +
                                                          " ranks made this call";
            EXPECT_NE(msg.find(want), std::string::npos) << msg;
            EXPECT_NE(msg.find("every rank of the comm must make the same calls"),
                      std::string::npos)
                << msg;
            ctxpar_comm_destroy(comm);
        });
    }
    for (auto &t : threads)
        t.join();
    ctxpar_local_group_destroy(group);
}

TEST_P(LocalComm, AbortMakesPeersFailPromptly) {
    int p = P();
    if (p < 2)
        GTEST_SKIP() << "needs two ranks";
    Rendezvous all(p);
    const size_t bytes = 256;
    // A 60 s timeout: only the abort can end the others' waits within the test's time limit.
    RunRanks(
        p,
        [&](int r, ctxpar_comm *&comm) {
            std::vector<uint8_t> send(bytes, 1), recv(bytes * (size_t)p);
            ctxpar_request *req = nullptr;
            all.Arrive();
            if (r == p - 1) {
                ctxpar_comm_abort(comm);
                // The aborted rank's own ops fail too.
                EXPECT_EQ(ctxpar_comm_barrier(comm), CTXPAR_ERR_REMOTE);
            } else {
                ctxpar_status st =
                    ctxpar_comm_allgather(comm, send.data(), recv.data(), bytes, nullptr, &req);
                if (st == CTXPAR_OK)
                    st = ctxpar_comm_wait(comm, req, nullptr);
                EXPECT_EQ(st, CTXPAR_ERR_REMOTE) << ctxpar_last_error();
                std::string msg = ctxpar_last_error();
                EXPECT_NE(msg.find("rank " + std::to_string(p - 1)), std::string::npos) << msg;
            }
            all.Arrive(); // nobody destroys its comm (a second failure) before all have seen it
        },
        60);
}

// split fails the way the parent's ops do: a rank that never calls it makes the others time
// out (with the parent's timeout), an aborted rank makes them fail with REMOTE; and a sub-comm's
// abort reaches the peers of the sub-comm promptly.
TEST_P(LocalComm, SplitTimesOutAndFailsLikeTheParent) {
    int p = P();
    if (p < 2)
        GTEST_SKIP() << "needs two ranks";
    Rendezvous all(p);
    RunRanks(
        p,
        [&](int r, ctxpar_comm *&comm) {
            ctxpar_comm *sub = nullptr;
            if (r != p - 1) { // rank p-1 does not take part
                EXPECT_EQ(ctxpar_comm_split(comm, 0, 0, &sub), CTXPAR_ERR_TIMEOUT)
                    << ctxpar_last_error();
                EXPECT_EQ(sub, nullptr);
            }
            all.Arrive();
        },
        0.2);
    RunRanks(
        p,
        [&](int r, ctxpar_comm *&comm) {
            ctxpar_comm *sub = nullptr;
            if (r == p - 1)
                ctxpar_comm_abort(comm);
            all.Arrive();
            EXPECT_EQ(ctxpar_comm_split(comm, 0, 0, &sub), CTXPAR_ERR_REMOTE)
                << ctxpar_last_error();
            EXPECT_EQ(sub, nullptr);
            all.Arrive();
        },
        60);
    RunRanks(
        p,
        [&](int r, ctxpar_comm *&comm) {
            ctxpar_comm *sub = nullptr;
            ASSERT_EQ(ctxpar_comm_split(comm, 0, 0, &sub), CTXPAR_OK) << ctxpar_last_error();
            EXPECT_OK(ctxpar_comm_set_timeout(sub, 60)); // only the abort can end the wait
            if (r == 0)
                ctxpar_comm_abort(sub);
            else
                EXPECT_EQ(ctxpar_comm_barrier(sub), CTXPAR_ERR_REMOTE) << ctxpar_last_error();
            all.Arrive();
            ctxpar_comm_destroy(sub);
        },
        60);
}

TEST_P(LocalComm, DestroyWhilePeersWaitMakesThemFail) {
    int p = P();
    if (p < 2)
        GTEST_SKIP() << "needs two ranks";
    Rendezvous all(p);
    RunRanks(
        p,
        [&](int r, ctxpar_comm *&comm) {
            all.Arrive();
            if (r == 0) {
                ctxpar_comm_destroy(comm);
                comm = nullptr;
            } else {
                ctxpar_status st = ctxpar_comm_barrier(comm);
                EXPECT_EQ(st, CTXPAR_ERR_REMOTE) << ctxpar_last_error();
                std::string msg = ctxpar_last_error();
                EXPECT_NE(msg.find("rank 0"), std::string::npos) << msg;
            }
            all.Arrive();
        },
        60);
}

// Cancel (or destroy) racing with the peer's matching post, then free the buffers at once: the
// peer either completes with the right bytes or fails with REMOTE, and never touches freed memory
// (run under --config=asan).
TEST_P(LocalComm, CancelThenFreeNeverTouchesTheBuffer) {
    int p = P();
    if (p < 2)
        GTEST_SKIP() << "needs two ranks";
    Rendezvous pair(2);
    const size_t bytes = 20000;
    RunRanks(p, [&](int r, ctxpar_comm *&comm) {
        if (r > 1)
            return;
        for (int it = 0; it < 100; it++) {
            bool sender_cancels = it % 2 == 0;
            uint64_t seed = (uint64_t)it;
            if (r == 0) {
                auto *send = new std::vector<uint8_t>(Pattern(seed, 0, bytes));
                ctxpar_request *req = nullptr;
                EXPECT_OK(ctxpar_comm_sendrecv(comm, send->data(), bytes, 1, nullptr, 0, -1, 0,
                                               nullptr, &req));
                if (sender_cancels) {
                    ctxpar_comm_cancel(comm, req);
                } else {
                    ctxpar_status st = ctxpar_comm_wait(comm, req, nullptr);
                    EXPECT_TRUE(st == CTXPAR_OK || st == CTXPAR_ERR_REMOTE) << ctxpar_last_error();
                }
                delete send;
            } else {
                auto *recv = new std::vector<uint8_t>(bytes, 0);
                ctxpar_request *req = nullptr;
                EXPECT_OK(ctxpar_comm_sendrecv(comm, nullptr, 0, -1, recv->data(), bytes, 0, 0,
                                               nullptr, &req));
                if (sender_cancels) {
                    ctxpar_status st = ctxpar_comm_wait(comm, req, nullptr);
                    EXPECT_TRUE(st == CTXPAR_OK || st == CTXPAR_ERR_REMOTE) << ctxpar_last_error();
                    if (st == CTXPAR_OK) {
                        std::vector<uint8_t> want = Pattern(seed, 0, bytes);
                        EXPECT_EQ(FirstDiff(recv->data(), want.data(), bytes), -1);
                    }
                } else {
                    ctxpar_comm_cancel(comm, req);
                }
                delete recv;
            }
            pair.Arrive();
        }
        // Unretired requests at destroy: the comm retires them; the buffers go right after.
        auto *send = new std::vector<uint8_t>(bytes, 1);
        auto *recv = new std::vector<uint8_t>(bytes * 2);
        ctxpar_request *req = nullptr;
        ctxpar_status st = ctxpar_comm_sendrecv(comm, send->data(), bytes, 1 - r, recv->data(),
                                                bytes, 1 - r, 0, nullptr, &req);
        EXPECT_TRUE(st == CTXPAR_OK || st == CTXPAR_ERR_REMOTE) << ctxpar_last_error(); // peer gone
        ctxpar_comm_destroy(comm);
        comm = nullptr;
        delete send;
        delete recv;
    });
}

INSTANTIATE_TEST_SUITE_P(Ranks, LocalComm, ::testing::Values(1, 2, 3, 4, 8),
                         [](const ::testing::TestParamInfo<int> &info) {
                             return "P" + std::to_string(info.param);
                         });

TEST(LocalCommUsage, MismatchedSizesAndOpsAreUsageErrors) {
    RunRanks(2, [&](int r, ctxpar_comm *&comm) {
        std::vector<uint8_t> a(100, 1), b(200);
        ctxpar_request *req = nullptr;
        // Rank 0 sends 100 bytes, rank 1 expects 50.
        if (r == 0)
            EXPECT_OK(ctxpar_comm_sendrecv(comm, a.data(), 100, 1, nullptr, 0, -1, 0, nullptr, &req));
        else
            EXPECT_OK(ctxpar_comm_sendrecv(comm, nullptr, 0, -1, b.data(), 50, 0, 0, nullptr, &req));
        EXPECT_EQ(ctxpar_comm_wait(comm, req, nullptr), CTXPAR_ERR_INVALID_USAGE);
        std::string msg = ctxpar_last_error();
        EXPECT_NE(msg.find("100 bytes"), std::string::npos) << msg;
        // Rank 0 runs allgather while rank 1 runs alltoall.
        if (r == 0)
            EXPECT_OK(ctxpar_comm_allgather(comm, a.data(), b.data(), 100, nullptr, &req));
        else
            EXPECT_OK(ctxpar_comm_alltoall(comm, b.data(), a.data(), 50, nullptr, &req));
        EXPECT_EQ(ctxpar_comm_wait(comm, req, nullptr), CTXPAR_ERR_INVALID_USAGE);
        msg = ctxpar_last_error();
        EXPECT_NE(msg.find("allgather"), std::string::npos) << msg;
        EXPECT_NE(msg.find("alltoall"), std::string::npos) << msg;
    });
}

TEST(LocalCommUsage, BadArguments) {
    ctxpar_local_group *group = nullptr;
    EXPECT_EQ(ctxpar_local_group_create(0, &group), CTXPAR_ERR_INVALID_ARG);
    EXPECT_EQ(ctxpar_local_group_create(2, nullptr), CTXPAR_ERR_INVALID_ARG);
    ASSERT_EQ(ctxpar_local_group_create(2, &group), CTXPAR_OK);
    ctxpar_comm *comm = nullptr, *twin = nullptr;
    EXPECT_EQ(ctxpar_comm_create_local(group, 2, nullptr, &comm), CTXPAR_ERR_INVALID_ARG);
    EXPECT_EQ(ctxpar_comm_create_local(nullptr, 0, nullptr, &comm), CTXPAR_ERR_INVALID_ARG);
    EXPECT_EQ(ctxpar_comm_create_local(group, 0, nullptr, nullptr), CTXPAR_ERR_INVALID_ARG);
    EXPECT_EQ(comm, nullptr);
    ASSERT_EQ(ctxpar_comm_create_local(group, 0, nullptr, &comm), CTXPAR_OK);
    EXPECT_EQ(ctxpar_comm_create_local(group, 0, nullptr, &twin), CTXPAR_ERR_INVALID_USAGE);
    EXPECT_EQ(twin, nullptr);
    uint8_t buf[64];
    ctxpar_request *req = nullptr;
    EXPECT_EQ(ctxpar_comm_sendrecv(comm, buf, 8, 2, nullptr, 0, -1, 0, nullptr, &req),
              CTXPAR_ERR_INVALID_ARG);
    EXPECT_EQ(ctxpar_comm_sendrecv(comm, buf, 8, 1, nullptr, 0, -1, 0, nullptr, nullptr),
              CTXPAR_ERR_INVALID_ARG);
    EXPECT_EQ(ctxpar_comm_sendrecv(comm, nullptr, 8, 1, nullptr, 0, -1, 0, nullptr, &req),
              CTXPAR_ERR_INVALID_ARG);
    EXPECT_EQ(ctxpar_comm_sendrecv(comm, buf, 32, 1, buf + 16, 32, 1, 0, nullptr, &req),
              CTXPAR_ERR_INVALID_ARG);
    EXPECT_EQ(ctxpar_comm_allgather(comm, buf, buf + 4, 8, nullptr, &req), CTXPAR_ERR_INVALID_ARG);
    EXPECT_EQ(ctxpar_comm_alltoall(comm, buf, buf, 8, nullptr, &req), CTXPAR_ERR_INVALID_ARG);
    EXPECT_EQ(ctxpar_comm_reduce_scatter(comm, nullptr, (float *)buf, 2, nullptr, &req),
              CTXPAR_ERR_INVALID_ARG);
    EXPECT_EQ(ctxpar_comm_allgather(comm, buf, buf + 8, SIZE_MAX / 2 + 1, nullptr, &req),
              CTXPAR_ERR_INVALID_ARG);
    int64_t v = 1;
    EXPECT_EQ(ctxpar_comm_allreduce_i64(comm, &v, 1, (ctxpar_reduce_op)7), CTXPAR_ERR_INVALID_ARG);
    EXPECT_EQ(ctxpar_comm_allreduce_i64(comm, nullptr, 1, CTXPAR_REDUCE_SUM),
              CTXPAR_ERR_INVALID_ARG);
    EXPECT_EQ(ctxpar_comm_test(comm, nullptr, nullptr), CTXPAR_ERR_INVALID_ARG); // no done_out
    EXPECT_EQ(v, 1);
    EXPECT_EQ(req, nullptr); // no failed call wrote its output
    // The group outlives a destroy request while a comm still holds it; destroy(NULL) is a no-op.
    ctxpar_local_group_destroy(group);
    ctxpar_comm_destroy(comm);
    ctxpar_comm_destroy(nullptr);
    ctxpar_local_group_destroy(nullptr);
}

TEST(LocalCommUsage, GroupIsReusableAfterItsComms) {
    ctxpar_local_group *group = nullptr;
    ASSERT_EQ(ctxpar_local_group_create(3, &group), CTXPAR_OK);
    for (int round = 0; round < 3; round++) {
        std::vector<std::thread> threads;
        for (int r = 0; r < 3; r++) {
            threads.emplace_back([&, r] {
                ctxpar_comm *comm = nullptr;
                ASSERT_EQ(ctxpar_comm_create_local(group, r, nullptr, &comm), CTXPAR_OK);
                EXPECT_OK(ctxpar_comm_set_timeout(comm, 30));
                int64_t v = round * 10 + r;
                EXPECT_OK(ctxpar_comm_allreduce_i64(comm, &v, 1, CTXPAR_REDUCE_MAX));
                EXPECT_EQ(v, round * 10 + 2);
                if (round == 1 && r == 2)
                    ctxpar_comm_abort(comm); // a failed round must not spoil the next one
                ctxpar_comm_destroy(comm);
            });
        }
        for (auto &t : threads)
            t.join();
    }
    ctxpar_local_group_destroy(group);
}

/* ---------------------------------------------------------------- copies through a device */

// A host-memory device that counts the copies and adds the comm makes through it.
struct CountingDevice {
    std::atomic<int> copies{0}, adds{0};
};

CountingDevice *Counter(ctxpar_device *dev) {
    return static_cast<CountingDevice *>(dev->impl);
}

ctxpar_status Unsupported() {
    return CTXPAR_ERROR(CTXPAR_ERR_NOT_SUPPORTED, "not part of the counting test device");
}

const ctxpar_device_ops *CountingOps() {
    static ctxpar_device_ops ops = [] {
        ctxpar_device_ops o;
        std::memset(&o, 0, sizeof o);
        o.version = CTXPAR_DEVICE_OPS_VERSION;
        o.struct_size = sizeof o;
        o.name = "counting";
        o.destroy = [](ctxpar_device *) {};
        o.alloc = [](ctxpar_device *, size_t, ctxpar_mem_kind, void **) { return Unsupported(); };
        o.free = [](ctxpar_device *, void *, ctxpar_mem_kind) { return CTXPAR_OK; };
        o.copy = [](ctxpar_device *dev, void *dst, const void *src, size_t n, ctxpar_copy_kind kind,
                    ctxpar_stream *) {
            EXPECT_EQ(kind, CTXPAR_COPY_D2D);
            std::memcpy(dst, src, n);
            Counter(dev)->copies++;
            return CTXPAR_OK;
        };
        o.memset = [](ctxpar_device *, void *, int, size_t, ctxpar_stream *) {
            return Unsupported();
        };
        o.attn_block_fwd = [](ctxpar_device *, const ctxpar_attn_block *, float *, float *, int,
                              ctxpar_stream *) { return Unsupported(); };
        o.attn_merge = [](ctxpar_device *, float *, float *, const float *, const float *, int64_t,
                          int64_t, int64_t, int64_t, ctxpar_stream *) { return Unsupported(); };
        o.attn_bwd_prep = [](ctxpar_device *, const ctxpar_tensor *, const ctxpar_tensor *, float *,
                             ctxpar_stream *) { return Unsupported(); };
        o.attn_block_bwd = [](ctxpar_device *, const ctxpar_attn_block *, const ctxpar_tensor *,
                              const float *, const float *, float *, float *, float *,
                              ctxpar_stream *) { return Unsupported(); };
        o.cast = [](ctxpar_device *, const ctxpar_tensor *, ctxpar_tensor *, ctxpar_stream *) {
            return Unsupported();
        };
        o.add = [](ctxpar_device *dev, float *dst, const float *src, size_t n, ctxpar_stream *) {
            for (size_t i = 0; i < n; i++)
                dst[i] += src[i];
            Counter(dev)->adds++;
            return CTXPAR_OK;
        };
        o.fill = [](ctxpar_device *, float *, float, size_t, ctxpar_stream *) {
            return Unsupported();
        };
        return o;
    }();
    return &ops;
}

TEST(LocalCommDevice, CopiesGoThroughTheDevice) {
    const int p = 3;
    std::vector<CountingDevice> impls(p);
    std::vector<ctxpar_device *> devs(p, nullptr);
    for (int r = 0; r < p; r++)
        ASSERT_EQ(ctxpar_device_create(CountingOps(), &impls[(size_t)r], 1, &devs[(size_t)r]),
                  CTXPAR_OK)
            << ctxpar_last_error();
    const size_t bytes = 4000, count = 1500;
    Rendezvous all(p);
    int copies_after_allgather = 0;
    RunRanks(
        p,
        [&](int r, ctxpar_comm *&comm) {
            std::vector<uint8_t> send = Pattern(9, r, bytes), recv(bytes * p);
            ctxpar_request *req = nullptr;
            EXPECT_OK(ctxpar_comm_allgather(comm, send.data(), recv.data(), bytes, nullptr, &req));
            EXPECT_OK(ctxpar_comm_wait(comm, req, nullptr));
            for (int j = 0; j < p; j++) {
                std::vector<uint8_t> want = Pattern(9, j, bytes);
                EXPECT_EQ(FirstDiff(recv.data() + (size_t)j * bytes, want.data(), bytes), -1);
            }
            all.Arrive();
            if (r == 0) {
                for (auto &d : impls)
                    copies_after_allgather += d.copies.load();
            }
            all.Arrive();
            std::vector<float> rs_send(count * p), rs_recv(count);
            for (size_t i = 0; i < rs_send.size(); i++)
                rs_send[i] = FloatAt(1, r, i);
            EXPECT_OK(ctxpar_comm_reduce_scatter(comm, rs_send.data(), rs_recv.data(), count,
                                                 nullptr, &req));
            EXPECT_OK(ctxpar_comm_wait(comm, req, nullptr));
            for (size_t i = 0; i < count; i++) {
                float want = FloatAt(1, 0, (size_t)r * count + i);
                for (int s = 1; s < p; s++)
                    want += FloatAt(1, s, (size_t)r * count + i);
                if (std::memcmp(&want, &rs_recv[i], sizeof want) != 0) {
                    ADD_FAILURE() << "rank " << r << " i " << i;
                    break;
                }
            }
            // Host-memory ops never go through the device.
            int64_t v = r;
            EXPECT_OK(ctxpar_comm_allreduce_i64(comm, &v, 1, CTXPAR_REDUCE_SUM));
            EXPECT_EQ(v, 3);
            EXPECT_OK(ctxpar_comm_barrier(comm));
        },
        30, devs);
    int copies = 0, adds = 0;
    for (auto &d : impls) {
        copies += d.copies.load();
        adds += d.adds.load();
    }
    EXPECT_EQ(copies_after_allgather, p * p); // one copy per (sender, receiver) block
    EXPECT_EQ(copies, p * p + p);             // + one per reduce_scatter receiver
    EXPECT_EQ(adds, p * (p - 1));             // the other P-1 contributions are added
    for (auto *d : devs)
        ctxpar_device_destroy(d);
}

// The counting device with streams: streams are tokens, and every copy, add and stream sync
// records the stream it was given.
struct StreamDevice {
    CountingDevice counts; // first: the counting ops read the impl as a CountingDevice
    std::mutex mu;
    std::vector<const void *> op_streams, sync_streams;
};

StreamDevice *Streams(ctxpar_device *dev) {
    return reinterpret_cast<StreamDevice *>(dev->impl);
}

const ctxpar_device_ops *StreamOps() {
    static ctxpar_device_ops ops = [] {
        ctxpar_device_ops o = *CountingOps();
        o.name = "counting-streams";
        o.copy = [](ctxpar_device *dev, void *dst, const void *src, size_t n, ctxpar_copy_kind,
                    ctxpar_stream *s) {
            std::memcpy(dst, src, n);
            std::lock_guard<std::mutex> lock(Streams(dev)->mu);
            Streams(dev)->op_streams.push_back(s);
            return CTXPAR_OK;
        };
        o.add = [](ctxpar_device *dev, float *dst, const float *src, size_t n, ctxpar_stream *s) {
            for (size_t i = 0; i < n; i++)
                dst[i] += src[i];
            std::lock_guard<std::mutex> lock(Streams(dev)->mu);
            Streams(dev)->op_streams.push_back(s);
            return CTXPAR_OK;
        };
        o.stream_create = [](ctxpar_device *, ctxpar_stream **out) {
            *out = reinterpret_cast<ctxpar_stream *>(new char);
            return CTXPAR_OK;
        };
        o.stream_destroy = [](ctxpar_device *, ctxpar_stream *s) {
            delete reinterpret_cast<char *>(s);
        };
        o.stream_sync = [](ctxpar_device *dev, ctxpar_stream *s) {
            std::lock_guard<std::mutex> lock(Streams(dev)->mu);
            Streams(dev)->sync_streams.push_back(s);
            return CTXPAR_OK;
        };
        o.event_create = [](ctxpar_device *, ctxpar_event **out) {
            *out = reinterpret_cast<ctxpar_event *>(new char);
            return CTXPAR_OK;
        };
        o.event_destroy = [](ctxpar_device *, ctxpar_event *e) {
            delete reinterpret_cast<char *>(e);
        };
        o.event_record = [](ctxpar_device *, ctxpar_event *, ctxpar_stream *) { return CTXPAR_OK; };
        o.stream_wait_event = [](ctxpar_device *, ctxpar_stream *, ctxpar_event *) {
            return CTXPAR_OK;
        };
        return o;
    }();
    return &ops;
}

// Ranks sharing a GPU each run on their own stream: every copy and sum the comm makes for a rank,
// and every wait for them, is on the stream that rank gave the op (never the device's default
// stream, which would make each rank wait for the others' work), for send/receive, all-gather,
// all-to-all and reduce-scatter; and the data still arrives.
TEST(LocalCommDevice, TransfersRunOnTheCallersStream) {
    const int p = 3;
    std::vector<StreamDevice> impls(p);
    std::vector<ctxpar_device *> devs(p, nullptr);
    std::vector<ctxpar_stream *> streams(p, nullptr);
    for (int r = 0; r < p; r++) {
        ASSERT_EQ(ctxpar_device_create(StreamOps(), &impls[(size_t)r], 1, &devs[(size_t)r]),
                  CTXPAR_OK)
            << ctxpar_last_error();
        ASSERT_TRUE(ctxpar_dev_has_streams(devs[(size_t)r]));
        ASSERT_EQ(ctxpar_dev_stream_create(devs[(size_t)r], &streams[(size_t)r]), CTXPAR_OK);
    }
    const size_t bytes = 512, count = 96;
    RunRanks(
        p,
        [&](int r, ctxpar_comm *&comm) {
            ctxpar_stream *s = streams[(size_t)r];
            std::vector<uint8_t> send = Pattern(3, r, bytes * p), recv(bytes * p);
            ctxpar_request *req = nullptr;
            const int dst = (r + 1) % p, src = (r + p - 1) % p;
            EXPECT_OK(ctxpar_comm_sendrecv(comm, send.data(), bytes, dst, recv.data(), bytes, src,
                                           0, s, &req));
            EXPECT_OK(ctxpar_comm_wait(comm, req, s));
            std::vector<uint8_t> want = Pattern(3, src, bytes * p);
            EXPECT_EQ(FirstDiff(recv.data(), want.data(), bytes), -1);
            EXPECT_OK(ctxpar_comm_allgather(comm, send.data(), recv.data(), bytes, s, &req));
            EXPECT_OK(ctxpar_comm_wait(comm, req, s));
            EXPECT_OK(ctxpar_comm_alltoall(comm, send.data(), recv.data(), bytes, s, &req));
            EXPECT_OK(ctxpar_comm_wait(comm, req, s));
            for (int j = 0; j < p; j++) { // block r of rank j's send
                want = Pattern(3, j, bytes * p);
                EXPECT_EQ(FirstDiff(recv.data() + (size_t)j * bytes,
                                    want.data() + (size_t)r * bytes, bytes),
                          -1);
            }
            std::vector<float> rs_send(count * p, 1.0f), rs_recv(count);
            EXPECT_OK(
                ctxpar_comm_reduce_scatter(comm, rs_send.data(), rs_recv.data(), count, s, &req));
            EXPECT_OK(ctxpar_comm_wait(comm, req, s));
            EXPECT_EQ(rs_recv[0], static_cast<float>(p));
        },
        30, devs);
    for (int r = 0; r < p; r++) {
        StreamDevice &d = impls[(size_t)r];
        EXPECT_FALSE(d.op_streams.empty()) << "rank " << r;
        EXPECT_FALSE(d.sync_streams.empty()) << "rank " << r;
        for (const void *s : d.op_streams)
            EXPECT_EQ(s, streams[(size_t)r]) << "rank " << r << ": a copy or add";
        for (const void *s : d.sync_streams)
            EXPECT_EQ(s, streams[(size_t)r]) << "rank " << r << ": a stream sync";
        ctxpar_dev_stream_destroy(devs[(size_t)r], streams[(size_t)r]);
        ctxpar_device_destroy(devs[(size_t)r]);
    }
}

} // namespace
