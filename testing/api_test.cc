// The public API's contracts: every bad argument gives the right status and a message naming it,
// and leaves the caller's outputs untouched; ranks that disagree all fail; ops tables are
// checked; the layout helpers are exact inverses.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "ctxpar.h"
#include "dispatch.h"
#include "ctxpar_cpu.h"
#include "ctxpar_local.h"
#include "limited_device.h"
#include "params_table.h"

namespace {

constexpr float kSentinel = 12345.0f;

// A CPU device, a comm of `ranks` in-process ranks for rank 0 (only usable alone when ranks = 1),
// a context, and valid tensors for a small problem.
struct Fixture {
    ctxpar_device *dev = nullptr;
    ctxpar_local_group *group = nullptr;
    ctxpar_comm *comm = nullptr;
    ctxpar_context *ctx = nullptr;
    int64_t B = 1, S = 16, H = 2, D = 8;
    std::vector<float> q, k, v, out, dout, dq, dk, dv, lse;
    ctxpar_tensor tq, tk, tv, tout, tdout, tdq, tdk, tdv;
    ctxpar_attn_params params = CTXPAR_ATTN_PARAMS_INIT;
    // What the calls pass; a case may point any of them elsewhere (NULL).
    ctxpar_context *use_ctx = nullptr;
    const ctxpar_attn_params *pp = &params;
    ctxpar_tensor *pq = &tq, *pk = &tk, *pv = &tv, *pout = &tout, *pdout = &tdout, *pdq = &tdq,
                  *pdk = &tdk, *pdv = &tdv;
    float *plse = nullptr;
    int32_t cu[4] = {0, 4, 10, 16};
    int32_t assign[16] = {0}; // every token on rank 0
    float sinks[2] = {0.5f, -1.0f}, dsinks[2] = {kSentinel, kSentinel}; // [H]

