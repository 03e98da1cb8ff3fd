/*
 * registry.c - devices by name (ctxpar_device_names, ctxpar_device_create_by_name): each backend
 * registers itself when its library is loaded or linked in (ctxpar_device_register, from a
 * constructor function; the CPU device's runs first). The tool's --backend and Python's
 * Context(device=) go through it, so a new backend is found without either knowing of it. Here,
 * on the lowest floor, because backends register: they must not depend on the front door.
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "ctxpar_backend.h"

#define MAX_DEVICES 16

typedef struct entry {
    const char *name, *description;
    ctxpar_device_factory create;
} entry;

// Constructors of other libraries may register before main(): static storage, a static mutex.
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static entry entries[MAX_DEVICES];
static int count;

static const entry *find(const char *name) {
    for (int i = 0; i < count; i++)
        if (!strcmp(entries[i].name, name))
            return &entries[i];
    return NULL;
}

ctxpar_status ctxpar_device_register(const char *name, const char *description,
                                     ctxpar_device_factory create) {
    if (!name || !*name || !create)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "device registry: %s",
                            !create ? "no factory" : "no name");
    ctxpar_status st = CTXPAR_OK;
    pthread_mutex_lock(&lock);
    if (find(name))
        st = CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "device registry: '%s' is already registered",
                          name);
    else if (count == MAX_DEVICES)
        st = CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "device registry: full (%d devices), '%s' left out",
                          MAX_DEVICES, name);
    else
        entries[count++] = (entry){name, description ? description : "", create};
    pthread_mutex_unlock(&lock);
    return st;
}

int ctxpar_device_names(const char **names, const char **descriptions, int capacity) {
    pthread_mutex_lock(&lock);
    const int n = count;
    for (int i = 0; i < n && i < capacity; i++) {
        if (names)
            names[i] = entries[i].name;
        if (descriptions)
            descriptions[i] = entries[i].description;
    }
    pthread_mutex_unlock(&lock);
    return n;
}

ctxpar_status ctxpar_device_create_by_name(const char *name, int num_threads,
                                           ctxpar_device **device_out) {
    if (!name || !device_out)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "%s is NULL", !name ? "name" : "device_out");
    pthread_mutex_lock(&lock);
    const entry *e = find(name);
    const ctxpar_device_factory create = e ? e->create : NULL;
    char known[MAX_DEVICES * 24] = "";
    for (int i = 0; !e && i < count; i++) {
        const size_t used = strlen(known);
        snprintf(known + used, sizeof known - used, "%s%s", i ? ", " : "", entries[i].name);
    }
    pthread_mutex_unlock(&lock);
    if (!create)
        return CTXPAR_ERROR(CTXPAR_ERR_NOT_SUPPORTED, "no device called '%s' here (there are: %s)",
                            name, known);
    if (num_threads < 0)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "num_threads (%d) < 0", num_threads);
    return create(num_threads, device_out);
}
