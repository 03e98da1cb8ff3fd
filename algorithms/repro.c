// Reproducible mode's blocks (repro.h): canonical chunk pairs on the device, binned sums.
#include "repro.h"

#include "ctxpar_count.h"

#define C CTXPAR_REPRO_CHUNK

// The chunk pieces of a span list, in order: each piece's first local row and its positions. A
// piece runs on into the next span when that one continues the positions (a zigzag rank's two
// halves at P = 1, a custom layout's runs), so that a chunk is one piece wherever it lies.
typedef struct chunk_iter {
    ctxpar_spans s;
    int i;
    int64_t in_span, local;
} chunk_iter;

static int next_chunk(chunk_iter *it, int64_t *local, ctxpar_span *pos) {
    while (it->i < it->s.count && it->in_span >= it->s.span[it->i].len) {
        it->i++;
        it->in_span = 0;
    }
    if (it->i >= it->s.count)
        return 0;
    const ctxpar_span *sp = &it->s.span[it->i];
    const int64_t start = sp->start + it->in_span * sp->stride;
    int64_t n = 1;
    if (sp->stride == 1 || sp->len == 1) {
        const int64_t edge = (start / C + 1) * C; // the chunk's end
        n = 0;
        for (int64_t at = start; it->i < it->s.count && at < edge;) {
            const ctxpar_span *cur = &it->s.span[it->i];
            if (cur->stride != 1 && cur->len > 1)
                break;
            const int64_t from = cur->start + it->in_span, left = cur->len - it->in_span;
            if (from != at)
                break; // a gap: the piece ends here
            const int64_t take = left < edge - at ? left : edge - at;
            n += take;
            at += take;
            it->in_span += take;
            if (it->in_span < cur->len)
                break;
            it->i++;
            it->in_span = 0;
        }
    } else {
        it->in_span += 1;
    }
    *local = it->local;
    *pos = (ctxpar_span){start, n, 1};
    it->local += n;
    return 1;
}

int ctxpar_repro_aligned(ctxpar_spans s, int64_t seq_global) {
    chunk_iter it = {s, 0, 0, 0};
    int64_t local;
    ctxpar_span pos;
    while (next_chunk(&it, &local, &pos))
        if (pos.start % C != 0 || (pos.len != C && pos.start + pos.len != seq_global))
            return 0;
    return 1;
}

ctxpar_status ctxpar_repro_check_shards(const ctxpar_problem *pb, const char *algo) {
    // Checks run before the front door has made the call's map: make one when there is none.
    ctxpar_layout_map own = {0};
    const ctxpar_layout_map *m = pb->map;
    if (!m) {
        CTXPAR_CHECK(
            ctxpar_layout_map_make(pb->layout, pb->assignment, pb->seq_global, pb->nranks, &own));
        m = &own;
    }
    int bad = -1;
    for (int j = 0; j < pb->nranks && bad < 0; j++)
        if (!ctxpar_repro_aligned(ctxpar_layout_map_spans(m, j), pb->seq_global))
            bad = j;
    ctxpar_layout_map_free(&own);
    if (bad < 0)
        return CTXPAR_OK;
    return CTXPAR_ERROR(CTXPAR_ERR_NOT_SUPPORTED,
                        "reproducible mode with %s needs every rank's shard to be whole chunks of "
                        "%d positions (rank %d's is not, sequence %lld); use a contiguous or "
                        "zigzag layout whose shards are multiples of %d, or alltoall",
                        algo, C, bad, (long long)pb->seq_global, C);
}

void ctxpar_repro_scratch_carve(const ctxpar_problem *pb, int64_t q_rows, int backward,
                                ctxpar_carve *c, ctxpar_repro_scratch *s) {
    const int64_t B = pb->batch, Hq = pb->heads_q, Hkv = pb->heads_kv;
    *s = (ctxpar_repro_scratch){0};
    (void)q_rows; // the blocks' pieces are at most a chunk of rows either way
    if (!backward) {
        s->out = ctxpar_carve_take(c, ctxpar_count(B, C, Hq, pb->head_dim_v) * sizeof(float));
        s->lse = ctxpar_carve_take(c, ctxpar_count(B, Hq, C, 1) * sizeof(float));
        s->lse_lo = ctxpar_carve_take(c, ctxpar_count(B, Hq, C, 1) * sizeof(float));
        return;
    }
    s->dq = ctxpar_carve_take(c, ctxpar_count(B, C, Hq, pb->head_dim) * sizeof(float));
    s->dk = ctxpar_carve_take(c, ctxpar_count(B, C, Hkv, pb->head_dim) * sizeof(float));
    s->dv = ctxpar_carve_take(c, ctxpar_count(B, C, Hkv, pb->head_dim_v) * sizeof(float));
    s->lse_c = ctxpar_carve_take(c, ctxpar_count(B, Hq, C, 1) * sizeof(float));
    s->lo_c = ctxpar_carve_take(c, ctxpar_count(B, Hq, C, 1) * sizeof(float));
    s->delta_c = ctxpar_carve_take(c, ctxpar_count(B, Hq, C, 1) * sizeof(float));
}