    Fixture() {
        EXPECT_EQ(ctxpar_device_create_cpu(nullptr, &dev), CTXPAR_OK);
        EXPECT_EQ(ctxpar_local_group_create(1, &group), CTXPAR_OK);
        EXPECT_EQ(ctxpar_comm_create_local(group, 0, nullptr, &comm), CTXPAR_OK);
        EXPECT_EQ(ctxpar_context_create(dev, comm, nullptr, &ctx), CTXPAR_OK);
        size_t n = B * S * H * D;
        for (auto *vec : {&q, &k, &v, &dout})
            vec->assign(n, 0.25f);
        for (auto *vec : {&out, &dq, &dk, &dv})
            vec->assign(n, kSentinel);
        lse.assign(B * H * S, kSentinel);
        tq = Make(q);
        tk = Make(k);
        tv = Make(v);
        tout = Make(out);
        tdout = Make(dout);
        tdq = Make(dq);
        tdk = Make(dk);
        tdv = Make(dv);
        params.algo = CTXPAR_ALGO_RING;
        use_ctx = ctx;
        plse = lse.data();
    }
    ~Fixture() {
        ctxpar_context_destroy(ctx);
        ctxpar_comm_destroy(comm);
        ctxpar_local_group_destroy(group);
        ctxpar_device_destroy(dev);
    }
    // Rank r of a shared local group instead of the fixture's own one-rank comm (20 s timeout,
    // so that a test that goes wrong fails instead of hanging).
    void JoinGroup(ctxpar_local_group *shared, int r) {
        ctxpar_context_destroy(ctx);
        ctxpar_comm_destroy(comm);
        ctx = nullptr;
        comm = nullptr;
        ASSERT_EQ(ctxpar_comm_create_local(shared, r, nullptr, &comm), CTXPAR_OK);
        ASSERT_EQ(ctxpar_comm_set_timeout(comm, 20.0), CTXPAR_OK);
        ASSERT_EQ(ctxpar_context_create(dev, comm, nullptr, &ctx), CTXPAR_OK);
        use_ctx = ctx;
    }
    ctxpar_tensor Make(std::vector<float> &buf) {
        return ctxpar_tensor_bshd(buf.data(), CTXPAR_DTYPE_F32, B, S, H, D);
    }
    ctxpar_status Fwd() { return ctxpar_attn_fwd(use_ctx, pp, pq, pk, pv, pout, plse, nullptr); }
    ctxpar_status Bwd() {
        return ctxpar_attn_bwd(use_ctx, pp, pq, pk, pv, pout, plse, pdout, pdq, pdk, pdv, nullptr);
    }
    // Sets dimension d of q, k, v and every output to n (strides stay dense for the new shape).
    void Reshape(int d, int64_t n) {
        for (ctxpar_tensor *t : {&tq, &tk, &tv, &tout, &tdout, &tdq, &tdk, &tdv}) {
            t->shape[d] = n;
            *t = ctxpar_tensor_bshd(t->data, t->dtype, t->shape[0], t->shape[1], t->shape[2],
                                    t->shape[3]);
        }
    }
    bool OutputsUntouched() const {
        for (const auto *vec : {&out, &dq, &dk, &dv, &lse})
            for (float x : *vec)
                if (x != kSentinel)
                    return false;
        return dsinks[0] == kSentinel && dsinks[1] == kSentinel;
    }
};

struct BadCase {
    const char *name;
    std::function<void(Fixture &)> spoil;
    ctxpar_status want;
    const char *message_names; // the message must contain this
};

std::string BadName(const testing::TestParamInfo<BadCase> &info) {
    return info.param.name;
}

class BadArgument : public testing::TestWithParam<BadCase> {};

TEST_P(BadArgument, ForwardAndBackwardRejectItAndWriteNothing) {
    const BadCase &c = GetParam();
    for (int backward = 0; backward < 2; backward++) {
        Fixture f;
        c.spoil(f);
        ctxpar_status st = backward ? f.Bwd() : f.Fwd();
        EXPECT_EQ(st, c.want) << (backward ? "bwd: " : "fwd: ") << ctxpar_last_error();
        EXPECT_NE(std::string(ctxpar_last_error()).find(c.message_names), std::string::npos)
            << "message: " << ctxpar_last_error();
        EXPECT_TRUE(f.OutputsUntouched());
    }
}

const BadCase kBadCases[] = {
    {"null_ctx", [](Fixture &f) { f.use_ctx = nullptr; }, CTXPAR_ERR_INVALID_ARG, "ctx is NULL"},
    {"null_params", [](Fixture &f) { f.pp = nullptr; }, CTXPAR_ERR_INVALID_ARG, "params is NULL"},
    {"null_q", [](Fixture &f) { f.pq = nullptr; }, CTXPAR_ERR_INVALID_ARG, "q is NULL"},
    {"null_k", [](Fixture &f) { f.pk = nullptr; }, CTXPAR_ERR_INVALID_ARG, "k is NULL"},
    {"null_v", [](Fixture &f) { f.pv = nullptr; }, CTXPAR_ERR_INVALID_ARG, "v is NULL"},
    {"null_out", [](Fixture &f) { f.pout = nullptr; }, CTXPAR_ERR_INVALID_ARG, "out is NULL"},
    {"null_q_data", [](Fixture &f) { f.tq.data = nullptr; }, CTXPAR_ERR_INVALID_ARG, "q.data"},
    {"zero_batch", [](Fixture &f) { f.tq.shape[0] = 0; }, CTXPAR_ERR_INVALID_ARG, "q.shape[0]"},
    {"negative_seq", [](Fixture &f) { f.tk.shape[1] = -4; }, CTXPAR_ERR_INVALID_ARG, "k.shape[1]"},
    {"head_dim_not_contiguous", [](Fixture &f) { f.tv.stride[3] = 2; }, CTXPAR_ERR_INVALID_ARG,
     "v.stride[3]"},
    {"overlapping_strides", [](Fixture &f) { f.tq.stride[1] = f.D; }, CTXPAR_ERR_INVALID_ARG,
     "overlaps"},
    {"negative_stride", [](Fixture &f) { f.tout.stride[2] = -8; }, CTXPAR_ERR_INVALID_ARG,
     "out.stride[2]"},
    {"mismatched_head_dim",
     [](Fixture &f) {
         for (ctxpar_tensor *t : {&f.tk, &f.tv})
             *t = ctxpar_tensor_bshd(t->data, t->dtype, f.B, f.S, f.H, 4);
     },
     CTXPAR_ERR_INVALID_ARG, "head_dim"},
    {"v_shape_differs_from_k", [](Fixture &f) { f.tv.shape[2] = 1; }, CTXPAR_ERR_INVALID_ARG,
     "v.shape[2]"},
    {"heads_not_multiple_of_kv_heads",
     [](Fixture &f) {
         for (ctxpar_tensor *t : {&f.tk, &f.tv})
             *t = ctxpar_tensor_bshd(t->data, t->dtype, f.B, f.S, 3, f.D);
     },
     CTXPAR_ERR_INVALID_ARG, "multiple"},
    {"batch_mismatch",
     [](Fixture &f) {
         f.tk.shape[0] = 2;
         f.tv.shape[0] = 2;
     },
     CTXPAR_ERR_INVALID_ARG, "batch"},
    {"unknown_dtype", [](Fixture &f) { f.tq.dtype = static_cast<ctxpar_dtype>(7); },
     CTXPAR_ERR_INVALID_ARG, "q.dtype"},
    {"dtype_mismatch_q_k", [](Fixture &f) { f.tq.dtype = CTXPAR_DTYPE_BF16; },
     CTXPAR_ERR_INVALID_ARG, "dtype"},
    {"dtype_mismatch_out", [](Fixture &f) { f.tout.dtype = CTXPAR_DTYPE_F16; },
     CTXPAR_ERR_INVALID_ARG, "out.dtype"},
    {"out_shape_mismatch", [](Fixture &f) { f.tout.shape[1] = 8; }, CTXPAR_ERR_INVALID_ARG,
     "out.shape[1]"},
    {"local_seq_is_not_the_ranks_share", [](Fixture &f) { f.params.seq_len_global = 15; },
     CTXPAR_ERR_INVALID_ARG, "q.shape[1] (16) != 15"},
    {"custom_layout_without_assignment",
     [](Fixture &f) {
         f.params.layout = CTXPAR_LAYOUT_CUSTOM;
         f.params.seq_len_global = 16;
     },
     CTXPAR_ERR_INVALID_ARG, "params.assignment is NULL"},
    {"custom_layout_without_seq_len_global",
     [](Fixture &f) {
         f.params.layout = CTXPAR_LAYOUT_CUSTOM;
         f.params.assignment = f.assign;
     },
     CTXPAR_ERR_INVALID_ARG, "params.seq_len_global"},
    {"assignment_token_on_no_rank",
     [](Fixture &f) {
         f.assign[5] = -1;
         f.params.layout = CTXPAR_LAYOUT_CUSTOM;
         f.params.assignment = f.assign;
         f.params.seq_len_global = 16;
     },
     CTXPAR_ERR_INVALID_ARG, "params.assignment[5] (-1)"},
    {"assignment_rank_out_of_range",
     [](Fixture &f) {
         f.assign[9] = 1; // one rank
         f.params.layout = CTXPAR_LAYOUT_CUSTOM;
         f.params.assignment = f.assign;
         f.params.seq_len_global = 16;
     },
     CTXPAR_ERR_INVALID_ARG, "params.assignment[9] (1)"},
    {"assignment_with_a_builtin_layout", [](Fixture &f) { f.params.assignment = f.assign; },
     CTXPAR_ERR_INVALID_ARG, "params.assignment is set"},
    {"cu_seqlens_rows_not_the_batch",
     [](Fixture &f) {
         f.params.cu_seqlens = f.cu;
         f.params.num_docs = 3;
         f.params.cu_seqlens_rows = 2;
     },
     CTXPAR_ERR_INVALID_ARG, "params.cu_seqlens_rows (2)"},
    {"cu_seqlens_rows_without_cu_seqlens", [](Fixture &f) { f.params.cu_seqlens_rows = 1; },
     CTXPAR_ERR_INVALID_ARG, "params.cu_seqlens_rows"},
    {"cu_seqlens_row_decreasing",
     [](Fixture &f) {
         f.cu[2] = 3;
         f.params.cu_seqlens = f.cu;
         f.params.num_docs = 3;
         f.params.cu_seqlens_rows = 1;
     },
     CTXPAR_ERR_INVALID_ARG, "params.cu_seqlens[0] is decreasing"},
    {"struct_size_too_small", [](Fixture &f) { f.params.struct_size = 8; }, CTXPAR_ERR_INVALID_ARG,
     "struct_size"},
    {"unknown_algo", [](Fixture &f) { f.params.algo = static_cast<ctxpar_algo>(9); },
     CTXPAR_ERR_INVALID_ARG, "params.algo"},
    {"unknown_layout", [](Fixture &f) { f.params.layout = static_cast<ctxpar_layout>(-1); },
     CTXPAR_ERR_INVALID_ARG, "params.layout"},
    {"unknown_mask", [](Fixture &f) { f.params.mask = static_cast<ctxpar_mask>(5); },
     CTXPAR_ERR_INVALID_ARG, "params.mask"},
    {"negative_window", [](Fixture &f) { f.params.window_left = -1; }, CTXPAR_ERR_INVALID_ARG,
     "window_left"},
    {"negative_window_right", [](Fixture &f) { f.params.window_right = -3; },
     CTXPAR_ERR_INVALID_ARG, "window_right"},
    {"window_right_with_causal",
     [](Fixture &f) {
         f.params.mask = CTXPAR_MASK_CAUSAL;
         f.params.window_right = 4;
     },
     CTXPAR_ERR_INVALID_ARG, "window_right"},
    {"nan_scale", [](Fixture &f) { f.params.softmax_scale = NAN; }, CTXPAR_ERR_INVALID_ARG,
     "softmax_scale"},
    {"wrong_seq_len_global", [](Fixture &f) { f.params.seq_len_global = 17; },
     CTXPAR_ERR_INVALID_ARG, "seq_len_global"},
    {"cu_seqlens_not_increasing",
     [](Fixture &f) {
         f.cu[2] = 3;
         f.params.cu_seqlens = f.cu;
         f.params.num_docs = 3;
     },
     CTXPAR_ERR_INVALID_ARG, "cu_seqlens"},
    {"cu_seqlens_wrong_end",
     [](Fixture &f) {
         f.cu[3] = 15;
         f.params.cu_seqlens = f.cu;
         f.params.num_docs = 3;
     },
     CTXPAR_ERR_INVALID_ARG, "cu_seqlens[3]"},
    {"num_docs_without_cu_seqlens", [](Fixture &f) { f.params.num_docs = 2; },
     CTXPAR_ERR_INVALID_ARG, "num_docs"},
    {"negative_softcap", [](Fixture &f) { f.params.softcap = -1.0f; }, CTXPAR_ERR_INVALID_ARG,
     "params.softcap"},
    {"nan_softcap", [](Fixture &f) { f.params.softcap = NAN; }, CTXPAR_ERR_INVALID_ARG,
     "params.softcap"},
    {"infinite_softcap", [](Fixture &f) { f.params.softcap = INFINITY; },
     CTXPAR_ERR_INVALID_ARG, "params.softcap"},
    {"nan_sink",
     [](Fixture &f) {
         f.sinks[1] = NAN;
         f.params.sinks = f.sinks;
     },
     CTXPAR_ERR_INVALID_ARG, "params.sinks[1]"},
    {"infinite_sink",
     [](Fixture &f) {
         f.sinks[0] = -INFINITY;
         f.params.sinks = f.sinks;
         f.params.dsinks = f.dsinks;
     },
     CTXPAR_ERR_INVALID_ARG, "params.sinks[0]"},
    {"dsinks_without_sinks", [](Fixture &f) { f.params.dsinks = f.dsinks; },
     CTXPAR_ERR_INVALID_ARG, "params.dsinks"},
    // MLA: v may have its own head_dim, but out follows it.
    {"out_head_dim_not_v",
     [](Fixture &f) {
         f.tv.shape[3] = 4;
         f.tv.stride[2] = 4;
         f.tv.stride[1] = 4 * f.H;
         f.tv.stride[0] = 4 * f.H * f.S;
     },
     CTXPAR_ERR_INVALID_ARG, "out.shape[3]"},
    {"v_heads_not_k", [](Fixture &f) { f.tv.shape[2] = 1; }, CTXPAR_ERR_INVALID_ARG,
     "v.shape[2]"},
};

INSTANTIATE_TEST_SUITE_P(Api, BadArgument, testing::ValuesIn(kBadCases), BadName);

// Backward-only arguments.
TEST(BadBackwardArgument, EachIsNamedAndNothingIsWritten) {
    const std::pair<const char *, std::function<void(Fixture &)>> cases[] = {
        {"lse is NULL", [](Fixture &f) { f.plse = nullptr; }},
        {"dout is NULL", [](Fixture &f) { f.pdout = nullptr; }},
        {"dq is NULL", [](Fixture &f) { f.pdq = nullptr; }},
        {"dk.shape[2]", [](Fixture &f) { f.tdk.shape[2] = 1; }},
        {"dv.dtype", [](Fixture &f) { f.tdv.dtype = CTXPAR_DTYPE_BF16; }},
        {"dout.shape[3]", [](Fixture &f) { f.tdout.shape[3] = 4; }},
    };
    for (const auto &c : cases) {
        Fixture f;
        c.second(f);
        EXPECT_EQ(f.Bwd(), CTXPAR_ERR_INVALID_ARG) << c.first;
        EXPECT_NE(std::string(ctxpar_last_error()).find(c.first), std::string::npos)
            << "want '" << c.first << "' in: " << ctxpar_last_error();
        EXPECT_TRUE(f.OutputsUntouched()) << c.first;
    }
}

TEST(Status, EveryStatusHasAName) {
    for (int s = 0; s >= -9; s--)
        EXPECT_EQ(
            std::string(ctxpar_status_string(static_cast<ctxpar_status>(s))).rfind("CTXPAR_", 0),
            0u);
    EXPECT_STREQ(ctxpar_status_string(CTXPAR_ERR_REMOTE), "CTXPAR_ERR_REMOTE");
    EXPECT_STREQ(ctxpar_status_string(static_cast<ctxpar_status>(-99)), "CTXPAR_ERR_UNKNOWN");
}

TEST(Lifecycle, DestroyNullIsANoOpAndCreateChecksArguments) {
    ctxpar_context_destroy(nullptr);
    ctxpar_comm_destroy(nullptr);
    ctxpar_device_destroy(nullptr);
    ctxpar_local_group_destroy(nullptr);
    ctxpar_context *ctx = reinterpret_cast<ctxpar_context *>(0x1);
    EXPECT_EQ(ctxpar_context_create(nullptr, nullptr, nullptr, &ctx), CTXPAR_ERR_INVALID_ARG);
    EXPECT_EQ(ctx, reinterpret_cast<ctxpar_context *>(0x1)) << "output written on error";
    EXPECT_NE(std::string(ctxpar_last_error()).find("device"), std::string::npos);
}

// Ranks called with different settings all fail, naming the difference, instead of hanging.
// Each rank's own arguments are valid; `both` (when set) is applied on every rank first, and a
// case marked backward calls the backward (where dsinks is computed) instead of the forward.
TEST(Agreement, RanksThatDisagreeAllReturnInvalidUsage) {
    struct Spoil {
        const char *names;
        std::function<void(Fixture &)> f;
        std::function<void(Fixture &)> both = nullptr;
        bool backward = false;
    };
    const Spoil spoils[] = {
        {"global sequence length", [](Fixture &f) { f.Reshape(1, 8); }},
        {"mask", [](Fixture &f) { f.params.mask = CTXPAR_MASK_CAUSAL; }},
        {"layout", [](Fixture &f) { f.params.layout = CTXPAR_LAYOUT_STRIPED; }},
        {"window_left", [](Fixture &f) { f.params.window_left = 3; }},
        {"softmax_scale", [](Fixture &f) { f.params.softmax_scale = 0.5f; }},
        {"algorithm", [](Fixture &f) { f.params.algo = CTXPAR_ALGO_ALLGATHER; }},
        {"softcap", [](Fixture &f) { f.params.softcap = 2.0f; }},
        {"sinks contents", [](Fixture &f) { f.params.sinks = f.sinks; }},
        {"window_right", [](Fixture &f) { f.params.window_right = 3; }},
        {"ulysses", [](Fixture &f) { f.params.ulysses = 2; }, // groups of 2 against 1
         [](Fixture &f) {
             f.params.algo = CTXPAR_ALGO_HYBRID;
             f.params.ulysses = 1;
         }},
        {"v head_dim", // MLA: v (and out, which follows it) 4 wide instead of 8
         [](Fixture &f) {
             f.tv = ctxpar_tensor_bshd(f.v.data(), CTXPAR_DTYPE_F32, f.B, f.S, f.H, 4);
             f.tout = ctxpar_tensor_bshd(f.out.data(), CTXPAR_DTYPE_F32, f.B, f.S, f.H, 4);
         }},
        {"dsinks wanted", [](Fixture &f) { f.params.dsinks = f.dsinks; },
         [](Fixture &f) { f.params.sinks = f.sinks; }, true},
    };
    for (const Spoil &sp : spoils) {
        ctxpar_local_group *group = nullptr;
        ASSERT_EQ(ctxpar_local_group_create(2, &group), CTXPAR_OK);
        ctxpar_status st[2];
        std::string msg[2];
        bool untouched[2];
        auto rank_main = [&](int r) {
            Fixture f;
            f.JoinGroup(group, r);
            if (::testing::Test::HasFatalFailure())
                return;
            if (sp.both)
                sp.both(f);
            if (r == 1)
                sp.f(f);
            st[r] = sp.backward ? f.Bwd() : f.Fwd();
            msg[r] = ctxpar_last_error();
            untouched[r] = f.OutputsUntouched();
        };
        std::thread t0(rank_main, 0), t1(rank_main, 1);
        t0.join();
        t1.join();
        for (int r = 0; r < 2; r++) {
            EXPECT_EQ(st[r], CTXPAR_ERR_INVALID_USAGE)
                << sp.names << ", rank " << r << ": " << msg[r];
            EXPECT_NE(msg[r].find(sp.names), std::string::npos) << msg[r];
            EXPECT_TRUE(untouched[r]) << sp.names;
        }
        ctxpar_local_group_destroy(group);
    }
}

// The custom layout's assignment and the documents per batch row are agreed on too: each rank
// is valid alone (16 tokens of 32 on each), but the ranks disagree.
TEST(Agreement, AssignmentsAndRowDocumentsMustMatch) {
    static int32_t halves[32], alternate[32], cu_a[4] = {0, 4, 10, 32}, cu_b[4] = {0, 4, 10, 32};
    for (int t = 0; t < 32; t++) {
        halves[t] = t < 16 ? 0 : 1;
        alternate[t] = t % 2;
    }
    const std::pair<const char *, std::function<void(Fixture &, int)>> cases[] = {
        {"assignment contents",
         [](Fixture &f, int r) {
             f.params.layout = CTXPAR_LAYOUT_CUSTOM;
             f.params.seq_len_global = 32;
             f.params.assignment = r == 0 ? halves : alternate;
         }},
        {"cu_seqlens_rows",
         [](Fixture &f, int r) {
             f.params.cu_seqlens = r == 0 ? cu_a : cu_b;
             f.params.num_docs = 3;
             f.params.cu_seqlens_rows = r; // 0: shared, 1: per row (batch 1)
         }},
    };
    for (const auto &c : cases) {
        ctxpar_local_group *group = nullptr;
        ASSERT_EQ(ctxpar_local_group_create(2, &group), CTXPAR_OK);
        ctxpar_status st[2];
        std::string msg[2];
        auto rank_main = [&](int r) {
            Fixture f;
            f.JoinGroup(group, r);
            if (::testing::Test::HasFatalFailure())
                return;
            c.second(f, r);
            st[r] = f.Fwd();
            msg[r] = ctxpar_last_error();
        };
        std::thread t0(rank_main, 0), t1(rank_main, 1);
        t0.join();
        t1.join();
        for (int r = 0; r < 2; r++) {
            EXPECT_EQ(st[r], CTXPAR_ERR_INVALID_USAGE) << c.first << ", rank " << r << ": " << msg[r];
            EXPECT_NE(msg[r].find(c.first), std::string::npos) << msg[r];
        }
        ctxpar_local_group_destroy(group);
    }
}

// A rank whose own arguments are bad reports them; its peers learn at once that it failed.
TEST(Agreement, APeersBadArgumentFailsEveryRankPromptly) {
    ctxpar_local_group *group = nullptr;
    ASSERT_EQ(ctxpar_local_group_create(2, &group), CTXPAR_OK);
    ctxpar_status st[2];
    std::string msg[2];
    auto rank_main = [&](int r) {
        Fixture f;
        f.JoinGroup(group, r);
        if (::testing::Test::HasFatalFailure())
            return;
        if (r == 1)
            f.tq.data = nullptr;
        st[r] = f.Fwd();
        msg[r] = ctxpar_last_error();
    };
    std::thread t0(rank_main, 0), t1(rank_main, 1);
    t0.join();
    t1.join();
    EXPECT_EQ(st[1], CTXPAR_ERR_INVALID_ARG) << msg[1];
    EXPECT_NE(msg[1].find("q.data"), std::string::npos) << msg[1];
    EXPECT_EQ(st[0], CTXPAR_ERR_INVALID_USAGE) << msg[0];
    EXPECT_NE(msg[0].find("rejected its arguments"), std::string::npos) << msg[0];
    ctxpar_local_group_destroy(group);
}

// Every other public function: each bad argument returns INVALID_ARG with a message naming it.
TEST(OtherEntryPoints, EachBadArgumentIsNamed) {
    Fixture f;
    // Outputs of the failing calls below, set to values the calls must leave as they are.
    ctxpar_memory_stats ms = {7, 7};
    ctxpar_work_stats ws = {7, 7, 7.0};
    uint64_t bytes = 7;
    ctxpar_algo algo = CTXPAR_ALGO_AUTO;
    std::vector<int64_t> pos(16);
    std::vector<float> small(8 * 2 * 8);
    ctxpar_tensor local = ctxpar_tensor_bshd(small.data(), CTXPAR_DTYPE_F32, 1, 8, 2, 8);
    ctxpar_tensor wrong_dtype = local;
    wrong_dtype.dtype = CTXPAR_DTYPE_BF16;
    ctxpar_context_options tiny = CTXPAR_CONTEXT_OPTIONS_INIT;
    tiny.struct_size = 1;
    ctxpar_context *ctx_out = nullptr;
    ctxpar_local_group *group_out = nullptr;
    ctxpar_comm *comm_out = nullptr;
    ctxpar_cpu_peak peak = CTXPAR_CPU_PEAK_INIT, tiny_peak = CTXPAR_CPU_PEAK_INIT;
    tiny_peak.struct_size = 8;
    const struct {
        const char *names;
        std::function<ctxpar_status()> call;
    } cases[] = {
        {"comm is NULL", [&] { return ctxpar_comm_set_timeout(nullptr, 1.0); }},
        {"timeout", [&] { return ctxpar_comm_set_timeout(f.comm, 0.0); }},
        {"timeout", [&] { return ctxpar_comm_set_timeout(f.comm, NAN); }},
        {"struct_size", [&] { return ctxpar_context_create(f.dev, f.comm, &tiny, &ctx_out); }},
        {"ctx_out", [&] { return ctxpar_context_create(f.dev, f.comm, nullptr, nullptr); }},
        {"stats_out", [&] { return ctxpar_context_memory_stats(f.ctx, nullptr); }},
        {"ctx", [&] { return ctxpar_context_memory_stats(nullptr, &ms); }},
        {"ctx is NULL", [&] { return ctxpar_context_reset_peak(nullptr); }},
        {"bytes_out", [&] { return ctxpar_context_bytes_sent(f.ctx, nullptr); }},
        {"ctx", [&] { return ctxpar_context_bytes_sent(nullptr, &bytes); }},
        {"ctx is NULL", [&] { return ctxpar_context_set_trace(nullptr, nullptr, nullptr); }},
        {"stats_out", [&] { return ctxpar_context_work_stats(f.ctx, nullptr); }},
        {"ctx", [&] { return ctxpar_context_work_stats(nullptr, &ws); }},
        {"ctx is NULL", [&] { return ctxpar_context_reset_work_stats(nullptr); }},
        {"algo_out",
         [&] { return ctxpar_attn_choose_algo(f.ctx, &f.params, &f.tq, &f.tk, nullptr); }},
        {"q is NULL",
         [&] { return ctxpar_attn_choose_algo(f.ctx, &f.params, nullptr, &f.tk, &algo); }},
        {"layout",
         [&] { return ctxpar_positions(static_cast<ctxpar_layout>(7), 16, 0, 1, pos.data()); }},
        {"rank", [&] { return ctxpar_positions(CTXPAR_LAYOUT_ZIGZAG, 16, 2, 2, pos.data()); }},
        {"pos_out", [&] { return ctxpar_positions(CTXPAR_LAYOUT_ZIGZAG, 16, 0, 2, nullptr); }},
        {"seq_global (0)",
         [&] { return ctxpar_positions(CTXPAR_LAYOUT_ZIGZAG, 0, 0, 4, pos.data()); }},
        {"count_out", [&] { return ctxpar_shard_count(CTXPAR_LAYOUT_ZIGZAG, nullptr, 9, 0, 4,
                                                      nullptr); }},
        {"global is NULL",
         [&] { return ctxpar_shard(CTXPAR_LAYOUT_ZIGZAG, 0, 2, nullptr, &local); }},
        {"local.shape[1]", [&] { return ctxpar_shard(CTXPAR_LAYOUT_ZIGZAG, 0, 4, &f.tq, &local); }},
        {"local.dtype",
         [&] { return ctxpar_unshard(CTXPAR_LAYOUT_ZIGZAG, 0, 2, &wrong_dtype, &f.tq); }},
        {"device_out", [&] { return ctxpar_device_create_cpu(nullptr, nullptr); }},
        {"group_out", [&] { return ctxpar_local_group_create(2, nullptr); }},
        {"nranks", [&] { return ctxpar_local_group_create(0, &group_out); }},
        {"rank", [&] { return ctxpar_comm_create_local(f.group, 5, nullptr, &comm_out); }},
        {"peak is NULL", [&] { return ctxpar_cpu_measure_peak(f.dev, nullptr); }},
        {"device is NULL", [&] { return ctxpar_cpu_measure_peak(nullptr, &peak); }},
        {"struct_size", [&] { return ctxpar_cpu_measure_peak(f.dev, &tiny_peak); }},
    };
    for (const auto &c : cases) {
        EXPECT_EQ(c.call(), CTXPAR_ERR_INVALID_ARG) << c.names << ": " << ctxpar_last_error();
        EXPECT_NE(std::string(ctxpar_last_error()).find(c.names), std::string::npos)
            << "want '" << c.names << "' in: " << ctxpar_last_error();
    }
    EXPECT_EQ(ctx_out, nullptr);
    EXPECT_EQ(group_out, nullptr);
    EXPECT_EQ(comm_out, nullptr);
    EXPECT_EQ(bytes, 7u);
    EXPECT_EQ(ms.current_bytes, 7u);
    EXPECT_EQ(ms.peak_bytes, 7u);
    EXPECT_EQ(ws.blocks_computed, 7u);
    EXPECT_EQ(ws.flops, 7.0);
    EXPECT_EQ(peak.kernels, nullptr);
    EXPECT_EQ(tiny_peak.struct_size, 8u);
    EXPECT_EQ(tiny_peak.flops_per_core, 0.0);
}

// ---------------------------------------------------------------- params from an older header

// A caller compiled before some fields existed passes a shorter struct: the fields past its
// struct_size take their defaults and nothing past it is read (the struct sits at the end of an
// exact-size heap block, so ASan would catch a read beyond it).
TEST(ParamsStructSize, AShorterStructGetsTheDefaultsForTheRest) {
    Fixture full;
    full.params.algo = CTXPAR_ALGO_ALLGATHER;
    ASSERT_EQ(full.Fwd(), CTXPAR_OK) << ctxpar_last_error();
    for (size_t size :
         {offsetof(ctxpar_attn_params, seq_len_global), offsetof(ctxpar_attn_params, window_left),
          offsetof(ctxpar_attn_params, algo) + sizeof(ctxpar_algo)}) {
        Fixture f;
        std::vector<unsigned char> block(size);
        ctxpar_attn_params p = CTXPAR_ATTN_PARAMS_INIT;
        p.struct_size = size;
        p.algo = CTXPAR_ALGO_ALLGATHER;
        std::memcpy(block.data(), &p, size);
        f.pp = reinterpret_cast<const ctxpar_attn_params *>(block.data());
        ASSERT_EQ(f.Fwd(), CTXPAR_OK) << "struct_size " << size << ": " << ctxpar_last_error();
        EXPECT_EQ(f.out, full.out) << "struct_size " << size;
        EXPECT_EQ(f.lse, full.lse) << "struct_size " << size;
    }
}

// ---------------------------------------------------------------- capability before agreement

// Both ranks' results of one forward call on P = 2 in-process ranks with limited devices.
struct TwoRanks {
    ctxpar_local_group *group = nullptr;
    ctxpar_device *dev[2] = {nullptr, nullptr};
    ctxpar_comm *comm[2] = {nullptr, nullptr};
    ctxpar_context *ctx[2] = {nullptr, nullptr};
    TwoRanks(int64_t max_dim0, int64_t max_dim1) {
        EXPECT_EQ(ctxpar_local_group_create(2, &group), CTXPAR_OK);
        const int64_t max_dim[2] = {max_dim0, max_dim1};
        for (int r = 0; r < 2; r++) {
            EXPECT_EQ(cpt_test_limited_device_create(max_dim[r], 0, &dev[r]), CTXPAR_OK);
            EXPECT_EQ(ctxpar_comm_create_local(group, r, nullptr, &comm[r]), CTXPAR_OK);
            EXPECT_EQ(ctxpar_comm_set_timeout(comm[r], 20.0), CTXPAR_OK);
            EXPECT_EQ(ctxpar_context_create(dev[r], comm[r], nullptr, &ctx[r]), CTXPAR_OK);
        }
    }
    ~TwoRanks() {
        for (int r = 0; r < 2; r++) {
            ctxpar_context_destroy(ctx[r]);
            ctxpar_comm_destroy(comm[r]);
            ctxpar_device_destroy(dev[r]);
        }
        ctxpar_local_group_destroy(group);
    }
    // Forward with head_dim D (seq 8 per rank, 2 heads) on both ranks: statuses, messages, outs.
    void Fwd(int64_t D, ctxpar_status st[2], std::string msg[2], std::vector<float> out[2]) {
        auto rank_main = [&](int r) {
            const int64_t n = 8 * 2 * D;
            std::vector<float> q(n), k(n), v(n);
            for (int64_t i = 0; i < n; i++) {
                q[i] = std::sin(0.37 * (i + 1) + r);
                k[i] = std::cos(0.11 * (i + 3) - r);
                v[i] = std::sin(0.05 * i * (r + 1));
            }
            out[r].assign(n, kSentinel);
            std::vector<float> lse(2 * 8);
            ctxpar_tensor tq = ctxpar_tensor_bshd(q.data(), CTXPAR_DTYPE_F32, 1, 8, 2, D);
            ctxpar_tensor tk = ctxpar_tensor_bshd(k.data(), CTXPAR_DTYPE_F32, 1, 8, 2, D);
            ctxpar_tensor tv = ctxpar_tensor_bshd(v.data(), CTXPAR_DTYPE_F32, 1, 8, 2, D);
            ctxpar_tensor to = ctxpar_tensor_bshd(out[r].data(), CTXPAR_DTYPE_F32, 1, 8, 2, D);
            ctxpar_attn_params p = CTXPAR_ATTN_PARAMS_INIT;
            p.algo = CTXPAR_ALGO_RING;
            p.mask = CTXPAR_MASK_CAUSAL;
            st[r] = ctxpar_attn_fwd(ctx[r], &p, &tq, &tk, &tv, &to, lse.data(), nullptr);
            msg[r] = ctxpar_last_error();
        };
        std::thread t0(rank_main, 0), t1(rank_main, 1);
        t0.join();
        t1.join();
    }
};

// A call the device cannot run fails on every rank before they agree, writes nothing, and leaves
// the comm and context usable: the next call on them gives the bits a fresh pair gives.
TEST(Capability, UnsupportedThenSupportedOnTheSameCommAndContext) {
    ctxpar_status st[2];
    std::string msg[2];
    std::vector<float> out[2], fresh[2];
    {
        TwoRanks clean(16, 16);
        clean.Fwd(16, st, msg, fresh);
        ASSERT_EQ(st[0], CTXPAR_OK) << msg[0];
        ASSERT_EQ(st[1], CTXPAR_OK) << msg[1];
    }
    TwoRanks both(16, 16); // both devices refuse head_dim 32
    both.Fwd(32, st, msg, out);
    for (int r = 0; r < 2; r++) {
        EXPECT_EQ(st[r], CTXPAR_ERR_NOT_SUPPORTED) << "rank " << r << ": " << msg[r];
        EXPECT_NE(msg[r].find("head_dim 32"), std::string::npos) << msg[r];
        EXPECT_EQ(out[r], std::vector<float>(out[r].size(), kSentinel)) << "rank " << r;
    }
    both.Fwd(16, st, msg, out);
    for (int r = 0; r < 2; r++) {
        ASSERT_EQ(st[r], CTXPAR_OK) << "rank " << r << ": " << msg[r];
        EXPECT_EQ(out[r], fresh[r]) << "rank " << r;
    }
    TwoRanks one(64, 16); // only rank 1's device refuses: rank 0 learns it at the agreement
    one.Fwd(32, st, msg, out);
    EXPECT_EQ(st[1], CTXPAR_ERR_NOT_SUPPORTED) << msg[1];
    EXPECT_EQ(st[0], CTXPAR_ERR_INVALID_USAGE) << msg[0];
    EXPECT_NE(msg[0].find("rejected its arguments"), std::string::npos) << msg[0];
    one.Fwd(16, st, msg, out);
    for (int r = 0; r < 2; r++) {
        ASSERT_EQ(st[r], CTXPAR_OK) << "rank " << r << ": " << msg[r];
        EXPECT_EQ(out[r], fresh[r]) << "rank " << r;
    }
}

// ctxpar_attn_supported answers on one rank alone (no communication: the peer never calls), with
// the device's reason; invalid arguments stay INVALID_ARG.
TEST(Capability, SupportedQueryNeedsNoPeer) {
    TwoRanks ranks(16, 16);
    std::vector<float> buf(8 * 2 * 32);
    ctxpar_tensor t16 = ctxpar_tensor_bshd(buf.data(), CTXPAR_DTYPE_F32, 1, 8, 2, 16);
    ctxpar_tensor t32 = ctxpar_tensor_bshd(buf.data(), CTXPAR_DTYPE_F32, 1, 8, 2, 32);
    ctxpar_attn_params p = CTXPAR_ATTN_PARAMS_INIT;
    EXPECT_EQ(ctxpar_attn_supported(ranks.ctx[0], &p, &t16, &t16, &t16), CTXPAR_OK)
        << ctxpar_last_error();
    EXPECT_EQ(ctxpar_attn_supported(ranks.ctx[0], &p, &t32, &t32, &t32), CTXPAR_ERR_NOT_SUPPORTED);
    EXPECT_NE(std::string(ctxpar_last_error()).find("above its limit of 16"), std::string::npos)
        << ctxpar_last_error();
    EXPECT_EQ(ctxpar_attn_supported(ranks.ctx[0], &p, &t16, &t32, &t32), CTXPAR_ERR_INVALID_ARG);
    EXPECT_EQ(ctxpar_attn_supported(nullptr, &p, &t16, &t16, &t16), CTXPAR_ERR_INVALID_ARG);
    // The plain CPU device runs everything valid.
    Fixture f;
    EXPECT_EQ(ctxpar_attn_supported(f.ctx, &f.params, &f.tq, &f.tk, &f.tv), CTXPAR_OK);
}

// AUTO takes the preferred algorithm the device can run: all-gather for GQA (K/V heads x P <= Q
// heads), but the ring when the device cannot take the whole sequence's keys in one block.
TEST(Capability, AutoAvoidsWhatTheDeviceCannotRun) {
    ctxpar_local_group *group = nullptr;
    ASSERT_EQ(ctxpar_local_group_create(2, &group), CTXPAR_OK);
    ctxpar_comm *comm = nullptr;
    ASSERT_EQ(ctxpar_comm_create_local(group, 0, nullptr, &comm), CTXPAR_OK);
    std::vector<float> buf(16 * 2 * 8);
    ctxpar_tensor q = ctxpar_tensor_bshd(buf.data(), CTXPAR_DTYPE_F32, 1, 16, 2, 8);
    ctxpar_tensor kv = ctxpar_tensor_bshd(buf.data(), CTXPAR_DTYPE_F32, 1, 16, 1, 8);
    ctxpar_attn_params p = CTXPAR_ATTN_PARAMS_INIT; // AUTO
    for (int64_t max_seq_k : {0, 16}) {
        ctxpar_device *dev = nullptr;
        ctxpar_context *ctx = nullptr;
        ASSERT_EQ(cpt_test_limited_device_create(0, max_seq_k, &dev), CTXPAR_OK);
        ASSERT_EQ(ctxpar_context_create(dev, comm, nullptr, &ctx), CTXPAR_OK);
        ctxpar_algo algo = CTXPAR_ALGO_AUTO;
        EXPECT_EQ(ctxpar_attn_choose_algo(ctx, &p, &q, &kv, &algo), CTXPAR_OK);
        EXPECT_EQ(algo, max_seq_k ? CTXPAR_ALGO_RING : CTXPAR_ALGO_ALLGATHER)
            << "max_seq_k " << max_seq_k;
        EXPECT_EQ(ctxpar_attn_supported(ctx, &p, &q, &kv, &kv), CTXPAR_OK) << ctxpar_last_error();
        ctxpar_context_destroy(ctx);
        ctxpar_device_destroy(dev);
    }
    ctxpar_comm_destroy(comm);
    ctxpar_local_group_destroy(group);
}

// ---------------------------------------------------------------- ops tables

ctxpar_status AllocStub(ctxpar_device *, size_t, ctxpar_mem_kind, void **) {
    return CTXPAR_OK;
}
void DestroyStub(ctxpar_device *) {}

struct ctxpar_device_ops FullDeviceTable() {
    struct ctxpar_device_ops ops;
    std::memset(&ops, 0, sizeof ops);
    ops.version = CTXPAR_DEVICE_OPS_VERSION;
    ops.struct_size = sizeof ops;
    ops.name = "stub";
    // Only presence is checked at creation; none of these is called.
    void *any = reinterpret_cast<void *>(&AllocStub);
    ops.destroy = DestroyStub;
    ops.alloc = AllocStub;
    std::memcpy(&ops.free, &any, sizeof any);
    std::memcpy(&ops.copy, &any, sizeof any);
    std::memcpy(&ops.memset, &any, sizeof any);
    std::memcpy(&ops.attn_block_fwd, &any, sizeof any);
    std::memcpy(&ops.attn_merge, &any, sizeof any);
    std::memcpy(&ops.attn_bwd_prep, &any, sizeof any);
    std::memcpy(&ops.attn_block_bwd, &any, sizeof any);
    std::memcpy(&ops.cast, &any, sizeof any);
    std::memcpy(&ops.add, &any, sizeof any);
    std::memcpy(&ops.fill, &any, sizeof any);
    return ops;
}

// The free's status is the free's result, and the block is forgotten either way.
int g_frees = 0;
char g_block[64];
ctxpar_status AllocBlock(ctxpar_device *, size_t, ctxpar_mem_kind, void **p) {
    *p = g_block;
    return CTXPAR_OK;
}
ctxpar_status FreeFailing(ctxpar_device *, void *, ctxpar_mem_kind) {
    g_frees++;
    return CTXPAR_ERROR(CTXPAR_ERR_DEVICE, "stub: free failed");
}

TEST(DeviceTable, FreeStatusIsTheFreesResult) {
    struct ctxpar_device_ops ops = FullDeviceTable();
    ops.alloc = AllocBlock;
    ops.free = FreeFailing;
    ctxpar_device *dev = nullptr;
    ASSERT_EQ(ctxpar_device_create(&ops, nullptr, 1, &dev), CTXPAR_OK) << ctxpar_last_error();
    g_frees = 0;
    void *p = nullptr;
    ASSERT_EQ(ctxpar_dev_alloc(dev, 64, CTXPAR_MEM_DEVICE, &p), CTXPAR_OK);
    EXPECT_EQ(ctxpar_dev_free(dev, p, 64, CTXPAR_MEM_DEVICE), CTXPAR_ERR_DEVICE);
    EXPECT_EQ(g_frees, 1);
    EXPECT_EQ(ctxpar_dev_books_of(dev)->mem_current, 0u) << "forgotten either way";
    ctxpar_device_destroy(dev);
}

// A table built against an earlier header (its blocks had no struct_size) is refused.
TEST(DeviceTable, EarlierVersionsAreRefused) {
    for (uint32_t version : {1u, 2u}) {
        struct ctxpar_device_ops ops = FullDeviceTable();
        ops.version = version;
        ctxpar_device *dev = reinterpret_cast<ctxpar_device *>(0x1);
        EXPECT_EQ(ctxpar_device_create(&ops, nullptr, 1, &dev), CTXPAR_ERR_NOT_SUPPORTED);
        EXPECT_NE(std::string(ctxpar_last_error()).find("rebuild the backend"), std::string::npos)
            << ctxpar_last_error();
        EXPECT_EQ(dev, reinterpret_cast<ctxpar_device *>(0x1));
    }
}

// A backend learns from struct_size which fields of a block it may read: the dispatch sets it on
// every block, whatever the caller left there.
size_t g_fwd_size = 0, g_bwd_size = 0;
ctxpar_status FwdSpy(ctxpar_device *, const ctxpar_attn_block *blk, float *, float *, int,
                     ctxpar_stream *) {
    g_fwd_size = blk->struct_size;
    return CTXPAR_OK;
}
ctxpar_status BwdSpy(ctxpar_device *, const ctxpar_attn_block *blk, const ctxpar_tensor *,
                     const float *, const float *, float *, float *, float *, ctxpar_stream *) {
    g_bwd_size = blk->struct_size;
    return CTXPAR_OK;
}

TEST(DeviceTable, BlocksReachTheBackendWithTheirSize) {
    struct ctxpar_device_ops ops = FullDeviceTable();
    ops.attn_block_fwd = FwdSpy;
    ops.attn_block_bwd = BwdSpy;
    ctxpar_device *dev = nullptr;
    ASSERT_EQ(ctxpar_device_create(&ops, nullptr, 1, &dev), CTXPAR_OK) << ctxpar_last_error();
    float x[4 * 2 * 8] = {0}, acc[4 * 2 * 8], lse[4 * 2] = {0}, delta[4 * 2] = {0};
    const ctxpar_span pos = {0, 4, 1};
    ctxpar_attn_block blk = {};
    blk.struct_size = 12345; // the caller's value is not what the backend sees
    blk.q = blk.k = blk.v = ctxpar_tensor_bshd(x, CTXPAR_DTYPE_F32, 1, 4, 2, 8);
    blk.q_pos = blk.k_pos = {&pos, 1};
    blk.scale = 1.0f;
    ASSERT_EQ(ctxpar_dev_attn_block_fwd(dev, &blk, acc, lse, 0, nullptr), CTXPAR_OK)
        << ctxpar_last_error();
    EXPECT_EQ(g_fwd_size, sizeof(ctxpar_attn_block));
    EXPECT_TRUE(CTXPAR_BLOCK_HAS(&blk, scale)) << "the caller's 12345 covers every field";
    const ctxpar_tensor dout = blk.q;
    ASSERT_EQ(ctxpar_dev_attn_block_bwd(dev, &blk, &dout, lse, delta, acc, acc, acc, nullptr),
              CTXPAR_OK)
        << ctxpar_last_error();
    EXPECT_EQ(g_bwd_size, sizeof(ctxpar_attn_block));
    // A block from a library older than a field does not hold it.
    blk.struct_size = offsetof(ctxpar_attn_block, lse_lo);
    EXPECT_FALSE(CTXPAR_BLOCK_HAS(&blk, lse_lo));
    EXPECT_TRUE(CTXPAR_BLOCK_HAS(&blk, softcap));
    ctxpar_device_destroy(dev);
}

TEST(DeviceTable, AcceptsACompleteTableAndNamesEachMissingOp) {
    struct ctxpar_device_ops ops = FullDeviceTable();
    ctxpar_device *dev = nullptr;
    ASSERT_EQ(ctxpar_device_create(&ops, nullptr, 1, &dev), CTXPAR_OK) << ctxpar_last_error();
    ctxpar_device_destroy(dev);
    const std::pair<const char *, size_t> required[] = {
        {"alloc", offsetof(ctxpar_device_ops, alloc)},
        {"free", offsetof(ctxpar_device_ops, free)},
        {"copy", offsetof(ctxpar_device_ops, copy)},
        {"memset", offsetof(ctxpar_device_ops, memset)},
        {"attn_block_fwd", offsetof(ctxpar_device_ops, attn_block_fwd)},
        {"attn_merge", offsetof(ctxpar_device_ops, attn_merge)},
        {"attn_bwd_prep", offsetof(ctxpar_device_ops, attn_bwd_prep)},
        {"attn_block_bwd", offsetof(ctxpar_device_ops, attn_block_bwd)},
        {"cast", offsetof(ctxpar_device_ops, cast)},
        {"add", offsetof(ctxpar_device_ops, add)},
        {"fill", offsetof(ctxpar_device_ops, fill)},
    };
    for (const auto &r : required) {
        struct ctxpar_device_ops bad = FullDeviceTable();
        std::memset(reinterpret_cast<char *>(&bad) + r.second, 0, sizeof(void *));
        dev = reinterpret_cast<ctxpar_device *>(0x1);
        EXPECT_EQ(ctxpar_device_create(&bad, nullptr, 1, &dev), CTXPAR_ERR_INVALID_ARG) << r.first;
        EXPECT_NE(std::string(ctxpar_last_error()).find(std::string("'") + r.first + "'"),
                  std::string::npos)
            << ctxpar_last_error();
        EXPECT_EQ(dev, reinterpret_cast<ctxpar_device *>(0x1));
    }
    struct ctxpar_device_ops future = FullDeviceTable();
    future.version = CTXPAR_DEVICE_OPS_VERSION + 1;
    EXPECT_EQ(ctxpar_device_create(&future, nullptr, 1, &dev), CTXPAR_ERR_NOT_SUPPORTED);
    struct ctxpar_device_ops half_streams = FullDeviceTable();
    void *any = reinterpret_cast<void *>(&AllocStub);
    std::memcpy(&half_streams.stream_create, &any, sizeof any);
    EXPECT_EQ(ctxpar_device_create(&half_streams, nullptr, 1, &dev), CTXPAR_ERR_INVALID_ARG);
    EXPECT_NE(std::string(ctxpar_last_error()).find("all or none"), std::string::npos);
    // A table from an older build (smaller struct_size) lacks the ops past its end.
    struct ctxpar_device_ops old = FullDeviceTable();
    old.struct_size = offsetof(ctxpar_device_ops, cast);
    EXPECT_EQ(ctxpar_device_create(&old, nullptr, 1, &dev), CTXPAR_ERR_INVALID_ARG);
    EXPECT_NE(std::string(ctxpar_last_error()).find("'cast'"), std::string::npos);
}

TEST(DeviceTable, PeakProbeRefusesADeviceThatIsNotTheCpu) {
    struct ctxpar_device_ops ops = FullDeviceTable();
    ctxpar_device *dev = nullptr;
    ASSERT_EQ(ctxpar_device_create(&ops, nullptr, 1, &dev), CTXPAR_OK) << ctxpar_last_error();
    ctxpar_cpu_peak peak = CTXPAR_CPU_PEAK_INIT;
    EXPECT_EQ(ctxpar_cpu_measure_peak(dev, &peak), CTXPAR_ERR_INVALID_ARG);
    EXPECT_NE(std::string(ctxpar_last_error()).find("not a CPU device"), std::string::npos)
        << ctxpar_last_error();
    EXPECT_EQ(peak.kernels, nullptr);
    ctxpar_device_destroy(dev);
}

TEST(CommTable, NamesEachMissingOp) {
    const char *names[] = {"sendrecv", "allgather", "reduce_scatter", "alltoall",
                           "wait",     "cancel",    "allreduce_i64",  "barrier"};
    const size_t offsets[] = {
        offsetof(ctxpar_comm_ops, sendrecv),       offsetof(ctxpar_comm_ops, allgather),
        offsetof(ctxpar_comm_ops, reduce_scatter), offsetof(ctxpar_comm_ops, alltoall),
        offsetof(ctxpar_comm_ops, wait),           offsetof(ctxpar_comm_ops, cancel),
        offsetof(ctxpar_comm_ops, allreduce_i64),  offsetof(ctxpar_comm_ops, barrier)};
    auto full = [] {
        struct ctxpar_comm_ops ops;
        std::memset(&ops, 0, sizeof ops);
        ops.version = CTXPAR_COMM_OPS_VERSION;
        ops.struct_size = sizeof ops;
        ops.name = "stub";
        void *any = reinterpret_cast<void *>(&AllocStub);
        // Fill every pointer from destroy to barrier.
        for (size_t off = offsetof(ctxpar_comm_ops, destroy);
             off <= offsetof(ctxpar_comm_ops, barrier); off += sizeof(void *))
            std::memcpy(reinterpret_cast<char *>(&ops) + off, &any, sizeof any);
        return ops;
    };
    ctxpar_comm *comm = nullptr;
    struct ctxpar_comm_ops ok = full();
    ASSERT_EQ(ctxpar_comm_create(&ok, nullptr, 0, 1, &comm), CTXPAR_OK);
    std::free(comm); // destroy would call the stub with the wrong signature
    EXPECT_EQ(ctxpar_comm_create(&ok, nullptr, 2, 2, &comm), CTXPAR_ERR_INVALID_ARG);
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        struct ctxpar_comm_ops bad = full();
        std::memset(reinterpret_cast<char *>(&bad) + offsets[i], 0, sizeof(void *));
        EXPECT_EQ(ctxpar_comm_create(&bad, nullptr, 0, 1, &comm), CTXPAR_ERR_INVALID_ARG);
        EXPECT_NE(std::string(ctxpar_last_error()).find(std::string("'") + names[i] + "'"),
                  std::string::npos)
            << ctxpar_last_error();
    }
}

