// The verdict every end-to-end suite asserts on one run of P ranks against the fp64 oracle:
// each tensor is present and within its per-element bound (docs/numerics.md; the worst element
// named by batch, position, head, dim and rank), and, for P > 1, its error is no worse than the
// single rank's by more than the error-ratio rule. At P = 1 there is no ratio: the single-rank
// run is the same computation.
#ifndef CPT_TESTING_E2E_EXPECT_H
#define CPT_TESTING_E2E_EXPECT_H

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "reference/runner.h"
#include "reference/tolerance.h"

// tensors: the first that many of out, lse, dq, dk, dv (2: a forward-only run).
inline void CptExpectTensorsMatch(const cpt_run_result &r, int ranks,
                                  int tensors = CPT_RUN_TENSORS) {
    for (int i = 0; i < tensors; i++) {
        const char *name = cpt_run_tensor_name(static_cast<cpt_run_tensor>(i));
        ASSERT_TRUE(r.has[i]) << name;
        const auto &w = r.bound_worst[i];
        EXPECT_LE(r.bound_ratio[i], 1.0)
            << name << ": worst at batch " << w.batch << ", position " << w.position << ", head "
            << w.head << ", dim " << w.dim << ", rank " << w.rank << ": got " << w.got
            << ", oracle " << w.ref;
        if (ranks > 1) {
            EXPECT_TRUE(cpt_error_ratio_ok(r.error[i], r.error_1[i]))
                << name << ": error " << r.error[i] << " at P=" << ranks << " vs " << r.error_1[i]
                << " at P=1";
        } else {
            EXPECT_TRUE(std::isnan(r.ratio[i])) << name << ": ratio " << r.ratio[i] << " at P=1";
        }
    }
}

// The bitwise promises: all-gather gives one rank's out and lse bits (the design's promise), and
// a run at P = 1, compared with itself, is reproducible bit for bit in every tensor.
inline void CptExpectBitwisePromises(const cpt_run_result &r, int ranks, ctxpar_algo algo,
                                     int tensors = CPT_RUN_TENSORS) {
    if (algo == CTXPAR_ALGO_ALLGATHER) {
        EXPECT_TRUE(r.bitwise_single[CPT_T_OUT]);
        EXPECT_TRUE(r.bitwise_single[CPT_T_LSE]);
    }
    if (ranks == 1) {
        for (int i = 0; i < tensors; i++)
            EXPECT_TRUE(r.bitwise_single[i]) << cpt_run_tensor_name((cpt_run_tensor)i);
    }
}

// A run's configuration and the inputs it points into, kept alive with it.
struct CptShardedRun {
    cpt_run_config cfg;
    std::vector<int32_t> cu;     // [rows, 5]: CptTestDocs of rows 0 and 1
    std::vector<int32_t> assign; // [S]: a custom layout's assignment
};

// Four documents of a row of S >= 1 tokens, with an empty one (two equal boundaries; more for
// tiny S); row 1's differ from row 0's.
inline void CptTestDocs(int64_t S, int64_t row, int32_t *cu) {
    const int32_t s = static_cast<int32_t>(S);
    const int32_t r0[5] = {0, s / 4, s / 4, s * 3 / 5, s};
    const int32_t r1[5] = {0, 0, s / 2 + 1 > s ? s : s / 2 + 1, s, s};
    for (int i = 0; i < 5; i++)
        cu[i] = row == 0 ? r0[i] : r1[i];
}

#endif // CPT_TESTING_E2E_EXPECT_H
