// End to end under MPI: every process is one rank (run by testing/mpi_run.sh with -np 4 and 3).
// Ring, all-gather and all-to-all forward and backward against the fp64 oracle and P = 1 (rank 0
// gathers and checks; every rank learns the verdict), every mask kind (two-sided windows too),
// uneven and custom shards and fewer tokens than ranks; all-gather bitwise equal to P = 1; ranks
// with mismatched settings all fail; a rank that never calls makes the others time out.
#include <gtest/gtest.h>
#include <mpi.h>

#include <string>
#include <vector>

#include "ctxpar.h"
#include "ctxpar_cpu.h"
#include "ctxpar_mpi.h"
#include "reference/data.h"
#include "e2e_expect.h"
#include "fault_comm.h"
#include "limited_device.h"
#include "reference/runner.h"
#include "reference/runner_mpi.h"
#include "reference/tolerance.h"

namespace {

int Rank() {
    int r = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    return r;
}

int Size() {
    int p = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &p);
    return p;
}

// Documents of arbitrary lengths (50, 1, 149, 136) over seq 336.
const int32_t kDocs[] = {0, 50, 51, 200, 336};

// Query heads that every rank count here divides (all-to-all splits them): 12, or 24 at P = 8.
int64_t QueryHeads(int P) {
    return 12 % P == 0 ? 12 : 24;
}

struct MpiCase {
    ctxpar_algo algo;
    ctxpar_layout layout;
    ctxpar_mask mask;
    int64_t window;
    int64_t window_right; // > 0: a two-sided window (with mask none)
    bool docs;
    ctxpar_dtype dtype;
    int64_t kv_heads; // of 12 query heads (QueryHeads): 12, 3 (groups of 4) or 1
};

class EndToEndMpi : public testing::TestWithParam<MpiCase> {};

TEST_P(EndToEndMpi, MatchesOracleAndSingleRank) {
    const MpiCase &c = GetParam();
    const int P = Size();
    cpt_run_config cfg;
    cpt_run_config_default(&cfg);
    cfg.ranks = P;
    cfg.batch = 1;
    cfg.seq = 48 * 7; // 336: divides by 2P for P in {1, 2, 3, 4, 8}; not a power of two
    cfg.heads = QueryHeads(P);
    cfg.kv_heads = c.kv_heads;
    // All-to-all needs the K/V heads to divide by P or P by them: MQA where 3 heads do not.
    if (c.algo == CTXPAR_ALGO_ALLTOALL && c.kv_heads % P != 0 && P % c.kv_heads != 0)
        cfg.kv_heads = 1;
    cfg.head_dim = 32;
    cfg.dtype = c.dtype;
    cfg.params.algo = c.algo;
    cfg.params.layout = c.layout;
    cfg.params.mask = c.mask;
    cfg.params.window_left = c.window;
    cfg.params.window_right = c.window_right;
    if (c.docs) {
        cfg.params.cu_seqlens = kDocs;
        cfg.params.num_docs = 4;
    }
    cfg.backward = 1;
    cfg.threads = 1;
    cpt_run_result r;
    ASSERT_EQ(cpt_run_mpi(&cfg, &r), CTXPAR_OK) << ctxpar_last_error();
    ASSERT_EQ(r.status, CTXPAR_OK) << r.message;
    EXPECT_TRUE(r.ok); // every rank: rank 0's verdict, broadcast
    if (Rank() == 0) {
        CptExpectTensorsMatch(r, Size());
        CptExpectBitwisePromises(r, Size(), c.algo);
    }
    cpt_run_result_free(&r);
}

std::vector<MpiCase> Cases() {
    std::vector<MpiCase> v;
    const ctxpar_dtype dtypes[] = {CTXPAR_DTYPE_F32, CTXPAR_DTYPE_BF16, CTXPAR_DTYPE_F16};
    const int64_t kv[] = {12, 3, 1};
    int n = 0;
    for (ctxpar_algo a : {CTXPAR_ALGO_RING, CTXPAR_ALGO_ALLGATHER, CTXPAR_ALGO_ALLTOALL})
        for (ctxpar_layout l :
             {CTXPAR_LAYOUT_CONTIGUOUS, CTXPAR_LAYOUT_ZIGZAG, CTXPAR_LAYOUT_STRIPED})
            // none, causal, causal + window, documents + causal, and two-sided windows (the band
            // q - 30 < k <= q + 17, narrower than a shard), alone and with documents
            for (int m = 0; m < 6; m++) {
                const bool two_sided = m >= 4;
                v.push_back({a, l, m == 0 || two_sided ? CTXPAR_MASK_NONE : CTXPAR_MASK_CAUSAL,
                             m == 2 || two_sided ? 30 : 0, two_sided ? 17 : 0, m == 3 || m == 5,
                             dtypes[n % 3], kv[(n / 3) % 3]});
                n++;
            }
    return v;
}

