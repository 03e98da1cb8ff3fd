/*
 * registry.c - devices and comms by name. Each backend and each comm registers itself when its
 * library is loaded or linked in (ctxpar_device_register, ctxpar_comm_register, from a
 * constructor function; the CPU device's and the local comm's run first). The tool and Python
 * go through it, so a new backend or comm is found without either knowing of it. Here, on the
 * lowest floor, because backends and comms register: they must not depend on the front door.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctxpar_backend.h"

#define MAX_ENTRIES 16

typedef struct entry {
    const char *name, *description;
    union {
        ctxpar_device_factory device;
        const ctxpar_comm_world_ops *comm;
    } make;
} entry;

typedef struct registry {
    const char *what; // "device", "comm": for messages
    entry entries[MAX_ENTRIES];
    int count;
} registry;

// Constructors of other libraries may register before main(): static storage, a static mutex.
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static registry devices = {"device", {{0}}, 0}, comms = {"comm", {{0}}, 0};

static const entry *find(const registry *r, const char *name) {
    for (int i = 0; i < r->count; i++)
        if (!strcmp(r->entries[i].name, name))
            return &r->entries[i];
    return NULL;
}

static ctxpar_status add(registry *r, const char *name, const char *description, entry e,
                         int has_factory) {
    if (!name || !*name || !has_factory)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "%s registry: %s", r->what,
                            !has_factory ? "no factory" : "no name");
    e.name = name;
    e.description = description ? description : "";
    ctxpar_status st = CTXPAR_OK;
    pthread_mutex_lock(&lock);
    if (find(r, name))
        st = CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "%s registry: '%s' is already registered",
                          r->what, name);
    else if (r->count == MAX_ENTRIES)
        st = CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "%s registry: full (%d entries), '%s' left out",
                          r->what, MAX_ENTRIES, name);
    else
        r->entries[r->count++] = e;
    pthread_mutex_unlock(&lock);
    return st;
}

static int names(const registry *r, const char **names_out, const char **descriptions,
                 int capacity) {
    pthread_mutex_lock(&lock);
    const int n = r->count;
    for (int i = 0; i < n && i < capacity; i++) {
        if (names_out)
            names_out[i] = r->entries[i].name;
        if (descriptions)
            descriptions[i] = r->entries[i].description;
    }
    pthread_mutex_unlock(&lock);
    return n;
}

// A copy of the entry called `name`, or NOT_SUPPORTED naming the ones there are.
static ctxpar_status lookup(const registry *r, const char *name, entry *out) {
    pthread_mutex_lock(&lock);
    const entry *e = find(r, name);
    if (e)
        *out = *e;
    char known[MAX_ENTRIES * 24] = "";
    for (int i = 0; !e && i < r->count; i++) {
        const size_t used = strlen(known);
        snprintf(known + used, sizeof known - used, "%s%s", i ? ", " : "", r->entries[i].name);
    }
    pthread_mutex_unlock(&lock);
    if (!e)
        return CTXPAR_ERROR(CTXPAR_ERR_NOT_SUPPORTED, "no %s called '%s' here (there are: %s)",
                            r->what, name, known);
    return CTXPAR_OK;
}

ctxpar_status ctxpar_device_register(const char *name, const char *description,
                                     ctxpar_device_factory create) {
    entry e = {0};
    e.make.device = create;
    return add(&devices, name, description, e, create != NULL);
}

int ctxpar_device_names(const char **names_out, const char **descriptions, int capacity) {
    return names(&devices, names_out, descriptions, capacity);
}

ctxpar_status ctxpar_device_create_by_name(const char *name, int num_threads,
                                           ctxpar_device **device_out) {
    if (!name || !device_out)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "%s is NULL", !name ? "name" : "device_out");
    entry e;
    CTXPAR_CHECK(lookup(&devices, name, &e));
    if (num_threads < 0)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "num_threads (%d) < 0", num_threads);
    return e.make.device(num_threads, device_out);
}

/* ---------------------------------------------------------------- comms */

struct ctxpar_comm_world {
    const ctxpar_comm_world_ops *ops;
    void *impl;
    int first, count;
};

ctxpar_status ctxpar_comm_register(const char *name, const char *description,
                                   const ctxpar_comm_world_ops *ops) {
    entry e = {0};
    e.make.comm = ops;
    return add(&comms, name, description, e, ops && ops->create && ops->comm && ops->destroy);
}

int ctxpar_comm_names(const char **names_out, const char **descriptions, int capacity) {
    return names(&comms, names_out, descriptions, capacity);
}

ctxpar_status ctxpar_comm_world_create(const char *name, int nranks,
                                       ctxpar_comm_world **world_out) {
    if (!name || !world_out)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "%s is NULL", !name ? "name" : "world_out");
    if (nranks < 0)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "nranks (%d) < 0", nranks);
    entry e;
    CTXPAR_CHECK(lookup(&comms, name, &e));
    ctxpar_comm_world *w = calloc(1, sizeof *w);
    if (!w)
        return CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "cannot allocate a comm world");
    w->ops = e.make.comm;
    ctxpar_status st = w->ops->create(nranks, &w->impl, &w->first, &w->count);
    if (st != CTXPAR_OK) {
        free(w);
        return st;
    }
    *world_out = w;
    return CTXPAR_OK;
}

int ctxpar_comm_world_ranks(const ctxpar_comm_world *world, int *first_rank_out) {
    if (first_rank_out)
        *first_rank_out = world ? world->first : 0;
    return world ? world->count : 0;
}

ctxpar_status ctxpar_comm_world_comm(ctxpar_comm_world *world, int i, ctxpar_device *copy_device,
                                     ctxpar_comm **comm_out) {
    if (!world || !comm_out)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "%s is NULL", !world ? "world" : "comm_out");
    if (i < 0 || i >= world->count)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG,
                            "i (%d) is not one of this process's %d ranks (0..%d)", i,
                            world->count, world->count - 1);
    return world->ops->comm(world->impl, i, copy_device, comm_out);
}

void ctxpar_comm_world_destroy(ctxpar_comm_world *world) {
    if (!world)
        return;
    world->ops->destroy(world->impl);
    free(world);
}
