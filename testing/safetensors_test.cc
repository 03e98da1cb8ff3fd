// The .safetensors reader and writer, and the tensor orders of tensor_format.h: a file written
// by the Hugging Face safetensors library read back exactly; round trips of every dtype, order
// and LSE layout with the same bits; malformed headers rejected with the file and the problem.
#include "reference/safetensors.h"

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "reference/tensor_format.h"

namespace {

// safetensors.numpy.save({'a': float32 [1.5, -2], 'b': bfloat16 [[1.0, -2.5]],
// 'c': int64 [7]}) with safetensors 0.8: the library sorts by dtype size, pads the header.
const std::string kHfFile =
    std::string("\xa8\0\0\0\0\0\0\0", 8) +
    R"({"c":{"dtype":"I64","shape":[1],"data_offsets":[0,8]},)"
    R"("a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]},)"
    R"("b":{"dtype":"BF16","shape":[1,2],"data_offsets":[16,20]}}  )" +
    std::string("\x07\0\0\0\0\0\0\0\0\0\xc0\x3f\0\0\0\xc0\x80\x3f\x20\xc0", 20);

TEST(Safetensors, ReadsWhatTheSafetensorsLibraryWrites) {
    ASSERT_EQ(kHfFile.size(), 196u);
    cpt_st_file f;
    ASSERT_EQ(cpt_st_read_mem(kHfFile.data(), kHfFile.size(), "hf", &f), CTXPAR_OK)
        << ctxpar_last_error();
    ASSERT_EQ(f.count, 3);
    const cpt_npy_array *a = cpt_st_find(&f, "a"), *b = cpt_st_find(&f, "b"),
                           *c = cpt_st_find(&f, "c");
    ASSERT_TRUE(a && b && c);
    EXPECT_EQ(a->dtype, CPT_NPY_F32);
    EXPECT_EQ(static_cast<const float *>(a->data)[0], 1.5f);
    EXPECT_EQ(static_cast<const float *>(a->data)[1], -2.0f);
    EXPECT_EQ(b->dtype, CPT_NPY_BF16);
    EXPECT_EQ(b->ndim, 2);
    EXPECT_EQ(b->shape[1], 2);
    EXPECT_EQ(static_cast<const uint16_t *>(b->data)[1], 0xc020); // -2.5
    EXPECT_EQ(c->dtype, CPT_NPY_I64);
    EXPECT_EQ(static_cast<const int64_t *>(c->data)[0], 7);
    EXPECT_EQ(cpt_st_find(&f, "d"), nullptr);

    // Written back and read again: the same tensors and bytes.
    void *bytes = nullptr;
    size_t n = 0;
    ASSERT_EQ(cpt_st_write_mem(f.count, f.tensors, &bytes, &n), CTXPAR_OK);
    uint64_t header = 0;
    std::memcpy(&header, bytes, 8);
    EXPECT_EQ(header % 8, 0u); // the data starts 8-byte aligned, as the library writes it
    cpt_st_file g;
    ASSERT_EQ(cpt_st_read_mem(bytes, n, "again", &g), CTXPAR_OK) << ctxpar_last_error();
    ASSERT_EQ(g.count, 3);
    for (int i = 0; i < 3; i++) {
        EXPECT_STREQ(g.tensors[i].name, f.tensors[i].name);
        EXPECT_EQ(g.tensors[i].array.count, f.tensors[i].array.count);
        EXPECT_EQ(
            std::memcmp(g.tensors[i].array.data, f.tensors[i].array.data,
                        f.tensors[i].array.count * cpt_npy_dtype_size(f.tensors[i].array.dtype)),
            0);
    }
    std::free(bytes);
    cpt_st_free(&g);
    cpt_st_free(&f);
}

std::string Le64(uint64_t n) {
    std::string b(8, '\0');
    for (int i = 0; i < 8; i++)
        b[i] = (char)(n >> (8 * i) & 0xff);
    return b;
}