std::string Name(const testing::TestParamInfo<MpiCase> &info) {
    const MpiCase &c = info.param;
    return std::string(ctxpar_algo_name(c.algo)) + "_" + ctxpar_layout_name(c.layout) + "_" +
           ctxpar_mask_name(c.mask) +
           (c.window_right ? "_two_sided_window"
            : c.window     ? "_window"
                           : "") +
           (c.docs ? "_docs" : "") + "_" + ctxpar_dtype_name(c.dtype) + "_KV" +
           std::to_string(c.kv_heads);
}

INSTANTIATE_TEST_SUITE_P(Mpi, EndToEndMpi, testing::ValuesIn(Cases()), Name);

// One run across the processes: every rank gets rank 0's verdict; rank 0 checks every tensor
// against the oracle and P = 1, and the bitwise promises.
void RunAndExpect(const cpt_run_config &cfg, ctxpar_algo algo, const std::string &what) {
    SCOPED_TRACE(what);
    cpt_run_result r;
    ASSERT_EQ(cpt_run_mpi(&cfg, &r), CTXPAR_OK) << ctxpar_last_error();
    ASSERT_EQ(r.status, CTXPAR_OK) << r.message;
    EXPECT_TRUE(r.ok);
    if (Rank() == 0) {
        CptExpectTensorsMatch(r, Size());
        CptExpectBitwisePromises(r, Size(), algo);
    }
    cpt_run_result_free(&r);
}

// Any length and any sharding across processes: 53 tokens (no P or 2P > 1 divides it), a
// custom random assignment, documents per batch row; against the oracle and P = 1.
TEST(EndToEndMpiLayout, UnevenCustomAndPerRowDocuments) {
    const int P = Size();
    std::vector<int32_t> assign(53), cu = {0, 9, 9, 30, 53, 0, 0, 27, 53, 53};
    uint64_t x = 12345;
    for (auto &a : assign) { // the same on every process
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        a = static_cast<int32_t>(x % static_cast<uint64_t>(P));
    }
    struct Variant {
        ctxpar_algo algo;
        ctxpar_layout layout;
        bool row_docs;
    };
    for (const Variant &var : {Variant{CTXPAR_ALGO_RING, CTXPAR_LAYOUT_ZIGZAG, false},
                               Variant{CTXPAR_ALGO_ALLGATHER, CTXPAR_LAYOUT_CUSTOM, false},
                               Variant{CTXPAR_ALGO_RING, CTXPAR_LAYOUT_CUSTOM, true},
                               Variant{CTXPAR_ALGO_ALLTOALL, CTXPAR_LAYOUT_STRIPED, true}}) {
        cpt_run_config cfg;
        cpt_run_config_default(&cfg);
        cfg.ranks = P;
        cfg.batch = 2;
        cfg.seq = 53;
        cfg.heads = QueryHeads(P);
        cfg.kv_heads = P == 3 ? 3 : 4;
        cfg.head_dim = 32;
        cfg.dtype = CTXPAR_DTYPE_F32;
        cfg.params.algo = var.algo;
        cfg.params.layout = var.layout;
        cfg.params.mask = CTXPAR_MASK_CAUSAL;
        if (var.layout == CTXPAR_LAYOUT_CUSTOM)
            cfg.params.assignment = assign.data();
        if (var.row_docs) {
            cfg.params.cu_seqlens = cu.data();
            cfg.params.num_docs = 4;
            cfg.params.cu_seqlens_rows = 2;
        }
        cfg.backward = 1;
        cfg.threads = 1;
        RunAndExpect(cfg, var.algo,
                     std::string(ctxpar_algo_name(var.algo)) + " " +
                         ctxpar_layout_name(var.layout) +
                         (var.row_docs ? " with documents per row" : ""));
    }
}

