// Chrome trace-event output (chrome://tracing, Perfetto): one process per rank, one thread per
// stream of work (compute, transfer, wait), one complete ("X") slice per event.
#include <math.h>
#include <pthread.h>
#include <stdlib.h>

#include "commands.h"

typedef struct trace_entry {
    int rank;
    ctxpar_trace_event ev;
} trace_entry;

struct ctxpar_trace_file {
    pthread_mutex_t lock;
    int ranks;
    size_t count, cap;
    trace_entry *entries;
};

int ctxpar_trace_open(ctxpar_trace_file **trace_out, int ranks) {
    ctxpar_trace_file *t = calloc(1, sizeof *t);
    if (!t)
        return -1;
    pthread_mutex_init(&t->lock, NULL);
    t->ranks = ranks;
    *trace_out = t;
    return 0;
}

void ctxpar_trace_record(void *trace, int rank, const ctxpar_trace_event *event) {
    ctxpar_trace_file *t = trace;
    pthread_mutex_lock(&t->lock);
    if (t->count == t->cap) {
        size_t cap = t->cap ? 2 * t->cap : 256;
        trace_entry *e = realloc(t->entries, cap * sizeof *e);
        if (!e) { // drop the event rather than fail the run; the file will show a gap
            pthread_mutex_unlock(&t->lock);
            return;
        }
        t->entries = e;
        t->cap = cap;
    }
    t->entries[t->count++] = (trace_entry){rank, *event};
    pthread_mutex_unlock(&t->lock);
}

static const char *const track_name[3] = {"compute", "transfer", "wait"};

static int write_file(const ctxpar_trace_file *t, const char *path) {
    FILE *f = fopen(path, "w");
    if (!f)
        return -1;
    double t0 = INFINITY;
    for (size_t i = 0; i < t->count; i++)
        if (t->entries[i].ev.t_begin < t0)
            t0 = t->entries[i].ev.t_begin;
    fprintf(f, "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n");
    int first = 1;
    for (int r = 0; r < t->ranks; r++) {
        fprintf(f, "%s{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":%d,\"args\":{\"name\":"
                   "\"rank %d\"}}",
                first ? "" : ",\n", r, r);
        first = 0;
        for (int k = 0; k < 3; k++)
            fprintf(f, ",\n{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":%d,\"tid\":%d,"
                       "\"args\":{\"name\":\"%s\"}}",
                    r, k, track_name[k]);
    }
    for (size_t i = 0; i < t->count; i++) {
        const trace_entry *e = &t->entries[i];
        char name[96];
        if (e->ev.step >= 0)
            snprintf(name, sizeof name, "%s step %d %s rank %d", e->ev.name, e->ev.step,
                     e->ev.kind == CTXPAR_EVENT_COMPUTE ? "block of" : "peer", e->ev.peer);
        else
            snprintf(name, sizeof name, "%s", e->ev.name);
        fprintf(f, ",\n{\"ph\":\"X\",\"name\":");
        ctxpar_json_string(f, name);
        fprintf(f,
                ",\"cat\":\"%s\",\"pid\":%d,\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f,"
                "\"args\":{\"step\":%d,\"peer\":%d,\"bytes\":%llu}}",
                track_name[e->ev.kind], e->rank, (int)e->ev.kind, (e->ev.t_begin - t0) * 1e6,
                (e->ev.t_end - e->ev.t_begin) * 1e6, e->ev.step, e->ev.peer,
                (unsigned long long)e->ev.bytes);
    }
    fprintf(f, "\n]}\n");
    return fclose(f) == 0 ? 0 : -1;
}

int ctxpar_trace_close(ctxpar_trace_file *t, const char *path) {
    if (!t)
        return 0;
    int rc = path ? write_file(t, path) : 0;
    pthread_mutex_destroy(&t->lock);
    free(t->entries);
    free(t);
    return rc;
}
