// Counter-based test data: range, independence of the counter words, and that shards, strided
// tensors of every dtype and the global f64 copy agree on every value.
#include "reference/data.h"

#include <cmath>
#include <cstdint>
#include <ostream>
#include <vector>

#include <gtest/gtest.h>

#include "ctxpar_half.h"

namespace {

TEST(TestValue, RangeAndMoments) {
    // 2^16 samples of U[-1, 1): mean 0 (sd of the mean 0.0023), variance 1/3.
    const int n = 1 << 16;
    double sum = 0.0, sum2 = 0.0, lo = 1.0, hi = -1.0;
    for (int i = 0; i < n; i++) {
        double x = cpt_test_value(1, 2, (uint64_t)i);
        ASSERT_GE(x, -1.0);
        ASSERT_LT(x, 1.0);
        sum += x;
        sum2 += x * x;
        lo = std::fmin(lo, x);
        hi = std::fmax(hi, x);
    }
    EXPECT_NEAR(sum / n, 0.0, 0.01);
    EXPECT_NEAR(sum2 / n, 1.0 / 3.0, 0.01);
    EXPECT_LT(lo, -0.999);
    EXPECT_GT(hi, 0.999);
}

TEST(TestValue, PureFunctionOfEachWord) {
    EXPECT_EQ(cpt_test_value(5, 6, 7), cpt_test_value(5, 6, 7));
    EXPECT_NE(cpt_test_value(5, 6, 7), cpt_test_value(4, 6, 7));
    EXPECT_NE(cpt_test_value(5, 6, 7), cpt_test_value(5, 5, 7));
    EXPECT_NE(cpt_test_value(5, 6, 7), cpt_test_value(5, 6, 8));
    // Swapping the words gives other values.
    EXPECT_NE(cpt_test_value(5, 6, 7), cpt_test_value(5, 7, 6));
    EXPECT_NE(cpt_test_value(0, 1, 0), cpt_test_value(0, 0, 1));
}

TEST(TestValue, NeighboursAreUncorrelated) {
    // Lag-1 correlation over consecutive indices and consecutive tensor ids.
    const int n = 1 << 15;
    double ci = 0.0, ct = 0.0;
    for (int i = 0; i < n; i++) {
        ci += cpt_test_value(3, 0, (uint64_t)i) * cpt_test_value(3, 0, (uint64_t)i + 1);
        ct += cpt_test_value(3, 0, (uint64_t)i) * cpt_test_value(3, 1, (uint64_t)i);
    }
    // E[xy] = 0, sd of the mean of xy = (1/3)/sqrt(n) = 0.0018.
    EXPECT_NEAR(ci / n, 0.0, 0.01);
    EXPECT_NEAR(ct / n, 0.0, 0.01);
}

TEST(TestRound, MatchesTheStorageFormats) {
    const double x = 0.1;
    EXPECT_EQ(cpt_test_round(CTXPAR_DTYPE_F32, x), (double)0.1f);
    EXPECT_EQ(cpt_test_round(CTXPAR_DTYPE_BF16, x), (double)ctxpar_bf16_to_f32(0x3dcd));
    EXPECT_EQ(cpt_test_round(CTXPAR_DTYPE_F16, x), (double)ctxpar_f16_to_f32(0x2e66));
    // Already representable values are kept.
    EXPECT_EQ(cpt_test_round(CTXPAR_DTYPE_BF16, -0.75), -0.75);
}

struct FillCase {
    ctxpar_dtype dtype;
    size_t elem;
};

// gtest would otherwise print the struct's bytes, padding included (valgrind objects).
void PrintTo(const FillCase &c, std::ostream *os) {
    *os << ctxpar_dtype_name(c.dtype);
}

class FillTest : public ::testing::TestWithParam<FillCase> {};

// A strided, padded, non-BSHD-ordered local shard holding global rows pos[] equals the global
// f64 tensor at those rows, bit for bit after rounding.
TEST_P(FillTest, StridedShardMatchesGlobal) {
    const FillCase c = GetParam();
    const int64_t B = 2, S = 12, H = 3, D = 5, Sl = 4;
    const int64_t pos[Sl] = {1, 4, 7, 10}; // striped: rank 1 of 3
    std::vector<double> global(B * S * H * D);
    cpt_test_fill_global_f64(global.data(), c.dtype, 9, 2, B, S, H, D);
    // Layout [B][H][S][D+2]: heads outside the sequence, two padding elements per row.
    const int64_t row = D + 2;
    std::vector<unsigned char> mem(B * H * Sl * row * c.elem, 0xAB);
    ctxpar_tensor t = {mem.data(), c.dtype, {B, Sl, H, D}, {H * Sl * row, row, Sl * row, 1}};
    cpt_test_fill(&t, 9, 2, S, pos);
    for (int64_t b = 0; b < B; b++)
        for (int64_t s = 0; s < Sl; s++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t d = 0; d < D; d++)
                    ASSERT_EQ(cpt_test_get(&t, b, s, h, d),
                              global[((b * S + pos[s]) * H + h) * D + d])
                        << b << " " << s << " " << h << " " << d;
    // The padding was not touched.
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t s = 0; s < Sl; s++)
                for (int64_t d = D; d < row; d++)
                    for (size_t byte = 0; byte < c.elem; byte++)
                        ASSERT_EQ(mem[(((b * H + h) * Sl + s) * row + d) * c.elem + byte], 0xAB);
    // And the values are the rounded generator values.
    EXPECT_EQ(global[0], cpt_test_round(c.dtype, cpt_test_value(9, 2, 0)));
}

