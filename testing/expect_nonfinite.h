/*
 * expect_nonfinite.h - a GoogleTest check shared by the non-finite tests of the public API
 * (nonfinite_test) and of every device (device_conformance.cc): a result against the fp64 oracle
 * where both may hold NaN and infinities.
 */
#ifndef CPT_TESTING_EXPECT_NONFINITE_H
#define CPT_TESTING_EXPECT_NONFINITE_H

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

// NaN exactly where the oracle has NaN, the same infinity where it has one, and finite values
// within tol of the largest finite reference value.
inline void ExpectSameNonFinite(const std::vector<float> &got, const std::vector<double> &ref, double tol,
                         const std::string &what) {
    ASSERT_EQ(got.size(), ref.size()) << what;
    double max_ref = 0.0, max_err = 0.0;
    int64_t nan_missing = 0, nan_extra = 0, inf_wrong = 0, first = -1;
    for (double r : ref)
        if (std::isfinite(r))
            max_ref = std::fmax(max_ref, std::fabs(r));
    for (size_t i = 0; i < ref.size(); i++) {
        const double g = got[i], r = ref[i];
        bool bad = false;
        if (std::isnan(r) != std::isnan(g)) {
            (std::isnan(r) ? nan_missing : nan_extra)++;
            bad = true;
        } else if (std::isinf(r) || std::isinf(g)) {
            bad = g != r;
            inf_wrong += bad;
        } else if (!std::isnan(r)) {
            max_err = std::fmax(max_err, std::fabs(g - r));
        }
        if (bad && first < 0)
            first = (int64_t)i;
    }
    EXPECT_EQ(nan_missing, 0) << what << ": NaN in the oracle but not in the result";
    EXPECT_EQ(nan_extra, 0) << what << ": NaN in the result where the oracle is not NaN";
    EXPECT_EQ(inf_wrong, 0) << what << ": infinities differ";
    if (first >= 0)
        ADD_FAILURE() << what << ": first mismatch at flat index " << first << ": got "
                      << got[(size_t)first] << ", oracle " << ref[(size_t)first];
    EXPECT_LE(max_err, tol * std::fmax(max_ref, 1e-30))
        << what << ": finite values differ by " << max_err << " (max |oracle| " << max_ref << ")";
}

#endif /* CPT_TESTING_EXPECT_NONFINITE_H */
