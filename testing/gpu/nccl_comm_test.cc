// nccl_comm_test: what only the NCCL comm has, with one rank per visible GPU (ranks are threads
// of this process, communicators from ncclCommInitAll): wait's stream ordering, the fast
// reduce-scatter option, cancel, timeouts of a missing peer (two GPUs), the constructor's checks.
// Every op's results, as for every comm, are the conformance suite's
// (comm_conformance_nccl_test.cc). Without a GPU every test is skipped, visibly.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "testing/gpu/gpu_rule.h"

#if defined(CTXPAR_TEST_NO_CUDA) || defined(CTXPAR_TEST_NO_NCCL)

namespace {
TEST(NcclComm, NotBuilt) {
    std::printf("nccl_comm_test: skipped: no CUDA device (built without CUDA/NCCL)\n");
    GTEST_SKIP() << "skipped: " << cpt_gpu::Unavailable("built without CUDA/NCCL");
}
} // namespace

#else

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

#include "dispatch.h"
#include "ctxpar_cpu.h"
#include "ctxpar_cuda.h"
#include "ctxpar_nccl.h"

namespace {

int GpuCount() {
    static const int n = [] {
        int c = 0;
        return cudaGetDeviceCount(&c) == cudaSuccess ? c : 0;
    }();
    return n;
}

class Banner : public ::testing::Environment {
  public:
    void SetUp() override {
        // Threads of one process each launching their own collectives: NCCL's GROUP launch
        // mode would make a missing rank block the host, not time out. PARALLEL is the default;
        // set it so that an environment cannot change it.
        setenv("NCCL_LAUNCH_MODE", "PARALLEL", 1);
        if (GpuCount() == 0)
            std::printf("nccl_comm_test: skipped: no CUDA device\n");
        else
            std::printf("nccl_comm_test: %d ranks (one per GPU)\n", GpuCount());
    }
};
[[maybe_unused]] ::testing::Environment *const kBanner =
    ::testing::AddGlobalTestEnvironment(new Banner);

// One rank: its GPU's device and its comm.
struct Rank {
    int rank = 0, size = 0;
    ctxpar_device *dev = nullptr;
    ctxpar_comm *comm = nullptr;
    ncclComm_t nccl = nullptr;
};

// Runs body on every rank, each on its own thread, with fresh communicators.
class NcclComm : public ::testing::Test {
  protected:
    void SetUp() override {
        CPT_SKIP_WITHOUT_GPU();
    }

