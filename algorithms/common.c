// Services the algorithms share: tracing and work accounting.
#include "algorithms.h"
#include "ctxpar_count.h"

void ctxpar_run_trace(const ctxpar_run *run, ctxpar_event_kind kind, const char *name, int step,
                      int peer, double t_begin, double t_end, uint64_t bytes) {
    if (!run->trace)
        return;
    ctxpar_trace_event ev = {kind, name, step, peer, t_begin, t_end, bytes};
    run->trace(run->trace_user, &ev);
}

static int64_t floor_div(int64_t a, int64_t b) {
    return a / b - (a % b != 0 && (a < 0) != (b < 0));
}

// Exactly how many (q, k) pairs of two spans the mask lets through: for each query, the visible
// keys form one interval of positions (causal, window and document bounds), and an interval holds
// a closed-form number of a span's positions. O(len of the query span); a statistic only.
static double visible_pairs(const ctxpar_mask_desc *m, const ctxpar_span *q, const ctxpar_span *k,
                            int64_t seq_global) {
    double n = 0;
    for (int64_t i = 0; i < q->len; i++) {
        int64_t pos = q->start + i * q->stride, lo = 0, hi = seq_global - 1;
        if (m->causal && pos < hi)
            hi = pos;
        if (m->window_left > 0 && pos - m->window_left + 1 > lo)
            lo = pos - m->window_left + 1;
        if (m->window_right > 0 && pos + m->window_right < hi)
            hi = pos + m->window_right;
        if (m->cu_seqlens) {
            int64_t d = ctxpar_mask_doc_of(m, pos);
            if (m->cu_seqlens[d] > lo)
                lo = m->cu_seqlens[d];
            if (m->cu_seqlens[d + 1] - 1 < hi)
                hi = m->cu_seqlens[d + 1] - 1;
        }
        // Positions k->start + t*k->stride in [lo, hi], for t in [0, k->len).
        int64_t t_lo = -floor_div(k->start - lo, k->stride),
                t_hi = floor_div(hi - k->start, k->stride);
        if (t_lo < 0)
            t_lo = 0;
        if (t_hi > k->len - 1)
            t_hi = k->len - 1;
        if (t_hi >= t_lo)
            n += (double)(t_hi - t_lo + 1);
    }
    return n;
}

int ctxpar_block_account(const ctxpar_run *run, const ctxpar_problem *pb, ctxpar_spans q_pos,
                         ctxpar_spans k_pos) {
    int live = 0;
    for (int i = 0; i < q_pos.count; i++) {
        for (int j = 0; j < k_pos.count; j++) {
            ctxpar_spans qs = {&q_pos.span[i], 1}, ks = {&k_pos.span[j], 1};
            int64_t qmin, qmax, kmin, kmax;
            ctxpar_spans_range(qs, &qmin, &qmax);
            ctxpar_spans_range(ks, &kmin, &kmax);
            ctxpar_block_class c = ctxpar_mask_classify(&pb->mask, qmin, qmax, kmin, kmax);
            if (run->work) {
                if (c == CTXPAR_BLOCK_SKIP) {
                    run->work->blocks_skipped++;
                } else {
                    run->work->blocks_computed++;
                    run->work->flops +=
                        4.0 * (double)pb->head_dim * (double)pb->batch * (double)pb->heads_q *
                        visible_pairs(&pb->mask, &q_pos.span[i], &k_pos.span[j], pb->seq_global);
                }
            }
            live |= c != CTXPAR_BLOCK_SKIP;
        }
    }
    return live;
}

size_t ctxpar_packed_kv_bytes(ctxpar_dtype dtype, const ctxpar_problem *pb, int64_t seq) {
    return 2 * ctxpar_count(pb->batch, seq, pb->heads_kv, pb->head_dim) * ctxpar_dtype_size(dtype);
}

ctxpar_tensor ctxpar_packed_kv(void *buf, ctxpar_dtype dtype, const ctxpar_problem *pb, int64_t seq,
                               int which) {
    size_t half = ctxpar_packed_kv_bytes(dtype, pb, seq) / 2;
    return ctxpar_tensor_bshd((char *)buf + (size_t)which * half, dtype, pb->batch, seq,
                              pb->heads_kv, pb->head_dim);
}

ctxpar_status ctxpar_pack_kv(const ctxpar_run *run, const ctxpar_problem *pb,
                             const ctxpar_tensor *k, const ctxpar_tensor *v, void *buf) {
    ctxpar_tensor kp = ctxpar_packed_kv(buf, pb->dtype, pb, pb->seq_local, 0);
    ctxpar_tensor vp = ctxpar_packed_kv(buf, pb->dtype, pb, pb->seq_local, 1);
    CTXPAR_CHECK(ctxpar_dev_cast(run->dev, k, &kp, run->stream));
    return ctxpar_dev_cast(run->dev, v, &vp, run->stream);
}

ctxpar_status ctxpar_store_fwd(const ctxpar_run *run, const ctxpar_problem *pb,
                               const float *out_acc, const float *lse_acc,
                               const float *lse_lo_acc, ctxpar_tensor *out, float *lse) {
    ctxpar_tensor acc = ctxpar_tensor_bshd((void *)out_acc, CTXPAR_DTYPE_F32, pb->batch,
                                           pb->seq_local, pb->heads_q, pb->head_dim);
    CTXPAR_CHECK(ctxpar_dev_cast(run->dev, &acc, out, run->stream));
    size_t bytes = ctxpar_count(pb->batch, pb->heads_q, pb->seq_local, 1) * sizeof(float);
    if (pb->lse_lo && lse_lo_acc)
        CTXPAR_CHECK(ctxpar_dev_copy(run->dev, pb->lse_lo, lse_lo_acc, bytes, CTXPAR_COPY_D2D,
                                     run->stream));
    if (!lse)
        return CTXPAR_OK;
    return ctxpar_dev_copy(run->dev, lse, lse_acc, bytes, CTXPAR_COPY_D2D, run->stream);
}

ctxpar_status ctxpar_move_shard_rows(const ctxpar_run *run, const ctxpar_problem *pb, int j,
                                     const ctxpar_tensor *local, const ctxpar_tensor *global,
                                     int to_global) {
    ctxpar_shard_spans sp;
    ctxpar_layout_spans(pb->layout, pb->seq_global, j, pb->nranks, &sp);
    int64_t first = 0;
    for (int i = 0; i < sp.count; i++) {
        ctxpar_tensor l = ctxpar_tensor_rows(local, first, sp.span[i].len);
        ctxpar_tensor g = ctxpar_tensor_span(global, &sp.span[i]);
        CTXPAR_CHECK(to_global ? ctxpar_dev_cast(run->dev, &l, &g, run->stream)
                               : ctxpar_dev_cast(run->dev, &g, &l, run->stream));
        first += sp.span[i].len;
    }
    return CTXPAR_OK;
}
