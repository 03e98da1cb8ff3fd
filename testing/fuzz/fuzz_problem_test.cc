// The fuzz input decoder draws every attention parameter: over many inputs each field of
// ctxpar_attn_params (the library's table, core/params_table.h) takes its default and some other
// value, so a parameter added to the table fails here until validate_fuzz draws it too.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "fuzz_problem.h"
#include "params_table.h"

TEST(FuzzProblem, DrawsEveryParameter) {
    std::mt19937 rng(7);
    std::vector<int> set(CTXPAR_PARAM_COUNT, 0), unset(CTXPAR_PARAM_COUNT, 0);
    const char *defaults = reinterpret_cast<const char *>(&ctxpar_param_defaults);
    int decoded = 0;
    for (int n = 0; n < 2000; n++) {
        // Header, tensor records, features block and a few element bytes (fuzz_problem.h); the
        // first input is empty (bytes read as 0: plain attention).
        std::vector<uint8_t> in(n == 0 ? 0 : FUZZ_EXT_BASE + FUZZ_EXT_SIZE + 16);
        for (uint8_t &b : in)
            b = static_cast<uint8_t>(rng());
        fuzz_problem pb;
        if (fuzz_problem_decode(in.data(), in.size(), &pb)) {
            decoded++;
            const char *got = reinterpret_cast<const char *>(&pb.params);
            for (int i = 0; i < CTXPAR_PARAM_COUNT; i++) {
                const ctxpar_param_field &f = ctxpar_param_fields[i];
                const bool is_default =
                    std::memcmp(got + f.offset, defaults + f.offset, f.size) == 0;
                (is_default ? unset : set)[i]++;
            }
        }
        fuzz_problem_free(&pb);
    }
    ASSERT_GT(decoded, 1000);
    for (int i = 0; i < CTXPAR_PARAM_COUNT; i++) {
        EXPECT_GT(set[i], 0) << "validate_fuzz never sets params." << ctxpar_param_fields[i].name
                             << ": draw it in testing/fuzz/fuzz_problem.c";
        EXPECT_GT(unset[i], 0) << "validate_fuzz always sets params."
                               << ctxpar_param_fields[i].name;
    }
}