// Fewer tokens than processes (P - 1: some process holds none; with the custom assignment
// rank 0 holds none and the others one token each, in reverse order of rank): every algorithm,
// causal and a two-sided window (mask none), built-in and custom layouts, documents with an
// empty one; against the oracle and P = 1.
TEST(EndToEndMpiLayout, FewerTokensThanRanks) {
    const int P = Size();
    const int64_t S = P - 1;
    std::vector<int32_t> assign, cu = {0, 1, 1, static_cast<int32_t>(S)};
    for (int64_t t = 0; t < S; t++)
        assign.push_back(static_cast<int32_t>(P - 1 - t));
    struct Variant {
        ctxpar_algo algo;
        ctxpar_layout layout;
        bool two_sided, docs;
    };
    for (const Variant &var : {Variant{CTXPAR_ALGO_RING, CTXPAR_LAYOUT_CONTIGUOUS, false, false},
                               Variant{CTXPAR_ALGO_RING, CTXPAR_LAYOUT_CUSTOM, true, false},
                               Variant{CTXPAR_ALGO_ALLGATHER, CTXPAR_LAYOUT_ZIGZAG, true, true},
                               Variant{CTXPAR_ALGO_ALLGATHER, CTXPAR_LAYOUT_CUSTOM, false, true},
                               Variant{CTXPAR_ALGO_ALLTOALL, CTXPAR_LAYOUT_STRIPED, true, false},
                               Variant{CTXPAR_ALGO_ALLTOALL, CTXPAR_LAYOUT_CUSTOM, false, true}}) {
        cpt_run_config cfg;
        cpt_run_config_default(&cfg);
        cfg.ranks = P;
        cfg.batch = 2;
        cfg.seq = S;
        cfg.heads = QueryHeads(P);
        cfg.kv_heads = P == 3 ? 3 : 4;
        cfg.head_dim = 32;
        cfg.dtype = CTXPAR_DTYPE_F32;
        cfg.params.algo = var.algo;
        cfg.params.layout = var.layout;
        cfg.params.mask = var.two_sided ? CTXPAR_MASK_NONE : CTXPAR_MASK_CAUSAL;
        if (var.two_sided) { // query q sees keys q and q + 1 only
            cfg.params.window_left = 1;
            cfg.params.window_right = 1;
        }
        if (var.layout == CTXPAR_LAYOUT_CUSTOM)
            cfg.params.assignment = assign.data();
        if (var.docs) {
            cfg.params.cu_seqlens = cu.data();
            cfg.params.num_docs = 3;
        }
        cfg.backward = 1;
        cfg.threads = 1;
        RunAndExpect(cfg, var.algo,
                     std::string(ctxpar_algo_name(var.algo)) + " " +
                         ctxpar_layout_name(var.layout) +
                         (var.two_sided ? " two-sided window" : " causal") +
                         (var.docs ? " with documents" : ""));
    }
}

// One rank of a direct API call: small valid tensors, a CPU device and an MPI comm.
struct Direct {
    ctxpar_device *dev = nullptr;
    ctxpar_comm *mpi = nullptr, *comm = nullptr; // comm: mpi, or a fault decorator around it
    ctxpar_context *ctx = nullptr;
    std::vector<float> q, k, v, out, lse;
    ctxpar_tensor tq, tk, tv, tout;
    ctxpar_attn_params params = CTXPAR_ATTN_PARAMS_INIT;

