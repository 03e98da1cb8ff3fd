// Layouts: which global positions each rank holds, as spans, for any S and P.
#include <stdlib.h>

#include "algorithms.h"

static int64_t min64(int64_t a, int64_t b) {
    return a < b ? a : b;
}

// The (at most two) spans of a built-in layout; empty spans are left out. The remainder of an
// uneven split goes to the lowest ranks: CONTIGUOUS gives ranks r < S mod P one token more;
// STRIPED is token t on rank t mod P as always; ZIGZAG cuts 2P chunks of S / 2P tokens and gives
// the S mod 2P extra tokens one each to the front chunks 0, 1, ..., P-1 (ranks 0, 1, ...), then
// to the back chunks 2P-1, 2P-2, ... (ranks 0, 1, ... again), so counts differ by at most one.
static int builtin_spans(ctxpar_layout layout, int64_t S, int rank, int nranks,
                         ctxpar_span out[2]) {
    const int64_t P = nranks, r = rank;
    ctxpar_span s[2] = {{0, 0, 1}, {0, 0, 1}};
    switch (layout) {
    case CTXPAR_LAYOUT_CONTIGUOUS: {
        int64_t base = S / P, rem = S % P;
        s[0] = (ctxpar_span){r * base + min64(r, rem), base + (r < rem), 1};
        break;
    }
    case CTXPAR_LAYOUT_ZIGZAG: {
        int64_t base = S / (2 * P), rem = S % (2 * P), back_rem = rem > P ? rem - P : 0;
        s[0] = (ctxpar_span){r * base + min64(r, rem), base + (r < rem), 1};
        // Back chunk 2P-1-r: the chunks after it belong to ranks 0 .. r-1.
        int64_t len = base + (r < back_rem), after = r * base + min64(r, back_rem);
        s[1] = (ctxpar_span){S - after - len, len, 1};
        break;
    }
    case CTXPAR_LAYOUT_STRIPED:
        s[0] = (ctxpar_span){r, S > r ? (S - r + P - 1) / P : 0, P};
        break;
    default:
        break;
    }
    int n = 0;
    for (int i = 0; i < 2; i++)
        if (s[i].len > 0)
            out[n++] = s[i];
    return n;
}

int64_t ctxpar_layout_count(ctxpar_layout layout, const int32_t *assignment, int64_t seq_global,
                            int rank, int nranks) {
    int64_t n = 0;
    if (layout == CTXPAR_LAYOUT_CUSTOM) {
        for (int64_t t = 0; t < seq_global; t++)
            n += assignment[t] == rank;
        return n;
    }
    ctxpar_span s[2];
    int c = builtin_spans(layout, seq_global, rank, nranks, s);
    for (int i = 0; i < c; i++)
        n += s[i].len;
    return n;
}

int64_t ctxpar_layout_max_count(ctxpar_layout layout, const int32_t *assignment, int64_t seq_global,
                                int nranks) {
    if (layout != CTXPAR_LAYOUT_CUSTOM) // rank 0 gets the remainder first
        return ctxpar_layout_count(layout, NULL, seq_global, 0, nranks);
    int64_t *count = calloc((size_t)nranks, sizeof *count), max = 0;
    if (!count)
        return -1;
    for (int64_t t = 0; t < seq_global; t++)
        count[assignment[t]]++;
    for (int r = 0; r < nranks; r++)
        max = count[r] > max ? count[r] : max;
    free(count);
    return max;
}

void ctxpar_layout_map_free(ctxpar_layout_map *map) {
    free(map->count);
    free(map->first);
    free(map->span);
    map->count = map->first = NULL;
    map->span = NULL;
}

// A rank whose tokens are single ones evenly spaced (token t on rank t mod P, given as a custom
// assignment) gets one strided span, as STRIPED does: the same positions in the same order, but
// the fast paths for whole classes of positions (the planner's counts and coverage) apply, where
// a list of one-token runs costs a pass per block. Any other rank keeps its runs as they are.
static void as_strided(ctxpar_layout_map *m) {
    int64_t used = 0;
    for (int r = 0; r < m->nranks; r++) {
        const int64_t lo = m->first[r], hi = m->first[r + 1];
        int even = hi - lo > 1;
        for (int64_t j = lo; even && j < hi; j++)
            even = m->span[j].len == 1 &&
                   (j < lo + 2 || m->span[j].start - m->span[j - 1].start ==
                                      m->span[lo + 1].start - m->span[lo].start);
        m->first[r] = used;
        if (even) {
            m->span[used++] = (ctxpar_span){m->span[lo].start, hi - lo,
                                            m->span[lo + 1].start - m->span[lo].start};
            continue;
        }
        for (int64_t j = lo; j < hi; j++)
            m->span[used++] = m->span[j];
    }
    m->first[m->nranks] = used;
}