// A version 1 table (compiled before split existed) is still accepted; splitting its comm is
// NOT_SUPPORTED, and writes nothing.
TEST(CommTable, VersionOneTableHasNoSplit) {
    struct ctxpar_comm_ops ops;
    std::memset(&ops, 0, sizeof ops);
    ops.version = 1;
    ops.struct_size = offsetof(ctxpar_comm_ops, split);
    ops.name = "old";
    void *any = reinterpret_cast<void *>(&AllocStub);
    for (size_t off = offsetof(ctxpar_comm_ops, destroy); off <= offsetof(ctxpar_comm_ops, abort);
         off += sizeof(void *))
        std::memcpy(reinterpret_cast<char *>(&ops) + off, &any, sizeof any);
    ops.split = reinterpret_cast<decltype(ops.split)>(any); // past struct_size: never read
    ctxpar_comm *comm = nullptr;
    ASSERT_EQ(ctxpar_comm_create(&ops, nullptr, 0, 1, &comm), CTXPAR_OK);
    ctxpar_comm *sub = comm;
    EXPECT_EQ(ctxpar_comm_split(comm, 0, 0, &sub), CTXPAR_ERR_NOT_SUPPORTED);
    EXPECT_NE(std::string(ctxpar_last_error()).find("'old' cannot be split"), std::string::npos)
        << ctxpar_last_error();
    EXPECT_EQ(sub, comm);
    std::free(comm);
}