    // max_seq_k > 0: a device that refuses blocks of more keys (limited_device.h).
    Direct(int64_t seq_local, double timeout_s, const cpt_fault *fault = nullptr, int verify = 0,
           int64_t max_seq_k = 0) {
        if (max_seq_k > 0)
            EXPECT_EQ(cpt_test_limited_device_create(0, max_seq_k, &dev), CTXPAR_OK);
        else
            EXPECT_EQ(ctxpar_device_create_cpu(nullptr, &dev), CTXPAR_OK);
        EXPECT_EQ(ctxpar_comm_create_mpi(MPI_COMM_WORLD, &mpi), CTXPAR_OK);
        comm = mpi;
        if (fault) {
            EXPECT_EQ(cpt_comm_create_fault(mpi, fault, &comm), CTXPAR_OK);
        }
        EXPECT_EQ(ctxpar_comm_set_timeout(comm, timeout_s), CTXPAR_OK);
        ctxpar_context_options opts = CTXPAR_CONTEXT_OPTIONS_INIT;
        opts.verify_transfers = verify;
        EXPECT_EQ(ctxpar_context_create(dev, comm, &opts, &ctx), CTXPAR_OK);
        const int64_t n = seq_local * 2 * 16;
        q.assign(n, 0.5f);
        k.assign(n, 0.25f);
        v.assign(n, 1.0f);
        // Values that differ by position, so that a misrouted block changes the result.
        for (int64_t i = 0; i < n; i++) {
            uint64_t g = static_cast<uint64_t>(Rank()) * n + i;
            q[i] = static_cast<float>(cpt_test_value(3, 1, g));
            k[i] = static_cast<float>(cpt_test_value(3, 2, g));
            v[i] = static_cast<float>(cpt_test_value(3, 3, g));
        }
        out.assign(n, -7.0f);
        lse.assign(seq_local * 2, -7.0f);
        tq = ctxpar_tensor_bshd(q.data(), CTXPAR_DTYPE_F32, 1, seq_local, 2, 16);
        tk = ctxpar_tensor_bshd(k.data(), CTXPAR_DTYPE_F32, 1, seq_local, 2, 16);
        tv = ctxpar_tensor_bshd(v.data(), CTXPAR_DTYPE_F32, 1, seq_local, 2, 16);
        tout = ctxpar_tensor_bshd(out.data(), CTXPAR_DTYPE_F32, 1, seq_local, 2, 16);
        params.algo = CTXPAR_ALGO_RING;
    }
    ~Direct() {
        ctxpar_context_destroy(ctx);
        if (comm != mpi)
            ctxpar_comm_destroy(comm);
        ctxpar_comm_destroy(mpi);
        ctxpar_device_destroy(dev);
    }
    ctxpar_status Fwd() {
        return ctxpar_attn_fwd(ctx, &params, &tq, &tk, &tv, &tout, lse.data(), nullptr);
    }
    bool Untouched() const {
        for (float x : out)
            if (x != -7.0f)
                return false;
        return true;
    }
};

// Ring forward of Direct(24) on a plain CPU device and a plain MPI comm; empty on failure.
std::vector<float> CleanRingOut() {
    Direct d(24, 30.0);
    ctxpar_status st = d.Fwd();
    EXPECT_EQ(st, CTXPAR_OK) << ctxpar_last_error();
    return st == CTXPAR_OK ? d.out : std::vector<float>();
}

// Faults injected into the MPI comm: a delay changes nothing; a dropped message or a corrupted
// one (with transfer checksums) fails every rank within the timeout instead of hanging or
// returning a wrong answer.
// MLA, sinks (dsinks gathered from every process and compared bit for bit) and soft-capping
// together, each algorithm, against the oracle and P = 1.
TEST(MpiFeatures, MlaSinksSoftcapMatchOracle) {
    static const float kSinkLogits[24] = {-2.0f, 0.5f,  3.0f,  6.5f, -0.25f, 1.75f, 4.0f,  9.0f,
                                          0.0f,  2.5f,  -1.0f, 5.0f, 1.0f,   -3.0f, 7.5f,  0.25f,
                                          2.0f,  -0.5f, 8.0f,  3.5f, -1.5f,  6.0f,  0.75f, 4.5f};
    for (ctxpar_algo algo : {CTXPAR_ALGO_RING, CTXPAR_ALGO_ALLGATHER, CTXPAR_ALGO_ALLTOALL}) {
        SCOPED_TRACE(ctxpar_algo_name(algo));
        cpt_run_config cfg;
        cpt_run_config_default(&cfg);
        cfg.ranks = Size();
        cfg.seq = 48 * 7;
        cfg.heads = QueryHeads(Size());
        cfg.kv_heads = 1; // MQA: all-to-all takes it for any P
        cfg.head_dim = 48;
        cfg.head_dim_v = 32;
        cfg.params.algo = algo;
        cfg.params.layout = CTXPAR_LAYOUT_ZIGZAG;
        cfg.params.sinks = kSinkLogits;
        cfg.params.softcap = 2.0f;
        cfg.params.softmax_scale = 0.4f;
        cfg.backward = 1;
        cfg.threads = 1;
        cpt_run_result r;
        ASSERT_EQ(cpt_run_mpi(&cfg, &r), CTXPAR_OK) << ctxpar_last_error();
        ASSERT_EQ(r.status, CTXPAR_OK) << r.message;
        EXPECT_TRUE(r.ok); // rank 0's verdict (every tensor and dsinks), broadcast
        if (Rank() == 0) {
            EXPECT_TRUE(r.has_dsinks);
            EXPECT_LE(r.dsinks_bound_ratio, 1.0);
            CptExpectTensorsMatch(r, Size());
            CptExpectBitwisePromises(r, Size(), algo);
        }
        cpt_run_result_free(&r);
    }
}

