// The files of `ctxpar audit`: every file kind (a folder of .npy, one .safetensors, per-rank
// shards of either), tensor order, LSE layout and dtype round-trips through cpt_audit_write and
// cpt_audit_read with the same bits; shards land at the layout's positions (checked here
// against zigzag positions written out in this file); the base-2 LSE comes back within an ulp.
#include "tools/ctxpar/audit_io.h"
#include "tools/ctxpar/text_ints.h"

#include <sys/stat.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace {

std::string Dir(const std::string &name) {
    const char *t = std::getenv("TEST_TMPDIR");
    std::string d = std::string(t ? t : "/tmp") + "/audit_io_" + name;
    mkdir(d.c_str(), 0777);
    return d;
}

struct Kind {
    const char *label;
    cpt_audit_src_kind kind;
    const char *like_path; // what the inputs were: decides how results are stored
    const char *read_path; // where they are read back, under the folder
};

const Kind kKinds[] = {
    {"npy_dir", CPT_AUDIT_SRC_NPY_DIR, "in", ""},
    {"safetensors", CPT_AUDIT_SRC_SAFETENSORS, "in.safetensors", "/cpt_results.safetensors"},
    {"npy_shards", CPT_AUDIT_SRC_SHARDS, "d/{name}-{rank}.npy", "/{name}-{rank}.npy"},
    {"st_shards", CPT_AUDIT_SRC_SHARDS, "d/r{rank}.safetensors", "/r{rank}.safetensors"},
};

TEST(AuditIo, EveryKindOrderAndDtypeRoundTripsBitExactly) {
    const int P = 2;
    const int64_t S = 8, H = 3, D = 2;
    for (const Kind &k : kKinds)
        for (int f = 0; f < 4; f++)
            for (cpt_npy_dtype t : {CPT_NPY_F32, CPT_NPY_F16, CPT_NPY_BF16}) {
                const int64_t B = f == CPT_TFORMAT_THD ? 1 : 2;
                SCOPED_TRACE(std::string(k.label) + " " + cpt_tformat_names[f] + " " +
                             cpt_npy_dtype_text(t));
                const cpt_lse_layout l = f == CPT_TFORMAT_THD    ? CPT_LSE_HT
                                            : f == CPT_TFORMAT_BHSD ? CPT_LSE_BSH
                                                                       : CPT_LSE_BHS;
                cpt_audit_layout lay = {(cpt_tformat)f,    l,       0, P,
                                           CTXPAR_LAYOUT_ZIGZAG, nullptr, 0, nullptr, 0, 0};
                const size_t n = (size_t)(B * S * H * D), es = cpt_npy_dtype_size(t);
                std::vector<unsigned char> out(n * es);
                std::vector<float> lse((size_t)(B * H * S));
                for (size_t i = 0; i < out.size(); i++)
                    out[i] = (unsigned char)(i * 61 + f); // any bits, NaN payloads included
                for (size_t i = 0; i < lse.size(); i++)
                    lse[i] = 0.731f * (float)i - 4.0f;
                cpt_audit_tensor ts[2] = {};
                ts[0].dtype = t;
                ts[0].dims[0] = B, ts[0].dims[1] = S, ts[0].dims[2] = H, ts[0].dims[3] = D;
                ts[0].data = out.data();
                ts[1].dtype = CPT_NPY_F32;
                ts[1].dims[0] = B, ts[1].dims[1] = H, ts[1].dims[2] = S, ts[1].dims[3] = 1;
                ts[1].data = lse.data();
                const char *names[2] = {"out", "lse"};
                const int is_lse[2] = {0, 1};
                std::string dir = Dir(std::string(k.label) + "_" + cpt_tformat_names[f] + "_" +
                                      cpt_npy_dtype_text(t));
                cpt_audit_src like = {};
                like.kind = k.kind;
                like.path = k.like_path;
                ASSERT_EQ(cpt_audit_write(&like, dir.c_str(), 2, names, ts, is_lse, &lay),
                          CTXPAR_OK)
                    << ctxpar_last_error();
                std::string back_path = dir + k.read_path;
                cpt_audit_src back;
                ASSERT_EQ(cpt_audit_src_open(&back, back_path.c_str()), CTXPAR_OK)
                    << ctxpar_last_error();
                for (int i = 0; i < 2; i++) {
                    ASSERT_TRUE(cpt_audit_src_has(&back, names[i])) << names[i];
                    cpt_audit_tensor r;
                    ASSERT_EQ(cpt_audit_read(&back, names[i], is_lse[i], &lay, &r), CTXPAR_OK)
                        << ctxpar_last_error();
                    EXPECT_EQ(r.dtype, ts[i].dtype);
                    EXPECT_EQ(std::memcmp(r.dims, ts[i].dims, sizeof r.dims), 0);
                    size_t bytes = i == 0 ? out.size() : lse.size() * sizeof(float);
                    EXPECT_EQ(std::memcmp(r.data, ts[i].data, bytes), 0) << names[i];
                    cpt_audit_tensor_free(&r);
                }
                cpt_audit_src_close(&back);
            }
}

