// End to end under MPI: every process is one rank (run by testing/mpi_run.sh with -np 4 and 3).
// Ring, all-gather and all-to-all forward and backward against the fp64 oracle and P = 1 (rank 0
// gathers and checks; every rank learns the verdict); all-gather bitwise equal to P = 1; ranks
// with mismatched settings all fail; a rank that never calls makes the others time out.
#include <gtest/gtest.h>
#include <mpi.h>

#include <string>
#include <vector>

#include "ctxpar.h"
#include "ctxpar_cpu.h"
#include "ctxpar_mpi.h"
#include "runner.h"
#include "runner_mpi.h"
#include "tolerance.h"

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

struct MpiCase {
    ctxpar_algo algo;
    ctxpar_layout layout;
    ctxpar_mask mask;
    int64_t window;
    ctxpar_dtype dtype;
};

class EndToEndMpi : public testing::TestWithParam<MpiCase> {};

TEST_P(EndToEndMpi, MatchesOracleAndSingleRank) {
    const MpiCase &c = GetParam();
    const int P = Size();
    if (c.algo == CTXPAR_ALGO_ALLTOALL && 12 % P != 0)
        GTEST_SKIP() << "12 heads do not divide by " << P << " ranks";
    ctxpar_run_config cfg;
    ctxpar_run_config_default(&cfg);
    cfg.ranks = P;
    cfg.batch = 1;
    cfg.seq = 48 * 7; // 336: divides by 2P for P in {1, 2, 3, 4}; not a power of two
    cfg.heads = 12;
    cfg.kv_heads = c.algo == CTXPAR_ALGO_ALLTOALL ? 12 : 4; // GQA where the heads allow
    cfg.head_dim = 32;
    cfg.dtype = c.dtype;
    cfg.params.algo = c.algo;
    cfg.params.layout = c.layout;
    cfg.params.mask = c.mask;
    cfg.params.window_left = c.window;
    cfg.backward = 1;
    cfg.threads = 1;
    ctxpar_run_result r;
    ASSERT_EQ(ctxpar_run_mpi(&cfg, &r), CTXPAR_OK) << ctxpar_last_error();
    ASSERT_EQ(r.status, CTXPAR_OK) << r.message;
    EXPECT_TRUE(r.ok); // every rank: rank 0's verdict, broadcast
    if (Rank() == 0) {
        for (int i = 0; i < CTXPAR_RUN_TENSORS; i++) {
            const char *name = ctxpar_run_tensor_name(static_cast<ctxpar_run_tensor>(i));
            EXPECT_LE(r.error[i], ctxpar_tolerance(c.dtype, name)) << name;
            EXPECT_TRUE(ctxpar_error_ratio_ok(r.error[i], r.error_1[i])) << name;
        }
        if (c.algo == CTXPAR_ALGO_ALLGATHER) {
            EXPECT_TRUE(r.bitwise_single[CTXPAR_T_OUT]);
            EXPECT_TRUE(r.bitwise_single[CTXPAR_T_LSE]);
        }
    }
    ctxpar_run_result_free(&r);
}

std::vector<MpiCase> Cases() {
    std::vector<MpiCase> v;
    for (ctxpar_algo a : {CTXPAR_ALGO_RING, CTXPAR_ALGO_ALLGATHER, CTXPAR_ALGO_ALLTOALL})
        for (ctxpar_layout l :
             {CTXPAR_LAYOUT_CONTIGUOUS, CTXPAR_LAYOUT_ZIGZAG, CTXPAR_LAYOUT_STRIPED}) {
            v.push_back({a, l, CTXPAR_MASK_NONE, 0, CTXPAR_DTYPE_F32});
            v.push_back({a, l, CTXPAR_MASK_CAUSAL, 0, CTXPAR_DTYPE_BF16});
            v.push_back({a, l, CTXPAR_MASK_CAUSAL, 30, CTXPAR_DTYPE_F16});
        }
    return v;
}

std::string Name(const testing::TestParamInfo<MpiCase> &info) {
    const MpiCase &c = info.param;
    return std::string(ctxpar_algo_name(c.algo)) + "_" + ctxpar_layout_name(c.layout) + "_" +
           ctxpar_mask_name(c.mask) + (c.window ? "_window" : "") + "_" +
           ctxpar_dtype_name(c.dtype);
}

INSTANTIATE_TEST_SUITE_P(Mpi, EndToEndMpi, testing::ValuesIn(Cases()), Name);

// One rank of a direct API call: small valid tensors, a CPU device and an MPI comm.
struct Direct {
    ctxpar_device *dev = nullptr;
    ctxpar_comm *comm = nullptr;
    ctxpar_context *ctx = nullptr;
    std::vector<float> q, k, v, out, lse;
    ctxpar_tensor tq, tk, tv, tout;
    ctxpar_attn_params params = CTXPAR_ATTN_PARAMS_INIT;

    Direct(int64_t seq_local, double timeout_s) {
        EXPECT_EQ(ctxpar_device_create_cpu(nullptr, &dev), CTXPAR_OK);
        EXPECT_EQ(ctxpar_comm_create_mpi(MPI_COMM_WORLD, &comm), CTXPAR_OK);
        EXPECT_EQ(ctxpar_comm_set_timeout(comm, timeout_s), CTXPAR_OK);
        EXPECT_EQ(ctxpar_context_create(dev, comm, nullptr, &ctx), CTXPAR_OK);
        const int64_t n = seq_local * 2 * 16;
        q.assign(n, 0.5f);
        k.assign(n, 0.25f);
        v.assign(n, 1.0f);
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
        ctxpar_comm_destroy(comm);
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