static int64_t rows_of(const ctxpar_problem *pb, int64_t seq, int64_t heads) {
    return pb->batch * seq * heads;
}

size_t ctxpar_repro_out_bytes(const ctxpar_problem *pb, int64_t q_rows, int64_t heads) {
    return ctxpar_bins_bytes(rows_of(pb, q_rows, heads), pb->head_dim_v + 1);
}

size_t ctxpar_repro_dq_bytes(const ctxpar_problem *pb, int64_t q_rows, int64_t heads) {
    return ctxpar_bins_bytes(rows_of(pb, q_rows, heads), pb->head_dim);
}

size_t ctxpar_repro_dkv_bytes(const ctxpar_problem *pb, int64_t k_rows, int64_t heads_kv) {
    const int64_t r = rows_of(pb, k_rows, heads_kv);
    return ctxpar_bins_bytes(r, pb->head_dim) + ctxpar_bins_bytes(r, pb->head_dim_v);
}

static void *dv_bins(const ctxpar_problem *pb, void *dkv, int64_t k_rows, int64_t heads_kv) {
    return (char *)dkv + ctxpar_bins_bytes(rows_of(pb, k_rows, heads_kv), pb->head_dim);
}

ctxpar_status ctxpar_repro_clear(const ctxpar_run *run, const ctxpar_problem *pb, void *bins,
                                 int which, int64_t rows, int64_t heads) {
    const int64_t r = rows_of(pb, rows, heads);
    if (which == 0)
        return ctxpar_dev_bins_clear(run->dev, bins, r, pb->head_dim_v + 1, run->stream);
    if (which == 1)
        return ctxpar_dev_bins_clear(run->dev, bins, r, pb->head_dim, run->stream);
    CTXPAR_CHECK(ctxpar_dev_bins_clear(run->dev, bins, r, pb->head_dim, run->stream));
    return ctxpar_dev_bins_clear(run->dev, dv_bins(pb, bins, rows, heads), r, pb->head_dim_v,
                                 run->stream);
}

ctxpar_status ctxpar_repro_fwd_block(const ctxpar_run *run, const ctxpar_attn_block *blk,
                                     void *out, const ctxpar_repro_scratch *s) {
    const int64_t B = blk->q.shape[0], Sq = blk->q.shape[1], H = blk->q.shape[2];
    // Query rows a chunk's worth at a time (a row's bits do not depend on the others), so that
    // their accumulators stay in cache while the key chunks come by.
    chunk_iter qi = {blk->q_pos, 0, 0, 0};
    int64_t ql, kl;
    ctxpar_span qpos, kpos;
    while (next_chunk(&qi, &ql, &qpos)) {
        const int64_t n = qpos.len;
        const ctxpar_spans qp = {&qpos, 1};
        const ctxpar_bins_shape sh = {B, Sq, H, blk->v.shape[3] + 1, ql, n};
        // 0 stands for a device that does not keep the LSE's low part.
        CTXPAR_CHECK(
            ctxpar_dev_fill(run->dev, s->lse_lo, 0.0f, ctxpar_count(B, H, n, 1), run->stream));
        chunk_iter ki = {blk->k_pos, 0, 0, 0};
        while (next_chunk(&ki, &kl, &kpos)) {
            const ctxpar_spans kp = {&kpos, 1};
            if (!ctxpar_spans_interact(&blk->mask, qp, kp))
                continue; // no row sees the chunk: it adds no term
            ctxpar_attn_block c = *blk;
            c.q = ctxpar_tensor_rows(&blk->q, ql, n);
            c.k = ctxpar_tensor_rows(&blk->k, kl, kpos.len);
            c.v = ctxpar_tensor_rows(&blk->v, kl, kpos.len);
            c.q_pos = qp;
            c.k_pos = kp;
            c.lse_lo = s->lse_lo;
            CTXPAR_CHECK(ctxpar_dev_attn_block_fwd(run->dev, &c, s->out, s->lse, 0, run->stream));
            CTXPAR_CHECK(ctxpar_dev_bins_add_attn(run->dev, out, s->out, s->lse, s->lse_lo, &sh,
                                                  run->stream));
        }
    }
    return CTXPAR_OK;
}