ctxpar_status ctxpar_layout_map_make(ctxpar_layout layout, const int32_t *assignment,
                                     int64_t seq_global, int nranks, ctxpar_layout_map *map_out) {
    ctxpar_layout_map m = {nranks, seq_global, NULL, NULL, NULL};
    const size_t P = (size_t)nranks;
    m.count = calloc(P, sizeof *m.count);
    m.first = calloc(P + 1, sizeof *m.first);
    int64_t *next = NULL;
    if (!m.count || !m.first)
        goto oom;
    if (layout == CTXPAR_LAYOUT_CUSTOM) {
        const int32_t *a = assignment;
        for (int64_t t = 0; t < seq_global; t++) {
            m.count[a[t]]++;
            if (t == 0 || a[t - 1] != a[t])
                m.first[a[t] + 1]++; // rank a[t]'s runs
        }
        for (size_t r = 0; r < P; r++)
            m.first[r + 1] += m.first[r];
        m.span = malloc(sizeof *m.span * (size_t)(m.first[P] > 0 ? m.first[P] : 1));
        next = malloc(sizeof *next * P);
        if (!m.span || !next)
            goto oom;
        for (size_t r = 0; r < P; r++)
            next[r] = m.first[r];
        for (int64_t t = 0; t < seq_global; t++) {
            if (t > 0 && a[t - 1] == a[t])
                m.span[next[a[t]] - 1].len++;
            else
                m.span[next[a[t]]++] = (ctxpar_span){t, 1, 1};
        }
        free(next);
        as_strided(&m);
    } else {
        m.span = malloc(sizeof *m.span * 2 * P);
        if (!m.span)
            goto oom;
        for (int r = 0; r < nranks; r++) {
            int c = builtin_spans(layout, seq_global, r, nranks, m.span + m.first[r]);
            m.first[r + 1] = m.first[r] + c;
            for (int i = 0; i < c; i++)
                m.count[r] += m.span[m.first[r] + i].len;
        }
    }
    *map_out = m;
    return CTXPAR_OK;
oom:
    free(next);
    ctxpar_layout_map_free(&m);
    return CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY,
                        "cannot allocate the layout of %lld tokens on %d "
                        "ranks",
                        (long long)seq_global, nranks);
}

// A span of a group by its first position (distinct ranks' positions never coincide).
typedef struct span_at {
    int64_t start, k; // k: its index in the map
} span_at;
static int by_start(const void *a, const void *b) {
    const int64_t x = ((const span_at *)a)->start, y = ((const span_at *)b)->start;
    return (x > y) - (x < y);
}

ctxpar_status ctxpar_layout_map_group(const ctxpar_layout_map *m, int g, ctxpar_layout_map *out,
                                      int64_t *span_row) {
    const int n = m->nranks / g;
    const int64_t total = m->first[m->nranks];
    ctxpar_layout_map r = {n, m->seq_global, NULL, NULL, NULL};
    r.count = calloc((size_t)n, sizeof *r.count);
    r.first = calloc((size_t)n + 1, sizeof *r.first);
    r.span = malloc(sizeof *r.span * (size_t)(total > 0 ? total : 1));
    span_at *order = malloc(sizeof *order * (size_t)(total > 0 ? total : 1));
    if (!r.count || !r.first || !r.span || !order) {
        free(order);
        ctxpar_layout_map_free(&r);
        return CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "cannot allocate the layout of %d groups", n);
    }
    for (int64_t k = 0; k < total; k++)
        order[k] = (span_at){m->span[k].start, k};
    int64_t used = 0;
    for (int i = 0; i < n; i++) {
        // A group's spans lie together in m (rank by rank): sort that range by position.
        const int64_t lo = m->first[i * g], hi = m->first[(i + 1) * g], begin = used;
        qsort(order + lo, (size_t)(hi - lo), sizeof *order, by_start);
        int64_t row = 0;
        for (int64_t x = lo; x < hi; x++) {
            const ctxpar_span *sp = &m->span[order[x].k];
            if (span_row)
                span_row[order[x].k] = row;
            row += sp->len;
            ctxpar_span *last = used > begin ? &r.span[used - 1] : NULL;
            if (last && last->stride == 1 && sp->stride == 1 &&
                last->start + last->len == sp->start)
                last->len += sp->len; // the next rows continue the positions: one span
            else
                r.span[used++] = *sp;
        }
        r.count[i] = row;
        r.first[i + 1] = used;
    }
    free(order);
    *out = r;
    return CTXPAR_OK;
}

ctxpar_tensor ctxpar_tensor_rows(const ctxpar_tensor *t, int64_t first, int64_t len) {
    ctxpar_tensor r = *t;
    r.data = (char *)t->data + (size_t)(first * t->stride[1]) * ctxpar_dtype_size(t->dtype);
    r.shape[1] = len;
    return r;
}

ctxpar_tensor ctxpar_tensor_span(const ctxpar_tensor *global, const ctxpar_span *span) {
    ctxpar_tensor r = ctxpar_tensor_rows(global, span->start, span->len);
    r.stride[1] = global->stride[1] * span->stride;
    return r;
}
