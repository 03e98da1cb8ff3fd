// Chrome trace-event output (chrome://tracing, Perfetto): one process per rank; in it one thread
// (track) per stream of work: the kernels, the waits, and one per kind of transfer ("kv", "dkv",
// ...) since the backward keeps two kinds in flight at once. One complete ("X") slice per event,
// named with the ring step and the peer.
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"

// One event of one rank, self-contained (the name copied) so that it can travel between
// processes as bytes.
typedef struct trace_entry {
    int32_t rank, kind, step, peer;
    double t_begin, t_end;
    uint64_t bytes;
    char name[32];
} trace_entry;

struct cpt_trace_file {
    pthread_mutex_t lock;
    int ranks;
    size_t count, cap;
    trace_entry *entries;
};

int cpt_trace_open(cpt_trace_file **trace_out, int ranks) {
    cpt_trace_file *t = calloc(1, sizeof *t);
    if (!t)
        return -1;
    pthread_mutex_init(&t->lock, NULL);
    t->ranks = ranks;
    *trace_out = t;
    return 0;
}

// Room for one more entry (lock held). 0 when there is none.
static int reserve(cpt_trace_file *t, size_t more) {
    if (t->count + more <= t->cap)
        return 1;
    size_t cap = t->cap ? 2 * t->cap : 256;
    while (cap < t->count + more)
        cap *= 2;
    trace_entry *e = realloc(t->entries, cap * sizeof *e);
    if (!e)
        return 0;
    t->entries = e;
    t->cap = cap;
    return 1;
}

void cpt_trace_record(void *trace, int rank, const ctxpar_trace_event *event) {
    cpt_trace_file *t = trace;
    trace_entry e = {rank,          (int32_t)event->kind, event->step, event->peer,
                     event->t_begin, event->t_end,         event->bytes, {0}};
    snprintf(e.name, sizeof e.name, "%s", event->name ? event->name : "?");
    pthread_mutex_lock(&t->lock);
    // Without room the event is dropped rather than the run failed; the file shows a gap.
    if (reserve(t, 1))
        t->entries[t->count++] = e;
    pthread_mutex_unlock(&t->lock);
}

int cpt_trace_export(const cpt_trace_file *t, void **bytes_out, size_t *size_out) {
    size_t n = t->count * sizeof(trace_entry);
    void *b = malloc(n ? n : 1);
    if (!b)
        return -1;
    memcpy(b, t->entries, n);
    *bytes_out = b;
    *size_out = n;
    return 0;
}

int cpt_trace_import(cpt_trace_file *t, const void *bytes, size_t size) {
    if (size % sizeof(trace_entry) != 0)
        return -1;
    size_t n = size / sizeof(trace_entry);
    pthread_mutex_lock(&t->lock);
    int ok = reserve(t, n);
    if (ok) {
        memcpy(t->entries + t->count, bytes, size);
        for (size_t i = 0; i < n; i++) // never trust a copied string to be terminated
            t->entries[t->count + i].name[sizeof t->entries[0].name - 1] = '\0';
        t->count += n;
    }
    pthread_mutex_unlock(&t->lock);
    return ok ? 0 : -1;
}

enum { TID_COMPUTE = 0, TID_WAIT = 1, TID_TRANSFER = 2, MAX_TRANSFER_KINDS = 16 };

// The track of an entry: transfers get one track per name, in order of first appearance.
static int track_of(const trace_entry *e, char (*names)[32], int *n_names) {
    if (e->kind == CTXPAR_EVENT_COMPUTE)
        return TID_COMPUTE;
    if (e->kind != CTXPAR_EVENT_TRANSFER)
        return TID_WAIT;
    for (int i = 0; i < *n_names; i++)
        if (!strcmp(names[i], e->name))
            return TID_TRANSFER + i;
    if (*n_names == MAX_TRANSFER_KINDS)
        return TID_TRANSFER + MAX_TRANSFER_KINDS - 1; // share the last track
    snprintf(names[*n_names], 32, "%s", e->name);
    return TID_TRANSFER + (*n_names)++;
}