ctxpar_status ctxpar_repro_fwd_finish(const ctxpar_run *run, const ctxpar_problem *pb,
                                      const void *out, int64_t rows, int64_t heads, float *out_acc,
                                      float *lse_acc, float *lse_lo) {
    const ctxpar_bins_shape sh = {pb->batch, rows, heads, pb->head_dim_v + 1, 0, rows};
    return ctxpar_dev_bins_finish_attn(run->dev, out, &sh, out_acc, lse_acc, lse_lo, run->stream);
}

// Rows [first, first + n) of each (batch, head) of a [B, H, S] F32 array, packed [B, H, n];
// src NULL: zeros.
static ctxpar_status pack_rows(const ctxpar_run *run, const float *src, int64_t B, int64_t H,
                               int64_t S, int64_t first, int64_t n, float *dst) {
    if (!src)
        return ctxpar_dev_fill(run->dev, dst, 0.0f, ctxpar_count(B, H, n, 1), run->stream);
    for (int64_t bh = 0; bh < B * H; bh++)
        CTXPAR_CHECK(ctxpar_dev_copy(run->dev, dst + bh * n, src + bh * S + first,
                                     (size_t)n * sizeof(float), CTXPAR_COPY_D2D, run->stream));
    return CTXPAR_OK;
}

ctxpar_status ctxpar_repro_bwd_block(const ctxpar_run *run, const ctxpar_problem *pb,
                                     const ctxpar_attn_block *blk, const ctxpar_tensor *dout,
                                     const float *lse, const float *lse_lo, const float *delta,
                                     void *dq, void *dkv, int64_t k_rows,
                                     const ctxpar_repro_scratch *s) {
    const int64_t B = blk->q.shape[0], Sq = blk->q.shape[1], Hq = blk->q.shape[2];
    const int64_t Hkv = blk->k.shape[2], D = blk->q.shape[3], Dv = blk->v.shape[3];
    chunk_iter qi = {blk->q_pos, 0, 0, 0};
    int64_t ql, kl;
    ctxpar_span qpos, kpos;
    while (next_chunk(&qi, &ql, &qpos)) {
        const int64_t n = qpos.len;
        ctxpar_spans qp = {&qpos, 1};
        CTXPAR_CHECK(pack_rows(run, lse, B, Hq, Sq, ql, n, s->lse_c));
        CTXPAR_CHECK(pack_rows(run, lse_lo, B, Hq, Sq, ql, n, s->lo_c));
        CTXPAR_CHECK(pack_rows(run, delta, B, Hq, Sq, ql, n, s->delta_c));
        const ctxpar_tensor qv = ctxpar_tensor_rows(&blk->q, ql, n);
        const ctxpar_tensor dov = ctxpar_tensor_rows(dout, ql, n);
        const ctxpar_bins_shape dq_sh = {B, Sq, Hq, D, ql, n};
        chunk_iter ki = {blk->k_pos, 0, 0, 0};
        while (next_chunk(&ki, &kl, &kpos)) {
            const int64_t m = kpos.len;
            ctxpar_spans kp = {&kpos, 1};
            if (!ctxpar_spans_interact(&blk->mask, qp, kp))
                continue;
            CTXPAR_CHECK(
                ctxpar_dev_fill(run->dev, s->dq, 0.0f, ctxpar_count(B, n, Hq, D), run->stream));
            if (dkv) {
                CTXPAR_CHECK(ctxpar_dev_fill(run->dev, s->dk, 0.0f, ctxpar_count(B, m, Hkv, D),
                                             run->stream));
                CTXPAR_CHECK(ctxpar_dev_fill(run->dev, s->dv, 0.0f, ctxpar_count(B, m, Hkv, Dv),
                                             run->stream));
            }
            ctxpar_attn_block c = *blk;
            c.q = qv;
            c.k = ctxpar_tensor_rows(&blk->k, kl, m);
            c.v = ctxpar_tensor_rows(&blk->v, kl, m);
            c.q_pos = qp;
            c.k_pos = kp;
            c.lse_lo = s->lo_c;
            CTXPAR_CHECK(ctxpar_dev_attn_block_bwd(run->dev, &c, &dov, s->lse_c, s->delta_c, s->dq,
                                                   dkv ? s->dk : NULL, dkv ? s->dv : NULL,
                                                   run->stream));
            CTXPAR_CHECK(ctxpar_dev_bins_add(run->dev, dq, s->dq, &dq_sh, run->stream));
            if (!dkv)
                continue;
            const ctxpar_bins_shape dk_sh = {B, k_rows, Hkv, D, kl, m};
            const ctxpar_bins_shape dv_sh = {B, k_rows, Hkv, Dv, kl, m};
            CTXPAR_CHECK(ctxpar_dev_bins_add(run->dev, dkv, s->dk, &dk_sh, run->stream));
            CTXPAR_CHECK(ctxpar_dev_bins_add(run->dev, dv_bins(pb, dkv, k_rows, Hkv), s->dv, &dv_sh,
                                             run->stream));
        }
    }
    return CTXPAR_OK;
}