TEST(Safetensors, RejectsMalformedFilesAndLeavesTheOutputAlone) {
    const std::string d8(8, '\0');
    auto file = [](const std::string &h, const std::string &d) { return Le64(h.size()) + h + d; };
    struct Case {
        std::string bytes, why;
    } cases[] = {
        {"", "not even the 8-byte header length"},
        {Le64(1u << 30) + "{}", "runs past the end"},
        {file("[]", ""), "not a JSON object"},
        {file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"a":{}})", d8), "duplicate"},
        {file(R"({"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]}})", d8), "'U8' not supp"},
        {file(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", d8), "shape[0]"},
        {file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", d8), "begin <= end"},
        {file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", d8), "belong to no"},
        {file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", d8), "after the last"},
        {file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1}})", d8), "exactly"},
        {file(R"({"__metadata__":{"k":1}})", ""), "__metadata__"},
        {file(R"({"a":{"dtype":"F32","shape":[1,1,1,1,1,1,1,1,1],"data_offsets":[0,4]}})", "abcd"),
         "dimensions"},
        {file(R"({"a":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,8]}})", d8),
         "overflows"},
    };
    for (const Case &c : cases) {
        cpt_st_file f;
        std::memset(&f, 0x5a, sizeof f);
        cpt_st_file untouched = f;
        EXPECT_EQ(cpt_st_read_mem(c.bytes.data(), c.bytes.size(), "bad.safetensors", &f),
                  CTXPAR_ERR_INVALID_ARG)
            << c.why;
        EXPECT_EQ(std::memcmp(&f, &untouched, sizeof f), 0) << c.why;
        std::string msg = ctxpar_last_error();
        EXPECT_NE(msg.find("bad.safetensors"), std::string::npos) << msg;
        EXPECT_NE(msg.find(c.why), std::string::npos) << msg;
    }
}

// Every order and LSE layout: a global tensor stored and read back through the views gives the
// same bits, and the stored element (b, s, h, d) sits where the format says (indexed here).
TEST(TensorFormat, EveryOrderRoundTripsBitExactly) {
    const int64_t B = 2, S = 5, H = 3, D = 4;
    for (int f = 0; f < 4; f++) {
        const int64_t b = f == CPT_TFORMAT_THD ? 1 : B;
        const int64_t dims[4] = {b, S, H, D};
        for (ctxpar_dtype dt : {CTXPAR_DTYPE_F32, CTXPAR_DTYPE_F16, CTXPAR_DTYPE_BF16}) {
            const size_t n = (size_t)(b * S * H * D), es = ctxpar_dtype_size(dt);
            std::vector<unsigned char> g(n * es), stored(n * es), back(n * es);
            for (size_t i = 0; i < g.size(); i++)
                g[i] = (unsigned char)(i * 37 + 11); // arbitrary bits, NaN payloads included
            ctxpar_tensor gv = ctxpar_tensor_bshd(g.data(), dt, b, S, H, D);
            ctxpar_tensor sv = cpt_tformat_view((cpt_tformat)f, stored.data(), dt, dims);
            cpt_tensor_copy(&gv, &sv);
            int64_t shape[4], again[4];
            int nd = cpt_tformat_shape((cpt_tformat)f, dims, shape);
            ASSERT_TRUE(cpt_tformat_dims((cpt_tformat)f, nd, shape, again));
            EXPECT_EQ(std::memcmp(again, dims, sizeof again), 0) << cpt_tformat_names[f];
            for (int64_t i0 = 0; i0 < b; i0++)
                for (int64_t s = 0; s < S; s++)
                    for (int64_t h = 0; h < H; h++)
                        for (int64_t d = 0; d < D; d++) {
                            int64_t want = f == CPT_TFORMAT_BHSD ? ((i0 * H + h) * S + s) * D + d
                                           : f == CPT_TFORMAT_SBHD
                                               ? ((s * b + i0) * H + h) * D + d
                                               : ((i0 * S + s) * H + h) * D + d;
                            int64_t from = ((i0 * S + s) * H + h) * D + d;
                            ASSERT_EQ(
                                std::memcmp(&stored[(size_t)want * es], &g[(size_t)from * es], es),
                                0)
                                << cpt_tformat_names[f];
                        }
            ctxpar_tensor bv = ctxpar_tensor_bshd(back.data(), dt, b, S, H, D);
            cpt_tensor_copy(&sv, &bv);
            EXPECT_EQ(back, g) << cpt_tformat_names[f] << " " << ctxpar_dtype_name(dt);
        }
    }
    for (int l = 0; l < 3; l++) {
        const int64_t b = l == CPT_LSE_HT ? 1 : 2, H = 3, S = 7;
        std::vector<float> x((size_t)(b * H * S)), stored(x.size()), back(x.size());
        for (size_t i = 0; i < x.size(); i++)
            x[i] = 0.37f * (float)i - 3.0f;
        cpt_lse_from_bhs(x.data(), (cpt_lse_layout)l, 0, b, H, S, stored.data());
        cpt_lse_to_bhs(stored.data(), CPT_NPY_F32, (cpt_lse_layout)l, 0, b, H, S,
                          back.data());
        EXPECT_EQ(back, x) << cpt_lse_layout_names[l];
        // bsh: (b, h, s) at (b * S + s) * H + h.
        if (l == CPT_LSE_BSH) {
            EXPECT_EQ(stored[(size_t)((1 * S + 4) * H + 2)], x[(size_t)((1 * H + 2) * S + 4)]);
        }
        int64_t shape[3], bb, hh, ss;
        int nd = cpt_lse_shape((cpt_lse_layout)l, b, H, S, shape);
        ASSERT_TRUE(cpt_lse_dims((cpt_lse_layout)l, nd, shape, &bb, &hh, &ss));
        EXPECT_TRUE(bb == b && hh == H && ss == S);
    }
}

} // namespace