// Rank 1 of 2 under zigzag holds chunks 1 and 2 of 4: positions 2, 3, 4, 5 of 8.
TEST(AuditIo, ShardsHoldTheLayoutsPositions) {
    cpt_audit_layout lay = {CPT_TFORMAT_BSHD,  CPT_LSE_BHS, 0, 2,
                               CTXPAR_LAYOUT_ZIGZAG, nullptr,        0, nullptr, 0, 0};
    std::vector<float> g(8);
    for (int i = 0; i < 8; i++)
        g[i] = (float)i;
    cpt_audit_tensor t = {};
    t.dtype = CPT_NPY_F32;
    t.dims[0] = 1, t.dims[1] = 8, t.dims[2] = 1, t.dims[3] = 1;
    t.data = g.data();
    const char *names[1] = {"out"};
    const int lse[1] = {0};
    cpt_audit_src like = {};
    like.kind = CPT_AUDIT_SRC_SHARDS;
    like.path = "{name}.{rank}.npy";
    std::string dir = Dir("positions");
    ASSERT_EQ(cpt_audit_write(&like, dir.c_str(), 1, names, &t, lse, &lay), CTXPAR_OK);
    cpt_npy_array a;
    ASSERT_EQ(cpt_npy_read((dir + "/out.1.npy").c_str(), &a), CTXPAR_OK);
    ASSERT_EQ(a.count, 4u);
    const float want[4] = {2, 3, 4, 5};
    EXPECT_EQ(std::memcmp(a.data, want, sizeof want), 0);
    cpt_npy_free(&a);

    // TransformerEngine's THD zigzag, documents of 4 and 8 tokens over 2 ranks: each document in
    // 4 chunks; rank 1 holds chunks 1 and 2 of each: 1, 2 and 6, 7, 8, 9.
    const int32_t cu[3] = {0, 4, 12};
    cpt_audit_layout thd = {
        CPT_TFORMAT_THD, CPT_LSE_HT, 0, 2, CTXPAR_LAYOUT_ZIGZAG, cu, 2, nullptr, 0, 0};
    int64_t pos[6];
    ASSERT_EQ(cpt_audit_positions(&thd, 12, 1, pos), CTXPAR_OK);
    const int64_t want_pos[6] = {1, 2, 6, 7, 8, 9};
    EXPECT_EQ(std::memcmp(pos, want_pos, sizeof pos), 0);
    const int32_t odd[3] = {0, 6, 12}; // 6 tokens do not split into 4 chunks
    thd.cu_seqlens = odd;
    EXPECT_EQ(cpt_audit_positions(&thd, 12, 1, pos), CTXPAR_ERR_INVALID_ARG);
    EXPECT_NE(std::string(ctxpar_last_error()).find("document 0 has 6 tokens"), std::string::npos);
}