// ---------------------------------------------------------------- layouts

TEST(Layout, PositionsPartitionTheSequence) {
    for (ctxpar_layout layout :
         {CTXPAR_LAYOUT_CONTIGUOUS, CTXPAR_LAYOUT_ZIGZAG, CTXPAR_LAYOUT_STRIPED}) {
        for (int P : {1, 2, 3, 4, 8}) {
            const int64_t S = 48;
            std::vector<int> seen(S, 0);
            std::vector<int64_t> pos(S / P);
            for (int r = 0; r < P; r++) {
                ASSERT_EQ(ctxpar_positions(layout, S, r, P, pos.data()), CTXPAR_OK);
                for (int64_t p : pos) {
                    ASSERT_GE(p, 0);
                    ASSERT_LT(p, S);
                    seen[p]++;
                }
            }
            for (int64_t t = 0; t < S; t++)
                EXPECT_EQ(seen[t], 1) << ctxpar_layout_name(layout) << " P=" << P << " t=" << t;
        }
    }
}

TEST(Layout, ZigzagAndStripedHoldTheDocumentedTokens) {
    std::vector<int64_t> pos(4);
    ASSERT_EQ(ctxpar_positions(CTXPAR_LAYOUT_ZIGZAG, 8, 0, 2, pos.data()), CTXPAR_OK);
    EXPECT_EQ(pos, (std::vector<int64_t>{0, 1, 6, 7}));
    ASSERT_EQ(ctxpar_positions(CTXPAR_LAYOUT_ZIGZAG, 8, 1, 2, pos.data()), CTXPAR_OK);
    EXPECT_EQ(pos, (std::vector<int64_t>{2, 3, 4, 5}));
    ASSERT_EQ(ctxpar_positions(CTXPAR_LAYOUT_STRIPED, 8, 1, 2, pos.data()), CTXPAR_OK);
    EXPECT_EQ(pos, (std::vector<int64_t>{1, 3, 5, 7}));
    EXPECT_EQ(ctxpar_positions(CTXPAR_LAYOUT_CONTIGUOUS, 8, 2, 2, pos.data()),
              CTXPAR_ERR_INVALID_ARG);
    // Uneven (docs/algorithms.md): zigzag's extra tokens go to the front chunks of ranks 0, 1,
    // ..., then to the back chunks of ranks 0, 1, ...; contiguous gives the first ranks one more.
    pos.assign(4, -1);
    ASSERT_EQ(ctxpar_positions(CTXPAR_LAYOUT_ZIGZAG, 7, 0, 2, pos.data()), CTXPAR_OK);
    EXPECT_EQ(pos, (std::vector<int64_t>{0, 1, 5, 6}));
    pos.assign(4, -1);
    ASSERT_EQ(ctxpar_positions(CTXPAR_LAYOUT_ZIGZAG, 7, 1, 2, pos.data()), CTXPAR_OK);
    EXPECT_EQ(pos, (std::vector<int64_t>{2, 3, 4, -1}));
    pos.assign(4, -1);
    ASSERT_EQ(ctxpar_positions(CTXPAR_LAYOUT_ZIGZAG, 13, 1, 3, pos.data()), CTXPAR_OK);
    EXPECT_EQ(pos, (std::vector<int64_t>{3, 4, 9, 10})); // chunks 3,2,2,2,2,2 -> rank 1: 2 + 2
    pos.assign(4, -1);
    ASSERT_EQ(ctxpar_positions(CTXPAR_LAYOUT_CONTIGUOUS, 10, 2, 4, pos.data()), CTXPAR_OK);
    EXPECT_EQ(pos, (std::vector<int64_t>{6, 7, -1, -1}));
}

