/*
 * plan_docs.h - the documents of a plan: N generated documents with a length distribution, or
 * the boundaries read from a text file.
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

/* A text file of whitespace-separated boundaries 0 ... seq; *cu_out malloc'ed, *docs_out the
 * number of documents. */
ctxpar_status cpt_plan_read_cu_seqlens(const char *path, int32_t **cu_out, int64_t *docs_out);

#ifdef __cplusplus
}
#endif

#endif /* CPT_PLAN_DOCS_H */