// "fwd step 2, block of rank 1", "kv step 2, to rank 3", "wait kv step 2, from rank 1".
static void slice_name(const trace_entry *e, char *buf, size_t n) {
    const char *pre = e->kind == CTXPAR_EVENT_WAIT ? "wait " : "";
    if (e->step < 0) {
        snprintf(buf, n, "%s%s", pre, e->name);
        return;
    }
    const char *rel = e->kind == CTXPAR_EVENT_COMPUTE    ? "block of"
                      : e->kind == CTXPAR_EVENT_TRANSFER ? "to"
                                                         : "from";
    if (e->peer >= 0)
        snprintf(buf, n, "%s%s step %d, %s rank %d", pre, e->name, e->step, rel, e->peer);
    else
        snprintf(buf, n, "%s%s step %d", pre, e->name, e->step);
}

static int write_file(const cpt_trace_file *t, const char *path) {
    char names[MAX_TRANSFER_KINDS][32];
    int n_names = 0;
    for (size_t i = 0; i < t->count; i++)
        track_of(&t->entries[i], names, &n_names);
    FILE *f = fopen(path, "w");
    if (!f)
        return -1;
    double t0 = INFINITY;
    for (size_t i = 0; i < t->count; i++)
        if (t->entries[i].t_begin < t0)
            t0 = t->entries[i].t_begin;
    fprintf(f, "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n");
    for (int r = 0; r < t->ranks; r++) {
        fprintf(f,
                "%s{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":%d,\"args\":{\"name\":"
                "\"rank %d\"}},\n{\"ph\":\"M\",\"name\":\"process_sort_index\",\"pid\":%d,"
                "\"args\":{\"sort_index\":%d}}",
                r ? ",\n" : "", r, r, r, r);
        fprintf(f, ",\n{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":%d,\"tid\":%d,\"args\":"
                   "{\"name\":\"compute\"}}",
                r, TID_COMPUTE);
        fprintf(f, ",\n{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":%d,\"tid\":%d,\"args\":"
                   "{\"name\":\"wait\"}}",
                r, TID_WAIT);
        for (int k = 0; k < n_names; k++) {
            fprintf(f, ",\n{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":%d,\"tid\":%d,"
                       "\"args\":{\"name\":",
                    r, TID_TRANSFER + k);
            char track[48];
            snprintf(track, sizeof track, "transfer %.31s", names[k]);
            cpt_json_string(f, track);
            fprintf(f, "}}");
        }
    }
    static const char *const cat[3] = {"compute", "transfer", "wait"};
    for (size_t i = 0; i < t->count; i++) {
        const trace_entry *e = &t->entries[i];
        char name[96];
        slice_name(e, name, sizeof name);
        fprintf(f, ",\n{\"ph\":\"X\",\"name\":");
        cpt_json_string(f, name);
        fprintf(f,
                ",\"cat\":\"%s\",\"pid\":%d,\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f,"
                "\"args\":{\"op\":",
                cat[e->kind >= 0 && e->kind < 3 ? e->kind : 2], e->rank,
                track_of(e, names, &n_names), (e->t_begin - t0) * 1e6,
                (e->t_end - e->t_begin) * 1e6);
        cpt_json_string(f, e->name);
        fprintf(f, ",\"step\":%d,\"peer\":%d,\"bytes\":%llu}}", e->step, e->peer,
                (unsigned long long)e->bytes);
    }
    fprintf(f, "\n]}\n");
    return fclose(f) == 0 ? 0 : -1;
}

int cpt_trace_close(cpt_trace_file *t, const char *path) {
    if (!t)
        return 0;
    int rc = path ? write_file(t, path) : 0;
    pthread_mutex_destroy(&t->lock);
    free(t->entries);
    free(t);
    return rc;
}