// Any S >= 1 and P: the shards partition the sequence in increasing order, differ by at most one
// token (built-in layouts), and ctxpar_shard_count says how many each rank holds.
TEST(Layout, AnyLengthPartitionsEvenlyAndCountsAgree) {
    for (ctxpar_layout layout :
         {CTXPAR_LAYOUT_CONTIGUOUS, CTXPAR_LAYOUT_ZIGZAG, CTXPAR_LAYOUT_STRIPED,
          CTXPAR_LAYOUT_CUSTOM})
        for (int P : {1, 2, 3, 4, 5, 8})
            for (int64_t S = 1; S <= 40; S++) {
                std::vector<int32_t> assign(S);
                for (int64_t t = 0; t < S; t++) // an arbitrary assignment
                    assign[t] = static_cast<int32_t>((t * 7 + t / 3) % P);
                const int32_t *a = layout == CTXPAR_LAYOUT_CUSTOM ? assign.data() : nullptr;
                std::vector<int> seen(S, 0);
                int64_t lo = S, hi = 0, total = 0;
                for (int r = 0; r < P; r++) {
                    int64_t n = -1;
                    ASSERT_EQ(ctxpar_shard_count(layout, a, S, r, P, &n), CTXPAR_OK)
                        << ctxpar_last_error();
                    std::vector<int64_t> pos(n + 1, -7);
                    ASSERT_EQ(ctxpar_positions_assigned(layout, a, S, r, P, pos.data()),
                              CTXPAR_OK);
                    EXPECT_EQ(pos[n], -7) << "wrote past the count";
                    for (int64_t i = 0; i < n; i++) {
                        ASSERT_GE(pos[i], 0);
                        ASSERT_LT(pos[i], S);
                        if (i > 0) {
                            EXPECT_LT(pos[i - 1], pos[i]) << "positions must increase";
                        }
                        if (a) {
                            EXPECT_EQ(a[pos[i]], r);
                        }
                        seen[pos[i]]++;
                    }
                    lo = std::min(lo, n);
                    hi = std::max(hi, n);
                    total += n;
                }
                EXPECT_EQ(total, S);
                if (!a) {
                    EXPECT_LE(hi - lo, 1) << ctxpar_layout_name(layout) << " S=" << S << " P=" << P;
                }
                for (int64_t t = 0; t < S; t++)
                    ASSERT_EQ(seen[t], 1) << ctxpar_layout_name(layout) << " S=" << S
                                          << " P=" << P << " t=" << t;
            }
}

