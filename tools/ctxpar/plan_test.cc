// The planner against real runs: for every algorithm, rank count up to 8 and layout, the mask
// kinds (none, causal, window, documents, two-sided window) in turn, the hybrid's groups of 2, 3
// and 4, attention sinks (their gradient's all-gather too) and MLA, the per-rank FLOPs and bytes
// `ctxpar plan` predicts equal what the library's work statistics and comm counted in a real run
// (in-process ranks, CPU device) - exactly, both being counts; the bytes each rank receives equal
// what the real run's trace shows its peers sending it; the per-rank pairs equal a pair-by-pair
// count against the mask; the coverage proof holds, and a problem the library refuses is refused by
// the plan too. Any length: uneven shards (a prime length) and fewer tokens than ranks as well.
// Striped and custom plans (the planner's fast paths for them) against a brute-force count.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "algorithms.h"
#include "plan_device.h"
#include "plan_run.h"
#include "reference/runner.h"
#include "dispatch.h"

namespace {

const int32_t kDocs[] = {0, 30, 31, 100, 100, 192}; // lengths 30, 1, 69, 0, 92
const int32_t kDocsUneven[] = {0, 30, 31, 100, 100, 197};

struct PlanCase {
    ctxpar_algo algo;
    int ranks;
    ctxpar_layout layout;
    int mask; // 0 none, 1 causal, 2 causal + window, 3 documents + causal, 4 two-sided window
    int64_t kv_heads;
    int64_t ulysses;
    int64_t seq = 192;
    int64_t heads = 12;
    int64_t head_dim_v = 0; // MLA when set (head_dim is 16)
    bool sinks = false;
    bool repro = false; // params.reproducible (binned sums: larger accumulators and transfers)
};

// Whether the library refuses the case: only the head rules of all-to-all and of the hybrid's
// explicit groups (any length runs).
bool Refused(const PlanCase &c) {
    const int64_t P = c.ranks, u = c.ulysses;
    if (c.algo == CTXPAR_ALGO_ALLTOALL)
        return c.heads % P != 0 || (c.kv_heads % P != 0 && P % c.kv_heads != 0);
    if (c.algo == CTXPAR_ALGO_HYBRID && u > 0)
        return P % u != 0 || c.heads % u != 0 || (c.kv_heads % u != 0 && u % c.kv_heads != 0);
    return false;
}

std::string Name(const testing::TestParamInfo<PlanCase> &info) {
    const PlanCase &c = info.param;
    const char *mask[] = {"none", "causal", "window", "docs", "window2"};
    return std::string(ctxpar_algo_name(c.algo)) + "_P" + std::to_string(c.ranks) + "_" +
           ctxpar_layout_name(c.layout) + "_" + mask[c.mask] + "_KV" + std::to_string(c.kv_heads) +
           "_U" + std::to_string(c.ulysses) + (c.seq == 192 ? "" : "_S" + std::to_string(c.seq)) +
           (c.heads == 12 ? "" : "_H" + std::to_string(c.heads)) +
           (c.head_dim_v ? "_DV" + std::to_string(c.head_dim_v) : "") + (c.sinks ? "_sinks" : "") +
           (c.repro ? "_repro" : "");
}

ctxpar_attn_params Params(const PlanCase &c) {
    ctxpar_attn_params p = CTXPAR_ATTN_PARAMS_INIT;
    p.algo = c.algo;
    p.layout = c.layout;
    p.mask = c.mask == 0 || c.mask == 4 ? CTXPAR_MASK_NONE : CTXPAR_MASK_CAUSAL;
    p.window_left = c.mask == 2 ? 40 : c.mask == 4 ? 30 : 0;
    p.window_right = c.mask == 4 ? 17 : 0;
    if (c.mask == 3 && (c.seq == 192 || c.seq == 197)) {
        p.cu_seqlens = c.seq == 192 ? kDocs : kDocsUneven;
        p.num_docs = 5;
    }
    p.ulysses = c.ulysses;
    p.reproducible = c.repro ? 1 : 0;
    return p;
}

// Whether query q sees key k: the mask's definition, pair by pair.
bool Visible(const ctxpar_attn_params &p, int64_t q, int64_t k) {
    if (p.mask == CTXPAR_MASK_CAUSAL && k > q)
        return false;
    if (p.window_left > 0 && q - k >= p.window_left)
        return false;
    if (p.window_right > 0 && k - q > p.window_right)
        return false;
    if (!p.cu_seqlens)
        return true;
    auto doc = [&](int64_t x) {
        int64_t d = 0;
        while (d + 1 < p.num_docs && !(x < p.cu_seqlens[d + 1]))
            d++;
        return d;
    };
    return doc(q) == doc(k);
}

// Positions rank r of P holds when 2P divides S: the layouts' definitions (docs/algorithms.md).
std::vector<int64_t> Positions(ctxpar_layout l, int64_t S, int P, int r) {
    std::vector<int64_t> pos;
    const int64_t n = S / P, c = S / (2 * P);
    for (int64_t t = 0; t < S; t++)
        if ((l == CTXPAR_LAYOUT_CONTIGUOUS && t / n == r) ||
            (l == CTXPAR_LAYOUT_ZIGZAG && (t / c == r || t / c == 2 * P - 1 - r)) ||
            (l == CTXPAR_LAYOUT_STRIPED && t % P == r))
            pos.push_back(t);
    return pos;
}

// What the real run's trace shows each rank receiving, by link class (plan_comm.h; link groups
// of 2 ranks, as the plan below): a transfer event of the sender names its peer (for the
// hybrid, the peer's index in the ring of equal group members, whose traffic crosses groups);
// a collective (peer -1) exchanges one block with every other member, all blocks alike, so a
// member receives what it sends. The front door's all-gather of the sinks' gradient
// (ctxpar_sinks_backward, after the algorithm's backward) runs on the whole comm, for the hybrid
// too.
struct Trace {
    std::vector<std::vector<ctxpar_trace_event>> events;
};

bool IsDsinksAllgather(const ctxpar_trace_event &ev) {
    return ev.name && std::strcmp(ev.name, "allgather_dsinks") == 0;
}

void OnEvent(void *user, int rank, const ctxpar_trace_event *ev) {
    Trace *t = static_cast<Trace *>(user);
    if (ev->kind != CTXPAR_EVENT_TRANSFER)
        return;
    t->events[static_cast<size_t>(rank)].push_back(*ev); // each rank its own vector
}

struct Received {
    uint64_t link[2] = {0, 0}; // inside a link group / across
    uint64_t sent = 0;         // the same events' bytes sent
};

std::vector<Received> ReceivedFromTrace(const Trace &t, int P, int u) {
    std::vector<Received> rx(static_cast<size_t>(P));
    auto link = [](int a, int b) { return a / 2 == b / 2 ? 0 : 1; };
    for (int r = 0; r < P; r++)
        for (const ctxpar_trace_event &ev : t.events[static_cast<size_t>(r)]) {
            rx[static_cast<size_t>(r)].sent += ev.bytes;
            if (ev.bytes == 0) // a receive alone: its sender's event counts it
                continue;
            if (ev.peer >= 0) {
                const int dst = u > 0 ? ev.peer * u + r % u : ev.peer;
                rx[static_cast<size_t>(dst)].link[u > 0 ? 1 : link(r, dst)] += ev.bytes;
            } else if (u > 0 && !IsDsinksAllgather(ev)) {
                rx[static_cast<size_t>(r)].link[0] += ev.bytes; // the group's all-to-all
            } else {
                const uint64_t block = ev.bytes / static_cast<uint64_t>(P - 1);
                for (int j = 0; j < P; j++)
                    if (j != r)
                        rx[static_cast<size_t>(r)].link[link(r, j)] += block;
            }
        }
    return rx;
}

class PlanMatchesRun : public testing::TestWithParam<PlanCase> {};

TEST_P(PlanMatchesRun, FlopsAndBytesPerRank) {
    const PlanCase &c = GetParam();
    cpt_run_config cfg;
    cpt_run_config_default(&cfg);
    cfg.ranks = c.ranks;
    cfg.batch = 2;
    cfg.seq = c.seq;
    cfg.heads = c.heads;
    cfg.kv_heads = c.kv_heads;
    cfg.head_dim = 16;
    cfg.head_dim_v = c.head_dim_v;
    cfg.dtype = CTXPAR_DTYPE_BF16;
    cfg.params = Params(c);
    std::vector<float> sinks(static_cast<size_t>(c.heads));
    for (size_t h = 0; h < sinks.size(); h++)
        sinks[h] = 0.25f * static_cast<float>(h % 5) - 0.5f;
    if (c.sinks)
        cfg.params.sinks = sinks.data(); // host memory for the runner; the plan never reads it
    cfg.backward = 1;
    cfg.threads = 1;
    cfg.compare_oracle = 0;
    cfg.compare_single = 0;
    Trace trace;
    trace.events.resize(static_cast<size_t>(c.ranks));
    cfg.trace = OnEvent;
    cfg.trace_user = &trace;
    cpt_run_result run;
    ASSERT_EQ(cpt_run(&cfg, &run), CTXPAR_OK) << ctxpar_last_error();

    cpt_plan_config pc = {};
    pc.ranks = c.ranks;
    pc.batch = cfg.batch;
    pc.seq = cfg.seq;
    pc.heads = cfg.heads;
    pc.kv_heads = cfg.kv_heads;
    pc.head_dim = cfg.head_dim;
    pc.head_dim_v = cfg.head_dim_v;
    pc.dtype = cfg.dtype;
    pc.params = cfg.params;
    pc.backward = 1;
    pc.group_size = 2;
    pc.coverage = 1;
    cpt_plan_result plan;
    const ctxpar_status st = cpt_plan_run(&pc, &plan);
    // Any length runs: only the head rules of all-to-all and of the hybrid's groups refuse
    // (PlanMatchesRunCases.RefusedOnlyWhereIntended counts them).
    EXPECT_EQ(st == CTXPAR_OK, !Refused(c)) << ctxpar_last_error();
    EXPECT_EQ(st, run.status) << "plan: " << ctxpar_last_error() << "; run: " << run.message;
    if (st == CTXPAR_OK && run.status == CTXPAR_OK) {
        EXPECT_EQ(plan.algo, run.algo);
        EXPECT_TRUE(plan.coverage_ok) << "first bad position " << plan.coverage_bad_position;
        EXPECT_GT(plan.pairs_visible, 0);
        const int u = plan.algo == CTXPAR_ALGO_HYBRID ? plan.ulysses : 0;
        const std::vector<Received> rx = ReceivedFromTrace(trace, c.ranks, u);
        uint64_t sent[2][2] = {}, received[2][2] = {}; // [p2p, collective][link]
        double pairs = 0;
        for (int r = 0; r < c.ranks; r++) {
            SCOPED_TRACE("rank " + std::to_string(r));
            const cpt_plan_rank &pr = plan.rank[r];
            EXPECT_EQ(rx[static_cast<size_t>(r)].sent, run.rank[r].bytes_sent)
                << "the trace shows every byte the run sent";
            const cpt_plan_traffic &t = pr.traffic;
            EXPECT_EQ(t.p2p_bytes[0] + t.p2p_bytes[1] + t.coll_bytes[0] + t.coll_bytes[1],
                      pr.bytes_sent)
                << "every byte has a link class";
            EXPECT_EQ(pr.flops_fwd + pr.flops_bwd, run.rank[r].work.flops);
            EXPECT_EQ(pr.bytes_sent, run.rank[r].bytes_sent);
            EXPECT_EQ(t.p2p_recv_bytes[0] + t.coll_recv_bytes[0],
                      rx[static_cast<size_t>(r)].link[0]);
            EXPECT_EQ(t.p2p_recv_bytes[1] + t.coll_recv_bytes[1],
                      rx[static_cast<size_t>(r)].link[1]);
            EXPECT_EQ(pr.bytes_received,
                      rx[static_cast<size_t>(r)].link[0] + rx[static_cast<size_t>(r)].link[1]);
            // The workspace is part of what the real run's library allocated (with the kernels'
            // scratch).
            EXPECT_LE(pr.workspace_bytes, run.rank[r].peak_bytes);
            // The plan's largest workspace is the largest rank's.
            EXPECT_GT(pr.workspace_bytes, 0u);
            EXPECT_LE(pr.workspace_bytes, plan.workspace_bytes);
            for (int l = 0; l < 2; l++) {
                sent[0][l] += t.p2p_bytes[l];
                sent[1][l] += t.coll_bytes[l];
                received[0][l] += t.p2p_recv_bytes[l];
                received[1][l] += t.coll_recv_bytes[l];
            }
            pairs += pr.pairs;
        }
        for (int k = 0; k < 2; k++)
            for (int l = 0; l < 2; l++)
                EXPECT_EQ(received[k][l], sent[k][l])
                    << (k ? "collective" : "p2p") << " link " << l;
        EXPECT_EQ(pairs, plan.pairs_computed);
        if (c.seq % (2 * c.ranks) == 0) {
            // Each rank's pairs, pair by pair: its rows (its own; all-to-all: every position;
            // the hybrid: its group's) x its heads x the batch.
            for (int r = 0; r < c.ranks; r++) {
                std::vector<int64_t> rows;
                int64_t heads = cfg.heads;
                if (plan.algo == CTXPAR_ALGO_ALLTOALL) {
                    rows = Positions(CTXPAR_LAYOUT_CONTIGUOUS, c.seq, 1, 0);
                    heads /= c.ranks;
                } else {
                    const int g = u > 0 ? u : 1;
                    for (int j = r / g * g; j < r / g * g + g; j++)
                        for (int64_t q : Positions(c.layout, c.seq, c.ranks, j))
                            rows.push_back(q);
                    heads /= g;
                }
                double want = 0;
                for (int64_t q : rows)
                    for (int64_t k = 0; k < c.seq; k++)
                        want += Visible(cfg.params, q, k);
                EXPECT_EQ(plan.rank[r].pairs, want * static_cast<double>(heads * cfg.batch))
                    << "rank " << r;
            }
        }
    }
    if (st == CTXPAR_OK)
        cpt_plan_result_free(&plan);
    cpt_run_result_free(&run);
}

const ctxpar_algo kAlgos[] = {CTXPAR_ALGO_RING, CTXPAR_ALGO_ALLGATHER, CTXPAR_ALGO_ALLTOALL,
                              CTXPAR_ALGO_HYBRID, CTXPAR_ALGO_AUTO};

// Case n of a grid: every mask kind and GQA ratio in turn (periods 5 and 4, coprime with each
// other and with the 3 layouts), so that each algorithm meets each of them. All-to-all splits the
// query heads over the ranks: where 12 do not divide by P (8), 24 with K/V heads 24, 8, 1, 2.
// The hybrid: groups of 2 where they fit, else the library's choice.
PlanCase GridCase(int n, ctxpar_algo a, int p, ctxpar_layout l, int64_t seq) {
    const int64_t kv[] = {12, 3, 1, 2}, kv_of_24[] = {24, 8, 1, 2};
    const bool h24 = a == CTXPAR_ALGO_ALLTOALL && 12 % p != 0;
    const int64_t u = a == CTXPAR_ALGO_HYBRID && p % 2 == 0 ? 2 : 0;
    return {a, p, l, n % 5, h24 ? kv_of_24[n % 4] : kv[n % 4], u, seq, h24 ? 24 : 12};
}

std::vector<PlanCase> Cases() {
    std::vector<PlanCase> v;
    int n = 0;
    for (ctxpar_algo a : kAlgos)
        for (int p : {1, 2, 3, 4, 6, 8})
            for (ctxpar_layout l :
                 {CTXPAR_LAYOUT_CONTIGUOUS, CTXPAR_LAYOUT_ZIGZAG, CTXPAR_LAYOUT_STRIPED}) {
                v.push_back(GridCase(n, a, p, l, 192));
                n++;
            }
    return v;
}

INSTANTIATE_TEST_SUITE_P(All, PlanMatchesRun, testing::ValuesIn(Cases()), Name);

// Any length: 197 tokens (prime: every layout's shards differ, and so do the hybrid's groups), and
// fewer tokens than ranks (some hold none).
std::vector<PlanCase> UnevenCases() {
    std::vector<PlanCase> v;
    int n = 0;
    for (ctxpar_algo a : kAlgos)
        for (int p : {3, 4, 8})
            for (ctxpar_layout l :
                 {CTXPAR_LAYOUT_CONTIGUOUS, CTXPAR_LAYOUT_ZIGZAG, CTXPAR_LAYOUT_STRIPED}) {
                v.push_back(GridCase(n, a, p, l, n % 7 == 6 ? p / 2 + 1 : 197));
                n++;
            }
    return v;
}

INSTANTIATE_TEST_SUITE_P(Uneven, PlanMatchesRun, testing::ValuesIn(UnevenCases()), Name);

// The hybrid's larger groups: u = 3 at P = 6 and u = 4 at P = 8, every layout, K/V heads split,
// replicated and shared, one uneven length each.
std::vector<PlanCase> GroupCases() {
    std::vector<PlanCase> v;
    const ctxpar_layout layouts[] = {CTXPAR_LAYOUT_CONTIGUOUS, CTXPAR_LAYOUT_ZIGZAG,
                                     CTXPAR_LAYOUT_STRIPED};
    const int64_t kv3[] = {3, 12, 1}, kv4[] = {2, 12, 1};
    for (int i = 0; i < 3; i++) {
        const int64_t seq = i == 2 ? 197 : 192;
        v.push_back({CTXPAR_ALGO_HYBRID, 6, layouts[i], (i + 1) % 5, kv3[i], 3, seq});
        v.push_back({CTXPAR_ALGO_HYBRID, 8, layouts[i], (i + 3) % 5, kv4[i], 4, seq});
    }
    return v;
}

INSTANTIATE_TEST_SUITE_P(Groups, PlanMatchesRun, testing::ValuesIn(GroupCases()), Name);

// Attention sinks, and MLA (head_dim_v 8 against head_dim 16) with sinks: one case of each per
// algorithm, P = 4, zigzag, causal, GQA.
std::vector<PlanCase> FeatureCases() {
    std::vector<PlanCase> v;
    for (ctxpar_algo a : kAlgos)
        for (int64_t dv : {0, 8}) {
            const int64_t u = a == CTXPAR_ALGO_HYBRID ? 2 : 0;
            v.push_back({a, 4, CTXPAR_LAYOUT_ZIGZAG, 1, 2, u, 192, 12, dv, true});
        }
    return v;
}

INSTANTIATE_TEST_SUITE_P(Features, PlanMatchesRun, testing::ValuesIn(FeatureCases()), Name);

// Reproducible mode (params.reproducible): its bins accumulators and its dK/dV transfers in bins
// form, counted by the plan as the real run counts them. Every rank's shard whole chunks of
// CTXPAR_REPRO_CHUNK (256) positions for the ring and the all-gather (contiguous: seq 256 P;
// zigzag: 512 P), all-to-all's K/V heads divisible by P; causal, no mask, windows; 2 heads.
std::vector<PlanCase> ReproCases() {
    std::vector<PlanCase> v;
    auto add = [&](ctxpar_algo a, int p, ctxpar_layout l, int mask, int64_t kv, int64_t seq) {
        PlanCase c = {a, p, l, mask, kv, 0, seq, 2};
        c.repro = true;
        v.push_back(c);
    };
    add(CTXPAR_ALGO_RING, 1, CTXPAR_LAYOUT_CONTIGUOUS, 1, 2, 512);
    add(CTXPAR_ALGO_RING, 2, CTXPAR_LAYOUT_CONTIGUOUS, 1, 1, 512);
    add(CTXPAR_ALGO_RING, 4, CTXPAR_LAYOUT_CONTIGUOUS, 2, 2, 1024);
    add(CTXPAR_ALGO_RING, 2, CTXPAR_LAYOUT_ZIGZAG, 1, 2, 1024);
    add(CTXPAR_ALGO_RING, 4, CTXPAR_LAYOUT_ZIGZAG, 0, 1, 2048);
    add(CTXPAR_ALGO_ALLGATHER, 4, CTXPAR_LAYOUT_CONTIGUOUS, 1, 2, 1024);
    add(CTXPAR_ALGO_ALLGATHER, 2, CTXPAR_LAYOUT_ZIGZAG, 4, 1, 1024);
    add(CTXPAR_ALGO_ALLTOALL, 2, CTXPAR_LAYOUT_ZIGZAG, 1, 2, 512);
    return v;
}

INSTANTIATE_TEST_SUITE_P(Reproducible, PlanMatchesRun, testing::ValuesIn(ReproCases()), Name);

// The same problem planned both ways: reproducible mode sends more (dK/dV as bins, not F32) and
// needs more workspace (the accumulators) on every rank.
TEST(PlanReproducible, CostsMoreThanTheDefault) {
    for (ctxpar_algo a : {CTXPAR_ALGO_RING, CTXPAR_ALGO_ALLGATHER}) {
        SCOPED_TRACE(ctxpar_algo_name(a));
        cpt_plan_config pc = {};
        pc.ranks = 8;
        pc.batch = 1;
        pc.seq = 65536;
        pc.heads = 4;
        pc.kv_heads = 4;
        pc.head_dim = 64;
        pc.dtype = CTXPAR_DTYPE_BF16;
        pc.params = Params({a, 8, CTXPAR_LAYOUT_ZIGZAG, 1, 4, 0});
        pc.backward = 1;
        pc.group_size = 8;
        pc.coverage = 1;
        cpt_plan_result def, rep;
        ASSERT_EQ(cpt_plan_run(&pc, &def), CTXPAR_OK) << ctxpar_last_error();
        pc.params.reproducible = 1;
        ASSERT_EQ(cpt_plan_run(&pc, &rep), CTXPAR_OK) << ctxpar_last_error();
        EXPECT_TRUE(rep.coverage_ok);
        EXPECT_EQ(rep.algo, a);
        EXPECT_GT(rep.workspace_bytes, def.workspace_bytes);
        for (int r = 0; r < pc.ranks; r++) {
            EXPECT_GT(rep.rank[r].bytes_sent, def.rank[r].bytes_sent) << "rank " << r;
            EXPECT_GT(rep.rank[r].workspace_bytes, def.rank[r].workspace_bytes) << "rank " << r;
            EXPECT_EQ(rep.rank[r].flops_fwd, def.rank[r].flops_fwd) << "rank " << r;
        }
        cpt_plan_result_free(&def);
        cpt_plan_result_free(&rep);
        // A shard that is not whole chunks: refused like the library refuses it.
        pc.seq = 65536 - 8;
        pc.params.reproducible = 1;
        cpt_plan_result bad;
        EXPECT_EQ(cpt_plan_run(&pc, &bad), CTXPAR_ERR_NOT_SUPPORTED);
    }
}

// Refused by both: 12 query heads over 8 ranks (all-to-all), groups of 3 and 4 that do not fit.
std::vector<PlanCase> RefusalCases() {
    return {{CTXPAR_ALGO_ALLTOALL, 8, CTXPAR_LAYOUT_ZIGZAG, 1, 12, 0},
            {CTXPAR_ALGO_HYBRID, 8, CTXPAR_LAYOUT_ZIGZAG, 1, 12, 3},
            {CTXPAR_ALGO_HYBRID, 8, CTXPAR_LAYOUT_ZIGZAG, 1, 3, 4}};
}

INSTANTIATE_TEST_SUITE_P(Refusals, PlanMatchesRun, testing::ValuesIn(RefusalCases()), Name);

// The refusals above are only the intended ones (FlopsAndBytesPerRank asserts each case is
// refused exactly when Refused says so): RefusalCases, and in the others all-to-all's K/V heads
// that neither divide by P nor divide it and the hybrid's groups of 2 with 3 K/V heads; every
// algorithm is compared (runs) at every P of the grids.
TEST(PlanMatchesRunCases, RefusedOnlyWhereIntended) {
    for (const PlanCase &c : RefusalCases())
        EXPECT_TRUE(Refused(c)) << Name({c, 0});
    int refused = 0, total = 0;
    std::vector<int> compared(5 * 9, 0); // [algo][P]
    for (const auto &cases : {Cases(), UnevenCases(), GroupCases(), FeatureCases()})
        for (const PlanCase &c : cases) {
            total++;
            if (Refused(c)) {
                refused++;
                EXPECT_TRUE((c.algo == CTXPAR_ALGO_ALLTOALL && c.heads % c.ranks == 0) ||
                            (c.algo == CTXPAR_ALGO_HYBRID && c.ulysses == 2 && c.kv_heads == 3))
                    << Name({c, 0});
            } else {
                compared[static_cast<size_t>(static_cast<int>(c.algo) * 9 + c.ranks)]++;
            }
        }
    EXPECT_EQ(total, 151);
    EXPECT_EQ(refused, 9);
    for (ctxpar_algo a : kAlgos)
        for (int p : {1, 2, 3, 4, 6, 8})
            EXPECT_GT(compared[static_cast<size_t>(static_cast<int>(a) * 9 + p)], 0)
                << ctxpar_algo_name(a) << " P " << p;
}

// Striped and custom layouts against a count made here, not by the library: each rank's pairs
// (its rows - the hybrid: its group's rows for its share of the heads - against every key, pair
// by pair by Visible above) forward and backward, and the coverage proof's totals. The shapes
// take the planner's fast paths: striped keys are whole residue classes of the sequence (the
// count cache, the coverage's pending classes; an uneven length too); a custom layout of chunks
// has a few runs per rank (classified only within a query run's reach) and one of single tokens
// many (a block counted whole); documents are many, some empty.
struct BruteCase {
    // "striped"; custom: "chunks" (8-token chunks at random), "tokens" (tokens at random),
    // "evenly" (token t on rank t mod P: one strided span per rank, as striped), "mixed" (evenly
    // but for the first 20 tokens, on rank 0: its runs stay runs beside the others' spans)
    const char *layout;
    int64_t seq;
    int mask; // 0 causal + docs, 1 causal + window + docs, 2 two-sided + docs, 3 causal
    ctxpar_algo algo;
    int64_t ulysses;
};

std::vector<int32_t> Assignment(const BruteCase &c, int P) {
    std::vector<int32_t> a(static_cast<size_t>(c.seq));
    const bool mixed = std::strcmp(c.layout, "mixed") == 0;
    if (mixed || std::strcmp(c.layout, "evenly") == 0) {
        for (int64_t t = 0; t < c.seq; t++)
            a[static_cast<size_t>(t)] = mixed && t < 20 ? 0 : static_cast<int32_t>(t % P);
        return a;
    }
    std::mt19937 rng(static_cast<uint32_t>(c.seq * 7 + c.mask));
    const int64_t chunk = std::strcmp(c.layout, "chunks") == 0 ? 8 : 1;
    int32_t r = 0;
    for (int64_t t = 0; t < c.seq; t++) {
        if (t % chunk == 0)
            r = static_cast<int32_t>(rng() % static_cast<uint32_t>(P));
        a[static_cast<size_t>(t)] = r;
    }
    return a;
}

std::vector<int32_t> ManyDocs(int64_t S) {
    std::mt19937 rng(31);
    std::vector<int32_t> cu = {0};
    for (int d = 1; d < 20; d++) // lengths 0 .. 23: some documents empty
        cu.push_back(std::min<int32_t>(static_cast<int32_t>(S),
                                       cu.back() + static_cast<int32_t>(rng() % 24)));
    cu.push_back(static_cast<int32_t>(S));
    return cu;
}

TEST(PlanBruteForce, StripedAndCustomCounts) {
    const int P = 8;
    const int64_t batch = 2, heads = 8;
    std::vector<BruteCase> cases;
    for (const char *l : {"striped", "chunks", "tokens", "evenly", "mixed"})
        for (int mask = 0; mask < 4; mask++)
            for (auto [algo, u] : {std::pair<ctxpar_algo, int64_t>{CTXPAR_ALGO_RING, 0},
                                   {CTXPAR_ALGO_HYBRID, 2},
                                   {CTXPAR_ALGO_HYBRID, 4},
                                   {CTXPAR_ALGO_ALLGATHER, 0}})
                for (int64_t S : {240, 241})
                    if (S == 240 || std::strcmp(l, "striped") == 0 || std::strcmp(l, "evenly") == 0)
                        cases.push_back({l, S, mask, algo, u});
    // Tokens at random at 4,096: each rank's queries are more runs than a block is classified
    // pair by pair for (the ring's dry run then counts each row once, not block by block).
    for (int mask : {0, 3})
        for (int64_t u : {0, 2})
            cases.push_back({"tokens", 4096, mask, u ? CTXPAR_ALGO_HYBRID : CTXPAR_ALGO_RING, u});
    int with_docs = 0;
    for (const BruteCase &c : cases) {
        SCOPED_TRACE(std::string(c.layout) + " S " + std::to_string(c.seq) + " mask " +
                     std::to_string(c.mask) + " " + ctxpar_algo_name(c.algo) + " u " +
                     std::to_string(c.ulysses));
        const std::vector<int32_t> assign = Assignment(c, P), cu = ManyDocs(c.seq);
        const bool custom = std::strcmp(c.layout, "striped") != 0;
        ctxpar_attn_params p = CTXPAR_ATTN_PARAMS_INIT;
        p.algo = c.algo;
        p.ulysses = c.ulysses;
        p.layout = custom ? CTXPAR_LAYOUT_CUSTOM : CTXPAR_LAYOUT_STRIPED;
        p.assignment = custom ? assign.data() : nullptr;
        p.mask = c.mask == 2 ? CTXPAR_MASK_NONE : CTXPAR_MASK_CAUSAL;
        p.window_left = c.mask == 1 ? 40 : c.mask == 2 ? 30 : 0;
        p.window_right = c.mask == 2 ? 17 : 0;
        if (c.mask < 3) {
            p.cu_seqlens = cu.data();
            p.num_docs = static_cast<int64_t>(cu.size()) - 1;
            with_docs++;
        }
        cpt_plan_config pc = {};
        pc.ranks = P;
        pc.batch = batch;
        pc.seq = c.seq;
        pc.heads = heads;
        pc.kv_heads = 2;
        pc.head_dim = 16;
        pc.dtype = CTXPAR_DTYPE_BF16;
        pc.params = p;
        pc.backward = 1;
        pc.group_size = 2;
        pc.coverage = 1;
        cpt_plan_result plan;
        ASSERT_EQ(cpt_plan_run(&pc, &plan), CTXPAR_OK) << ctxpar_last_error();
        EXPECT_EQ(plan.algo, c.algo);
        // Each position's visible keys and the rank holding it, counted here.
        std::vector<double> keys(static_cast<size_t>(c.seq), 0.0);
        double all = 0;
        for (int64_t q = 0; q < c.seq; q++) {
            for (int64_t k = 0; k < c.seq; k++)
                keys[static_cast<size_t>(q)] += Visible(p, q, k);
            all += keys[static_cast<size_t>(q)];
        }
        const int u = static_cast<int>(c.ulysses > 0 ? c.ulysses : 1);
        for (int r = 0; r < P; r++) {
            double want = 0; // its (group's) rows' keys
            for (int64_t q = 0; q < c.seq; q++) {
                const int owner = custom ? assign[static_cast<size_t>(q)] : static_cast<int>(q % P);
                want += owner / u == r / u ? keys[static_cast<size_t>(q)] : 0.0;
            }
            want *= static_cast<double>(batch * heads / u);
            EXPECT_EQ(plan.rank[r].pairs, want) << "rank " << r;
            EXPECT_EQ(plan.rank[r].flops_fwd, 2.0 * 32 * want) << "rank " << r; // 2 (D + Dv)
            EXPECT_EQ(plan.rank[r].flops_bwd, plan.rank[r].flops_fwd) << "rank " << r;
        }
        EXPECT_TRUE(plan.coverage_ok) << "first bad position " << plan.coverage_bad_position;
        EXPECT_EQ(plan.pairs_visible, all * static_cast<double>(batch * heads));
        EXPECT_EQ(plan.pairs_computed, plan.pairs_visible);
        cpt_plan_result_free(&plan);
    }
    EXPECT_EQ(cases.size(), 116u);
    EXPECT_EQ(with_docs, 86);
}

// The hybrid's first member standing for its group gives the plan of running every member:
// per rank, every count and link class; the coverage proof alike (its sums too). Groups of 2, 4
// and 8, K/V heads split and replicated, every layout and mask kind, uneven shards, forward alone
// and with backward.
TEST(PlanSharedMembers, SameAsEveryMember) {
    int n = 0;
    for (int backward : {0, 1})
        for (int u : {2, 4, 8})
            for (int64_t seq : {192, 197})
                for (ctxpar_layout l :
                     {CTXPAR_LAYOUT_CONTIGUOUS, CTXPAR_LAYOUT_ZIGZAG, CTXPAR_LAYOUT_STRIPED}) {
                    const int64_t kv[] = {12, 3, 1, 2};
                    PlanCase c = {CTXPAR_ALGO_HYBRID, 8, l, n % 4, kv[n % 4], u, seq};
                    n++;
                    if (kv[(n - 1) % 4] % u != 0 && u % kv[(n - 1) % 4] != 0)
                        continue;
                    cpt_plan_config pc = {};
                    pc.ranks = c.ranks;
                    pc.batch = 2;
                    pc.seq = c.seq;
                    pc.heads = 24;
                    pc.kv_heads = c.kv_heads;
                    pc.head_dim = 16;
                    pc.dtype = CTXPAR_DTYPE_BF16;
                    pc.params = Params(c);
                    pc.backward = backward;
                    pc.group_size = 2;
                    pc.coverage = 1;
                    cpt_plan_result shared, every;
                    ASSERT_EQ(cpt_plan_run(&pc, &every), CTXPAR_OK) << ctxpar_last_error();
                    pc.share_members = 1;
                    ASSERT_EQ(cpt_plan_run(&pc, &shared), CTXPAR_OK) << ctxpar_last_error();
                    SCOPED_TRACE("u " + std::to_string(u) + " seq " + std::to_string(seq) + " " +
                                 ctxpar_layout_name(l) + " mask " + std::to_string(c.mask));
                    EXPECT_EQ(shared.ulysses, u);
                    EXPECT_TRUE(every.coverage_ok);
                    EXPECT_EQ(shared.coverage_ok, every.coverage_ok);
                    EXPECT_EQ(shared.pairs_computed, every.pairs_computed);
                    EXPECT_EQ(shared.workspace_bytes, every.workspace_bytes);
                    for (int r = 0; r < c.ranks; r++) {
                        const cpt_plan_rank &a = shared.rank[r], &b = every.rank[r];
                        EXPECT_EQ(a.flops_fwd, b.flops_fwd) << r;
                        EXPECT_EQ(a.flops_bwd, b.flops_bwd) << r;
                        EXPECT_EQ(a.pairs, b.pairs) << r;
                        EXPECT_EQ(a.bytes_sent, b.bytes_sent) << r;
                        EXPECT_EQ(a.bytes_received, b.bytes_received) << r;
                        EXPECT_EQ(a.workspace_bytes, b.workspace_bytes) << r;
                        for (int k = 0; k < 2; k++) {
                            EXPECT_EQ(a.traffic.p2p_bytes[k], b.traffic.p2p_bytes[k]) << r;
                            EXPECT_EQ(a.traffic.p2p_msgs[k], b.traffic.p2p_msgs[k]) << r;
                            EXPECT_EQ(a.traffic.coll_bytes[k], b.traffic.coll_bytes[k]) << r;
                            EXPECT_EQ(a.traffic.coll_msgs[k], b.traffic.coll_msgs[k]) << r;
                            EXPECT_EQ(a.traffic.p2p_recv_bytes[k], b.traffic.p2p_recv_bytes[k])
                                << r;
                            EXPECT_EQ(a.traffic.coll_recv_bytes[k], b.traffic.coll_recv_bytes[k])
                                << r;
                        }
                    }
                    cpt_plan_result_free(&shared);
                    cpt_plan_result_free(&every);
                }
}

// A custom assignment whose rank holds evenly spaced single tokens maps that rank to one strided
// span (the planner's fast paths for striped keys apply); any other rank keeps its runs. Token t
// on rank t mod P is the striped map exactly, for even and uneven lengths.
TEST(CustomMap, EvenlySpacedTokensAreOneStridedSpan) {
    const int P = 8;
    for (int64_t S : {96, 97, 5}) {
        SCOPED_TRACE("S " + std::to_string(S));
        std::vector<int32_t> a(static_cast<size_t>(S));
        for (int64_t t = 0; t < S; t++)
            a[static_cast<size_t>(t)] = static_cast<int32_t>(t % P);
        ctxpar_layout_map c = {}, s = {};
        ASSERT_EQ(ctxpar_layout_map_make(CTXPAR_LAYOUT_CUSTOM, a.data(), S, P, &c), CTXPAR_OK);
        ASSERT_EQ(ctxpar_layout_map_make(CTXPAR_LAYOUT_STRIPED, nullptr, S, P, &s), CTXPAR_OK);
        for (int r = 0; r <= P; r++)
            ASSERT_EQ(c.first[r], s.first[r]) << "rank " << r;
        for (int64_t k = 0; k < s.first[P]; k++) {
            EXPECT_EQ(c.span[k].start, s.span[k].start) << k;
            EXPECT_EQ(c.span[k].len, s.span[k].len) << k;
            // One token: its stride says nothing (striped's is P; a lone run's 1).
            if (s.span[k].len > 1) {
                EXPECT_EQ(c.span[k].stride, s.span[k].stride) << k;
            }
        }
        ctxpar_layout_map_free(&c);
        ctxpar_layout_map_free(&s);
    }
    // Rank 0: 0, 1 (a run of two), 8, 16; rank 1: 2, 5, 9 (uneven gaps); rank 2: 3, 6, 10, 14
    // (gaps 3, 4, 4); rank 3: 4, 7, 11 (gaps 3, 4); rank 4: 12 alone; rank 5: 13, 15 (evenly).
    const std::vector<int32_t> a = {0, 0, 1, 2, 3, 1, 2, 3, 0, 1, 2, 3, 4, 5, 2, 5, 0};
    const int64_t S = static_cast<int64_t>(a.size());
    ctxpar_layout_map m = {};
    ASSERT_EQ(ctxpar_layout_map_make(CTXPAR_LAYOUT_CUSTOM, a.data(), S, 6, &m), CTXPAR_OK);
    const int want_spans[6] = {3, 3, 4, 3, 1, 1};
    for (int r = 0; r < 6; r++) {
        const ctxpar_spans sp = ctxpar_layout_map_spans(&m, r);
        EXPECT_EQ(sp.count, want_spans[r]) << "rank " << r;
        std::vector<int64_t> got, want;
        for (int x = 0; x < sp.count; x++)
            for (int64_t t = 0; t < sp.span[x].len; t++)
                got.push_back(sp.span[x].start + t * sp.span[x].stride);
        for (int64_t t = 0; t < S; t++)
            if (a[static_cast<size_t>(t)] == r)
                want.push_back(t);
        EXPECT_EQ(got, want) << "rank " << r;
    }
    EXPECT_EQ(ctxpar_layout_map_spans(&m, 5).span[0].stride, 2);
    ctxpar_layout_map_free(&m);
}

// The hybrid's ring positions (ctxpar_layout_map_group): each group holds exactly its members'
// positions, in increasing order, and each member span's first row in the group's rows
// (span_row) holds that span's positions; a zigzag group of any size is at most two spans (what
// keeps the hybrid's plans as fast as the ring's).
TEST(GroupMap, PositionOrderAndEachSpansRows) {
    for (ctxpar_layout l : {CTXPAR_LAYOUT_CONTIGUOUS, CTXPAR_LAYOUT_ZIGZAG, CTXPAR_LAYOUT_STRIPED})
        for (int64_t S : {96, 97, 5})
            for (int u : {1, 2, 4}) {
                SCOPED_TRACE(std::string(ctxpar_layout_name(l)) + " S " + std::to_string(S) +
                             " u " + std::to_string(u));
                const int P = 8;
                ctxpar_layout_map m = {}, g = {};
                ASSERT_EQ(ctxpar_layout_map_make(l, nullptr, S, P, &m), CTXPAR_OK);
                std::vector<int64_t> span_row(static_cast<size_t>(m.first[P]), -1);
                ASSERT_EQ(ctxpar_layout_map_group(&m, u, &g, span_row.data()), CTXPAR_OK);
                ASSERT_EQ(g.nranks, P / u);
                for (int i = 0; i < P / u; i++) {
                    std::vector<int64_t> rows; // the group's positions, row by row
                    const ctxpar_spans gs = ctxpar_layout_map_spans(&g, i);
                    for (int x = 0; x < gs.count; x++)
                        for (int64_t t = 0; t < gs.span[x].len; t++)
                            rows.push_back(gs.span[x].start + t * gs.span[x].stride);
                    ASSERT_EQ(static_cast<int64_t>(rows.size()), g.count[i]);
                    EXPECT_TRUE(std::is_sorted(rows.begin(), rows.end()) ||
                                l == CTXPAR_LAYOUT_STRIPED);
                    int64_t members = 0;
                    for (int j = i * u; j < (i + 1) * u; j++) {
                        members += m.count[j];
                        for (int64_t k = m.first[j]; k < m.first[j + 1]; k++)
                            for (int64_t t = 0; t < m.span[k].len; t++)
                                ASSERT_EQ(rows.at(static_cast<size_t>(span_row[k] + t)),
                                          m.span[k].start + t * m.span[k].stride)
                                    << "rank " << j << " span " << k;
                    }
                    EXPECT_EQ(members, g.count[i]);
                    if (l == CTXPAR_LAYOUT_ZIGZAG && S == 96) {
                        EXPECT_LE(gs.count, 2) << "group " << i; // one where the chunks meet
                    }
                }
                ctxpar_layout_map_free(&g);
                ctxpar_layout_map_free(&m);
            }
}

// A block through the planner's device: queries q x keys k, causal, 2 heads.
void Block(ctxpar_device *dev, ctxpar_span q, ctxpar_span k) {
    ctxpar_mask_desc mask = {1, 0, nullptr, 0, 0, 0};
    ctxpar_tensor t =
        ctxpar_tensor_bshd(reinterpret_cast<void *>(4096), CTXPAR_DTYPE_F32, 1, q.len, 2, 8);
    ctxpar_tensor tk =
        ctxpar_tensor_bshd(reinterpret_cast<void *>(4096), CTXPAR_DTYPE_F32, 1, k.len, 2, 8);
    ctxpar_attn_block blk = {};
    blk.q = t;
    blk.k = blk.v = tk;
    blk.q_pos = {&q, 1};
    blk.k_pos = {&k, 1};
    blk.mask = mask;
    blk.scale = 1.0f;
    float *acc = reinterpret_cast<float *>(8192); // never touched by the planner's device
    ASSERT_EQ(ctxpar_dev_attn_block_fwd(dev, &blk, acc, acc, 0, nullptr), CTXPAR_OK);
}

struct Cover {
    ctxpar_device *dev = nullptr;
    cpt_plan_cover cover = {};
    explicit Cover(int64_t seq) {
        EXPECT_EQ(cpt_plan_device_create(&dev), CTXPAR_OK);
        EXPECT_EQ(cpt_plan_cover_init(&cover, seq), CTXPAR_OK);
        cpt_plan_device_record(dev, &cover, 1);
    }
    ~Cover() {
        cpt_plan_cover_free(&cover);
        ctxpar_device_destroy(dev);
    }
    // The proof against a causal mask, 2 heads, batch 1: the first bad position, or -1.
    int64_t Check() {
        ctxpar_mask_desc mask = {1, 0, nullptr, 0, 0, 0};
        int64_t bad = 0;
        double computed = 0, visible = 0;
        const int ok = cpt_plan_cover_check(&cover, &mask, 1, 2, &bad, &computed, &visible);
        EXPECT_EQ(ok, bad < 0);
        return bad;
    }
};

// The coverage records what blocks compute: a block computed twice shows in its query rows.
TEST(PlanCoverage, CountsABlockComputedTwice) {
    for (int times : {1, 2}) {
        Cover c(64);
        for (int i = 0; i < times; i++)
            Block(c.dev, {16, 16, 1}, {0, 32, 1});
        cpt_plan_cover_settle(&c.cover);
        for (int64_t pos = 16; pos < 32; pos++) { // causal: keys 0..pos, 2 heads
            EXPECT_EQ(c.cover.row[pos].count, static_cast<uint64_t>(times * 2 * (pos + 1))) << pos;
            EXPECT_EQ(c.cover.row[pos].sum, static_cast<uint64_t>(times * pos * (pos + 1)));
        }
        EXPECT_EQ(c.cover.row[40].count, 0u);
    }
}

// Row 10 of a causal 16-token sequence gets a key computed twice and a visible key missed:
// every row's count is the mask's (a check of counts alone passes), the proof fails at row 10.
// Then two keys twice and two missed with the same total: the sums agree, the squares do not.
TEST(PlanCoverage, SumsCatchWhatCountsCancel) {
    const struct {
        std::vector<ctxpar_span> row10; // the key spans row 10 is computed with
    } faults[] = {
        {{{0, 10, 1}, {3, 1, 1}}},                      // key 3 twice, key 10 missed
        {{{0, 2, 1}, {4, 7, 1}, {1, 1, 1}, {4, 1, 1}}}, // keys 1 and 4 twice, 2 and 3 missed
    };
    for (const auto &f : faults) {
        Cover c(16);
        Block(c.dev, {0, 10, 1}, {0, 16, 1});
        Block(c.dev, {11, 5, 1}, {0, 16, 1});
        for (const ctxpar_span &k : f.row10)
            Block(c.dev, {10, 1, 1}, k);
        cpt_plan_cover_settle(&c.cover);
        for (int64_t pos = 0; pos < 16; pos++)
            EXPECT_EQ(c.cover.row[pos].count, static_cast<uint64_t>(2 * (pos + 1))) << pos;
        EXPECT_EQ(c.Check(), 10);
    }
    Cover ok(16);
    Block(ok.dev, {0, 16, 1}, {0, 16, 1});
    EXPECT_EQ(ok.Check(), -1);
}

// The mask's keys of a span for one query, against a pair-by-pair count and sums, for random
// masks (causal, windows left and right, documents) and strided spans; at the longest sequence
// a flag allows too, where the sums of squares wrap around 2^64.
TEST(PlanCoverage, MaskKeysMatchPairByPair) {
    std::mt19937_64 rng(18);
    auto below = [&](int64_t n) { return static_cast<int64_t>(rng() % static_cast<uint64_t>(n)); };
    for (int64_t S : {int64_t{97}, int64_t{INT32_MAX}})
        for (int trial = 0; trial < 2000; trial++) {
            const int64_t scale = S / 97; // documents and windows in proportion
            std::vector<int32_t> cu = {0};
            const bool docs = below(2);
            while (docs && cu.back() < S)
                cu.push_back(static_cast<int32_t>(std::min(S, cu.back() + below(30) * scale)));
            if (!docs)
                cu.push_back(static_cast<int32_t>(S));
            ctxpar_mask_desc m = {
                static_cast<int>(below(2)),       below(3) ? 0 : below(20) * scale,
                docs ? cu.data() : nullptr,       static_cast<int64_t>(cu.size() - 1),
                below(3) ? 0 : below(20) * scale, 0};
            const int64_t pos = below(S);
            ctxpar_span k = {below(S), 0, 1 + below(5) * scale};
            k.len = 1 + below(std::min<int64_t>((S - 1 - k.start) / k.stride + 1, 400));
            uint64_t n = 0, sum = 0, sumsq = 0;
            for (int64_t t = 0; t < k.len; t++) {
                const int64_t key = k.start + t * k.stride;
                if (ctxpar_mask_visible(&m, pos, key)) {
                    n++;
                    sum += static_cast<uint64_t>(key);
                    sumsq += static_cast<uint64_t>(key) * static_cast<uint64_t>(key);
                }
            }
            const cpt_plan_keys got = cpt_plan_mask_keys(&m, pos, &k, S);
            ASSERT_EQ(got.count, n) << S << " " << trial;
            ASSERT_EQ(got.sum, sum) << S << " " << trial;
            ASSERT_EQ(got.sumsq, sumsq) << S << " " << trial;
        }
}

} // namespace
