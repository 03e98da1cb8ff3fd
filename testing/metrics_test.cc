// Error metrics (non-finite handling, ULPs, bitwise comparison) and the tolerance table.
#include "reference/metrics.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include <gtest/gtest.h>

#include "ctxpar_half.h"
#include "reference/tolerance.h"

namespace {

const double kInf = std::numeric_limits<double>::infinity();

TEST(Compare, RelativeToTheTensorScale) {
    const float got[] = {1.0f, -2.5f, 4.0f};
    const double ref[] = {1.0, -2.0, 4.0};
    cpt_error_stats st = cpt_compare_f32(got, ref, 3);
    EXPECT_DOUBLE_EQ(st.max_abs, 0.5);
    EXPECT_DOUBLE_EQ(st.max_ref, 4.0);
    EXPECT_DOUBLE_EQ(st.rel, 0.125);
    EXPECT_EQ(st.worst, 1);
    EXPECT_EQ(st.nonfinite, 0);
    EXPECT_EQ(st.count, 3u);
    EXPECT_DOUBLE_EQ(cpt_max_abs_error(got, ref, 3), 0.5);
    EXPECT_DOUBLE_EQ(cpt_rel_error(got, ref, 3), 0.125);
}

TEST(Compare, AllZeroReferenceUsesAbsoluteError) {
    const float got[] = {0.0f, 1e-3f};
    const double ref[] = {0.0, 0.0};
    cpt_error_stats st = cpt_compare_f32(got, ref, 2);
    EXPECT_DOUBLE_EQ(st.rel, (double)1e-3f);
}

TEST(Compare, LseInfinities) {
    // Both -inf (a fully masked row): no error, and the scale ignores them.
    const float both[] = {-INFINITY, 2.0f};
    const double ref[] = {-kInf, 2.0};
    cpt_error_stats st = cpt_compare_f32(both, ref, 2);
    EXPECT_EQ(st.max_abs, 0.0);
    EXPECT_EQ(st.max_ref, 2.0);
    EXPECT_EQ(st.nonfinite, 0);
    // -inf on one side only: infinite error, either way round.
    const float one[] = {-INFINITY, 2.0f};
    const double ref_finite[] = {-1e30, 2.0};
    st = cpt_compare_f32(one, ref_finite, 2);
    EXPECT_EQ(st.max_abs, kInf);
    EXPECT_EQ(st.rel, kInf);
    EXPECT_EQ(st.nonfinite, 1);
    const float finite[] = {-3.0f, 2.0f};
    st = cpt_compare_f32(finite, ref, 2);
    EXPECT_EQ(st.rel, kInf);
    EXPECT_EQ(st.worst, 0);
    // +inf against -inf is no match either.
    const float pinf[] = {INFINITY};
    st = cpt_compare_f32(pinf, ref, 1);
    EXPECT_EQ(st.max_abs, kInf);
}

TEST(Compare, NaNIsInfiniteError) {
    const float got[] = {1.0f, NAN, 3.0f};
    const double ref[] = {1.0, 2.0, 3.0};
    cpt_error_stats st = cpt_compare_f32(got, ref, 3);
    EXPECT_EQ(st.max_abs, kInf);
    EXPECT_EQ(st.rel, kInf);
    EXPECT_EQ(st.worst, 1);
    EXPECT_EQ(st.nonfinite, 1);
    // A NaN reference (an oracle that failed) can never pass either.
    const float ok[] = {1.0f};
    const double nan_ref[] = {std::nan("")};
    EXPECT_EQ(cpt_compare_f32(ok, nan_ref, 1).rel, kInf);
}

TEST(Compare, EmptyInput) {
    cpt_error_stats st = cpt_compare_f32(nullptr, nullptr, 0);
    EXPECT_EQ(st.max_abs, 0.0);
    EXPECT_EQ(st.worst, -1);
}

TEST(Compare, TensorOfEveryDtypeWithStrides) {
    // [1, 2, 1, 2] viewed with a padded sequence stride; element (0, 1, 0, 1) is off by 0.25.
    const double ref[] = {0.5, -1.0, 2.0, 4.0};
    uint16_t bf[6] = {ctxpar_f32_to_bf16(0.5f), ctxpar_f32_to_bf16(-1.0f), 0xffff,
                      ctxpar_f32_to_bf16(2.0f), ctxpar_f32_to_bf16(4.25f), 0xffff};
    ctxpar_tensor t = {bf, CTXPAR_DTYPE_BF16, {1, 2, 1, 2}, {6, 3, 2, 1}};
    cpt_error_stats st = cpt_compare_tensor(&t, ref);
    EXPECT_DOUBLE_EQ(st.max_abs, 0.25);
    EXPECT_DOUBLE_EQ(st.rel, 0.25 / 4.0);
    EXPECT_EQ(st.worst, 3);
    uint16_t h[4] = {ctxpar_f32_to_f16(0.5f), ctxpar_f32_to_f16(-1.0f), ctxpar_f32_to_f16(2.0f),
                     ctxpar_f32_to_f16(4.0f)};
    ctxpar_tensor th = ctxpar_tensor_bshd(h, CTXPAR_DTYPE_F16, 1, 2, 1, 2);
    EXPECT_EQ(cpt_compare_tensor(&th, ref).max_abs, 0.0);
}

TEST(Ulp, Distances) {
    EXPECT_EQ(cpt_ulp_distance_f32(1.0f, 1.0f), 0u);
    EXPECT_EQ(cpt_ulp_distance_f32(1.0f, std::nextafter(1.0f, 2.0f)), 1u);
    EXPECT_EQ(cpt_ulp_distance_f32(std::nextafter(1.0f, 0.0f), std::nextafter(1.0f, 2.0f)), 2u);
    EXPECT_EQ(cpt_ulp_distance_f32(0.0f, -0.0f), 0u);
    // Across zero: the two smallest subnormals are 2 apart (via +-0).
    const float tiny = std::numeric_limits<float>::denorm_min();
    EXPECT_EQ(cpt_ulp_distance_f32(tiny, -tiny), 2u);
    // The largest float is one step below infinity.
    EXPECT_EQ(cpt_ulp_distance_f32(std::numeric_limits<float>::max(), INFINITY), 1u);
    EXPECT_EQ(cpt_ulp_distance_f32(NAN, 1.0f), UINT64_MAX);
    // 2.0 and 1.0 are 2^23 floats apart.
    EXPECT_EQ(cpt_ulp_distance_f32(1.0f, 2.0f), 1u << 23);
}

TEST(Ulp, StatsRoundTheReferenceToFloat) {
    const float got[] = {1.0f, std::nextafter(2.0f, 3.0f), 0.1f, -4.0f};
    // 0.1 rounds to 0.1f: no distance even though got != ref exactly.
    const double ref[] = {1.0, 2.0, 0.1, -4.0};
    cpt_ulp_stats st = cpt_ulp_f32(got, ref, 4);
    EXPECT_EQ(st.max, 1u);
    EXPECT_EQ(st.worst, 1);
    EXPECT_DOUBLE_EQ(st.mean, 0.25);
    const float bad[] = {NAN};
    EXPECT_EQ(cpt_ulp_f32(bad, ref, 1).max, UINT64_MAX);
}

TEST(Bitwise, Buffers) {
    const float a[] = {1.0f, 0.0f, 3.0f, 4.0f};
    const float b[] = {1.0f, -0.0f, 3.0f, 5.0f}; // -0 equals 0 in value, not in bits
    int64_t first = 7;
    EXPECT_EQ(cpt_bitwise_diff(a, b, 4, sizeof(float), &first), 2u);
    EXPECT_EQ(first, 1);
    EXPECT_EQ(cpt_bitwise_diff(a, a, 4, sizeof(float), &first), 0u);
    EXPECT_EQ(first, -1);
    EXPECT_EQ(cpt_bitwise_diff(a, b, 1, sizeof(float), nullptr), 0u);
}

TEST(Bitwise, TensorsWithDifferentStrides) {
    // The same values, dense and with a padded row stride.
    float dense[4] = {1, 2, 3, 4};
    float padded[6] = {1, 2, -1, 3, 4, -1};
    ctxpar_tensor a = ctxpar_tensor_bshd(dense, CTXPAR_DTYPE_F32, 1, 2, 1, 2);
    ctxpar_tensor b = {padded, CTXPAR_DTYPE_F32, {1, 2, 1, 2}, {6, 3, 2, 1}};
    int64_t first = 7;
    EXPECT_EQ(cpt_bitwise_diff_tensor(&a, &b, &first), 0u);
    EXPECT_EQ(first, -1);
    padded[4] = 4.5f;
    EXPECT_EQ(cpt_bitwise_diff_tensor(&a, &b, &first), 1u);
    EXPECT_EQ(first, 3);
    b.shape[3] = 1;
    EXPECT_EQ(cpt_bitwise_diff_tensor(&a, &b, &first), SIZE_MAX);
    b.shape[3] = 2;
    b.dtype = CTXPAR_DTYPE_BF16;
    EXPECT_EQ(cpt_bitwise_diff_tensor(&a, &b, &first), SIZE_MAX);
}

TEST(Tolerance, F32MeetsTheProjectBar) {
    for (const char *t : {"out", "lse", "dq", "dk", "dv"}) {
        double f32 = cpt_tolerance(CTXPAR_DTYPE_F32, t);
        EXPECT_GT(f32, 0.0) << t;
        EXPECT_LE(f32, 1e-5) << t;
        // 16-bit storage cannot be held tighter than F32, nor BF16 tighter than F16.
        EXPECT_GE(cpt_tolerance(CTXPAR_DTYPE_F16, t), f32) << t;
        EXPECT_GE(cpt_tolerance(CTXPAR_DTYPE_BF16, t), cpt_tolerance(CTXPAR_DTYPE_F16, t));
    }
    // A stored BF16 result is off by up to 2^-8 of its scale from rounding alone.
    EXPECT_GT(cpt_tolerance(CTXPAR_DTYPE_BF16, "out"), std::ldexp(1.0, -8));
    EXPECT_GT(cpt_tolerance(CTXPAR_DTYPE_F16, "out"), std::ldexp(1.0, -11));
}

TEST(Tolerance, UnknownNamesFailEveryCheck) {
    EXPECT_TRUE(std::isnan(cpt_tolerance(CTXPAR_DTYPE_F32, "o")));
    EXPECT_TRUE(std::isnan(cpt_tolerance(CTXPAR_DTYPE_F32, nullptr)));
    EXPECT_TRUE(std::isnan(cpt_tolerance((ctxpar_dtype)7, "out")));
    EXPECT_FALSE(0.0 <= cpt_tolerance(CTXPAR_DTYPE_F32, "outx"));
}

TEST(Tolerance, LongSequencesScaleF32Only) {
    EXPECT_EQ(cpt_tolerance_for_seq(CTXPAR_DTYPE_F32, "out", 1024),
              cpt_tolerance(CTXPAR_DTYPE_F32, "out"));
    EXPECT_DOUBLE_EQ(cpt_tolerance_for_seq(CTXPAR_DTYPE_F32, "dv", 16384),
                     2.0 * cpt_tolerance(CTXPAR_DTYPE_F32, "dv"));
    EXPECT_EQ(cpt_tolerance_for_seq(CTXPAR_DTYPE_BF16, "out", 16384),
              cpt_tolerance(CTXPAR_DTYPE_BF16, "out"));
}

TEST(Tolerance, ErrorRatio) {
    // Above the floor the ratio decides.
    EXPECT_TRUE(cpt_error_ratio_ok(2e-3, 1e-3));
    EXPECT_FALSE(cpt_error_ratio_ok(2.1e-3, 1e-3));
    // Below it, rounding noise: held to twice the floor, not to twice the noise.
    EXPECT_TRUE(cpt_error_ratio_ok(3e-7, 1e-8));
    EXPECT_TRUE(cpt_error_ratio_ok(2 * CPT_TOL_RATIO_FLOOR, 0.0));
    EXPECT_FALSE(cpt_error_ratio_ok(2.1 * CPT_TOL_RATIO_FLOOR, 0.0));
    EXPECT_FALSE(cpt_error_ratio_ok(std::nan(""), 1e-3));
    EXPECT_FALSE(cpt_error_ratio_ok(kInf, 1e-3));
    // The floor is a few F32 ulps of the scale.
    EXPECT_GE(CPT_TOL_RATIO_FLOOR, std::ldexp(1.0, -23));
    EXPECT_LE(CPT_TOL_RATIO_FLOOR, 8 * std::ldexp(1.0, -23));
}

TEST(Compare, PerRowRelativeError) {
    // Row 0 is large and exact; row 1 is small and off by 10% of itself: the per-tensor measure
    // sees 1e-4 / 100, the per-row one the row's own 10%.
    const float got[] = {100.0f, -50.0f, 1.1e-3f, 0.0f};
    const double ref[] = {100.0, -50.0, 1e-3, 0.0};
    int64_t row = -1;
    EXPECT_NEAR(cpt_rel_error_rows(got, ref, 2, 2, &row), 0.1, 1e-6);
    EXPECT_EQ(row, 1);
    EXPECT_LT(cpt_rel_error(got, ref, 4), 2e-6);
    const float nan_row[] = {100.0f, -50.0f, NAN, 0.0f};
    EXPECT_EQ(cpt_rel_error_rows(nan_row, ref, 2, 2, nullptr), kInf);
}

TEST(Bound, ElementBoundScalesWithMagnitudeAndDtype) {
    // C u M for F32, plus the storage rounding 2 u_store |ref| for 16-bit results.
    // 16-bit results also C16 u_store M16; M16 is ignored for F32 results and for lse.
    // Every bound also allows the dtype's smallest subnormal (storage below the normal range).
    EXPECT_DOUBLE_EQ(cpt_bound_elem(CTXPAR_DTYPE_F32, 0, 1.0, 5.0, 0.0),
                     CPT_BOUND_C * 0x1p-24 + 0x1p-149);
    EXPECT_DOUBLE_EQ(cpt_bound_elem(CTXPAR_DTYPE_BF16, 0, 0.0, 0.0, 1.0), 2 * 0x1p-8 + 0x1p-133);
    EXPECT_DOUBLE_EQ(cpt_bound_elem(CTXPAR_DTYPE_BF16, 0, 0.0, 1.0, 0.0),
                     CPT_BOUND_C16 * 0x1p-8 + 0x1p-133);
    EXPECT_DOUBLE_EQ(cpt_bound_elem(CTXPAR_DTYPE_F16, 0, 0.0, 1.0, 0.0),
                     CPT_BOUND_C16 * 0x1p-11 + 0x1p-24);
    EXPECT_DOUBLE_EQ(cpt_bound_elem(CTXPAR_DTYPE_BF16, 1, 0.0, 1.0, 1.0),
                     2 * 0x1p-24 + 0x1p-149); // lse: F32
    const float got[] = {1.0f, 2.0f};
    const double ref[] = {1.0, 2.0 + 1e-3}, mag[] = {1.0, 1.0};
    cpt_bound_stats st = cpt_bound_check(got, ref, mag, nullptr, 2, CTXPAR_DTYPE_F32, 0);
    EXPECT_EQ(st.worst, 1);
    EXPECT_GT(st.max_ratio, 1.0);
}

} // namespace
