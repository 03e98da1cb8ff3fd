// The CPU device's memory: 64-byte aligned host blocks, and a small cache of freed ones.
//
// Fresh memory from the OS costs a page fault per 4 KiB page when first touched, and ranks that
// are threads of one process take those faults under one address-space lock. The algorithms
// allocate their large buffers (K/V shards, the gathered K/V, dK/dV sums) per call, so without a
// cache every call paid for them again: about 16 ms of a 230 ms all-gather forward at seq 8192
// with two in-process ranks. A freed block is kept and handed out again for a request of the
// same rounded size; at most CACHE_SLOTS blocks and CACHE_BYTES bytes are kept (the oldest go
// first), and everything is returned when the device is destroyed. The memory statistics (ctxpar_dev_alloc) count
// blocks in use, not cached ones. Under AddressSanitizer nothing is cached, so that a use after
// free in the library is still caught.
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

#include "backends/cpu/cpu_internal.h"

#define CACHE_SLOTS 32
#define CACHE_BYTES ((size_t)1 << 30)
#define HEADER 64 // the block's rounded size, kept in front of it; keeps the 64-byte alignment

#if defined(__SANITIZE_ADDRESS__)
#define CACHE_ON 0
#else
#define CACHE_ON 1
#endif

struct ctxpar_cpu_cache {
    pthread_mutex_t mu; // a device may be shared by threads that allocate
    void *block[CACHE_SLOTS];
    size_t bytes[CACHE_SLOTS];
    int count;
    size_t total;
};

ctxpar_cpu_cache *ctxpar_cpu_cache_create(void) {
    ctxpar_cpu_cache *c = calloc(1, sizeof *c);
    if (c && pthread_mutex_init(&c->mu, NULL) != 0) {
        free(c);
        c = NULL;
    }
    return c;
}

void ctxpar_cpu_cache_destroy(ctxpar_cpu_cache *c) {
    if (!c)
        return;
    for (int i = 0; i < c->count; i++)
        free(c->block[i]);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

// Removes entry i, keeping the others in the order they were freed (oldest first).
static void drop(ctxpar_cpu_cache *c, int i) {
    c->total -= c->bytes[i];
    for (int j = i + 1; j < c->count; j++) {
        c->block[j - 1] = c->block[j];
        c->bytes[j - 1] = c->bytes[j];
    }
    c->count--;
}

// A cached block of exactly `rounded` bytes, removed from the cache; NULL if none.
static void *take(ctxpar_cpu_cache *c, size_t rounded) {
    void *p = NULL;
    pthread_mutex_lock(&c->mu);
    for (int i = c->count - 1; i >= 0; i--) { // the most recently freed first
        if (c->bytes[i] == rounded) {
            p = c->block[i];
            drop(c, i);
            break;
        }
    }
    pthread_mutex_unlock(&c->mu);
    return p;
}

void *ctxpar_cpu_cache_alloc(ctxpar_cpu_cache *c, size_t bytes) {
    if (bytes > SIZE_MAX - 2 * HEADER)
        return NULL;
    const size_t rounded = (bytes + HEADER - 1) / HEADER * HEADER;
    char *base = CACHE_ON ? take(c, rounded) : NULL;
    if (!base)
        base = ctxpar_cpu_aligned_alloc(rounded + HEADER);
    if (!base)
        return NULL;
    *(size_t *)base = rounded;
    return base + HEADER;
}

void ctxpar_cpu_cache_free(ctxpar_cpu_cache *c, void *ptr) {
    if (!ptr)
        return;
    char *base = (char *)ptr - HEADER;
    const size_t rounded = *(const size_t *)base;
    if (!CACHE_ON || rounded > CACHE_BYTES) {
        free(base);
        return;
    }
    // Makes room by returning the oldest blocks: the sizes of past calls give way to new ones.
    void *evicted[CACHE_SLOTS];
    int n = 0;
    pthread_mutex_lock(&c->mu);
    while (c->count == CACHE_SLOTS || rounded > CACHE_BYTES - c->total) {
        evicted[n++] = c->block[0];
        drop(c, 0);
    }
    c->block[c->count] = base;
    c->bytes[c->count++] = rounded;
    c->total += rounded;
    pthread_mutex_unlock(&c->mu);
    for (int i = 0; i < n; i++)
        free(evicted[i]);
}
