// The MPI comm under mpirun (every rank runs every test; see testing/mpi_run.sh), what only it
// has: messages split in pieces, sizes above INT_MAX, ranks that skip an op or abort,
// cancellation, its usage errors. Every op's results are in the comm conformance suite
// (comm_conformance.cc, run under mpirun by comm_conformance_mpi_test); main() is
// testing/mpi_gtest_main.cc.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sched.h>
#include <string>
#include <vector>

#include "dispatch.h"
#include "ctxpar_mpi.h"
#include "ctxpar_mpi_testing.h"
#include "testing/comm_conformance.h"

namespace {

using namespace cpt_commconf;



// Each test gets a fresh comm over MPI_COMM_WORLD; ranks line up again after it.
class MpiComm : public ::testing::Test {
  protected:
    void SetUp() override {
        MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
        MPI_Comm_size(MPI_COMM_WORLD, &p_);
        ASSERT_EQ(ctxpar_comm_create_mpi(MPI_COMM_WORLD, &comm_), CTXPAR_OK) << ctxpar_last_error();
        EXPECT_OK(ctxpar_comm_set_timeout(comm_, 30));
    }
    // A new comm in place of one a test left timed out (after MPI_Barrier on every rank).
    void FreshComm() {
        ctxpar_comm_destroy(comm_);
        comm_ = nullptr;
        ASSERT_EQ(ctxpar_comm_create_mpi(MPI_COMM_WORLD, &comm_), CTXPAR_OK);
        EXPECT_OK(ctxpar_comm_set_timeout(comm_, 30));
    }
    void TearDown() override {
        ctxpar_comm_destroy(comm_);
        MPI_Barrier(MPI_COMM_WORLD);
    }
    ctxpar_comm *comm_ = nullptr;
    int rank_ = 0, p_ = 1;
};

TEST_F(MpiComm, BackToBackCollectives) {
    const size_t bytes = 1000, count = 300;
    for (int it = 0; it < 30; it++) {
        uint64_t seed = 5000 + (uint64_t)it;
        std::vector<uint8_t> ag_send = Pattern(seed, rank_, bytes), ag_recv(bytes * (size_t)p_);
        std::vector<uint8_t> a2a_send(bytes * (size_t)p_), a2a_recv(bytes * (size_t)p_);
        for (size_t i = 0; i < a2a_send.size(); i++)
            a2a_send[i] = ByteAt(seed + 1, rank_, i);
        std::vector<float> rs_send(count * (size_t)p_), rs_recv(count);
        for (size_t i = 0; i < rs_send.size(); i++)
            rs_send[i] = (float)(it + rank_ + (int)i % 5);
        int dst = (rank_ + 1) % p_, src = (rank_ - 1 + p_) % p_;
        std::vector<uint8_t> sr_send = Pattern(seed + 2, rank_, bytes), sr_recv(bytes);
        // Four ops in flight at once, retired in a different order than posted.
        ctxpar_request *ag = nullptr, *a2a = nullptr, *rs = nullptr, *sr = nullptr;
        EXPECT_OK(
            ctxpar_comm_allgather(comm_, ag_send.data(), ag_recv.data(), bytes, nullptr, &ag));
        EXPECT_OK(
            ctxpar_comm_alltoall(comm_, a2a_send.data(), a2a_recv.data(), bytes, nullptr, &a2a));
        EXPECT_OK(
            ctxpar_comm_reduce_scatter(comm_, rs_send.data(), rs_recv.data(), count, nullptr, &rs));
        EXPECT_OK(ctxpar_comm_sendrecv(comm_, sr_send.data(), bytes, dst, sr_recv.data(), bytes,
                                       src, 0, nullptr, &sr));
        EXPECT_OK(ctxpar_comm_wait(comm_, sr, nullptr));
        EXPECT_OK(ctxpar_comm_wait(comm_, rs, nullptr));
        EXPECT_OK(ctxpar_comm_wait(comm_, ag, nullptr));
        EXPECT_OK(ctxpar_comm_wait(comm_, a2a, nullptr));
        int64_t total = it;
        EXPECT_OK(ctxpar_comm_allreduce_i64(comm_, &total, 1, CTXPAR_REDUCE_SUM));
        EXPECT_EQ(total, (int64_t)it * p_);
        EXPECT_OK(ctxpar_comm_barrier(comm_));
        for (int j = 0; j < p_; j++) {
            std::vector<uint8_t> want = Pattern(seed, j, bytes);
            EXPECT_EQ(FirstDiff(ag_recv.data() + (size_t)j * bytes, want.data(), bytes), -1);
            for (size_t i = 0; i < bytes; i++) {
                if (a2a_recv[(size_t)j * bytes + i] !=
                    ByteAt(seed + 1, j, (size_t)rank_ * bytes + i)) {
                    ADD_FAILURE() << "alltoall: block " << j << " i " << i;
                    break;
                }
            }
        }
        std::vector<uint8_t> want = Pattern(seed + 2, src, bytes);
        EXPECT_EQ(FirstDiff(sr_recv.data(), want.data(), bytes), -1);
        for (size_t i = 0; i < count; i++) {
            double w = 0;
            for (int s = 0; s < p_; s++)
                w += (double)(it + s + (int)((size_t)rank_ * count + i) % 5);
            if ((double)rs_recv[i] != w) {
                ADD_FAILURE() << "reduce_scatter: i " << i;
                break;
            }
        }
    }
}

TEST_F(MpiComm, TestEventuallyReportsDone) {
    const size_t bytes = 300000, count = 500; // a large message: MPI's rendezvous path
    int dst = (rank_ + 1) % p_, src = (rank_ - 1 + p_) % p_;
    std::vector<uint8_t> send = Pattern(11, rank_, bytes), recv(bytes);
    std::vector<float> rs_send(count * (size_t)p_, 1.0f), rs_recv(count);
    ctxpar_request *sr = nullptr, *rs = nullptr;
    EXPECT_OK(ctxpar_comm_sendrecv(comm_, send.data(), bytes, dst, recv.data(), bytes, src, 0, nullptr,
                                   &sr));
    EXPECT_OK(
        ctxpar_comm_reduce_scatter(comm_, rs_send.data(), rs_recv.data(), count, nullptr, &rs));
    int sr_done = 0, rs_done = 0;
    double end = ctxpar_now() + 30;
    while ((!sr_done || !rs_done) && ctxpar_now() < end) {
        EXPECT_OK(ctxpar_comm_test(comm_, sr, &sr_done));
        EXPECT_OK(ctxpar_comm_test(comm_, rs, &rs_done));
        sched_yield();
    }
    EXPECT_TRUE(sr_done && rs_done);
    EXPECT_OK(ctxpar_comm_wait(comm_, sr, nullptr));
    EXPECT_OK(ctxpar_comm_wait(comm_, rs, nullptr));
    std::vector<uint8_t> want = Pattern(11, src, bytes);
    EXPECT_EQ(FirstDiff(recv.data(), want.data(), bytes), -1);
    for (size_t i = 0; i < count; i++)
        EXPECT_EQ(rs_recv[i], (float)p_);
}

// Buffers above the largest single message go as several messages. With 1000-byte messages,
// odd sizes exercise the split and the short last piece, as buffers above INT_MAX bytes would.
TEST_F(MpiComm, BuffersSplitIntoSeveralMessages) {
    ASSERT_EQ(ctxpar_mpi_set_max_message(comm_, 1000), CTXPAR_OK) << ctxpar_last_error();
    const size_t bytes = 10007, count = 3001;
    int dst = (rank_ + 1) % p_, src = (rank_ - 1 + p_) % p_;
    std::vector<uint8_t> send = Pattern(21, rank_, bytes), recv(bytes);
    ctxpar_request *req = nullptr;
    EXPECT_OK(ctxpar_comm_sendrecv(comm_, send.data(), bytes, dst, recv.data(), bytes, src, 0, nullptr,
                                   &req));
    EXPECT_OK(ctxpar_comm_wait(comm_, req, nullptr));
    std::vector<uint8_t> want = Pattern(21, src, bytes);
    EXPECT_EQ(FirstDiff(recv.data(), want.data(), bytes), -1);

    std::vector<uint8_t> ag(bytes * (size_t)p_);
    EXPECT_OK(ctxpar_comm_allgather(comm_, send.data(), ag.data(), bytes, nullptr, &req));
    EXPECT_OK(ctxpar_comm_wait(comm_, req, nullptr));
    for (int j = 0; j < p_; j++) {
        std::vector<uint8_t> w = Pattern(21, j, bytes);
        EXPECT_EQ(FirstDiff(ag.data() + (size_t)j * bytes, w.data(), bytes), -1) << "block " << j;
    }

    std::vector<float> rs_send(count * (size_t)p_), rs_recv(count);
    for (size_t i = 0; i < rs_send.size(); i++)
        rs_send[i] = FloatAt(3, rank_, i);
    EXPECT_OK(
        ctxpar_comm_reduce_scatter(comm_, rs_send.data(), rs_recv.data(), count, nullptr, &req));
    EXPECT_OK(ctxpar_comm_wait(comm_, req, nullptr));
    for (size_t i = 0; i < count; i++) {
        float w = FloatAt(3, 0, (size_t)rank_ * count + i);
        for (int s = 1; s < p_; s++)
            w += FloatAt(3, s, (size_t)rank_ * count + i);
        if (std::memcmp(&w, &rs_recv[i], sizeof w) != 0) {
            ADD_FAILURE() << "reduce_scatter i " << i;
            break;
        }
    }
}

// A real buffer above INT_MAX bytes between ranks 0 and 1 (about 4.3 GB per rank): opt-in with
// CTXPAR_TEST_HUGE=1.
TEST_F(MpiComm, SendrecvAboveIntMax) {
    const char *env = std::getenv("CTXPAR_TEST_HUGE");
    if (!env || std::strcmp(env, "1") != 0 || p_ < 2)
        GTEST_SKIP() << "set CTXPAR_TEST_HUGE=1 (needs ~9 GB) to move a 2^31 + 5 byte buffer";
    const size_t bytes = ((size_t)1 << 31) + 5;
    if (rank_ > 1)
        return;
    std::vector<uint8_t> send(bytes), recv(bytes, 0);
    for (size_t i = 0; i < bytes; i++)
        send[i] = (uint8_t)(Mix(i / 4096 + (uint64_t)rank_) + i);
    ctxpar_request *req = nullptr;
    int peer = 1 - rank_;
    EXPECT_OK(ctxpar_comm_sendrecv(comm_, send.data(), bytes, peer, recv.data(), bytes, peer, 0,
                                   nullptr, &req));
    EXPECT_OK(ctxpar_comm_wait(comm_, req, nullptr));
    for (size_t i = 0; i < bytes; i++) {
        if (recv[i] != (uint8_t)(Mix(i / 4096 + (uint64_t)peer) + i)) {
            ADD_FAILURE() << "byte " << i;
            break;
        }
    }
}

// A rank that skips an op: the others time out within the (short) timeout, naming it, and
// after a fresh comm everything works again. Large messages make sends that Open MPI cannot
// cancel: they stay with the comm until it is destroyed.
TEST_F(MpiComm, SkippedOpTimesOutThenAFreshCommWorks) {
    if (p_ < 2)
        GTEST_SKIP() << "needs two ranks";
    const size_t sizes[] = {64, 1 << 20};
    for (size_t bytes : sizes) {
        EXPECT_OK(ctxpar_comm_set_timeout(comm_, 0.2));
        std::vector<uint8_t> send(bytes, (uint8_t)rank_), recv(bytes * (size_t)p_);
        MPI_Barrier(MPI_COMM_WORLD); // the others post together: only rank p-1 can be missing
        if (rank_ != p_ - 1) {
            ctxpar_request *req = nullptr;
            EXPECT_OK(ctxpar_comm_allgather(comm_, send.data(), recv.data(), bytes, nullptr, &req));
            EXPECT_EQ(ctxpar_comm_wait(comm_, req, nullptr), CTXPAR_ERR_TIMEOUT);
            std::string msg = ctxpar_last_error();
            EXPECT_NE(msg.find("allgather"), std::string::npos) << msg;
            EXPECT_NE(msg.find("timed out after 0.2 s"), std::string::npos) << msg;
            EXPECT_NE(msg.find("waited for rank " + std::to_string(p_ - 1)), std::string::npos)
                << msg;
            // What to do about it (how many came depends on what landed in the 0.2 s).
            EXPECT_NE(msg.find(" of " + std::to_string(p_) + " ranks made this call: every rank "
                               "of the comm must make the same calls"),
                      std::string::npos)
                << msg;
            EXPECT_EQ(ctxpar_comm_barrier(comm_), CTXPAR_ERR_TIMEOUT); // p-1 skips this one too
        }
        MPI_Barrier(MPI_COMM_WORLD);
        ASSERT_NO_FATAL_FAILURE(FreshComm());
        ctxpar_request *req = nullptr;
        EXPECT_OK(ctxpar_comm_allgather(comm_, send.data(), recv.data(), bytes, nullptr, &req));
        EXPECT_OK(ctxpar_comm_wait(comm_, req, nullptr));
        for (int j = 0; j < p_; j++)
            EXPECT_EQ(recv[(size_t)j * bytes + bytes - 1], (uint8_t)j) << "block " << j;
        EXPECT_OK(ctxpar_comm_barrier(comm_));
    }
}

// A rank that never joins a split: the others get the parent's timeout error (the split waits
// no longer than any other op), their comm_out untouched; after a fresh comm a split works.
TEST_F(MpiComm, SplitWithAMissingRankTimesOut) {
    if (p_ < 2)
        GTEST_SKIP() << "needs two ranks";
    EXPECT_OK(ctxpar_comm_set_timeout(comm_, 0.2));
    MPI_Barrier(MPI_COMM_WORLD); // only rank p-1 can be missing
    if (rank_ != p_ - 1) {
        ctxpar_comm *sub = reinterpret_cast<ctxpar_comm *>(&rank_); // must stay as it is
        const double t0 = MPI_Wtime();
        EXPECT_EQ(ctxpar_comm_split(comm_, 0, rank_, &sub), CTXPAR_ERR_TIMEOUT);
        EXPECT_LT(MPI_Wtime() - t0, 10.0); // the timeout, not a hang
        std::string msg = ctxpar_last_error();
        EXPECT_NE(msg.find("timed out after 0.2 s"), std::string::npos) << msg;
        EXPECT_EQ(sub, reinterpret_cast<ctxpar_comm *>(&rank_));
    }
    MPI_Barrier(MPI_COMM_WORLD);
    ASSERT_NO_FATAL_FAILURE(FreshComm());
    ctxpar_comm *sub = nullptr;
    ASSERT_EQ(ctxpar_comm_split(comm_, rank_ % 2, rank_, &sub), CTXPAR_OK) << ctxpar_last_error();
    ASSERT_NE(sub, nullptr);
    EXPECT_EQ(ctxpar_comm_rank(sub), rank_ / 2);
    EXPECT_OK(ctxpar_comm_barrier(sub));
    ctxpar_comm_destroy(sub);
}

// A rank that aborts: the others' split fails with REMOTE promptly (not after the 60 s timeout),
// naming the rank, and leaves comm_out as it was.
TEST_F(MpiComm, SplitAfterAPeerAbortedFailsRemote) {
    if (p_ < 2)
        GTEST_SKIP() << "needs two ranks";
    EXPECT_OK(ctxpar_comm_set_timeout(comm_, 60));
    if (rank_ == p_ - 1) {
        ctxpar_comm_abort(comm_);
    } else {
        ctxpar_comm *sub = reinterpret_cast<ctxpar_comm *>(&rank_); // must stay as it is
        const double t0 = MPI_Wtime();
        EXPECT_EQ(ctxpar_comm_split(comm_, 0, rank_, &sub), CTXPAR_ERR_REMOTE)
            << ctxpar_last_error();
        EXPECT_LT(MPI_Wtime() - t0, 30.0);
        std::string msg = ctxpar_last_error();
        EXPECT_NE(msg.find("rank " + std::to_string(p_ - 1) + " aborted"), std::string::npos)
            << msg;
        EXPECT_EQ(sub, reinterpret_cast<ctxpar_comm *>(&rank_));
    }
    MPI_Barrier(MPI_COMM_WORLD);
    ASSERT_NO_FATAL_FAILURE(FreshComm());
}

// A sub-communicator keeps the parent's timeout: a member that never joins an op makes the
// others' wait end with TIMEOUT after the parent's 0.2 s.
TEST_F(MpiComm, SplitKeepsTheParentTimeout) {
    if (p_ < 2)
        GTEST_SKIP() << "needs two ranks";
    EXPECT_OK(ctxpar_comm_set_timeout(comm_, 0.2));
    ctxpar_comm *sub = nullptr;
    ASSERT_EQ(ctxpar_comm_split(comm_, 0, rank_, &sub), CTXPAR_OK) << ctxpar_last_error();
    ASSERT_NE(sub, nullptr);
    if (rank_ != 0) { // rank 0 never joins this barrier
        const double t0 = MPI_Wtime();
        EXPECT_EQ(ctxpar_comm_barrier(sub), CTXPAR_ERR_TIMEOUT) << ctxpar_last_error();
        EXPECT_LT(MPI_Wtime() - t0, 10.0);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    ctxpar_comm_destroy(sub);
    ASSERT_NO_FATAL_FAILURE(FreshComm());
}

TEST_F(MpiComm, SendrecvTimeoutNamesThePeer) {
    if (p_ < 2)
        GTEST_SKIP() << "needs two ranks";
    EXPECT_OK(ctxpar_comm_set_timeout(comm_, 0.2));
    if (rank_ == 0) { // rank 1 never sends
        uint8_t buf[16];
        ctxpar_request *req = nullptr;
        EXPECT_OK(ctxpar_comm_sendrecv(comm_, nullptr, 0, -1, buf, sizeof buf, 1, 0, nullptr, &req));
        EXPECT_EQ(ctxpar_comm_wait(comm_, req, nullptr), CTXPAR_ERR_TIMEOUT);
        std::string msg = ctxpar_last_error();
        EXPECT_NE(msg.find("sendrecv"), std::string::npos) << msg;
        EXPECT_NE(msg.find("rank 0 waited for rank 1 to send"), std::string::npos) << msg;
    }
}

TEST_F(MpiComm, AbortMakesPeersFailPromptly) {
    if (p_ < 2)
        GTEST_SKIP() << "needs two ranks";
    // A 60 s timeout: only the abort notice can end the others' waits within the test's limit.
    EXPECT_OK(ctxpar_comm_set_timeout(comm_, 60));
    const size_t bytes = 256;
    std::vector<uint8_t> send(bytes, 1), recv(bytes * (size_t)p_);
    if (rank_ == p_ - 1) {
        ctxpar_comm_abort(comm_);
        EXPECT_EQ(ctxpar_comm_barrier(comm_), CTXPAR_ERR_REMOTE); // its own ops fail too
    } else {
        ctxpar_request *req = nullptr;
        ctxpar_status st =
            ctxpar_comm_allgather(comm_, send.data(), recv.data(), bytes, nullptr, &req);
        if (st == CTXPAR_OK)
            st = ctxpar_comm_wait(comm_, req, nullptr);
        EXPECT_EQ(st, CTXPAR_ERR_REMOTE) << ctxpar_last_error();
        std::string msg = ctxpar_last_error();
        EXPECT_NE(msg.find("rank " + std::to_string(p_ - 1) + " aborted"), std::string::npos)
            << msg;
        // Later ops with the aborted rank fail at once.
        EXPECT_EQ(ctxpar_comm_barrier(comm_), CTXPAR_ERR_REMOTE);
    }
}

TEST_F(MpiComm, MismatchedSizesAreUsageErrors) {
    if (p_ < 2)
        GTEST_SKIP() << "needs two ranks";
    std::vector<uint8_t> a(100, 1), b(100);
    ctxpar_request *req = nullptr;
    // Rank 0 sends 100 then 40 bytes; rank 1 expects 50 then 80.
    const size_t sent[] = {100, 40}, expected[] = {50, 80};
    for (int k = 0; k < 2; k++) {
        if (rank_ == 0) {
            EXPECT_OK(
                ctxpar_comm_sendrecv(comm_, a.data(), sent[k], 1, nullptr, 0, -1, 0, nullptr, &req));
            EXPECT_OK(ctxpar_comm_wait(comm_, req, nullptr)); // small sends complete locally
        } else if (rank_ == 1) {
            EXPECT_OK(ctxpar_comm_sendrecv(comm_, nullptr, 0, -1, b.data(), expected[k], 0, 0, nullptr,
                                           &req));
            EXPECT_EQ(ctxpar_comm_wait(comm_, req, nullptr), CTXPAR_ERR_INVALID_USAGE)
                << ctxpar_last_error();
        }
    }
}

// A receive cancelled (and its buffer freed) before the matching send: the send completes and
// MPI never writes the freed buffer (checked under AddressSanitizer's interceptors).
TEST_F(MpiComm, CancelThenFree) {
    if (p_ < 2)
        GTEST_SKIP() << "needs two ranks";
    const size_t bytes = 64;
    if (rank_ == 1) {
        auto *buf = new std::vector<uint8_t>(bytes);
        ctxpar_request *req = nullptr;
        EXPECT_OK(
            ctxpar_comm_sendrecv(comm_, nullptr, 0, -1, buf->data(), bytes, 0, 0, nullptr, &req));
        ctxpar_comm_cancel(comm_, req);
        delete buf;
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank_ == 0) {
        std::vector<uint8_t> send(bytes, 9);
        ctxpar_request *req = nullptr;
        EXPECT_OK(
            ctxpar_comm_sendrecv(comm_, send.data(), bytes, 1, nullptr, 0, -1, 0, nullptr, &req));
        EXPECT_OK(ctxpar_comm_wait(comm_, req, nullptr));
    }
    MPI_Barrier(MPI_COMM_WORLD);
}

// A send MPI cannot cancel (large: it waits for the receive) is cancelled, and its buffer
// overwritten and freed at once, as an algorithm may after an error. The receive posted later
// still gets the bytes as they were when sent: the comm sends from its own copy, kept until the
// orphaned send retires, and never reads memory its caller gave back.
TEST_F(MpiComm, CancelledSendNeverReadsTheCallersBufferAfterwards) {
    if (p_ < 2)
        GTEST_SKIP() << "needs two ranks";
    const size_t bytes = 4 << 20; // far above the eager limit
    const std::vector<uint8_t> want = Pattern(77, 0, bytes);
    if (rank_ == 0) {
        auto *send = new std::vector<uint8_t>(want);
        ctxpar_request *req = nullptr;
        EXPECT_OK(ctxpar_comm_sendrecv(comm_, send->data(), bytes, 1, nullptr, 0, -1, 5, nullptr,
                                       &req));
        ctxpar_comm_cancel(comm_, req);
        std::fill(send->begin(), send->end(), 0xEE); // reused, then given back
        delete send;
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank_ == 1) {
        std::vector<uint8_t> got(bytes, 0);
        ctxpar_request *req = nullptr;
        EXPECT_OK(ctxpar_comm_sendrecv(comm_, nullptr, 0, -1, got.data(), bytes, 0, 5, nullptr,
                                       &req));
        EXPECT_OK(ctxpar_comm_wait(comm_, req, nullptr));
        EXPECT_EQ(FirstDiff(got.data(), want.data(), bytes), -1);
    }
    MPI_Barrier(MPI_COMM_WORLD);
}

// Destroying a comm with requests in flight (one whose peer never posts, with a large buffer
// whose send MPI cannot cancel) frees everything; the next comm is unaffected.
TEST_F(MpiComm, DestroyWithRequestsInFlight) {
    if (p_ < 2)
        GTEST_SKIP() << "needs two ranks";
    const size_t bytes = 1 << 20;
    auto *send = new std::vector<uint8_t>(bytes, 3);
    auto *recv = new std::vector<uint8_t>(bytes);
    ctxpar_request *req = nullptr;
    if (rank_ == 0)
        EXPECT_OK(ctxpar_comm_sendrecv(comm_, send->data(), bytes, 1, recv->data(), bytes, 1, 0,
                                       nullptr, &req));
    ctxpar_comm_destroy(comm_);
    comm_ = nullptr;
    delete send;
    delete recv;
    MPI_Barrier(MPI_COMM_WORLD);
    ASSERT_EQ(ctxpar_comm_create_mpi(MPI_COMM_WORLD, &comm_), CTXPAR_OK);
    EXPECT_OK(ctxpar_comm_set_timeout(comm_, 30));
    int64_t v = rank_;
    EXPECT_OK(ctxpar_comm_allreduce_i64(comm_, &v, 1, CTXPAR_REDUCE_SUM));
    EXPECT_EQ(v, (int64_t)p_ * (p_ - 1) / 2);
}

TEST_F(MpiComm, BadArguments) {
    ctxpar_comm *other = nullptr;
    EXPECT_EQ(ctxpar_comm_create_mpi(MPI_COMM_NULL, &other), CTXPAR_ERR_INVALID_ARG);
    EXPECT_EQ(ctxpar_comm_create_mpi(MPI_COMM_WORLD, nullptr), CTXPAR_ERR_INVALID_ARG);
    uint8_t buf[64];
    ctxpar_request *req = nullptr;
    EXPECT_EQ(ctxpar_comm_sendrecv(comm_, buf, 8, p_, nullptr, 0, -1, 0, nullptr, &req),
              CTXPAR_ERR_INVALID_ARG);
    EXPECT_EQ(ctxpar_comm_sendrecv(comm_, buf, 8, 0, nullptr, 0, -1, 0, nullptr, nullptr),
              CTXPAR_ERR_INVALID_ARG);
    EXPECT_EQ(ctxpar_comm_sendrecv(comm_, buf, 32, 0, buf + 16, 32, 0, 0, nullptr, &req),
              CTXPAR_ERR_INVALID_ARG);
    EXPECT_EQ(ctxpar_comm_alltoall(comm_, buf, buf, 8, nullptr, &req), CTXPAR_ERR_INVALID_ARG);
    EXPECT_EQ(ctxpar_comm_allgather(comm_, buf, buf, 8, nullptr, &req), CTXPAR_ERR_INVALID_ARG);
    int64_t v = 1;
    EXPECT_EQ(ctxpar_comm_allreduce_i64(comm_, &v, 1, (ctxpar_reduce_op)7), CTXPAR_ERR_INVALID_ARG);
    EXPECT_EQ(v, 1);
    EXPECT_EQ(req, nullptr);
    EXPECT_EQ(ctxpar_mpi_set_max_message(comm_, 0), CTXPAR_ERR_INVALID_ARG);
}

} // namespace
