/*
 * plan_comm.h - the planner's comm: every op completes at once and moves nothing (the planner's
 * device holds no data), but the dispatch counts its bytes as for a real comm, and it sorts what
 * this rank sends and receives by link class: inside the all-to-all group (a node's fast links)
 * or across groups. Received bytes are counted on the receiving rank, from the sizes its own
 * calls post (a sendrecv's recv_bytes from src; a collective's block from every peer), not taken
 * from what peers send. Point-to-point traffic (the ring's, which overlaps compute) and
 * collectives (which do not) are kept apart. It splits as the algorithm's table entry says its
 * calls split (ctxpar_algorithm.splits): a rank of a dry run has no peers to meet in a split.
 */
#ifndef CPT_PLAN_COMM_H
#define CPT_PLAN_COMM_H

#include <stdint.h>

#include "ctxpar_backend.h"
#include "registry.h"

#ifdef __cplusplus
extern "C" {
#endif

enum { CPT_LINK_GROUP = 0, CPT_LINK_ACROSS = 1, CPT_LINKS = 2 };

typedef struct cpt_plan_traffic {
    uint64_t p2p_bytes[CPT_LINKS], p2p_msgs[CPT_LINKS];   /* sent */
    uint64_t coll_bytes[CPT_LINKS], coll_msgs[CPT_LINKS]; /* sent */
    uint64_t p2p_recv_bytes[CPT_LINKS], coll_recv_bytes[CPT_LINKS];
} cpt_plan_traffic;

/* Rank `rank` of `size`. A peer is in this rank's group when peer / group_size equals
 * rank / group_size; link >= 0 instead puts every peer in that class (the sub-comms). Its splits
 * make the sub-comms of `splits` (nsplits of them, copied) in turn, again from the first when
 * they run out: a sub-comm whose members are one all-to-all group is all GROUP links, the others
 * all ACROSS; with none, a split is NOT_SUPPORTED. Counts into *traffic (borrowed), as its
 * sub-comms do. */
ctxpar_status cpt_plan_comm_create(int rank, int size, int group_size, int link,
                                   const ctxpar_split_shape *splits, int nsplits,
                                   cpt_plan_traffic *traffic, ctxpar_comm **comm_out);

#ifdef __cplusplus
}
#endif

#endif /* CPT_PLAN_COMM_H */