TEST(Layout, CustomHelpersCheckTheAssignment) {
    std::vector<int64_t> pos(8);
    int64_t n = 0;
    int32_t bad[4] = {0, 1, 2, 1};
    EXPECT_EQ(ctxpar_shard_count(CTXPAR_LAYOUT_CUSTOM, nullptr, 4, 0, 2, &n),
              CTXPAR_ERR_INVALID_ARG);
    EXPECT_NE(std::string(ctxpar_last_error()).find("assignment is NULL"), std::string::npos);
    EXPECT_EQ(ctxpar_positions_assigned(CTXPAR_LAYOUT_CUSTOM, bad, 4, 0, 2, pos.data()),
              CTXPAR_ERR_INVALID_ARG);
    EXPECT_NE(std::string(ctxpar_last_error()).find("assignment[2] (2)"), std::string::npos);
    EXPECT_EQ(ctxpar_positions(CTXPAR_LAYOUT_CUSTOM, 4, 0, 2, pos.data()), CTXPAR_ERR_INVALID_ARG);
    EXPECT_EQ(ctxpar_shard_count(CTXPAR_LAYOUT_ZIGZAG, bad, 4, 0, 2, &n), CTXPAR_ERR_INVALID_ARG);
    EXPECT_EQ(ctxpar_shard_count(CTXPAR_LAYOUT_ZIGZAG, nullptr, 0, 0, 2, &n),
              CTXPAR_ERR_INVALID_ARG);
    EXPECT_STREQ(ctxpar_layout_name(CTXPAR_LAYOUT_CUSTOM), "custom");
}

