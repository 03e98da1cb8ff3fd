// The documents of a plan (see plan_docs.h).
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctxpar_backend.h"
#include "plan_docs.h"
#include "reference/data.h"
#include "reference/runner.h"

// exp(sigma·z), z standard normal by Box-Muller from two uniform values in (0, 1].
static double lognormal_weight(uint64_t seed, int64_t i, void *user) {
    const double sigma = *(const double *)user;
    const double u1 = 0.5 - 0.5 * cpt_test_value(seed, 101, (uint64_t)i);
    const double u2 = 0.5 + 0.5 * cpt_test_value(seed, 102, (uint64_t)i);
    return exp(sigma * sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

ctxpar_status cpt_plan_docs(const char *dist, double sigma, uint64_t seed, int64_t seq,
                            int64_t docs, int32_t *cu_out) {
    if (!strcmp(dist, "uniform"))
        return cpt_run_docs(seed, seq, docs, cu_out);
    if (strcmp(dist, "lognormal") != 0)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "--doc-dist %s: uniform or lognormal", dist);
    return cpt_run_docs_with(seed, seq, docs, lognormal_weight, &sigma, cu_out);
}
