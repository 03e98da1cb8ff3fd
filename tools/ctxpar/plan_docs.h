/*
 * plan_docs.h - the documents of a plan: N generated documents with a length distribution (a
 * file of boundaries is read as every command reads --cu-seqlens: cli.c).
 */
#ifndef CPT_PLAN_DOCS_H
#define CPT_PLAN_DOCS_H

#include <stdint.h>

#include "ctxpar.h"

#ifdef __cplusplus
extern "C" {
#endif

/* dist "uniform": lengths in [0.25, 1.75) x the mean (cpt_run_docs); "lognormal": lengths
 * exp(sigma·z), z standard normal, scaled to fill seq. cu_out: docs + 1 entries. */
ctxpar_status cpt_plan_docs(const char *dist, double sigma, uint64_t seed, int64_t seq,
                            int64_t docs, int32_t *cu_out);

#ifdef __cplusplus
}
#endif

#endif /* CPT_PLAN_DOCS_H */
