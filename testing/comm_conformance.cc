// The comm conformance suite: every op of the comm vtable against expected bytes or exact sums,
// for every world (comm kind and rank count) of the binary it is linked into. Cases specific to
// one comm (timeouts, abort, cancel, message splitting, device copies) stay in its own suite.
#include "testing/comm_conformance.h"
#include "dispatch.h"

#include <algorithm>
#include <cstring>

namespace cpt_commconf {
namespace {

class CommConformance : public ::testing::TestWithParam<CommWorld> {
  protected:
    void Run(const CommBody &body) {
        const std::string skip = GetParam().run(body);
        if (!skip.empty())
            GTEST_SKIP() << "skipped: " << skip;
    }
};

TEST_P(CommConformance, RankAndSize) {
    Run([](int r, int p, ctxpar_comm *comm, ctxpar_device *) {
        EXPECT_EQ(ctxpar_comm_rank(comm), r);
        EXPECT_EQ(ctxpar_comm_size(comm), p);
    });
}

TEST_P(CommConformance, SendrecvShifts) {
    const size_t sizes[] = {0, 1, 4099, (1u << 20) + 3};
    Run([&](int r, int p, ctxpar_comm *comm, ctxpar_device *mem) {
        for (size_t bytes : sizes) {
            for (int shift = 0; shift < p; shift++) { // shift 1 is the ring; 0 sends to itself
                int dst = (r + shift) % p, src = (r - shift + p) % p;
                uint64_t seed = bytes * 31 + (uint64_t)shift;
                CommBuffer<uint8_t> send(mem, Pattern(seed, r, bytes));
                CommBuffer<uint8_t> recv(mem, std::vector<uint8_t>(bytes, 0xEE));
                ctxpar_request *req = nullptr;
                EXPECT_OK(ctxpar_comm_sendrecv(comm, send.data(), bytes, dst, recv.data(), bytes,
                                               src, 0, nullptr, &req));
                EXPECT_OK(ctxpar_comm_wait(comm, req, nullptr));
                std::vector<uint8_t> want = Pattern(seed, src, bytes);
                EXPECT_EQ(FirstDiff(recv.Read().data(), want.data(), bytes), -1)
                    << "rank " << r << " from " << src << ", " << bytes << " bytes";
            }
        }
    });
}

TEST_P(CommConformance, SendrecvSkippedHalves) {
    const size_t bytes = 5000;
    Run([&](int r, int p, ctxpar_comm *comm, ctxpar_device *mem) {
        int dst = (r + 1) % p, src = (r - 1 + p) % p;
        CommBuffer<uint8_t> send(mem, Pattern(7, r, bytes));
        CommBuffer<uint8_t> recv(mem, std::vector<uint8_t>(bytes, 0));
        // The send and the receive as two ops, retired in the other order.
        ctxpar_request *sreq = nullptr, *rreq = nullptr;
        EXPECT_OK(
            ctxpar_comm_sendrecv(comm, send.data(), bytes, dst, nullptr, 0, -1, 0, nullptr, &sreq));
        EXPECT_OK(
            ctxpar_comm_sendrecv(comm, nullptr, 0, -1, recv.data(), bytes, src, 0, nullptr, &rreq));
        EXPECT_OK(ctxpar_comm_wait(comm, rreq, nullptr));
        EXPECT_OK(ctxpar_comm_wait(comm, sreq, nullptr));
        std::vector<uint8_t> want = Pattern(7, src, bytes);
        EXPECT_EQ(FirstDiff(recv.Read().data(), want.data(), bytes), -1);
        // Both halves skipped: a request that is done at once.
        ctxpar_request *none = nullptr;
        EXPECT_OK(ctxpar_comm_sendrecv(comm, nullptr, 0, -1, nullptr, 0, -1, 0, nullptr, &none));
        int done = 0;
        EXPECT_OK(ctxpar_comm_test(comm, none, &done));
        EXPECT_EQ(done, 1);
        EXPECT_OK(ctxpar_comm_wait(comm, none, nullptr));
    });
}

TEST_P(CommConformance, Allgather) {
    const size_t sizes[] = {0, 1, 777, 65536 + 5};
    Run([&](int r, int p, ctxpar_comm *comm, ctxpar_device *mem) {
        for (size_t bytes : sizes) {
            CommBuffer<uint8_t> send(mem, Pattern(bytes, r, bytes));
            CommBuffer<uint8_t> recv(mem, std::vector<uint8_t>(bytes * (size_t)p, 0xEE));
            ctxpar_request *req = nullptr;
            EXPECT_OK(ctxpar_comm_allgather(comm, send.data(), recv.data(), bytes, nullptr, &req));
            EXPECT_OK(ctxpar_comm_wait(comm, req, nullptr));
            const std::vector<uint8_t> &got = recv.Read();
            for (int j = 0; j < p; j++) {
                std::vector<uint8_t> want = Pattern(bytes, j, bytes);
                EXPECT_EQ(FirstDiff(got.data() + (size_t)j * bytes, want.data(), bytes), -1)
                    << "rank " << r << ": block " << j << " of " << bytes << " bytes";
            }
        }
    });
}

TEST_P(CommConformance, ReduceScatterKnownSums) {
    const size_t counts[] = {1, 1000, 3000}; // 3000 crosses the local comm's summation tiles
    Run([&](int r, int p, ctxpar_comm *comm, ctxpar_device *mem) {
        for (size_t count : counts) {
            // Small integers: every sum is exact, so the expected value is order-free.
            std::vector<float> parts(count * (size_t)p);
            for (int j = 0; j < p; j++)
                for (size_t i = 0; i < count; i++)
                    parts[(size_t)j * count + i] = (float)(r * 1000 + j * 10 + (int)(i % 7));
            CommBuffer<float> send(mem, parts), out(mem, std::vector<float>(count, -1.0f));
            ctxpar_request *req = nullptr;
            EXPECT_OK(
                ctxpar_comm_reduce_scatter(comm, send.data(), out.data(), count, nullptr, &req));
            EXPECT_OK(ctxpar_comm_wait(comm, req, nullptr));
            const std::vector<float> &recv = out.Read();
            for (size_t i = 0; i < count; i++) {
                double want = 1000.0 * p * (p - 1) / 2 + (double)p * (r * 10 + (int)(i % 7));
                if ((double)recv[i] != want) {
                    ADD_FAILURE() << "rank " << r << " i " << i << ": " << recv[i]
                                  << " != " << want;
                    break;
                }
            }
        }
    });
}

// Sums in rank order, whatever order the parts arrive in: bit for bit the sequential sum.
TEST_P(CommConformance, ReduceScatterSumsInRankOrder) {
    const size_t count = 2500;
    Run([&](int r, int p, ctxpar_comm *comm, ctxpar_device *mem) {
        std::vector<float> parts(count * (size_t)p);
        for (int j = 0; j < p; j++)
            for (size_t i = 0; i < count; i++)
                parts[(size_t)j * count + i] = FloatAt(j, r, i); // block j: rank r's part for j
        CommBuffer<float> send(mem, parts), out(mem, std::vector<float>(count));
        ctxpar_request *req = nullptr;
        EXPECT_OK(ctxpar_comm_reduce_scatter(comm, send.data(), out.data(), count, nullptr, &req));
        EXPECT_OK(ctxpar_comm_wait(comm, req, nullptr));
        const std::vector<float> &recv = out.Read();
        int order_matters = 0;
        for (size_t i = 0; i < count; i++) {
            float fwd = FloatAt(r, 0, i), rev = FloatAt(r, p - 1, i);
            for (int s = 1; s < p; s++)
                fwd += FloatAt(r, s, i);
            for (int s = p - 2; s >= 0; s--)
                rev += FloatAt(r, s, i);
            order_matters += std::memcmp(&fwd, &rev, sizeof fwd) != 0;
            if (std::memcmp(&recv[i], &fwd, sizeof fwd) != 0) {
                ADD_FAILURE() << "rank " << r << " i " << i << ": " << recv[i]
                              << " is not the rank-order sum " << fwd;
                break;
            }
        }
        if (p >= 3) { // otherwise this test could not tell the orders apart
            EXPECT_GT(order_matters, 0);
        }
    });
}

TEST_P(CommConformance, Alltoall) {
    const size_t sizes[] = {0, 3, 4096 + 1};
    Run([&](int r, int p, ctxpar_comm *comm, ctxpar_device *mem) {
        for (size_t bytes : sizes) {
            // Block j of rank r's send buffer is Pattern(seed of (r -> j)).
            std::vector<uint8_t> blocks(bytes * (size_t)p);
            for (int j = 0; j < p; j++) {
                std::vector<uint8_t> blk = Pattern(bytes * 100 + (uint64_t)j, r, bytes);
                std::copy(blk.begin(), blk.end(), blocks.begin() + (long)((size_t)j * bytes));
            }
            CommBuffer<uint8_t> send(mem, blocks);
            CommBuffer<uint8_t> recv(mem, std::vector<uint8_t>(bytes * (size_t)p, 0xEE));
            ctxpar_request *req = nullptr;
            EXPECT_OK(ctxpar_comm_alltoall(comm, send.data(), recv.data(), bytes, nullptr, &req));
            EXPECT_OK(ctxpar_comm_wait(comm, req, nullptr));
            const std::vector<uint8_t> &got = recv.Read();
            for (int i = 0; i < p; i++) {
                std::vector<uint8_t> want = Pattern(bytes * 100 + (uint64_t)r, i, bytes);
                EXPECT_EQ(FirstDiff(got.data() + (size_t)i * bytes, want.data(), bytes), -1)
                    << "rank " << r << ": block from " << i;
            }
        }
    });
}

// allreduce_i64 works on host memory for every comm (the ranks' agreement uses it).
TEST_P(CommConformance, AllreduceSumMinMax) {
    auto value = [](int rank, size_t i) -> int64_t {
        int64_t v = (int64_t)(rank + 1) * (int64_t)(i + 1) * 1000000007LL;
        return rank % 2 ? -v : v;
    };
    Run([&](int r, int p, ctxpar_comm *comm, ctxpar_device *) {
        const ctxpar_reduce_op ops[] = {CTXPAR_REDUCE_SUM, CTXPAR_REDUCE_MIN, CTXPAR_REDUCE_MAX};
        for (size_t count : {4, 40}) { // 40: more than a comm's first staging buffer may hold
            for (ctxpar_reduce_op op : ops) {
                std::vector<int64_t> buf(count);
                for (size_t i = 0; i < count; i++)
                    buf[i] = value(r, i);
                EXPECT_OK(ctxpar_comm_allreduce_i64(comm, buf.data(), count, op));
                for (size_t i = 0; i < count; i++) {
                    int64_t want = value(0, i);
                    for (int s = 1; s < p; s++) {
                        int64_t v = value(s, i);
                        want = op == CTXPAR_REDUCE_SUM   ? want + v
                               : op == CTXPAR_REDUCE_MIN ? std::min(want, v)
                                                         : std::max(want, v);
                    }
                    EXPECT_EQ(buf[i], want) << "rank " << r << " op " << op << " i " << i;
                }
            }
        }
        EXPECT_OK(ctxpar_comm_allreduce_i64(comm, nullptr, 0, CTXPAR_REDUCE_SUM));
    });
}

// Barriers back to back complete on every rank and leave the comm usable. (Whether a barrier
// holds a rank back is each comm's own suite's: it needs a rank that arrives late.)
TEST_P(CommConformance, Barrier) {
    Run([&](int, int p, ctxpar_comm *comm, ctxpar_device *) {
        for (int i = 0; i < 5; i++)
            EXPECT_OK(ctxpar_comm_barrier(comm));
        int64_t total = 1;
        EXPECT_OK(ctxpar_comm_allreduce_i64(comm, &total, 1, CTXPAR_REDUCE_SUM));
        EXPECT_EQ(total, p);
    });
}

// Rejected by the dispatch before any rank communicates (so every rank can make the same bad
// calls and the comm stays usable); no output is written.
TEST_P(CommConformance, BadArgumentsAreRejectedAndTheCommStaysUsable) {
    Run([](int r, int p, ctxpar_comm *comm, ctxpar_device *) {
        uint8_t buf[64] = {0};
        ctxpar_request *req = nullptr;
        EXPECT_EQ(ctxpar_comm_sendrecv(comm, buf, 32, p, buf + 32, 32, 0, 0, nullptr, &req),
                  CTXPAR_ERR_INVALID_ARG); // no such peer
        EXPECT_EQ(ctxpar_comm_sendrecv(comm, buf, 32, 0, buf + 16, 32, 0, 0, nullptr, &req),
                  CTXPAR_ERR_INVALID_ARG); // overlapping buffers
        EXPECT_EQ(ctxpar_comm_allgather(comm, buf, nullptr, 8, nullptr, &req),
                  CTXPAR_ERR_INVALID_ARG);
        EXPECT_EQ(ctxpar_comm_allgather(comm, buf, buf, 8, nullptr, nullptr),
                  CTXPAR_ERR_INVALID_ARG); // no req_out
        EXPECT_EQ(ctxpar_comm_reduce_scatter(comm, nullptr, (float *)buf, 2, nullptr, &req),
                  CTXPAR_ERR_INVALID_ARG);
        int64_t v = 1;
        EXPECT_EQ(ctxpar_comm_allreduce_i64(comm, &v, 1, (ctxpar_reduce_op)7),
                  CTXPAR_ERR_INVALID_ARG);
        EXPECT_EQ(ctxpar_comm_allreduce_i64(comm, nullptr, 1, CTXPAR_REDUCE_SUM),
                  CTXPAR_ERR_INVALID_ARG);
        EXPECT_EQ(ctxpar_comm_test(comm, nullptr, nullptr), CTXPAR_ERR_INVALID_ARG);
        EXPECT_EQ(v, 1);
        EXPECT_EQ(req, nullptr);
        v = r;
        EXPECT_OK(ctxpar_comm_allreduce_i64(comm, &v, 1, CTXPAR_REDUCE_SUM));
        EXPECT_EQ(v, (int64_t)p * (p - 1) / 2);
    });
}

// split by color and key: members ranked by (key, parent rank), each sub-comm works on its own
// (an allreduce and a ring of transfers see only its members), with the parent's timeout.
TEST_P(CommConformance, SplitByColorAndKey) {
    Run([](int r, int p, ctxpar_comm *comm, ctxpar_device *mem) {
        const int color = r % 2, key = -r / 2; // later parent ranks first (ties: none)
        std::vector<int> members;              // parent ranks, in their sub-comm's order
        for (int s = p - 1; s >= 0; s--)
            if (s % 2 == color)
                members.push_back(s);
        const int want_rank = (int)(std::find(members.begin(), members.end(), r) - members.begin());
        const int n = (int)members.size();
        ctxpar_comm *sub = nullptr;
        ASSERT_EQ(ctxpar_comm_split(comm, color, key, &sub), CTXPAR_OK) << ctxpar_last_error();
        ASSERT_NE(sub, nullptr);
        EXPECT_EQ(ctxpar_comm_rank(sub), want_rank);
        EXPECT_EQ(ctxpar_comm_size(sub), n);
        EXPECT_EQ(sub->timeout_s, comm->timeout_s);
        int64_t v = r;
        EXPECT_OK(ctxpar_comm_allreduce_i64(sub, &v, 1, CTXPAR_REDUCE_SUM));
        int64_t want = 0;
        for (int m : members)
            want += m;
        EXPECT_EQ(v, want) << "rank " << r;
        const size_t bytes = 3001;
        const int dst = (want_rank + 1) % n, src = (want_rank - 1 + n) % n;
        CommBuffer<uint8_t> send(mem, Pattern(11, r, bytes));
        CommBuffer<uint8_t> recv(mem, std::vector<uint8_t>(bytes, 0xEE));
        ctxpar_request *req = nullptr;
        EXPECT_OK(ctxpar_comm_sendrecv(sub, send.data(), bytes, dst, recv.data(), bytes, src, 0,
                                       nullptr, &req));
        EXPECT_OK(ctxpar_comm_wait(sub, req, nullptr));
        std::vector<uint8_t> want_bytes = Pattern(11, members[(size_t)src], bytes);
        EXPECT_EQ(FirstDiff(recv.Read().data(), want_bytes.data(), bytes), -1) << "rank " << r;
        // The parent still works, and the sub-comm outlives nothing: destroyed before it.
        v = 1;
        EXPECT_OK(ctxpar_comm_allreduce_i64(comm, &v, 1, CTXPAR_REDUCE_SUM));
        EXPECT_EQ(v, p);
        ctxpar_comm_destroy(sub);
    });
}

// Equal keys keep the parent's order; a negative color joins no sub-comm; a sub-comm splits
// again; the 2-D grid of the hybrid algorithm (rows of u consecutive ranks, columns across).
TEST_P(CommConformance, SplitNoneNestedAndGrid) {
    Run([](int r, int p, ctxpar_comm *comm, ctxpar_device *mem) {
        ctxpar_comm *rest = reinterpret_cast<ctxpar_comm *>(&r); // must be overwritten
        EXPECT_OK(ctxpar_comm_split(comm, r == 0 ? -1 : 5, 0, &rest));
        if (r == 0) {
            EXPECT_EQ(rest, nullptr);
        } else {
            ASSERT_NE(rest, nullptr);
            EXPECT_EQ(ctxpar_comm_rank(rest), r - 1);
            EXPECT_EQ(ctxpar_comm_size(rest), p - 1);
            ctxpar_comm *again = nullptr; // everyone in one sub-comm of the sub-comm
            EXPECT_OK(ctxpar_comm_split(rest, 0, 0, &again));
            ASSERT_NE(again, nullptr);
            EXPECT_EQ(ctxpar_comm_rank(again), r - 1);
            EXPECT_OK(ctxpar_comm_barrier(again));
            ctxpar_comm_destroy(again);
            ctxpar_comm_destroy(rest);
        }
        const int u = p % 2 == 0 ? 2 : 1;
        ctxpar_comm *row = nullptr, *col = nullptr;
        ASSERT_EQ(ctxpar_comm_split(comm, r / u, r % u, &row), CTXPAR_OK) << ctxpar_last_error();
        ASSERT_EQ(ctxpar_comm_split(comm, r % u, r / u, &col), CTXPAR_OK) << ctxpar_last_error();
        EXPECT_EQ(ctxpar_comm_rank(row), r % u);
        EXPECT_EQ(ctxpar_comm_size(row), u);
        EXPECT_EQ(ctxpar_comm_rank(col), r / u);
        EXPECT_EQ(ctxpar_comm_size(col), p / u);
        // Both in flight at once: an all-to-all in the row, an allgather down the column.
        CommBuffer<uint8_t> a2a_send(mem, Pattern(21, r, 64 * (size_t)u));
        CommBuffer<uint8_t> a2a_out(mem, std::vector<uint8_t>(64 * (size_t)u));
        CommBuffer<uint8_t> ag_send(mem, Pattern(22, r, 48));
        CommBuffer<uint8_t> ag_out(mem, std::vector<uint8_t>(48 * (size_t)(p / u)));
        ctxpar_request *q1 = nullptr, *q2 = nullptr;
        EXPECT_OK(ctxpar_comm_alltoall(row, a2a_send.data(), a2a_out.data(), 64, nullptr, &q1));
        EXPECT_OK(ctxpar_comm_allgather(col, ag_send.data(), ag_out.data(), 48, nullptr, &q2));
        EXPECT_OK(ctxpar_comm_wait(col, q2, nullptr));
        EXPECT_OK(ctxpar_comm_wait(row, q1, nullptr));
        const std::vector<uint8_t> &a2a_recv = a2a_out.Read(), &ag_recv = ag_out.Read();
        for (int i = 0; i < u; i++) {
            const int from = (r / u) * u + i;
            std::vector<uint8_t> want = Pattern(21, from, 64 * (size_t)u);
            EXPECT_EQ(FirstDiff(&a2a_recv[64 * (size_t)i], &want[64 * (size_t)(r % u)], 64), -1)
                << "rank " << r << " block from " << from;
        }
        for (int j = 0; j < p / u; j++) {
            std::vector<uint8_t> want = Pattern(22, j * u + r % u, 48);
            EXPECT_EQ(FirstDiff(&ag_recv[48 * (size_t)j], want.data(), 48), -1) << "rank " << r;
        }
        ctxpar_comm_destroy(col);
        ctxpar_comm_destroy(row);
    });
}

INSTANTIATE_TEST_SUITE_P(Comms, CommConformance, ::testing::ValuesIn(CommWorlds()),
                         [](const ::testing::TestParamInfo<CommWorld> &i) { return i.param.name; });

} // namespace
} // namespace cpt_commconf