TEST(MpiFault, DelayChangesNothing) {
    if (Size() < 2)
        GTEST_SKIP() << "needs 2 ranks";
    const std::vector<float> clean = CleanRingOut();
    ASSERT_FALSE(clean.empty());
    cpt_fault f = {CPT_FAULT_DELAY, 1, 0, 0.3, 0};
    Direct d(24, 30.0, &f);
    ASSERT_EQ(d.Fwd(), CTXPAR_OK) << ctxpar_last_error();
    EXPECT_EQ(d.out, clean);
}

TEST(MpiFault, DroppedMessageFailsEveryRank) {
    if (Size() < 2)
        GTEST_SKIP() << "needs 2 ranks";
    cpt_fault f = {CPT_FAULT_DROP, 0, 0, 0, 0};
    Direct d(24, 1.0, &f);
    double t0 = MPI_Wtime();
    ctxpar_status st = d.Fwd();
    EXPECT_TRUE(st == CTXPAR_ERR_TIMEOUT || st == CTXPAR_ERR_REMOTE || st == CTXPAR_ERR_COMM)
        << ctxpar_status_string(st) << ": " << ctxpar_last_error();
    EXPECT_LT(MPI_Wtime() - t0, 15.0);
    EXPECT_TRUE(d.Untouched());
}

TEST(MpiFault, CorruptionIsCaughtByTransferChecksums) {
    if (Size() < 2)
        GTEST_SKIP() << "needs 2 ranks";
    cpt_fault f = {CPT_FAULT_CORRUPT, 0, 0, 0, 0};
    Direct d(24, 5.0, &f, /*verify=*/1);
    ctxpar_status st = d.Fwd();
    std::string msg = ctxpar_last_error();
    if (Rank() == 1) { // rank 0's first transfer goes to rank 1
        EXPECT_EQ(st, CTXPAR_ERR_COMM) << msg;
        EXPECT_NE(msg.find("corrupted transfer"), std::string::npos) << msg;
        EXPECT_NE(msg.find("from rank 0"), std::string::npos) << msg;
    } else {
        EXPECT_TRUE(st == CTXPAR_ERR_TIMEOUT || st == CTXPAR_ERR_REMOTE || st == CTXPAR_ERR_COMM)
            << ctxpar_status_string(st) << ": " << msg;
    }
    EXPECT_TRUE(d.Untouched());
}

// A call the device cannot run (all-gather's blocks hold every key; this device takes at most the
// local ones) fails on every rank before they agree, and leaves the MPI comm and the context
// usable: the ring on them then gives the bits of a plain CPU device.
TEST(MpiCapability, UnsupportedThenSupportedOnTheSameComm) {
    if (Size() < 2)
        GTEST_SKIP() << "needs 2 ranks";
    const std::vector<float> clean = CleanRingOut();
    ASSERT_FALSE(clean.empty());
    Direct d(24, 30.0, nullptr, 0, /*max_seq_k=*/24);
    d.params.algo = CTXPAR_ALGO_ALLGATHER;
    EXPECT_EQ(d.Fwd(), CTXPAR_ERR_NOT_SUPPORTED) << ctxpar_last_error();
    EXPECT_NE(std::string(ctxpar_last_error()).find("above its limit of 24"), std::string::npos)
        << ctxpar_last_error();
    EXPECT_TRUE(d.Untouched());
    d.params.algo = CTXPAR_ALGO_RING;
    ASSERT_EQ(d.Fwd(), CTXPAR_OK) << ctxpar_last_error();
    EXPECT_EQ(d.out, clean);
}