TEST(AuditIo, Base2LseComesBackWithinAnUlp) {
    cpt_audit_layout lay = {CPT_TFORMAT_BSHD,  CPT_LSE_BHS, 1, 1,
                               CTXPAR_LAYOUT_ZIGZAG, nullptr,        0, nullptr, 0, 0};
    std::vector<float> x(64);
    for (size_t i = 0; i < x.size(); i++)
        x[i] = 0.917f * (float)i - 20.0f;
    cpt_audit_tensor t = {};
    t.dtype = CPT_NPY_F32;
    t.dims[0] = 1, t.dims[1] = 2, t.dims[2] = 32, t.dims[3] = 1;
    t.data = x.data();
    const char *names[1] = {"lse"};
    const int lse[1] = {1};
    cpt_audit_src like = {};
    like.kind = CPT_AUDIT_SRC_NPY_DIR;
    like.path = "in";
    std::string dir = Dir("base2");
    ASSERT_EQ(cpt_audit_write(&like, dir.c_str(), 1, names, &t, lse, &lay), CTXPAR_OK);
    cpt_npy_array a;
    ASSERT_EQ(cpt_npy_read((dir + "/lse.npy").c_str(), &a), CTXPAR_OK);
    EXPECT_NEAR(static_cast<float *>(a.data)[5], x[5] / std::log(2.0), 1e-5); // stored in base 2
    cpt_npy_free(&a);
    cpt_audit_src back;
    ASSERT_EQ(cpt_audit_src_open(&back, dir.c_str()), CTXPAR_OK);
    cpt_audit_tensor r;
    ASSERT_EQ(cpt_audit_read(&back, "lse", 1, &lay, &r), CTXPAR_OK);
    for (size_t i = 0; i < x.size(); i++)
        EXPECT_LE(std::fabs(static_cast<float *>(r.data)[i] - x[i]),
                  std::nextafter(std::fabs(x[i]), INFINITY) - std::fabs(x[i]))
            << i;
    cpt_audit_tensor_free(&r);
    cpt_audit_src_close(&back);
}

// --cu-seqlens as text: one list of numbers, or rows of equal length one a line; the numbers as
// written here.
TEST(TextInts, ListsRowsAndErrors) {
    struct Case {
        const char *text;
        int ndim;
        int64_t rows, cols;
        std::vector<int64_t> want;
    } cases[] = {
        {"0 100 100 612\n1024\n", 1, 5, 0, {0, 100, 100, 612, 1024}},
        {"0\n10\n20\n", 1, 3, 0, {0, 10, 20}},
        {"0, 5, 9", 1, 3, 0, {0, 5, 9}},
        {"0 30 128 128\n\n0 0 100 128\n", 2, 2, 4, {0, 30, 128, 128, 0, 0, 100, 128}},
        {"1 2\n3\n", 1, 3, 0, {1, 2, 3}}, // lines of different lengths: one list
    };
    const std::string path = Dir("text_ints") + "/cu.txt";
    for (const Case &c : cases) {
        SCOPED_TRACE(c.text);
        std::ofstream(path) << c.text;
        cpt_npy_array a;
        ASSERT_EQ(cpt_text_ints_read(path.c_str(), &a), CTXPAR_OK) << ctxpar_last_error();
        EXPECT_EQ(a.dtype, CPT_NPY_I64);
        EXPECT_EQ(a.ndim, c.ndim);
        EXPECT_EQ(a.shape[0], c.rows);
        if (c.ndim == 2) {
            EXPECT_EQ(a.shape[1], c.cols);
        }
        ASSERT_EQ(a.count, c.want.size());
        for (size_t i = 0; i < a.count; i++)
            EXPECT_EQ(static_cast<const int64_t *>(a.data)[i], c.want[i]) << i;
        cpt_npy_free(&a);
    }
    std::ofstream(path) << "0 10\n20 x1\n";
    cpt_npy_array a;
    std::memset(&a, 0x5a, sizeof a);
    EXPECT_EQ(cpt_text_ints_read(path.c_str(), &a), CTXPAR_ERR_INVALID_ARG);
    EXPECT_NE(std::string(ctxpar_last_error()).find("cu.txt:2: 'x1' is not an integer"),
              std::string::npos)
        << ctxpar_last_error();
    EXPECT_EQ(a.ndim, 0x5a5a5a5a) << "untouched on failure";
    std::ofstream(path) << " \n";
    EXPECT_EQ(cpt_text_ints_read(path.c_str(), &a), CTXPAR_ERR_INVALID_ARG);
    EXPECT_NE(std::string(ctxpar_last_error()).find("holds no numbers"), std::string::npos);
    EXPECT_EQ(cpt_text_ints_read((path + ".missing").c_str(), &a), CTXPAR_ERR_INVALID_ARG);
    // Thousands of documents on one line (print(*cu) in Python): one list, however long.
    std::string line;
    for (int i = 0; i <= 5000; i++)
        line += std::to_string(i * 1000) + (i < 5000 ? " " : "\n");
    std::ofstream(path) << line;
    ASSERT_EQ(cpt_text_ints_read(path.c_str(), &a), CTXPAR_OK) << ctxpar_last_error();
    EXPECT_EQ(a.ndim, 1);
    ASSERT_EQ(a.count, 5001u);
    EXPECT_EQ(static_cast<const int64_t *>(a.data)[5000], 5000000);
    cpt_npy_free(&a);
}

} // namespace
