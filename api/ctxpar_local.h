/*
 * ctxpar_local.h - ranks as threads of one process: the embedded default comm.
 *
 * Make one group for P ranks, then one comm per rank (each used by its own thread). Transfers
 * are memory copies between the ranks' buffers. A rank that does not arrive makes the others
 * return CTXPAR_ERR_TIMEOUT after the comm's timeout; a rank that aborts or destroys its comm
 * makes peers waiting on it return CTXPAR_ERR_REMOTE.
 */
#ifndef CTXPAR_LOCAL_H
#define CTXPAR_LOCAL_H

#include "ctxpar.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ctxpar_local_group ctxpar_local_group;

/* A group of nranks >= 1 in-process ranks. Destroy it after every comm made from it. */
CTXPAR_API ctxpar_status ctxpar_local_group_create(int nranks, ctxpar_local_group **group_out);
CTXPAR_API void ctxpar_local_group_destroy(ctxpar_local_group *group);

/* The comm of `rank` in the group. copy_device: the device whose memory the buffers live in
 * (copies go through it); NULL means host memory and memcpy. Destroy with ctxpar_comm_destroy. */
CTXPAR_API ctxpar_status ctxpar_comm_create_local(ctxpar_local_group *group, int rank,
                                                  ctxpar_device *copy_device,
                                                  ctxpar_comm **comm_out);

#ifdef __cplusplus
}
#endif

#endif /* CTXPAR_LOCAL_H */
