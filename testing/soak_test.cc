// Soak: 1,000 forward + backward calls with random valid shapes, settings, dtypes and rank counts
// on long-lived contexts (one per rank, for P = 1..4). After every call and
// ctxpar_context_release() each rank's context holds exactly the bytes it held before (the kept
// workspace and scratch are all it holds; nothing accumulates across calls), and every 50th call's
// results match the float64 oracle within the tolerance table. Not timed; the random choices come
// from a fixed seed, so a failure names the call and replays the same way.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "ctxpar.h"
#include "ctxpar_backend.h"
#include "ctxpar_cpu.h"
#include "ctxpar_local.h"
#include "reference/data.h"
#include "reference/metrics.h"
#include "reference/oracle.h"
#include "reference/tolerance.h"

namespace {

constexpr int kMaxRanks = 4;
constexpr int kCalls = 1000;
constexpr int kOracleEvery = 50;

// One group of P in-process ranks, each with its own device, comm and context, kept for the
// whole soak.
struct Group {
    int P = 0;
    ctxpar_local_group *group = nullptr;
    std::vector<ctxpar_device *> dev;
    std::vector<ctxpar_comm *> comm;
    std::vector<ctxpar_context *> ctx;

    explicit Group(int ranks) : P(ranks), dev(ranks), comm(ranks), ctx(ranks) {
        EXPECT_EQ(ctxpar_local_group_create(P, &group), CTXPAR_OK);
        ctxpar_cpu_options co = CTXPAR_CPU_OPTIONS_INIT;
        co.num_threads = 1;
        for (int r = 0; r < P; r++) {
            EXPECT_EQ(ctxpar_device_create_cpu(&co, &dev[r]), CTXPAR_OK);
            EXPECT_EQ(ctxpar_comm_create_local(group, r, nullptr, &comm[r]), CTXPAR_OK);
            EXPECT_EQ(ctxpar_context_create(dev[r], comm[r], nullptr, &ctx[r]), CTXPAR_OK)
                << ctxpar_last_error();
        }
    }
    ~Group() {
        for (int r = 0; r < P; r++) {
            ctxpar_context_destroy(ctx[r]);
            ctxpar_comm_destroy(comm[r]);
            ctxpar_device_destroy(dev[r]);
        }
        ctxpar_local_group_destroy(group);
    }
    Group(const Group &) = delete;
    Group &operator=(const Group &) = delete;
};

// One call's random problem.
struct Problem {
    int P;
    int64_t B, S, Hq, Hkv, D; // S global
    ctxpar_dtype dtype;
    ctxpar_attn_params params;
    std::vector<int32_t> cu; // documents, empty for none
    uint64_t seed;