TEST(Layout, ShardThenUnshardIsTheIdentity) {
    const int64_t B = 2, S = 24, H = 3, D = 4;
    std::vector<float> global(B * S * H * D), back(B * S * H * D, -1.0f);
    for (size_t i = 0; i < global.size(); i++)
        global[i] = static_cast<float>(i);
    ctxpar_tensor g = ctxpar_tensor_bshd(global.data(), CTXPAR_DTYPE_F32, B, S, H, D);
    ctxpar_tensor gb = ctxpar_tensor_bshd(back.data(), CTXPAR_DTYPE_F32, B, S, H, D);
    for (ctxpar_layout layout :
         {CTXPAR_LAYOUT_CONTIGUOUS, CTXPAR_LAYOUT_ZIGZAG, CTXPAR_LAYOUT_STRIPED}) {
        const int P = 3;
        std::fill(back.begin(), back.end(), -1.0f);
        for (int r = 0; r < P; r++) {
            std::vector<float> local(B * (S / P) * H * D);
            ctxpar_tensor l = ctxpar_tensor_bshd(local.data(), CTXPAR_DTYPE_F32, B, S / P, H, D);
            ASSERT_EQ(ctxpar_shard(layout, r, P, &g, &l), CTXPAR_OK) << ctxpar_last_error();
            // Row s of the shard is global row positions[s].
            std::vector<int64_t> pos(S / P);
            ASSERT_EQ(ctxpar_positions(layout, S, r, P, pos.data()), CTXPAR_OK);
            for (int64_t s = 0; s < S / P; s++)
                EXPECT_EQ(local[(s * H) * D], global[(pos[s] * H) * D]);
            ASSERT_EQ(ctxpar_unshard(layout, r, P, &l, &gb), CTXPAR_OK);
        }
        EXPECT_EQ(back, global) << ctxpar_layout_name(layout);
    }
}