// Without positions the whole tensor is the global one; to_f64 gives it back densely.
TEST_P(FillTest, IdentityFillAndToF64) {
    const FillCase c = GetParam();
    const int64_t B = 1, S = 6, H = 2, D = 4, n = B * S * H * D;
    std::vector<double> global(n), back(n);
    cpt_test_fill_global_f64(global.data(), c.dtype, 1, 0, B, S, H, D);
    std::vector<unsigned char> mem(n * c.elem);
    ctxpar_tensor t = ctxpar_tensor_bshd(mem.data(), c.dtype, B, S, H, D);
    cpt_test_fill(&t, 1, 0, S, nullptr);
    cpt_test_to_f64(&t, back.data());
    EXPECT_EQ(back, global);
}

TEST_P(FillTest, SetRoundsLikeFill) {
    const FillCase c = GetParam();
    std::vector<unsigned char> mem(4 * c.elem);
    ctxpar_tensor t = ctxpar_tensor_bshd(mem.data(), c.dtype, 1, 1, 1, 4);
    cpt_test_set(&t, 0, 0, 0, 2, 0.1);
    EXPECT_EQ(cpt_test_get(&t, 0, 0, 0, 2), cpt_test_round(c.dtype, 0.1));
}

INSTANTIATE_TEST_SUITE_P(Dtypes, FillTest,
                         ::testing::Values(FillCase{CTXPAR_DTYPE_F32, 4},
                                           FillCase{CTXPAR_DTYPE_F16, 2},
                                           FillCase{CTXPAR_DTYPE_BF16, 2}),
                         [](const ::testing::TestParamInfo<FillCase> &i) {
                             return std::string(ctxpar_dtype_name(i.param.dtype));
                         });

TEST(Fill, ShardsOfAllRanksCoverTheGlobalTensor) {
    // Contiguous shards of 4 ranks, each filled on its own, reassemble into the global tensor.
    const int64_t B = 2, S = 8, H = 2, D = 3, P = 4, Sl = S / P;
    std::vector<double> global(B * S * H * D);
    cpt_test_fill_global_f64(global.data(), CTXPAR_DTYPE_F32, 4, 1, B, S, H, D);
    for (int64_t r = 0; r < P; r++) {
        std::vector<float> local(B * Sl * H * D);
        std::vector<int64_t> pos(Sl);
        for (int64_t i = 0; i < Sl; i++)
            pos[i] = r * Sl + i;
        ctxpar_tensor t = ctxpar_tensor_bshd(local.data(), CTXPAR_DTYPE_F32, B, Sl, H, D);
        cpt_test_fill(&t, 4, 1, S, pos.data());
        for (int64_t b = 0; b < B; b++)
            for (int64_t s = 0; s < Sl; s++)
                for (int64_t e = 0; e < H * D; e++)
                    ASSERT_EQ(local[(b * Sl + s) * H * D + e],
                              global[(b * S + pos[s]) * H * D + e]);
    }
}

} // namespace
