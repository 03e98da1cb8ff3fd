/*
 * plan_device.h - the planner's device: it holds no memory and computes nothing, so that the
 * library's own algorithms can be run rank by rank for problems far larger than this machine
 * (ctxpar plan). Allocations return distinct addresses that are never touched. Its forward block
 * op records, per query position, the (key, head, batch) triples the block computes, which the
 * coverage proof compares with the mask (cpt_plan_cover_check).
 */
#ifndef CPT_PLAN_DEVICE_H
#define CPT_PLAN_DEVICE_H

#include <stdint.h>

#include "ctxpar_backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Some (key, head, batch) triples of one query position: how many, the sum of their key
 * positions and the sum of the squares, modulo 2^64 (unsigned wraparound keeps the sums exact
 * modulo 2^64 at any length). A key computed twice and a visible key missed in the same row
 * leave the count as it should be but not the sums (two keys twice and two missed with the same
 * total: the squares). */
typedef struct cpt_plan_keys {
    uint64_t count, sum, sumsq;
} cpt_plan_keys;

/* The keys of span k that query position pos sees under m (one batch row's mask: doc_rows 0),
 * from the mask's rules read as an interval of key positions, in closed form. */
cpt_plan_keys cpt_plan_mask_keys(const ctxpar_mask_desc *m, int64_t pos, const ctxpar_span *k,
                                 int64_t seq);

/* Per query position of the global sequence, the triples computed: seq + 1 entries holding
 * differences (a block that sees whole stretches of keys adds in O(1), a position adds in two
 * entries) until cpt_plan_cover_settle makes them per-position values. 24 bytes per token. */
typedef struct cpt_plan_cover {
    int64_t seq;
    cpt_plan_keys *row;
    int settled;
} cpt_plan_cover;

ctxpar_status cpt_plan_cover_init(cpt_plan_cover *c, int64_t seq);
/* Turns the differences into per-position values (once; later calls do nothing). */
void cpt_plan_cover_settle(cpt_plan_cover *c);
void cpt_plan_cover_free(cpt_plan_cover *c);

/* The coverage proof: settles c, then compares every position's count, sum and sum of squares
 * with those of the keys the mask lets it see in the whole sequence, x heads x batch (with
 * documents per batch row, each row's own). 1 when every position agrees; else 0 and *bad_out
 * is the first that differs (-1 when all agree). Adds the triples over all positions to
 * *computed and *visible. */
int cpt_plan_cover_check(cpt_plan_cover *c, const ctxpar_mask_desc *m, int64_t batch, int64_t heads,
                         int64_t *bad_out, double *computed, double *visible);

/* A device that records forward blocks into *cover while recording is on. */
ctxpar_status cpt_plan_device_create(ctxpar_device **dev_out);
/* Records each block `copies` times (for ranks whose blocks are this rank's: plan_run.c); cover
 * NULL: stop recording. Blocks whose keys are a whole residue class (striped) wait per query
 * span until cpt_plan_device_flush, or recording into another cover, adds them to their cover
 * (OUT_OF_MEMORY when there is no room for that). */
ctxpar_status cpt_plan_device_record(ctxpar_device *dev, cpt_plan_cover *cover, uint64_t copies);
/* Adds every block still waiting to its cover: before the cover is read. */
ctxpar_status cpt_plan_device_flush(ctxpar_device *dev);

#ifdef __cplusplus
}
#endif

#endif /* CPT_PLAN_DEVICE_H */