// Uneven and custom shards (a rank may hold none) round-trip too.
TEST(Layout, UnevenAndCustomShardThenUnshardIsTheIdentity) {
    const int64_t B = 2, S = 11, H = 2, D = 3;
    std::vector<float> global(B * S * H * D), back(B * S * H * D);
    for (size_t i = 0; i < global.size(); i++)
        global[i] = static_cast<float>(i);
    ctxpar_tensor g = ctxpar_tensor_bshd(global.data(), CTXPAR_DTYPE_F32, B, S, H, D);
    ctxpar_tensor gb = ctxpar_tensor_bshd(back.data(), CTXPAR_DTYPE_F32, B, S, H, D);
    const int32_t assign[S] = {2, 2, 0, 3, 0, 0, 2, 3, 3, 0, 2}; // rank 1 holds nothing
    for (ctxpar_layout layout : {CTXPAR_LAYOUT_CONTIGUOUS, CTXPAR_LAYOUT_ZIGZAG,
                                 CTXPAR_LAYOUT_STRIPED, CTXPAR_LAYOUT_CUSTOM})
        for (int P : {3, 4, 16}) {
            if (layout == CTXPAR_LAYOUT_CUSTOM && P != 4)
                continue;
            const int32_t *a = layout == CTXPAR_LAYOUT_CUSTOM ? assign : nullptr;
            std::fill(back.begin(), back.end(), -1.0f);
            for (int r = 0; r < P; r++) {
                int64_t n = 0;
                ASSERT_EQ(ctxpar_shard_count(layout, a, S, r, P, &n), CTXPAR_OK);
                std::vector<float> local(B * n * H * D + 1);
                ctxpar_tensor l = ctxpar_tensor_bshd(local.data(), CTXPAR_DTYPE_F32, B, n, H, D);
                ASSERT_EQ(ctxpar_shard_assigned(layout, a, r, P, &g, &l), CTXPAR_OK)
                    << ctxpar_last_error();
                ASSERT_EQ(ctxpar_unshard_assigned(layout, a, r, P, &l, &gb), CTXPAR_OK);
                l.shape[1] = n + 1;
                EXPECT_EQ(ctxpar_shard_assigned(layout, a, r, P, &g, &l), CTXPAR_ERR_INVALID_ARG);
            }
            EXPECT_EQ(back, global) << ctxpar_layout_name(layout) << " P=" << P;
        }
}

// The parameter table (core/params_table.h; its fields' order and types are checked when it
// compiles) gives CTXPAR_ATTN_PARAMS_INIT's defaults, and ctxpar_attn_params_field reports its
// layout: each field's name, offset and size, then the struct's size.
TEST(ParamsTable, DefaultsAreInitAndTheLayoutQueryDescribesTheStruct) {
    const ctxpar_attn_params init = CTXPAR_ATTN_PARAMS_INIT;
    const char *want = reinterpret_cast<const char *>(&init);
    const char *got = reinterpret_cast<const char *>(&ctxpar_param_defaults);
    size_t end = 0;
    for (int i = 0; i < CTXPAR_PARAM_COUNT; i++) {
        const ctxpar_param_field &f = ctxpar_param_fields[i];
        EXPECT_EQ(std::memcmp(got + f.offset, want + f.offset, f.size), 0)
            << "params." << f.name << ": the table's default is not CTXPAR_ATTN_PARAMS_INIT's";
        const char *name = nullptr;
        size_t offset = 1, size = 1;
        ASSERT_EQ(ctxpar_attn_params_field(i, &name, &offset, &size), CTXPAR_OK);
        EXPECT_STREQ(name, f.name);
        EXPECT_EQ(offset, f.offset);
        EXPECT_EQ(size, f.size);
        EXPECT_GE(offset, end) << name;
        end = offset + size;
    }
    const char *name = "x";
    size_t offset = 0, size = 1;
    ASSERT_EQ(ctxpar_attn_params_field(CTXPAR_PARAM_COUNT, &name, &offset, &size), CTXPAR_OK);
    EXPECT_EQ(name, nullptr);
    EXPECT_EQ(offset, sizeof(ctxpar_attn_params));
    EXPECT_EQ(size, 0u);
    EXPECT_EQ(ctxpar_attn_params_field(0, &name, nullptr, &size), CTXPAR_ERR_INVALID_ARG);
    EXPECT_EQ(ctxpar_attn_params_field(0, nullptr, &offset, &size), CTXPAR_ERR_INVALID_ARG);
    for (int bad : {-1, CTXPAR_PARAM_COUNT + 1}) {
        EXPECT_EQ(ctxpar_attn_params_field(bad, &name, &offset, &size), CTXPAR_ERR_INVALID_ARG);
        EXPECT_NE(std::string(ctxpar_last_error()).find("index"), std::string::npos);
    }
    // Spot checks against the compiler, for the first, a middle and the last field.
    EXPECT_EQ(ctxpar_param_fields[CTXPAR_PARAM_struct_size].offset, 0u);
    EXPECT_EQ(ctxpar_param_fields[CTXPAR_PARAM_softcap].offset,
              offsetof(ctxpar_attn_params, softcap));
    EXPECT_EQ(ctxpar_param_fields[CTXPAR_PARAM_lse_lo].offset,
              offsetof(ctxpar_attn_params, lse_lo));
}

} // namespace
