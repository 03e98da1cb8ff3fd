// One context per rank reused across calls that change the layout, the global length (even and
// uneven shards) and a custom assignment, as a trainer does from batch to batch: every call must
// give the same bits as the same call on fresh contexts (the context keeps per-call state between
// calls, such as the layout's map and the workspace, and none of it may leak into the next call:
// a buffer read before it is written shows here as stale bytes from the call before, where a fresh
// process's zeroed pages would hide it). Forward and backward.
// Fresh contexts' results are checked against the fp64 oracle by the e2e suites.
#include <gtest/gtest.h>

#include <cstring>
#include <thread>
#include <vector>

#include "ctxpar.h"
#include "ctxpar_cpu.h"
#include "ctxpar_local.h"
#include "fault_comm.h"

namespace {

constexpr int kRanks = 2;
constexpr int64_t kHeads = 2, kDim = 8;

struct Call {
    ctxpar_layout layout;
    int64_t seq; // global
    ctxpar_algo algo;
    int64_t ulysses = 0; // the hybrid's group size (0: chosen)
};

// Odd tokens on rank 1, except a run of 3 on rank 0 (covers runs and single tokens).
std::vector<int32_t> Assignment(int64_t seq) {
    std::vector<int32_t> a(seq);
    for (int64_t t = 0; t < seq; t++)
        a[t] = (t >= 4 && t < 7) ? 0 : static_cast<int32_t>(t % 2);
    return a;
}

// Rank `rank`'s out, lse, dq, dk and dv for `call` on `ctx`, concatenated (inputs a function of
// position).
void RunRank(ctxpar_context *ctx, int rank, const Call &call, std::vector<float> *res,
             ctxpar_status *st) {
    std::vector<int32_t> assign = Assignment(call.seq);
    const int32_t *a = call.layout == CTXPAR_LAYOUT_CUSTOM ? assign.data() : nullptr;
    int64_t n = 0;
    *st = ctxpar_shard_count(call.layout, a, call.seq, rank, kRanks, &n);
    if (*st != CTXPAR_OK)
        return;
    std::vector<int64_t> pos(n);
    *st = ctxpar_positions_assigned(call.layout, a, call.seq, rank, kRanks, pos.data());
    if (*st != CTXPAR_OK)
        return;
    const size_t elems = static_cast<size_t>(n * kHeads * kDim);
    std::vector<float> q(elems), k(elems), v(elems), dout(elems);
    for (int64_t i = 0; i < n; i++)
        for (int64_t e = 0; e < kHeads * kDim; e++) {
            const size_t at = static_cast<size_t>(i * kHeads * kDim + e);
            q[at] = static_cast<float>((pos[i] * 7 + e * 3) % 11) / 11.0f - 0.5f;
            k[at] = static_cast<float>((pos[i] * 5 + e) % 13) / 13.0f - 0.5f;
            v[at] = static_cast<float>((pos[i] * 3 + e * 5) % 17) / 17.0f - 0.5f;
            dout[at] = static_cast<float>((pos[i] + e * 7) % 19) / 19.0f - 0.5f;
        }
    std::vector<float> out(elems), lse(static_cast<size_t>(kHeads * n)), dq(elems), dk(elems),
        dv(elems);
    auto make = [&](std::vector<float> &buf) {
        ctxpar_tensor t;
        std::memset(&t, 0, sizeof t);
        t.data = buf.data();
        t.dtype = CTXPAR_DTYPE_F32;
        const int64_t shape[4] = {1, n, kHeads, kDim};
        const int64_t stride[4] = {n * kHeads * kDim, kHeads * kDim, kDim, 1};
        std::memcpy(t.shape, shape, sizeof shape);
        std::memcpy(t.stride, stride, sizeof stride);
        return t;
    };
    ctxpar_tensor tq = make(q), tk = make(k), tv = make(v), to = make(out), tdo = make(dout);
    ctxpar_tensor tdq = make(dq), tdk = make(dk), tdv = make(dv);
    ctxpar_attn_params p = CTXPAR_ATTN_PARAMS_INIT;
    p.algo = call.algo;
    p.ulysses = call.ulysses;
    p.layout = call.layout;
    p.mask = CTXPAR_MASK_CAUSAL;
    p.seq_len_global = call.seq;
    p.assignment = a;
    *st = ctxpar_attn_fwd(ctx, &p, &tq, &tk, &tv, &to, lse.data(), nullptr);
    if (*st == CTXPAR_OK)
        *st = ctxpar_attn_bwd(ctx, &p, &tq, &tk, &tv, &to, lse.data(), &tdo, &tdq, &tdk, &tdv,
                              nullptr);
    for (const auto *part : {&out, &lse, &dq, &dk, &dv})
        res->insert(res->end(), part->begin(), part->end());
}

// Each rank's local comm wrapped in a fault comm without a fault, which counts the sub-comms
// split from it (fault_comm.h).
struct Ranks {
    ctxpar_local_group *group = nullptr;
    ctxpar_device *dev[kRanks] = {};
    ctxpar_comm *local[kRanks] = {};
    ctxpar_comm *comm[kRanks] = {};
    ctxpar_context *ctx[kRanks] = {};
    Ranks() {
        ctxpar_cpu_options o = CTXPAR_CPU_OPTIONS_INIT;
        o.num_threads = 1;
        const cpt_fault none = {CPT_FAULT_NONE, -1, 0, 0.0, 0};
        EXPECT_EQ(ctxpar_local_group_create(kRanks, &group), CTXPAR_OK);
        for (int r = 0; r < kRanks; r++) {
            EXPECT_EQ(ctxpar_device_create_cpu(&o, &dev[r]), CTXPAR_OK);
            EXPECT_EQ(ctxpar_comm_create_local(group, r, nullptr, &local[r]), CTXPAR_OK);
            EXPECT_EQ(ctxpar_comm_set_timeout(local[r], 20.0), CTXPAR_OK);
            EXPECT_EQ(cpt_comm_create_fault(local[r], &none, &comm[r]), CTXPAR_OK);
            EXPECT_EQ(ctxpar_context_create(dev[r], comm[r], nullptr, &ctx[r]), CTXPAR_OK);
        }
    }
    void DestroyContexts() {
        for (int r = 0; r < kRanks; r++) {
            ctxpar_context_destroy(ctx[r]);
            ctx[r] = nullptr;
        }
    }
    ~Ranks() {
        DestroyContexts();
        for (int r = 0; r < kRanks; r++) {
            ctxpar_comm_destroy(comm[r]);
            ctxpar_comm_destroy(local[r]);
            ctxpar_device_destroy(dev[r]);
        }
        ctxpar_local_group_destroy(group);
    }
    // Every rank's results, concatenated in rank order.
    ctxpar_status Run(const Call &call, std::vector<float> *all) {
        std::vector<float> res[kRanks];
        ctxpar_status st[kRanks];
        std::vector<std::thread> t;
        for (int r = 0; r < kRanks; r++)
            t.emplace_back(RunRank, ctx[r], r, call, &res[r], &st[r]);
        for (auto &th : t)
            th.join();
        all->clear();
        for (int r = 0; r < kRanks; r++) {
            if (st[r] != CTXPAR_OK)
                return st[r];
            all->insert(all->end(), res[r].begin(), res[r].end());
        }
        return CTXPAR_OK;
    }
};

TEST(ContextReuse, LayoutLengthAndAssignmentChangesGiveFreshContextsBits) {
    // All-to-all's uneven backward once read rows of its workspace it had not written (the zeros
    // standing in for a missing lse_lo were too few): the calls before it leave them non-zero.
    const Call calls[] = {
        {CTXPAR_LAYOUT_CONTIGUOUS, 16, CTXPAR_ALGO_RING},
        {CTXPAR_LAYOUT_ZIGZAG, 16, CTXPAR_ALGO_RING},
        {CTXPAR_LAYOUT_ZIGZAG, 13, CTXPAR_ALGO_RING},
        {CTXPAR_LAYOUT_CUSTOM, 13, CTXPAR_ALGO_RING},
        {CTXPAR_LAYOUT_STRIPED, 13, CTXPAR_ALGO_ALLGATHER},
        {CTXPAR_LAYOUT_CONTIGUOUS, 16, CTXPAR_ALGO_ALLTOALL},
        {CTXPAR_LAYOUT_CONTIGUOUS, 13, CTXPAR_ALGO_ALLTOALL},
        {CTXPAR_LAYOUT_CONTIGUOUS, 16, CTXPAR_ALGO_RING},
        {CTXPAR_LAYOUT_CONTIGUOUS, 9, CTXPAR_ALGO_ALLGATHER},
        {CTXPAR_LAYOUT_CUSTOM, 16, CTXPAR_ALGO_RING},
        {CTXPAR_LAYOUT_CONTIGUOUS, 16, CTXPAR_ALGO_RING},
    };
    Ranks reused;
    for (const Call &c : calls) {
        SCOPED_TRACE(std::string(ctxpar_layout_name(c.layout)) + " seq " + std::to_string(c.seq) +
                     " " + ctxpar_algo_name(c.algo));
        std::vector<float> got, want;
        ASSERT_EQ(reused.Run(c, &got), CTXPAR_OK) << ctxpar_last_error();
        Ranks fresh;
        ASSERT_EQ(fresh.Run(c, &want), CTXPAR_OK) << ctxpar_last_error();
        ASSERT_EQ(got.size(), want.size());
        EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0);
    }
}

