/*
 * fault_device.h - a device decorator for tests: forwards every op to an inner device and can
 * make the n-th call of one op fail with CTXPAR_ERR_DEVICE (a fault the hardware reports late,
 * at the end of a call), emulate streams and events (so that the library takes its
 * stream-ordered paths on top of the synchronous CPU device), and remembers the last block it
 * allocated (so that a test can look at memory the library owns).
 */
#ifndef CPT_TESTING_FAULT_DEVICE_H
#define CPT_TESTING_FAULT_DEVICE_H

#include <stddef.h>

#include "ctxpar.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cpt_fault_device_config {
    int streams;         /* emulate stream and event ops (synchronous underneath) */
    const char *fail_op; /* op name as in ctxpar_device_ops ("event_record", "stream_sync",
                            "cast", ...); NULL: nothing fails */
    int fail_at;         /* which call of fail_op fails, counting from 0 */
} cpt_fault_device_config;

/* Wraps `inner` (borrowed: destroy it after the wrapper). */
ctxpar_status cpt_device_create_fault(ctxpar_device *inner,
                                         const cpt_fault_device_config *config,
                                         ctxpar_device **device_out);

/* Calls of an op so far (the failing one included). */
int cpt_fault_device_calls(const ctxpar_device *device, const char *op);

/* The block of the last alloc and its size; NULL before any. */
void *cpt_fault_device_last_alloc(const ctxpar_device *device, size_t *bytes_out);

#ifdef __cplusplus
}
#endif

#endif /* CPT_TESTING_FAULT_DEVICE_H */
