// The limited device (limited_device.h): the CPU device's ops table with its own attn_supported
// and destroy; the CPU device's impl is shared, so its ops work unchanged.
#include "limited_device.h"

#include <stdlib.h>

#include "dispatch.h"
#include "ctxpar_cpu.h"

typedef struct limited {
    struct ctxpar_device_ops ops; // first: a device's ops pointer leads back here
    ctxpar_device *cpu;
    int64_t max_head_dim, max_seq_k;
} limited;

static const limited *limited_of(const ctxpar_device *dev) {
    return (const limited *)(const void *)dev->ops;
}

static ctxpar_status limited_supported(const ctxpar_device *dev, const ctxpar_attn_query *q) {
    const limited *l = limited_of(dev);
    if (l->max_head_dim && q->head_dim > l->max_head_dim)
        return CTXPAR_ERROR(CTXPAR_ERR_NOT_SUPPORTED,
                            "limited device: head_dim %lld is above its limit of %lld",
                            (long long)q->head_dim, (long long)l->max_head_dim);
    if (l->max_seq_k && q->seq_k > l->max_seq_k)
        return CTXPAR_ERROR(CTXPAR_ERR_NOT_SUPPORTED,
                            "limited device: blocks of %lld keys are above its limit of %lld",
                            (long long)q->seq_k, (long long)l->max_seq_k);
    return ctxpar_dev_attn_supported(l->cpu, q);
}

static void limited_destroy(ctxpar_device *dev) {
    limited *l = (limited *)(void *)dev->ops;
    ctxpar_device_destroy(l->cpu);
    free(l);
}

ctxpar_status cpt_test_limited_device_create(int64_t max_head_dim, int64_t max_seq_k,
                                                ctxpar_device **dev_out) {
    limited *l = calloc(1, sizeof *l);
    if (!l)
        return CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "limited device: out of memory");
    ctxpar_cpu_options co = CTXPAR_CPU_OPTIONS_INIT;
    co.num_threads = 1;
    ctxpar_status st = ctxpar_device_create_cpu(&co, &l->cpu);
    if (st == CTXPAR_OK) {
        l->ops = *l->cpu->ops;
        l->ops.name = "limited cpu";
        l->ops.destroy = limited_destroy;
        l->ops.attn_supported = limited_supported;
        l->max_head_dim = max_head_dim;
        l->max_seq_k = max_seq_k;
        st = ctxpar_device_create(&l->ops, l->cpu->impl, 1, dev_out);
    }
    if (st != CTXPAR_OK) {
        ctxpar_device_destroy(l->cpu);
        free(l);
    }
    return st;
}
