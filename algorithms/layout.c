// Layouts: which global positions each rank holds, as spans.
#include "algorithms.h"

ctxpar_status ctxpar_layout_check(ctxpar_layout layout, int64_t seq_global, int nranks) {
    int64_t unit = layout == CTXPAR_LAYOUT_ZIGZAG ? 2 * (int64_t)nranks : nranks;
    if (seq_global <= 0 || seq_global % unit != 0)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG,
                            "sequence length %lld does not divide by %lld (%s layout, %d ranks)",
                            (long long)seq_global, (long long)unit, ctxpar_layout_name(layout),
                            nranks);
    return CTXPAR_OK;
}

void ctxpar_layout_spans(ctxpar_layout layout, int64_t seq_global, int rank, int nranks,
                         ctxpar_shard_spans *spans_out) {
    // Only the entries used are written: the struct holds room for a hybrid group's spans.
    ctxpar_shard_spans *s = spans_out;
    s->count = 1;
    int64_t local = seq_global / nranks;
    switch (layout) {
    case CTXPAR_LAYOUT_CONTIGUOUS:
        s->span[0] = (ctxpar_span){rank * local, local, 1};
        break;
    case CTXPAR_LAYOUT_ZIGZAG: {
        // 2P chunks; rank r holds chunk r and chunk 2P-1-r, so causal work is equal.
        int64_t chunk = seq_global / (2 * (int64_t)nranks);
        s->span[0] = (ctxpar_span){rank * chunk, chunk, 1};
        s->span[1] = (ctxpar_span){(2 * (int64_t)nranks - 1 - rank) * chunk, chunk, 1};
        s->count = 2;
        break;
    }
    case CTXPAR_LAYOUT_STRIPED:
        s->span[0] = (ctxpar_span){rank, local, nranks};
        break;
    }
}

void ctxpar_problem_spans(const ctxpar_problem *pb, int rank, ctxpar_shard_spans *spans_out) {
    const int g = pb->span_group > 1 ? pb->span_group : 1;
    if (g == 1) {
        ctxpar_layout_spans(pb->layout, pb->seq_global, rank, pb->nranks, spans_out);
        return;
    }
    ctxpar_shard_spans out;
    out.count = 0;
    for (int i = 0; i < g; i++) {
        ctxpar_shard_spans one;
        ctxpar_layout_spans(pb->layout, pb->seq_global, rank * g + i, pb->nranks * g, &one);
        for (int j = 0; j < one.count; j++) {
            ctxpar_span *last = out.count ? &out.span[out.count - 1] : NULL;
            const ctxpar_span *sp = &one.span[j];
            if (last && last->stride == 1 && sp->stride == 1 && last->start + last->len == sp->start)
                last->len += sp->len; // the next rows continue the positions: one span
            else
                out.span[out.count++] = *sp;
        }
    }
    spans_out->count = out.count;
    for (int i = 0; i < out.count; i++)
        spans_out->span[i] = out.span[i];
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
