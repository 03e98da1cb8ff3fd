// The per-call plan of a block pair: global positions of every row, the keys every query row
// sees, the position range of every tile, and the helpers the forward and backward share.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backends/cpu/cpu_internal.h"

static void expand_positions(ctxpar_spans s, int64_t *pos) {
    int64_t n = 0;
    for (int i = 0; i < s.count; i++)
        for (int64_t j = 0; j < s.span[i].len; j++)
            pos[n++] = s.span[i].start + j * s.span[i].stride;
}

// Per tile of `tile` rows: the smallest and largest position in it.
static void tile_ranges(const int64_t *pos, int64_t rows, int64_t tile, int64_t *range) {
    for (int64_t t = 0; t * tile < rows; t++) {
        int64_t lo = INT64_MAX, hi = INT64_MIN;
        for (int64_t i = t * tile; i < rows && i < (t + 1) * tile; i++) {
            lo = pos[i] < lo ? pos[i] : lo;
            hi = pos[i] > hi ? pos[i] : hi;
        }
        range[2 * t] = lo;
        range[2 * t + 1] = hi;
    }
}

ctxpar_status ctxpar_cpu_plan_init(const ctxpar_attn_block *blk, const char *op,
                                   ctxpar_cpu_plan *plan) {
    // The dispatch (dispatch/dispatch_device.c) checked the block.
    ctxpar_cpu_plan p;
    memset(&p, 0, sizeof p);
    p.blk = blk;
    p.batch = blk->q.shape[0];
    p.seq_q = blk->q.shape[1];
    p.seq_k = blk->k.shape[1];
    p.heads_q = blk->q.shape[2];
    p.heads_kv = blk->k.shape[2];
    p.dim = blk->q.shape[3];
    p.dim_v = blk->v.shape[3];
    p.group = p.heads_q / p.heads_kv;
    p.q_tiles = (p.seq_q + CTXPAR_CPU_TILE_Q - 1) / CTXPAR_CPU_TILE_Q;
    p.k_tiles = (p.seq_k + CTXPAR_CPU_TILE_K - 1) / CTXPAR_CPU_TILE_K;
    // One allocation: positions, key intervals, tile ranges (+1: never malloc(0)).
    size_t n = (size_t)(3 * p.seq_q + p.seq_k + 2 * p.q_tiles + 2 * p.k_tiles + 1);
    int64_t *mem = malloc(n * sizeof *mem);
    if (!mem)
        return CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "%s: cannot allocate the %zu-byte plan", op,
                            n * sizeof *mem);
    p.q_pos = mem;
    p.k_pos = p.q_pos + p.seq_q;
    p.q_lo = p.k_pos + p.seq_k;
    p.q_hi = p.q_lo + p.seq_q;
    p.q_range = p.q_hi + p.seq_q;
    p.k_range = p.q_range + 2 * p.q_tiles;
    expand_positions(blk->q_pos, p.q_pos);
    expand_positions(blk->k_pos, p.k_pos);
    for (int64_t i = 0; i < p.seq_q; i++)
        ctxpar_mask_keys_of(&blk->mask, p.q_pos[i], &p.q_lo[i], &p.q_hi[i]);
    tile_ranges(p.q_pos, p.seq_q, CTXPAR_CPU_TILE_Q, p.q_range);
    tile_ranges(p.k_pos, p.seq_k, CTXPAR_CPU_TILE_K, p.k_range);
    p.whole = CTXPAR_BLOCK_SKIP;
    if (p.seq_q > 0 && p.seq_k > 0) {
        int64_t qmin, qmax, kmin, kmax;
        ctxpar_spans_range(blk->q_pos, &qmin, &qmax);
        ctxpar_spans_range(blk->k_pos, &kmin, &kmax);
        p.whole = ctxpar_mask_classify(&blk->mask, qmin, qmax, kmin, kmax);
    }
    *plan = p;
    return CTXPAR_OK;
}

void ctxpar_cpu_plan_release(ctxpar_cpu_plan *plan) {
    free(plan->q_pos);
    plan->q_pos = NULL;
}

ctxpar_block_class ctxpar_cpu_plan_classify(const ctxpar_cpu_plan *plan, int64_t qt, int64_t kt) {
    if (plan->whole != CTXPAR_BLOCK_PARTIAL) // the whole block's class holds for every tile
        return plan->whole;
    const int64_t *q = plan->q_range + 2 * qt, *k = plan->k_range + 2 * kt;
    return ctxpar_mask_classify(&plan->blk->mask, q[0], q[1], k[0], k[1]);
}

void ctxpar_cpu_plan_mask(const ctxpar_cpu_plan *plan, float *s, uint32_t *vis, int64_t lds,
                          int64_t q0, int64_t k0, int64_t rows, int64_t lanes, int keys_in_rows) {
    for (int64_t n = 0; n < rows; n++)
        for (int64_t l = 0; l < lds; l++) {
            int64_t qi = q0 + (keys_in_rows ? l : n), ki = k0 + (keys_in_rows ? n : l);
            int seen = l >= lanes || ctxpar_cpu_plan_sees(plan, qi, ki);
            vis[n * lds + l] = seen ? 0xffffffffu : 0u;
            if (!seen)
                s[n * lds + l] = -INFINITY;
        }
}

const void *ctxpar_cpu_row(const ctxpar_tensor *t, int64_t b, int64_t s, int64_t h) {
    int64_t off = b * t->stride[0] + s * t->stride[1] + h * t->stride[2];
    return (const char *)t->data + off * (int64_t)ctxpar_dtype_size(t->dtype);
}

void ctxpar_cpu_load_rows(const ctxpar_cpu_kernels *kern, const ctxpar_tensor *t, int64_t b,
                          int64_t s0, int64_t n, int64_t h, float *dst, const float **rows) {
    const int64_t dim = t->shape[3];
    for (int64_t i = 0; i < n; i++) {
        kern->to_f32(dst + i * dim, ctxpar_cpu_row(t, b, s0 + i, h), t->dtype, dim);
        rows[i] = dst + i * dim;
    }
}

void *ctxpar_cpu_aligned_alloc(size_t bytes) {
    size_t rounded = (bytes + 63) / 64 * 64;
    return aligned_alloc(64, rounded ? rounded : 64);
}

void *ctxpar_cpu_kernel_ws(ctxpar_cpu_device *cpu, size_t bytes) {
    if (bytes > cpu->kernel_ws_bytes) {
        void *p = ctxpar_cpu_aligned_alloc(bytes);
        if (!p)
            return NULL;
        free(cpu->kernel_ws);
        cpu->kernel_ws = p;
        cpu->kernel_ws_bytes = bytes;
    }
    return cpu->kernel_ws;
}

void ctxpar_cpu_softcap(const ctxpar_cpu_kernels *kern, const ctxpar_attn_block *blk, float *s,
                        float *dcap, const uint32_t *vis, int64_t lds, int64_t rows) {
    const double cap = blk->softcap;
    const double mul = fabs((double)blk->scale) / cap; // the sign is in the packed operand
    kern->softcap(s, dcap, vis, rows * lds, cap, mul);
}
