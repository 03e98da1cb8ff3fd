/*
 * limited_device.h - a CPU device that claims less than it can do, as a GPU backend refuses a
 * head_dim above its tile limit: its attn_supported op refuses head_dim > max_head_dim and
 * blocks of more than max_seq_k keys (0 = no limit), then asks the CPU device. For the tests that
 * show a NOT_SUPPORTED call leaving the comm and context usable, and AUTO steering around it.
 */
#ifndef CPT_TESTING_LIMITED_DEVICE_H
#define CPT_TESTING_LIMITED_DEVICE_H

#include <stdint.h>

#include "ctxpar.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One OpenMP thread; destroy with ctxpar_device_destroy. */
ctxpar_status cpt_test_limited_device_create(int64_t max_head_dim, int64_t max_seq_k,
                                                ctxpar_device **dev_out);

#ifdef __cplusplus
}
#endif

#endif /* CPT_TESTING_LIMITED_DEVICE_H */
