/*
 * plan_device.h - the planner's device: it holds no memory and computes nothing, so that the
 * library's own algorithms can be run rank by rank for problems far larger than this machine
 * (ctxpar plan). Allocations return distinct addresses that are never touched. Its forward block
 * op counts, per query position, the (key, head, batch) triples the block computes, which the
 * coverage proof compares with the mask (plan_run.c).
 */
#ifndef CPT_PLAN_DEVICE_H
#define CPT_PLAN_DEVICE_H

#include <stdint.h>

#include "ctxpar_backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Per query position of the global sequence: triples computed (count) and pending range adds
 * (diff, seq + 1 entries: blocks that see whole stretches of keys add there in O(1)). */
typedef struct cpt_plan_cover {
    int64_t seq;
    int64_t *count;
    int64_t *diff;
} cpt_plan_cover;

ctxpar_status cpt_plan_cover_init(cpt_plan_cover *c, int64_t seq);
/* Folds diff into count. */
void cpt_plan_cover_settle(cpt_plan_cover *c);
void cpt_plan_cover_free(cpt_plan_cover *c);

/* A device that records forward blocks into *cover while recording is on. */
ctxpar_status cpt_plan_device_create(ctxpar_device **dev_out);
/* cover NULL: stop recording. */
void cpt_plan_device_record(ctxpar_device *dev, cpt_plan_cover *cover);

#ifdef __cplusplus
}
#endif

#endif /* CPT_PLAN_DEVICE_H */