// Every rank must fail with INVALID_USAGE naming the difference, instead of hanging.
TEST(MpiAgreement, MismatchedSettingsFailOnEveryRank) {
    if (Size() < 2)
        GTEST_SKIP() << "needs 2 ranks";
    struct Spoil {
        const char *names;
        void (*apply)(Direct &);
    };
    const Spoil spoils[] = {
        {"mask", [](Direct &d) { d.params.mask = CTXPAR_MASK_CAUSAL; }},
        {"layout", [](Direct &d) { d.params.layout = CTXPAR_LAYOUT_STRIPED; }},
        {"algorithm", [](Direct &d) { d.params.algo = CTXPAR_ALGO_ALLGATHER; }},
    };
    for (const Spoil &sp : spoils) {
        Direct d(12, 20.0);
        if (Rank() == 1)
            sp.apply(d);
        ctxpar_status st = d.Fwd();
        EXPECT_EQ(st, CTXPAR_ERR_INVALID_USAGE) << ctxpar_last_error();
        EXPECT_NE(std::string(ctxpar_last_error()).find(sp.names), std::string::npos)
            << ctxpar_last_error();
        EXPECT_TRUE(d.Untouched());
    }
    // A different local sequence length is a different global one.
    Direct d(Rank() == 1 ? 24 : 12, 20.0);
    EXPECT_EQ(d.Fwd(), CTXPAR_ERR_INVALID_USAGE);
    EXPECT_NE(std::string(ctxpar_last_error()).find("global sequence length"), std::string::npos)
        << ctxpar_last_error();
}

// The last rank leaves without calling: the others return TIMEOUT (or REMOTE) within the timeout.
TEST(MpiFailure, ARankThatNeverCallsMakesTheOthersFailWithinTheTimeout) {
    if (Size() < 2)
        GTEST_SKIP() << "needs 2 ranks";
    const double timeout = 1.0;
    {
        Direct d(12, timeout);
        if (Rank() != Size() - 1) {
            double t0 = MPI_Wtime();
            ctxpar_status st = d.Fwd();
            double took = MPI_Wtime() - t0;
            EXPECT_TRUE(st == CTXPAR_ERR_TIMEOUT || st == CTXPAR_ERR_REMOTE)
                << ctxpar_status_string(st) << ": " << ctxpar_last_error();
            EXPECT_LT(took, 10 * timeout); // bounded: a hang would not return at all
            EXPECT_TRUE(d.Untouched());
        }
    }
    MPI_Barrier(MPI_COMM_WORLD);
    // Afterwards fresh comms work again.
    Direct again(12, 30.0);
    EXPECT_EQ(again.Fwd(), CTXPAR_OK) << ctxpar_last_error();
}

// "mpi" by name (libctxpar_mpi's registration): one rank per process, this process's rank, and
// its comm talks to the other processes.
TEST(MpiWorld, ByNameOneRankPerProcess) {
    const int n = ctxpar_comm_names(nullptr, nullptr, 0);
    std::vector<const char *> names(n);
    ctxpar_comm_names(names.data(), nullptr, n);
    ASSERT_GE(n, 2);
    EXPECT_STREQ(names[0], "local");
    EXPECT_STREQ(names[1], "mpi");
    ctxpar_comm_world *world = nullptr;
    EXPECT_EQ(ctxpar_comm_world_create("mpi", Size() + 1, &world), CTXPAR_ERR_INVALID_ARG);
    ASSERT_EQ(ctxpar_comm_world_create("mpi", 0, &world), CTXPAR_OK) << ctxpar_last_error();
    int first = -1;
    EXPECT_EQ(ctxpar_comm_world_ranks(world, &first), 1);
    EXPECT_EQ(first, Rank());
    ctxpar_comm *comm = nullptr;
    ASSERT_EQ(ctxpar_comm_world_comm(world, 0, nullptr, &comm), CTXPAR_OK) << ctxpar_last_error();
    EXPECT_EQ(ctxpar_comm_rank(comm), Rank());
    EXPECT_EQ(ctxpar_comm_size(comm), Size());
    ctxpar_comm_destroy(comm);
    ctxpar_comm_world_destroy(world);
}

} // namespace

// Every rank runs every test; only rank 0 prints the report, and a failure on any rank fails the
// process (so mpirun's exit code).
int main(int argc, char **argv) {
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
    testing::InitGoogleTest(&argc, argv);
    if (Rank() != 0) {
        testing::TestEventListeners &l = testing::UnitTest::GetInstance()->listeners();
        delete l.Release(l.default_result_printer());
    }
    int failed = RUN_ALL_TESTS() != 0, any = 0;
    MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (failed)
        fprintf(stderr, "[rank %d] tests FAILED\n", Rank());
    MPI_Finalize();
    return any;
}
