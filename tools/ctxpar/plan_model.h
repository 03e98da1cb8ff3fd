/*
 * plan_model.h - the hardware model of `ctxpar plan`: per-rank attention FLOP/s and, per link
 * class (inside an all-to-all group / a node, across), bandwidth and latency; and the predicted
 * time of a planned call. A model file is JSON (docs/performance.md, "Hardware model"):
 *
 *   {"name": "h200", "flops_per_s": 4.0e14, "bwd_factor": 2.5, "group_size": 8,
 *    "links": {"group":  {"bandwidth_Bps": 3.6e11, "latency_s": 3e-6},
 *              "across": {"bandwidth_Bps": 4.5e10, "latency_s": 8e-6}}}
 *
 * flops_per_s is in the unit the library counts (4·D per visible pair and head, forward); a
 * backward call counts the same and takes bwd_factor times as long. machine_flops_per_s (> 0)
 * instead shares one machine's rate among all ranks (ranks as threads of one machine: the "cpu"
 * model). Missing fields keep the built-in default's values.
 */
#ifndef CPT_PLAN_MODEL_H
#define CPT_PLAN_MODEL_H

#include "plan_run.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cpt_plan_model {
    char name[64];
    double flops_per_s, bwd_factor, machine_flops_per_s;
    int group_size;
    double bandwidth[CPT_LINKS], latency[CPT_LINKS];
} cpt_plan_model;

/* A built-in model: "h200" (a node of 8 H200 with NVLink, InfiniBand between nodes) or "cpu"
 * (this project's 2-core test machine, threads as ranks); 0 if there is no such name. */
int cpt_plan_model_builtin(const char *name, cpt_plan_model *m);

/* Reads a model file over the "h200" defaults; INVALID_ARG naming the file and field. */
ctxpar_status cpt_plan_model_load(const char *path, cpt_plan_model *m);

/* Seconds rank r's part takes, one of `ranks`: max(compute, point-to-point transfers, which
 * overlap compute) plus the collectives, which do not. */
double cpt_plan_rank_time(const cpt_plan_model *m, const cpt_plan_rank *r, int ranks);

/* The slowest rank's time. */
double cpt_plan_time(const cpt_plan_model *m, const cpt_plan_result *res);

#ifdef __cplusplus
}
#endif

#endif /* CPT_PLAN_MODEL_H */
