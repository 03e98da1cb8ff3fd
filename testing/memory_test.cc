// Memory the context owns: steady-state calls allocate nothing (every algorithm, forward and
// backward), the ring's workspace stays within its budget and its peak falls as 1/P against one
// rank, reserve and release do what they say, idle workspace is poisoned under ASan, and a device
// fault in the last work of a call is never lost.
#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

#include "ctxpar.h"
#include "ctxpar_backend.h"
#include "dispatch.h"
#include "ctxpar_cpu.h"
#include "ctxpar_local.h"
#include "reference/data.h"
#include "fault_device.h"
#include "reference/runner.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define HAVE_ASAN 1
#else
#define HAVE_ASAN 0
#endif

namespace {

cpt_run_config Config(ctxpar_algo algo, int ranks, int64_t seq, bool backward) {
    cpt_run_config c;
    cpt_run_config_default(&c);
    c.ranks = ranks;
    c.seq = seq;
    c.params.algo = algo;
    c.backward = backward;
    c.threads = 1;
    return c;
}

struct AllocCase {
    ctxpar_algo algo;
    int ranks;
    bool backward;
};

class Allocations : public ::testing::TestWithParam<AllocCase> {};

// After one warm-up call, the timed calls allocate nothing on any rank, and the answer is still
// within the oracle's tolerance.
TEST_P(Allocations, NoneAfterWarmup) {
    const AllocCase a = GetParam();
    cpt_run_config c = Config(a.algo, a.ranks, 512, a.backward);
    c.warmup = 1;
    c.repeat = 3;
    c.compare_single = 0;
    cpt_run_result r;
    ASSERT_EQ(cpt_run(&c, &r), CTXPAR_OK);
    EXPECT_TRUE(r.ok) << r.message;
    for (int i = 0; i < a.ranks; i++)
        EXPECT_EQ(r.rank[i].allocations, 0u) << "rank " << i;
    cpt_run_result_free(&r);
}

std::vector<AllocCase> AllocCases() {
    std::vector<AllocCase> v;
    for (ctxpar_algo algo : {CTXPAR_ALGO_RING, CTXPAR_ALGO_ALLGATHER, CTXPAR_ALGO_ALLTOALL})
        for (int ranks : {2, 4})
            for (bool bwd : {false, true})
                v.push_back({algo, ranks, bwd});
    return v;
}

INSTANTIATE_TEST_SUITE_P(Cpu, Allocations, ::testing::ValuesIn(AllocCases()),
                         [](const ::testing::TestParamInfo<AllocCase> &i) {
                             return std::string(ctxpar_algo_name(i.param.algo)) + "_P" +
                                    std::to_string(i.param.ranks) +
                                    (i.param.backward ? "_fwd_bwd" : "_fwd");
                         });

// Ring forward + backward: the peak per rank against one rank's falls as 1/P (at most 2/P: 0.5
// at P = 4), measured by the runner on both sides of the same run.
TEST(RingMemory, PeakFallsAsOneOverP) {
    for (int P : {2, 4, 8}) {
        cpt_run_config c = Config(CTXPAR_ALGO_RING, P, 1024, true); // 128 tokens a rank at P = 8
        c.compare_oracle = 0;
        c.warmup = 1;
        cpt_run_result r;
        ASSERT_EQ(cpt_run(&c, &r), CTXPAR_OK);
        ASSERT_EQ(r.status, CTXPAR_OK) << r.message;
        ASSERT_GT(r.single_rank_peak_bytes, 0u);
        const double ratio = (double)r.peak_bytes_per_rank / (double)r.single_rank_peak_bytes;
        EXPECT_LE(ratio, 2.0 / P) << "P = " << P << ": " << r.peak_bytes_per_rank << " vs "
                                  << r.single_rank_peak_bytes << " bytes";
        cpt_run_result_free(&r);
    }
}

// One rank's device, comm and context of a group of P (no communication needed: reserve and
// release are local).
struct Rank {
    ctxpar_local_group *group = nullptr;
    ctxpar_device *cpu = nullptr, *dev = nullptr;
    ctxpar_comm *comm = nullptr;
    ctxpar_context *ctx = nullptr;
    explicit Rank(int P, const cpt_fault_device_config *fault = nullptr) {
        ctxpar_cpu_options co = CTXPAR_CPU_OPTIONS_INIT;
        co.num_threads = 1;
        EXPECT_EQ(ctxpar_local_group_create(P, &group), CTXPAR_OK);
        EXPECT_EQ(ctxpar_device_create_cpu(&co, &cpu), CTXPAR_OK);
        dev = cpu;
        if (fault) {
            EXPECT_EQ(cpt_device_create_fault(cpu, fault, &dev), CTXPAR_OK);
        }
        EXPECT_EQ(ctxpar_comm_create_local(group, 0, nullptr, &comm), CTXPAR_OK);
        EXPECT_EQ(ctxpar_context_create(dev, comm, nullptr, &ctx), CTXPAR_OK);
    }
    ~Rank() {
        ctxpar_context_destroy(ctx);
        ctxpar_comm_destroy(comm);
        if (dev != cpu)
            ctxpar_device_destroy(dev);
        ctxpar_device_destroy(cpu);
        ctxpar_local_group_destroy(group);
    }
    size_t Current() {
        ctxpar_memory_stats ms;
        EXPECT_EQ(ctxpar_context_memory_stats(ctx, &ms), CTXPAR_OK);
        return ms.current_bytes;
    }
};

constexpr int64_t kB = 1, kH = 4, kD = 64;

struct Tensors {
    std::vector<float> q, k, v, out, dout, dq, dk, dv, lse;
    int64_t s;
    explicit Tensors(int64_t s_local) : s(s_local) {
        const size_t n = (size_t)(kB * s * kH * kD);
        for (auto *x : {&q, &k, &v, &out, &dout, &dq, &dk, &dv})
            x->assign(n, 0.0f);
        lse.assign((size_t)(kB * kH * s), 0.0f);
        std::vector<int64_t> pos((size_t)s);
        for (int64_t i = 0; i < s; i++)
            pos[(size_t)i] = i;
        int id = 1;
        for (auto *x : {&q, &k, &v, &dout}) {
            ctxpar_tensor t = T(*x);
            cpt_test_fill(&t, 3, id++, s, pos.data());
        }
    }
    ctxpar_tensor T(std::vector<float> &x) {
        return ctxpar_tensor_bshd(x.data(), CTXPAR_DTYPE_F32, kB, s, kH, kD);
    }
};

// The ring's reserved workspace is at most 10 shard-sized tensors ([B, S/P, H, D] F32), for
// every P, mask and layout (what the ring keeps per rank: docs/algorithms.md).
TEST(Workspace, RingBudgetIsTenShardTensors) {
    const int64_t S = 4096;
    for (int P : {2, 4, 8})
        for (ctxpar_layout layout :
             {CTXPAR_LAYOUT_CONTIGUOUS, CTXPAR_LAYOUT_ZIGZAG, CTXPAR_LAYOUT_STRIPED})
            for (int64_t window : {0, 64})
                for (ctxpar_mask mask : {CTXPAR_MASK_NONE, CTXPAR_MASK_CAUSAL}) {
                    SCOPED_TRACE(testing::Message()
                                 << "P = " << P << ", " << ctxpar_layout_name(layout) << ", "
                                 << ctxpar_mask_name(mask) << ", window " << window);
                    Rank r(P);
                    Tensors t(S / P);
                    ctxpar_attn_params p = CTXPAR_ATTN_PARAMS_INIT;
                    p.algo = CTXPAR_ALGO_RING;
                    p.layout = layout;
                    p.mask = mask;
                    p.window_left = window;
                    ctxpar_tensor q = t.T(t.q), k = t.T(t.k), v = t.T(t.v);
                    ASSERT_EQ(ctxpar_context_reserve(r.ctx, &p, &q, &k, &v), CTXPAR_OK)
                        << ctxpar_last_error();
                    const size_t shard = (size_t)(kB * (S / P) * kH * kD) * sizeof(float);
                    EXPECT_GT(r.Current(), 4 * shard) << "K/V double buffer at least";
                    EXPECT_LE(r.Current(), 10 * shard);
                    EXPECT_EQ(ctxpar_context_release(r.ctx), CTXPAR_OK);
                    EXPECT_EQ(r.Current(), 0u);
                }
}

// No mask or layout makes the ring hold more than without a mask (before, a rank whose finished
// dK/dV came home early or stayed at step 0 kept a third dK/dV buffer: 11 shard tensors).
// Measured on real forward + backward runs, all ranks, against the unmasked run's peak.
TEST(Workspace, RingPeakIsTheSameForEveryMaskAndLayout) {
    struct MaskCase {
        const char *name;
        ctxpar_mask mask;
        int64_t window, docs;
    } masks[] = {{"none", CTXPAR_MASK_NONE, 0, 0},
                 {"causal", CTXPAR_MASK_CAUSAL, 0, 0},
                 {"causal_window", CTXPAR_MASK_CAUSAL, 96, 0},
                 {"causal_docs", CTXPAR_MASK_CAUSAL, 0, 5}};
    for (int P : {3, 4}) {
        size_t plain = 0;
        for (ctxpar_layout layout :
             {CTXPAR_LAYOUT_CONTIGUOUS, CTXPAR_LAYOUT_ZIGZAG, CTXPAR_LAYOUT_STRIPED})
            for (const MaskCase &m : masks) {
                cpt_run_config c = Config(CTXPAR_ALGO_RING, P, 96 * P, true);
                c.params.layout = layout;
                c.params.mask = m.mask;
                c.params.window_left = m.window;
                c.docs = m.docs;
                c.compare_single = 0;
                cpt_run_result r;
                ASSERT_EQ(cpt_run(&c, &r), CTXPAR_OK);
                EXPECT_TRUE(r.ok) << r.message;
                if (plain == 0)
                    plain = r.peak_bytes_per_rank; // contiguous, no mask: first
                EXPECT_LE(r.peak_bytes_per_rank, plain)
                    << "P = " << P << ", " << ctxpar_layout_name(layout) << ", " << m.name;
                cpt_run_result_free(&r);
            }
    }
}

// After reserve, even the first calls allocate nothing; release gives everything back (the
// backward's kernel scratch too) and the next call allocates again.
TEST(Workspace, ReserveThenCallsAllocateNothingAndReleaseGivesBack) {
    Rank r(1);
    Tensors t(256);
    ctxpar_attn_params p = CTXPAR_ATTN_PARAMS_INIT;
    ctxpar_tensor q = t.T(t.q), k = t.T(t.k), v = t.T(t.v), out = t.T(t.out),
                  dout = t.T(t.dout), dq = t.T(t.dq), dk = t.T(t.dk), dv = t.T(t.dv);
    ASSERT_EQ(ctxpar_context_reserve(r.ctx, &p, &q, &k, &v), CTXPAR_OK) << ctxpar_last_error();
    const size_t reserved = r.Current();
    EXPECT_GT(reserved, 0u);
    const uint64_t allocs = ctxpar_dev_books_of(r.dev)->alloc_count;
    ASSERT_EQ(ctxpar_attn_fwd(r.ctx, &p, &q, &k, &v, &out, t.lse.data(), nullptr), CTXPAR_OK);
    EXPECT_EQ(ctxpar_dev_books_of(r.dev)->alloc_count, allocs) << "forward after reserve";
    EXPECT_EQ(r.Current(), reserved);
    ASSERT_EQ(ctxpar_attn_bwd(r.ctx, &p, &q, &k, &v, &out, t.lse.data(), &dout, &dq, &dk, &dv,
                              nullptr),
              CTXPAR_OK);
    const uint64_t after_first_bwd = ctxpar_dev_books_of(r.dev)->alloc_count; // the kernel's scratch, once
    ASSERT_EQ(ctxpar_attn_bwd(r.ctx, &p, &q, &k, &v, &out, t.lse.data(), &dout, &dq, &dk, &dv,
                              nullptr),
              CTXPAR_OK);
    EXPECT_EQ(ctxpar_dev_books_of(r.dev)->alloc_count, after_first_bwd) << "second backward";
    EXPECT_GE(r.Current(), reserved);
    EXPECT_EQ(ctxpar_context_release(r.ctx), CTXPAR_OK);
    EXPECT_EQ(r.Current(), 0u) << "release leaves nothing";
    ASSERT_EQ(ctxpar_attn_fwd(r.ctx, &p, &q, &k, &v, &out, t.lse.data(), nullptr), CTXPAR_OK);
    EXPECT_GT(ctxpar_dev_books_of(r.dev)->alloc_count, after_first_bwd) << "a call after release allocates again";
    EXPECT_GT(r.Current(), 0u);
}

TEST(Workspace, ReserveRejectsBadArguments) {
    Rank r(1);
    Tensors t(64);
    ctxpar_attn_params p = CTXPAR_ATTN_PARAMS_INIT;
    ctxpar_tensor q = t.T(t.q), k = t.T(t.k);
    EXPECT_EQ(ctxpar_context_reserve(r.ctx, &p, &q, &k, nullptr), CTXPAR_ERR_INVALID_ARG);
    EXPECT_EQ(ctxpar_context_reserve(nullptr, &p, &q, &k, &k), CTXPAR_ERR_INVALID_ARG);
    EXPECT_EQ(r.Current(), 0u);
    EXPECT_EQ(ctxpar_context_release(nullptr), CTXPAR_ERR_INVALID_ARG);
}

// Between calls the workspace is poisoned, so a read of it after a call returned is caught.
TEST(Workspace, IdleWorkspaceIsPoisonedUnderAsan) {
    if (!HAVE_ASAN)
        GTEST_SKIP() << "skipped: needs AddressSanitizer (bazel test --config=asan)";
#if HAVE_ASAN
    cpt_fault_device_config none = {0, nullptr, 0};
    Rank r(1, &none);
    Tensors t(128);
    ctxpar_attn_params p = CTXPAR_ATTN_PARAMS_INIT;
    ctxpar_tensor q = t.T(t.q), k = t.T(t.k), v = t.T(t.v), out = t.T(t.out);
    ASSERT_EQ(ctxpar_context_reserve(r.ctx, &p, &q, &k, &v), CTXPAR_OK);
    size_t bytes = 0;
    char *ws = static_cast<char *>(cpt_fault_device_last_alloc(r.dev, &bytes));
    ASSERT_NE(ws, nullptr);
    EXPECT_TRUE(__asan_address_is_poisoned(ws)) << "reserved, not in use";
    ASSERT_EQ(ctxpar_attn_fwd(r.ctx, &p, &q, &k, &v, &out, t.lse.data(), nullptr), CTXPAR_OK);
    EXPECT_TRUE(__asan_address_is_poisoned(ws)) << "after a call";
    EXPECT_TRUE(__asan_address_is_poisoned(ws + bytes - 1));
    ::testing::FLAGS_gtest_death_test_style = "threadsafe";
    EXPECT_DEATH({ volatile char c = ws[bytes / 2]; (void)c; }, "use-after-poison");
#endif
}

// A device fault reported by the last call of an op during an attention call (the last
// synchronisation, the end-of-call event, the last kernel or copy) is the call's result, never
// OK. Two ranks run ring forward + backward; rank 0's device emulates streams and fails, and
// *calls_out gets how often rank 0 called `op`. Returns rank 0's status (rank 1 may see REMOTE).
ctxpar_status RunTwoRanks(const char *op, int fail_at, bool verify, int *calls_out) {
    constexpr int P = 2;
    const int64_t S = 256, s = S / P;
    ctxpar_local_group *group = nullptr;
    EXPECT_EQ(ctxpar_local_group_create(P, &group), CTXPAR_OK);
    ctxpar_status result[P] = {CTXPAR_OK, CTXPAR_OK};
    auto rank_main = [&](int rk) {
        ctxpar_cpu_options co = CTXPAR_CPU_OPTIONS_INIT;
        co.num_threads = 1;
        ctxpar_device *cpu = nullptr, *dev = nullptr;
        ctxpar_comm *comm = nullptr;
        ctxpar_context *ctx = nullptr;
        ctxpar_context_options opts = CTXPAR_CONTEXT_OPTIONS_INIT;
        opts.verify_transfers = verify;
        cpt_fault_device_config cfg = {1, rk == 0 && fail_at >= 0 ? op : nullptr, fail_at};
        Tensors t(s);
        ctxpar_attn_params p = CTXPAR_ATTN_PARAMS_INIT;
        p.algo = CTXPAR_ALGO_RING;
        p.mask = CTXPAR_MASK_CAUSAL;
        p.layout = CTXPAR_LAYOUT_ZIGZAG;
        ctxpar_tensor q = t.T(t.q), k = t.T(t.k), v = t.T(t.v), out = t.T(t.out),
                      dout = t.T(t.dout), dq = t.T(t.dq), dk = t.T(t.dk), dv = t.T(t.dv);
        ctxpar_status st = ctxpar_device_create_cpu(&co, &cpu);
        if (st == CTXPAR_OK)
            st = cpt_device_create_fault(cpu, &cfg, &dev);
        if (st == CTXPAR_OK)
            st = ctxpar_comm_create_local(group, rk, nullptr, &comm);
        if (st == CTXPAR_OK)
            st = ctxpar_comm_set_timeout(comm, 5);
        if (st == CTXPAR_OK)
            st = ctxpar_context_create(dev, comm, &opts, &ctx);
        if (st == CTXPAR_OK)
            st = ctxpar_attn_fwd(ctx, &p, &q, &k, &v, &out, t.lse.data(), nullptr);
        if (st == CTXPAR_OK)
            st = ctxpar_attn_bwd(ctx, &p, &q, &k, &v, &out, t.lse.data(), &dout, &dq, &dk, &dv,
                                 nullptr);
        result[rk] = st;
        if (rk == 0 && calls_out)
            *calls_out = dev ? cpt_fault_device_calls(dev, op) : -1;
        ctxpar_context_destroy(ctx);
        ctxpar_comm_destroy(comm);
        ctxpar_device_destroy(dev);
        ctxpar_device_destroy(cpu);
    };
    std::thread t1(rank_main, 1);
    rank_main(0);
    t1.join();
    ctxpar_local_group_destroy(group);
    return result[0];
}

TEST(NoLostErrors, AFaultInTheLastCallOfAnOpIsTheCallsResult) {
    struct Case {
        const char *op;
        bool verify;
    } cases[] = {{"event_record", false}, {"stream_sync", true}, {"cast", false},
                 {"attn_block_bwd", false}, {"fill", false}};
    for (const Case &c : cases) {
        int calls = 0;
        ASSERT_EQ(RunTwoRanks(c.op, -1, c.verify, &calls), CTXPAR_OK) << c.op << ": clean run";
        ASSERT_GT(calls, 0) << c.op << " is called during forward + backward";
        // The last call of the op (in the backward, the last attention call of the run).
        EXPECT_EQ(RunTwoRanks(c.op, calls - 1, c.verify, nullptr), CTXPAR_ERR_DEVICE) << c.op;
    }
}

// The status of every free is the result of the call that freed: a call that grows the
// workspace frees the old block, and a fault the device reports there turns the otherwise OK
// call into an error; so does release. The same sequence without the fault is OK throughout.
ctxpar_status GrowThenRelease(int fail_at, ctxpar_status *release_out, int *frees_out,
                              std::string *message_out = nullptr) {
    cpt_fault_device_config cfg = {0, fail_at >= 0 ? "free" : nullptr, fail_at};
    Rank r(1, &cfg);
    Tensors small(64), large(256);
    ctxpar_attn_params p = CTXPAR_ATTN_PARAMS_INIT;
    ctxpar_tensor q = small.T(small.q), k = small.T(small.k), v = small.T(small.v),
                  out = small.T(small.out);
    EXPECT_EQ(ctxpar_attn_fwd(r.ctx, &p, &q, &k, &v, &out, small.lse.data(), nullptr), CTXPAR_OK)
        << "no free yet: " << ctxpar_last_error();
    EXPECT_EQ(cpt_fault_device_calls(r.dev, "free"), 0);
    q = large.T(large.q), k = large.T(large.k), v = large.T(large.v), out = large.T(large.out);
    const ctxpar_status st =
        ctxpar_attn_fwd(r.ctx, &p, &q, &k, &v, &out, large.lse.data(), nullptr);
    if (message_out)
        *message_out = ctxpar_last_error();
    *frees_out = cpt_fault_device_calls(r.dev, "free");
    *release_out = ctxpar_context_release(r.ctx);
    EXPECT_EQ(r.Current(), 0u) << "a failed free still gives the block back";
    return st;
}

TEST(NoLostErrors, AFailingFreeIsTheCallsResult) {
    ctxpar_status release = CTXPAR_ERR_INTERNAL;
    int frees = 0;
    ASSERT_EQ(GrowThenRelease(-1, &release, &frees), CTXPAR_OK) << ctxpar_last_error();
    EXPECT_EQ(release, CTXPAR_OK);
    ASSERT_GE(frees, 1) << "growing the workspace frees the smaller block";
    // The first free is the growing call's.
    std::string message;
    int failed_frees = 0;
    EXPECT_EQ(GrowThenRelease(0, &release, &failed_frees, &message), CTXPAR_ERR_DEVICE);
    EXPECT_NE(message.find("free"), std::string::npos) << message;
    EXPECT_EQ(release, CTXPAR_OK);
    // A fault in release's free is release's result.
    EXPECT_EQ(GrowThenRelease(frees, &release, &frees), CTXPAR_OK);
    EXPECT_EQ(release, CTXPAR_ERR_DEVICE);
}

}  // namespace