    void RunRanks(const std::function<void(Rank &)> &body,
                  const ctxpar_nccl_options *opt = nullptr) {
        const int n = GpuCount();
        std::vector<ncclComm_t> nccl((size_t)n);
        ASSERT_EQ(ncclCommInitAll(nccl.data(), n, nullptr), ncclSuccess);
        std::vector<Rank> ranks((size_t)n);
        std::vector<std::thread> threads;
        for (int r = 0; r < n; r++) {
            threads.emplace_back([&, r] {
                Rank &k = ranks[(size_t)r];
                k.rank = r;
                k.size = n;
                k.nccl = nccl[(size_t)r];
                ctxpar_cuda_options o = CTXPAR_CUDA_OPTIONS_INIT;
                o.device_ordinal = r;
                o.use_cudnn = CTXPAR_CUDA_CUDNN_OFF;
                ASSERT_EQ(ctxpar_device_create_cuda(&o, &k.dev), CTXPAR_OK) << ctxpar_last_error();
                ASSERT_EQ(ctxpar_comm_create_nccl(k.nccl, k.dev, opt, &k.comm), CTXPAR_OK)
                    << ctxpar_last_error();
                EXPECT_EQ(ctxpar_comm_rank(k.comm), r);
                EXPECT_EQ(ctxpar_comm_size(k.comm), n);
                body(k);
            });
        }
        for (std::thread &t : threads)
            t.join();
        for (Rank &k : ranks) {
            int aborted = 0;
            if (k.comm) {
                EXPECT_EQ(ctxpar_nccl_comm_aborted(k.comm, &aborted), CTXPAR_OK);
            }
            ctxpar_comm_destroy(k.comm);
            ctxpar_device_destroy(k.dev);
            if (!aborted)
                ncclCommDestroy(k.nccl);
        }
    }
};

// Device buffer of n floats on rank k's GPU.
struct Buf {
    ctxpar_device *dev;
    float *p = nullptr;
    size_t n;
    Buf(ctxpar_device *d, size_t count) : dev(d), n(count) {
        void *v = nullptr;
        EXPECT_EQ(ctxpar_dev_alloc(dev, n * sizeof(float), CTXPAR_MEM_DEVICE, &v), CTXPAR_OK);
        p = (float *)v;
    }
    ~Buf() { ctxpar_dev_free(dev, p, n * sizeof(float), CTXPAR_MEM_DEVICE); }
    void Set(const std::vector<float> &h) {
        ASSERT_EQ(ctxpar_dev_copy(dev, p, h.data(), n * sizeof(float), CTXPAR_COPY_H2D, nullptr),
                  CTXPAR_OK);
    }
    std::vector<float> Get() {
        std::vector<float> h(n);
        EXPECT_EQ(ctxpar_dev_copy(dev, h.data(), p, n * sizeof(float), CTXPAR_COPY_D2H, nullptr),
                  CTXPAR_OK);
        EXPECT_EQ(ctxpar_dev_stream_sync(dev, nullptr), CTXPAR_OK);
        return h;
    }
};

// Value i of rank r's data: distinct per rank and index, exact in F32.
float Val(int r, size_t i) {
    return (float)(r * 100000 + (int)(i % 50000)) * 0.5f;
}

std::vector<float> Data(int r, size_t n) {
    std::vector<float> v(n);
    for (size_t i = 0; i < n; i++)
        v[i] = Val(r, i);
    return v;
}

// wait orders the caller's stream after the transfer: work enqueued on that stream right after
// wait sees the received data, with the host waiting too (default) and without (host_wait 0).
void WaitOrders(Rank &k) {
    {
        const size_t n = 1 << 22;
        const int next = (k.rank + 1) % k.size, prev = (k.rank + k.size - 1) % k.size;
        ctxpar_stream *s = nullptr;
        ASSERT_EQ(ctxpar_dev_stream_create(k.dev, &s), CTXPAR_OK);
        Buf send(k.dev, n), recv(k.dev, n), acc(k.dev, n);
        for (int round = 0; round < 3; round++) {
            ASSERT_EQ(ctxpar_dev_fill(k.dev, send.p, (float)(k.rank + 10 * round), n, s),
                      CTXPAR_OK);
            ASSERT_EQ(ctxpar_dev_fill(k.dev, acc.p, 1.0f, n, s), CTXPAR_OK);
            ctxpar_request *req = nullptr;
            ASSERT_EQ(ctxpar_comm_sendrecv(k.comm, send.p, n * 4, next, recv.p, n * 4, prev, round,
                                           s, &req),
                      CTXPAR_OK);
            ASSERT_EQ(ctxpar_comm_wait(k.comm, req, s), CTXPAR_OK);
            ASSERT_EQ(ctxpar_dev_add(k.dev, acc.p, recv.p, n, s), CTXPAR_OK);
            ASSERT_EQ(ctxpar_dev_stream_sync(k.dev, s), CTXPAR_OK);
            std::vector<float> got = acc.Get();
            size_t bad = 0;
            for (float x : got)
                bad += x != 1.0f + (float)(prev + 10 * round);
            EXPECT_EQ(bad, 0u) << "round " << round;
        }
        ctxpar_dev_stream_destroy(k.dev, s);
    }
}

TEST_F(NcclComm, WaitOrdersTheCallersStream) {
    RunRanks(WaitOrders);
}

TEST_F(NcclComm, WaitOrdersTheCallersStreamWithoutHostWait) {
    ctxpar_nccl_options opt = CTXPAR_NCCL_OPTIONS_INIT;
    opt.host_wait = 0;
    RunRanks(WaitOrders, &opt);
}

TEST_F(NcclComm, ReduceScatterFastOptionIsClose) {
    ctxpar_nccl_options opt = CTXPAR_NCCL_OPTIONS_INIT;
    opt.rank_order_reduce = 0;
    RunRanks(
        [](Rank &k) {
            const size_t n = 5000, P = (size_t)k.size;
            Buf send(k.dev, n * P), recv(k.dev, n);
            send.Set(Data(k.rank, n * P));
            ctxpar_request *req = nullptr;
            ASSERT_EQ(ctxpar_comm_reduce_scatter(k.comm, send.p, recv.p, n, nullptr, &req),
                      CTXPAR_OK);
            ASSERT_EQ(ctxpar_comm_wait(k.comm, req, nullptr), CTXPAR_OK);
            std::vector<float> got = recv.Get();
            for (size_t i = 0; i < n; i++) {
                double want = 0;
                for (int r = 0; r < k.size; r++)
                    want += Val(r, (size_t)k.rank * n + i);
                ASSERT_NEAR(got[i], want, 1e-6 * std::fabs(want) + 1e-6) << i;
            }
        },
        &opt);
}

// A request abandoned with cancel is freed and leaves the comm usable.
TEST_F(NcclComm, CancelLeavesTheCommUsable) {
    RunRanks([](Rank &k) {
        const size_t n = 1000;
        const int next = (k.rank + 1) % k.size, prev = (k.rank + k.size - 1) % k.size;
        Buf send(k.dev, n), recv(k.dev, n);
        send.Set(Data(k.rank, n));
        ctxpar_request *req = nullptr;
        ASSERT_EQ(ctxpar_comm_sendrecv(k.comm, send.p, n * 4, next, recv.p, n * 4, prev, 0, nullptr,
                                       &req),
                  CTXPAR_OK);
        ctxpar_comm_cancel(k.comm, req);
        ASSERT_EQ(ctxpar_comm_barrier(k.comm), CTXPAR_OK) << ctxpar_last_error();
        EXPECT_EQ(recv.Get(), Data(prev, n));
    });
}

// A rank that never arrives: the other ranks' barrier returns TIMEOUT after the timeout and
// the communicator is aborted (reported by ctxpar_nccl_comm_aborted).
TEST_F(NcclComm, MissingPeerTimesOut) {
    if (GpuCount() < 2)
        GTEST_SKIP() << "skipped: needs 2 GPUs (found " << GpuCount() << ")";
    RunRanks([](Rank &k) {
        // One barrier together first: NCCL sets its connections up on first use, and a blocking
        // communicator's setup waits for the peers on the host, outside any timeout.
        ASSERT_EQ(ctxpar_comm_barrier(k.comm), CTXPAR_OK) << ctxpar_last_error();
        if (k.rank == 1)
            return; // never arrives again
        ASSERT_EQ(ctxpar_comm_set_timeout(k.comm, 2.0), CTXPAR_OK);
        double t0 = ctxpar_now();
        EXPECT_EQ(ctxpar_comm_barrier(k.comm), CTXPAR_ERR_TIMEOUT);
        double dt = ctxpar_now() - t0;
        EXPECT_GE(dt, 2.0);
        EXPECT_LT(dt, 30.0);
        int aborted = 0;
        ASSERT_EQ(ctxpar_nccl_comm_aborted(k.comm, &aborted), CTXPAR_OK);
        EXPECT_EQ(aborted, 1);
        ctxpar_request *req = nullptr;
        float x = 0;
        EXPECT_EQ(ctxpar_comm_sendrecv(k.comm, &x, 4, 0, &x, 4, 0, 0, nullptr, &req),
                  CTXPAR_ERR_COMM);
    });
}

// A transfer whose peer never posts: wait returns TIMEOUT after the timeout and aborts.
TEST_F(NcclComm, MissingPeerTransferTimesOut) {
    if (GpuCount() < 2)
        GTEST_SKIP() << "skipped: needs 2 GPUs (found " << GpuCount() << ")";
    RunRanks([](Rank &k) {
        Buf send(k.dev, 1000), recv(k.dev, 1000);
        ctxpar_request *req = nullptr;
        const int peer = 1 - k.rank;
        if (k.rank < 2) { // connect ranks 0 and 1 first (see MissingPeerTimesOut)
            ASSERT_EQ(ctxpar_comm_sendrecv(k.comm, send.p, 4000, peer, recv.p, 4000, peer, 0,
                                           nullptr, &req),
                      CTXPAR_OK);
            ASSERT_EQ(ctxpar_comm_wait(k.comm, req, nullptr), CTXPAR_OK) << ctxpar_last_error();
        }
        if (k.rank != 0)
            return;
        ASSERT_EQ(ctxpar_comm_set_timeout(k.comm, 2.0), CTXPAR_OK);
        ASSERT_EQ(ctxpar_comm_sendrecv(k.comm, send.p, 4000, 1, recv.p, 4000, 1, 1, nullptr, &req),
                  CTXPAR_OK)
            << ctxpar_last_error();
        EXPECT_EQ(ctxpar_comm_wait(k.comm, req, nullptr), CTXPAR_ERR_TIMEOUT);
        int aborted = 0;
        ASSERT_EQ(ctxpar_nccl_comm_aborted(k.comm, &aborted), CTXPAR_OK);
        EXPECT_EQ(aborted, 1);
    });
}

TEST_F(NcclComm, ConstructorRefusesBadArguments) {
    ncclComm_t nccl = nullptr;
    int dev0 = 0;
    ASSERT_EQ(ncclCommInitAll(&nccl, 1, &dev0), ncclSuccess);
    ctxpar_comm *comm = nullptr;
    ctxpar_device *cpu = nullptr;
    ASSERT_EQ(ctxpar_device_create_cpu(nullptr, &cpu), CTXPAR_OK);
    EXPECT_EQ(ctxpar_comm_create_nccl(nccl, cpu, nullptr, &comm), CTXPAR_ERR_INVALID_ARG);
    EXPECT_EQ(ctxpar_comm_create_nccl(nullptr, cpu, nullptr, &comm), CTXPAR_ERR_INVALID_ARG);
    EXPECT_EQ(comm, nullptr);
    ctxpar_device_destroy(cpu);
    if (GpuCount() >= 2) {
        ctxpar_cuda_options o = CTXPAR_CUDA_OPTIONS_INIT;
        o.device_ordinal = 1;
        ctxpar_device *gpu1 = nullptr;
        ASSERT_EQ(ctxpar_device_create_cuda(&o, &gpu1), CTXPAR_OK);
        EXPECT_EQ(ctxpar_comm_create_nccl(nccl, gpu1, nullptr, &comm), CTXPAR_ERR_INVALID_ARG);
        EXPECT_NE(std::string(ctxpar_last_error()).find("GPU"), std::string::npos);
        ctxpar_device_destroy(gpu1);
    }
    ncclCommDestroy(nccl);
}

} // namespace

#endif