// The hybrid keeps its sub-comms in its per-context state (the algorithm table's state hooks): a
// context splits its comm once per group size, reuses the sub-comms across forward and backward
// calls and calls of other algorithms, splits again when the group size changes, and destroys them
// with the context. Every call gives fresh contexts' bits.
TEST(ContextReuse, HybridSplitsOncePerGroupSizeAndDestroyReleases) {
    struct Step {
        Call call;
        int splits; // each rank's sub-comms made so far: two (group, ring) per group size
    };
    const Step steps[] = {
        {{CTXPAR_LAYOUT_ZIGZAG, 16, CTXPAR_ALGO_HYBRID, 2}, 2},
        {{CTXPAR_LAYOUT_CONTIGUOUS, 13, CTXPAR_ALGO_HYBRID, 2}, 2},
        {{CTXPAR_LAYOUT_CONTIGUOUS, 16, CTXPAR_ALGO_RING}, 2},
        {{CTXPAR_LAYOUT_CUSTOM, 13, CTXPAR_ALGO_HYBRID, 2}, 2},
        {{CTXPAR_LAYOUT_ZIGZAG, 16, CTXPAR_ALGO_HYBRID, 1}, 4},
        {{CTXPAR_LAYOUT_STRIPED, 13, CTXPAR_ALGO_HYBRID, 1}, 4},
        {{CTXPAR_LAYOUT_ZIGZAG, 16, CTXPAR_ALGO_HYBRID, 2}, 6},
    };
    Ranks reused;
    for (const Step &s : steps) {
        const Call &c = s.call;
        SCOPED_TRACE(std::string(ctxpar_layout_name(c.layout)) + " seq " + std::to_string(c.seq) +
                     " " + ctxpar_algo_name(c.algo) + " u " + std::to_string(c.ulysses));
        std::vector<float> got, want;
        ASSERT_EQ(reused.Run(c, &got), CTXPAR_OK) << ctxpar_last_error();
        for (int r = 0; r < kRanks; r++) {
            EXPECT_EQ(cpt_fault_splits(reused.comm[r]), s.splits) << "rank " << r;
            EXPECT_EQ(cpt_fault_splits_live(reused.comm[r]), 2) << "rank " << r;
        }
        Ranks fresh;
        ASSERT_EQ(fresh.Run(c, &want), CTXPAR_OK) << ctxpar_last_error();
        ASSERT_EQ(got.size(), want.size());
        EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0);
    }
    reused.DestroyContexts();
    for (int r = 0; r < kRanks; r++)
        EXPECT_EQ(cpt_fault_splits_live(reused.comm[r]), 0) << "rank " << r;
}

// A context that never ran the hybrid splits nothing.
TEST(ContextReuse, NoStateWithoutTheHybrid) {
    Ranks ranks;
    std::vector<float> got;
    ASSERT_EQ(ranks.Run({CTXPAR_LAYOUT_ZIGZAG, 16, CTXPAR_ALGO_RING}, &got), CTXPAR_OK)
        << ctxpar_last_error();
    for (int r = 0; r < kRanks; r++)
        EXPECT_EQ(cpt_fault_splits(ranks.comm[r]), 0) << "rank " << r;
}

} // namespace