    std::string Describe() const {
        std::ostringstream os;
        os << "P=" << P << " B=" << B << " S=" << S << " Hq=" << Hq << " Hkv=" << Hkv << " D=" << D
           << " " << ctxpar_dtype_name(dtype) << " " << ctxpar_algo_name(params.algo) << " "
           << ctxpar_layout_name(params.layout) << " " << ctxpar_mask_name(params.mask)
           << " window=" << params.window_left << " docs=" << (cu.empty() ? 0 : cu.size() - 1)
           << " seed=" << seed;
        return os.str();
    }
};

Problem RandomProblem(std::mt19937_64 &rng, uint64_t seed) {
    auto pick = [&](int64_t lo, int64_t hi) {
        return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
    };
    Problem pb;
    pb.P = static_cast<int>(pick(1, kMaxRanks));
    pb.params = CTXPAR_ATTN_PARAMS_INIT;
    const ctxpar_algo algos[] = {CTXPAR_ALGO_RING, CTXPAR_ALGO_ALLGATHER, CTXPAR_ALGO_AUTO};
    pb.params.algo = algos[pick(0, 2)];
    pb.params.layout = static_cast<ctxpar_layout>(pick(0, 2));
    pb.params.mask = static_cast<ctxpar_mask>(pick(0, 1));
    // The layout's unit: zigzag cuts the sequence in 2P chunks.
    const int64_t unit = pb.params.layout == CTXPAR_LAYOUT_ZIGZAG ? 2 * pb.P : pb.P;
    pb.S = unit * pick((16 + unit - 1) / unit, 48 / unit + 1);
    pb.B = pick(1, 2);
    pb.Hkv = pick(1, 3);
    pb.Hq = pb.Hkv * pick(1, 3);
    pb.D = pick(8, 40);
    pb.dtype = static_cast<ctxpar_dtype>(pick(0, 2));
    if (pick(0, 2) == 0)
        pb.params.window_left = pick(1, pb.S);
    if (pick(0, 2) == 0) {
        // Random boundaries, one-token documents included.
        pb.cu.push_back(0);
        while (pb.cu.back() < pb.S)
            pb.cu.push_back(
                static_cast<int32_t>(std::min<int64_t>(pb.S, pb.cu.back() + pick(1, pb.S / 2))));
        pb.params.cu_seqlens = pb.cu.data();
        pb.params.num_docs = static_cast<int64_t>(pb.cu.size()) - 1;
    }
    pb.seed = seed;
    return pb;
}

// A dense host tensor of `dtype` that owns its bytes.
struct Buffer {
    std::vector<unsigned char> bytes;
    ctxpar_tensor t{};
    Buffer(ctxpar_dtype dtype, int64_t B, int64_t S, int64_t H, int64_t D)
        : bytes(static_cast<size_t>(B * S * H * D) * ctxpar_dtype_size(dtype)) {
        t = ctxpar_tensor_bshd(bytes.data(), dtype, B, S, H, D);
    }
};

enum { kQ, kK, kV, kDout };
enum { kOut, kLse, kDq, kDk, kDv };
const char *const kName[] = {"out", "lse", "dq", "dk", "dv"};

// Global results of one call, gathered from every rank.
struct Results {
    std::vector<Buffer> t; // out, lse ([B * Hq, S, 1, 1] F32), dq, dk, dv
    explicit Results(const Problem &pb) {
        t.emplace_back(pb.dtype, pb.B, pb.S, pb.Hq, pb.D);
        t.emplace_back(CTXPAR_DTYPE_F32, pb.B * pb.Hq, pb.S, 1, 1);
        t.emplace_back(pb.dtype, pb.B, pb.S, pb.Hq, pb.D);
        t.emplace_back(pb.dtype, pb.B, pb.S, pb.Hkv, pb.D);
        t.emplace_back(pb.dtype, pb.B, pb.S, pb.Hkv, pb.D);
    }
};

// What one rank did: its status and message, and its memory before and after the call.
struct RankReport {
    ctxpar_status status = CTXPAR_OK;
    std::string message;
    size_t before = 0, after = 0;
};

// Rank r's call: shard the global inputs, forward and backward, unshard its outputs.
RankReport RunRank(const Problem &pb, Group &g, int r, const std::vector<Buffer> &in,
                   Results &res) {
    RankReport rep;
    const int64_t s = pb.S / pb.P;
    const ctxpar_layout lay = pb.params.layout;
    Buffer q(pb.dtype, pb.B, s, pb.Hq, pb.D), k(pb.dtype, pb.B, s, pb.Hkv, pb.D),
        v(pb.dtype, pb.B, s, pb.Hkv, pb.D), dout(pb.dtype, pb.B, s, pb.Hq, pb.D);
    Buffer out(pb.dtype, pb.B, s, pb.Hq, pb.D), lse(CTXPAR_DTYPE_F32, pb.B * pb.Hq, s, 1, 1),
        dq(pb.dtype, pb.B, s, pb.Hq, pb.D), dk(pb.dtype, pb.B, s, pb.Hkv, pb.D),
        dv(pb.dtype, pb.B, s, pb.Hkv, pb.D);
    ctxpar_memory_stats ms;
    ctxpar_status st = ctxpar_context_memory_stats(g.ctx[r], &ms);
    rep.before = ms.current_bytes;
    Buffer *local_in[] = {&q, &k, &v, &dout};
    for (int i = 0; i < 4 && st == CTXPAR_OK; i++)
        st = ctxpar_shard(lay, r, pb.P, &in[i].t, &local_in[i]->t);
    float *lse_data = reinterpret_cast<float *>(lse.bytes.data());
    if (st == CTXPAR_OK)
        st = ctxpar_attn_fwd(g.ctx[r], &pb.params, &q.t, &k.t, &v.t, &out.t, lse_data, nullptr);
    if (st == CTXPAR_OK)
        st = ctxpar_attn_bwd(g.ctx[r], &pb.params, &q.t, &k.t, &v.t, &out.t, lse_data, &dout.t,
                             &dq.t, &dk.t, &dv.t, nullptr);
    rep.status = st;
    rep.message = ctxpar_last_error();
    // The workspace is kept between calls by design; what release leaves behind would be a leak.
    if (ctxpar_context_release(g.ctx[r]) == CTXPAR_OK &&
        ctxpar_context_memory_stats(g.ctx[r], &ms) == CTXPAR_OK)
        rep.after = ms.current_bytes;
    Buffer *local_out[] = {&out, &lse, &dq, &dk, &dv};
    for (int i = 0; i < 5 && st == CTXPAR_OK; i++)
        st = ctxpar_unshard(lay, r, pb.P, &local_out[i]->t, &res.t[i].t);
    if (rep.status == CTXPAR_OK && st != CTXPAR_OK) {
        rep.status = st;
        rep.message = ctxpar_last_error();
    }
    return rep;
}

// Every tensor against the float64 oracle of the whole sequence.
void ExpectMatchesOracle(const Problem &pb, const Results &res, const std::string &what) {
    const int64_t nq = pb.B * pb.S * pb.Hq * pb.D, nk = pb.B * pb.S * pb.Hkv * pb.D;
    std::vector<double> x[4] = {std::vector<double>(nq), std::vector<double>(nk),
                                std::vector<double>(nk), std::vector<double>(nq)};
    const int64_t heads[4] = {pb.Hq, pb.Hkv, pb.Hkv, pb.Hq};
    for (int i = 0; i < 4; i++)
        cpt_test_fill_global_f64(x[i].data(), pb.dtype, pb.seed, i + 1, pb.B, pb.S, heads[i],
                                    pb.D);
    cpt_oracle_shape sh = {pb.B, pb.S, pb.S, pb.Hq, pb.Hkv, pb.D};
    ctxpar_mask_desc mask = cpt_oracle_mask(&pb.params);
    const double scale = 1.0f / std::sqrt(static_cast<float>(pb.D)); // as the library resolves
    std::vector<double> ref[5] = {std::vector<double>(nq), std::vector<double>(pb.B * pb.Hq * pb.S),
                                  std::vector<double>(nq), std::vector<double>(nk),
                                  std::vector<double>(nk)};
    cpt_oracle_fwd(&sh, x[kQ].data(), x[kK].data(), x[kV].data(), nullptr, nullptr, &mask, scale,
                      ref[kOut].data(), ref[kLse].data());
    cpt_oracle_bwd(&sh, x[kQ].data(), x[kK].data(), x[kV].data(), nullptr, nullptr, &mask, scale,
                      x[kDout].data(), ref[kDq].data(), ref[kDk].data(), ref[kDv].data());
    for (int i = 0; i < 5; i++) {
        cpt_error_stats e = cpt_compare_tensor(&res.t[i].t, ref[i].data());
        EXPECT_LE(e.rel, cpt_tolerance_for_seq(pb.dtype, kName[i], pb.S))
            << what << ": " << kName[i] << " max_abs " << e.max_abs << " at " << e.worst << ", "
            << e.nonfinite << " non-finite";
    }
}

TEST(Soak, ThousandCallsKeepMemoryFlatAndMatchTheOracle) {
    std::vector<std::unique_ptr<Group>> groups;
    for (int P = 1; P <= kMaxRanks; P++)
        groups.emplace_back(new Group(P));
    std::mt19937_64 rng(20240611);
    int checked = 0;
    for (int call = 0; call < kCalls; call++) {
        Problem pb = RandomProblem(rng, 1000 + call);
        const std::string what = "call " + std::to_string(call) + " (" + pb.Describe() + ")";
        // Global inputs, each rank takes its shard.
        std::vector<Buffer> in;
        const int64_t heads[4] = {pb.Hq, pb.Hkv, pb.Hkv, pb.Hq};
        for (int i = 0; i < 4; i++) {
            in.emplace_back(pb.dtype, pb.B, pb.S, heads[i], pb.D);
            cpt_test_fill(&in.back().t, pb.seed, i + 1, pb.S, nullptr);
        }
        Results res(pb);
        Group &g = *groups[pb.P - 1];
        std::vector<RankReport> rep(pb.P);
        std::vector<std::thread> threads;
        for (int r = 0; r < pb.P; r++)
            threads.emplace_back([&, r] { rep[r] = RunRank(pb, g, r, in, res); });
        for (auto &t : threads)
            t.join();
        for (int r = 0; r < pb.P; r++) {
            ASSERT_EQ(rep[r].status, CTXPAR_OK) << what << ": rank " << r << ": " << rep[r].message;
            ASSERT_EQ(rep[r].after, rep[r].before)
                << what << ": rank " << r << " holds " << rep[r].after << " bytes after the call, "
                << rep[r].before << " before";
        }
        if (call % kOracleEvery == 0) {
            ExpectMatchesOracle(pb, res, what);
            checked++;
            if (HasFailure())
                return;
        }
    }
    EXPECT_EQ(checked, kCalls / kOracleEvery);
    // The counter the flat-memory check reads does move: every rank allocated during its calls.
    for (auto &g : groups)
        for (int r = 0; r < g->P; r++) {
            ctxpar_memory_stats ms;
            ASSERT_EQ(ctxpar_context_memory_stats(g->ctx[r], &ms), CTXPAR_OK);
            EXPECT_GT(ms.peak_bytes, 0u) << "P=" << g->P << " rank " << r;
        }
}

} // namespace