ctxpar_status ctxpar_repro_dq_finish(const ctxpar_run *run, const ctxpar_problem *pb,
                                     const void *dq, int64_t rows, int64_t heads, float *dq_f32) {
    return ctxpar_dev_bins_finish(run->dev, dq, rows_of(pb, rows, heads), pb->head_dim, dq_f32,
                                  run->stream);
}

ctxpar_status ctxpar_repro_dkv_finish(const ctxpar_run *run, const ctxpar_problem *pb,
                                      const void *dkv, int64_t rows, int64_t heads_kv,
                                      float *dkv_f32) {
    const int64_t r = rows_of(pb, rows, heads_kv);
    CTXPAR_CHECK(ctxpar_dev_bins_finish(run->dev, dkv, r, pb->head_dim, dkv_f32, run->stream));
    return ctxpar_dev_bins_finish(run->dev, dv_bins(pb, (void *)dkv, rows, heads_kv), r,
                                  pb->head_dim_v, dkv_f32 + r * pb->head_dim, run->stream);
}

// Copies sequence rows [from, from + len) of every batch row of one bins block of B x src_seq x
// heads rows to rows [to, to + len) of one of B x dst_seq x heads rows (same width).
static ctxpar_status move_rows(const ctxpar_run *run, const ctxpar_problem *pb, const void *src,
                               int64_t src_seq, int64_t from, void *dst, int64_t dst_seq,
                               int64_t to, int64_t len, int64_t heads, int64_t width) {
    ctxpar_bins_view s = ctxpar_bins_at((void *)src, rows_of(pb, src_seq, heads), width);
    ctxpar_bins_view d = ctxpar_bins_at(dst, rows_of(pb, dst_seq, heads), width);
    const int64_t n = len * heads * width; // values per batch row
    for (int64_t b = 0; b < pb->batch; b++) {
        const int64_t i = (b * src_seq + from) * heads * width,
                      o = (b * dst_seq + to) * heads * width;
        int64_t *const dst_parts[4] = {d.top, d.hi, d.mid, d.lo};
        const int64_t *const src_parts[4] = {s.top, s.hi, s.mid, s.lo};
        for (int p = 0; p < 4; p++)
            CTXPAR_CHECK(ctxpar_dev_copy(run->dev, dst_parts[p] + o, src_parts[p] + i,
                                         (size_t)n * sizeof(int64_t), CTXPAR_COPY_D2D,
                                         run->stream));
        CTXPAR_CHECK(ctxpar_dev_copy(run->dev, d.special + o, s.special + i,
                                     (size_t)n * sizeof(float), CTXPAR_COPY_D2D, run->stream));
    }
    return CTXPAR_OK;
}

ctxpar_status ctxpar_repro_dkv_move(const ctxpar_run *run, const ctxpar_problem *pb,
                                    const void *src, int64_t src_seq, int64_t from, void *dst,
                                    int64_t dst_seq, int64_t to, int64_t len, int64_t heads_kv) {
    CTXPAR_CHECK(
        move_rows(run, pb, src, src_seq, from, dst, dst_seq, to, len, heads_kv, pb->head_dim));
    return move_rows(run, pb, dv_bins(pb, (void *)src, src_seq, heads_kv), src_seq, from,
                     dv_bins(pb, dst, dst_seq, heads_kv), dst_seq, to, len, heads_kv,
                     pb->head_dim_v);
}

ctxpar_status ctxpar_repro_dkv_merge(const ctxpar_run *run, const ctxpar_problem *pb, void *dst,
                                     const void *src, int64_t rows, int64_t heads_kv) {
    const int64_t r = rows_of(pb, rows, heads_kv);
    CTXPAR_CHECK(ctxpar_dev_bins_merge(run->dev, dst, src, r, pb->head_dim, run->stream));
    return ctxpar_dev_bins_merge(run->dev, dv_bins(pb, dst, rows, heads_kv),
                                 dv_bins(pb, (void *)src, rows, heads_kv), r, pb->head_dim_v,
                                 run->stream);
}
