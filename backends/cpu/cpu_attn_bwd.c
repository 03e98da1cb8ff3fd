/*
 * Block attention backward on the CPU (shapes and formulas: cpu_attn_bwd.h).
 *
 * Every output element has one owner and its sums a fixed order, so no atomics are needed and
 * the bits do not depend on the thread count. Two schedules, chosen from the shapes alone:
 *  - fused (the usual one): items (batch, K/V head, chunk of key tiles) own dK and dV of their
 *    key rows, compute P and dS once per tile pair, and also add dS K into a dQ partial sum of
 *    their own (one per chunk); the partial sums are then added in chunk order. Five products
 *    per tile pair; extra memory: one F64 dQ-sized buffer per chunk.
 *  - two-pass, when (batch x K/V heads) is too small for the fused items to keep threads busy
 *    (few K/V heads, batch 1): a dq pass over (batch, query head, query tiles) items, then a
 *    dk/dv pass; P and dP are computed in both, seven products per tile pair.
 */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "backends/cpu/cpu_attn_bwd.h"

// Fused items wanted: enough for a few dozen threads with dynamic balancing.
#define FUSED_ITEMS 32
// Most key chunks, each one dQ-sized F64 partial sum: 4 ran no faster than 2 on the benchmark
// shapes (seq 4096-8192, 4 K/V heads) and held twice the memory (a long-sequence audit feels it).
#define FUSED_MAX_CHUNKS 2
// Fewest items the fused schedule accepts; below, the two-pass one keeps more threads busy.
#define FUSED_MIN_ITEMS 8

// Key chunks of the fused schedule, or 0 for the two-pass one. A function of the shapes (and of
// the device's forced schedule) only, never of the thread count.
static int64_t fused_chunks(const ctxpar_cpu_plan *p, ctxpar_cpu_bwd_schedule forced) {
    const int64_t heads = p->batch * p->heads_kv;
    const int64_t k_groups = (p->k_tiles + CTXPAR_CPU_GROUP - 1) / CTXPAR_CPU_GROUP;
    int64_t c = (FUSED_ITEMS + heads - 1) / heads;
    c = c < FUSED_MAX_CHUNKS ? c : FUSED_MAX_CHUNKS;
    c = c < k_groups ? c : k_groups;
    if (forced != CTXPAR_CPU_BWD_AUTO)
        return forced == CTXPAR_CPU_BWD_FUSED ? c : 0;
    return heads * c >= FUSED_MIN_ITEMS ? c : 0;
}

// This thread's part of the workspaces.
static int64_t ws_dim(const ctxpar_cpu_plan *p) {
    return p->dim > p->dim_v ? p->dim : p->dim_v;
}

static ctxpar_bwd_ws thread_ws(float *ws, size_t per_thread, int64_t dim, int groups) {
    size_t unused;
    return ctxpar_bwd_ws_at(ws + (size_t)omp_get_thread_num() * per_thread, dim, groups, &unused);
}

// dq += scale * (sum of the chunks' partial sums, in chunk order), for query tile qt of (b, h).
static void reduce_dq(const ctxpar_bwd_args *a, int64_t b, int64_t h, int64_t qt) {
    const ctxpar_cpu_plan *p = a->p;
    const int64_t dim = p->dim, i0 = qt * CTXPAR_CPU_TILE_Q;
    const int64_t nq = ctxpar_bwd_tile_rows(p->seq_q, qt, CTXPAR_CPU_TILE_Q);
    const size_t chunk = (size_t)(p->batch * p->heads_q * p->q_tiles * dim * 64);
    const double *part =
        a->dq_part + (size_t)(((b * p->heads_q + h) * p->q_tiles + qt) * dim * 64);
    for (int64_t r = 0; r < nq; r++) {
        if (ctxpar_bwd_row_masked(a, b, h, i0 + r))
            continue;
        int nan = 0;
        for (int64_t d = 0; d < dim; d++)
            for (int64_t c = 0; c < a->chunks; c++)
                nan |= isnan(part[(size_t)c * chunk + (size_t)(d * 64 + r)]);
        if (nan && ctxpar_bwd_row_sees_only_neg_inf(a, b, h, i0 + r))
            continue;
        float *dq = a->dq + ((b * p->seq_q + i0 + r) * p->heads_q + h) * dim;
        for (int64_t d = 0; d < dim; d++) {
            double sum = part[d * 64 + r];
            for (int64_t c = 1; c < a->chunks; c++)
                sum += part[(size_t)c * chunk + (size_t)(d * 64 + r)];
            dq[d] += (float)(p->blk->scale * sum); // the F64 sum rounded once, then accumulated
        }
    }
}

// The fused schedule: items by decreasing chunk size first (a chunk's keys can be seen by more
// or fewer queries), handed out dynamically: each item's outputs are its own, so which thread
// runs it does not change a bit.
static void run_fused(const ctxpar_bwd_args *a, float *ws, size_t per_thread, int nt) {
    const ctxpar_cpu_plan *p = a->p;
    const int64_t items = p->batch * p->heads_kv * a->chunks;
    const int64_t q_items = a->dq ? p->batch * p->heads_q * p->q_tiles : 0;
#pragma omp parallel num_threads(nt)
    {
        ctxpar_bwd_ws w = thread_ws(ws, per_thread, ws_dim(p), a->group);
#pragma omp for schedule(dynamic, 1)
        for (int64_t it = 0; it < items; it++) {
            const int64_t bh = it % (p->batch * p->heads_kv), c = it / (p->batch * p->heads_kv);
            ctxpar_bwd_fused_item(a, &w, bh / p->heads_kv, bh % p->heads_kv, c);
        }
#pragma omp for schedule(static)
        for (int64_t it = 0; it < q_items; it++) {
            const int64_t qt = it % p->q_tiles, bh = it / p->q_tiles;
            reduce_dq(a, bh / p->heads_q, bh % p->heads_q, qt);
        }
    }
}

// The two-pass schedule: static round-robin over dq items, then dk/dv items.
static void run_two_pass(const ctxpar_bwd_args *a, float *ws, size_t per_thread, int nt) {
    const ctxpar_cpu_plan *p = a->p;
    const int64_t q_groups = (p->q_tiles + CTXPAR_CPU_GROUP - 1) / CTXPAR_CPU_GROUP;
    const int64_t k_groups = (p->k_tiles + CTXPAR_CPU_GROUP - 1) / CTXPAR_CPU_GROUP;
    const int64_t dq_items = a->dq ? p->batch * p->heads_q * q_groups : 0;
    const int64_t dkv_items = a->dk || a->dv ? p->batch * p->heads_kv * k_groups : 0;
#pragma omp parallel num_threads(nt)
    {
        ctxpar_bwd_ws w = thread_ws(ws, per_thread, ws_dim(p), CTXPAR_CPU_GROUP);
#pragma omp for schedule(static, 1)
        for (int64_t it = 0; it < dq_items; it++) {
            int64_t grp = it % q_groups, h = (it / q_groups) % p->heads_q;
            int64_t qt0 = grp * CTXPAR_CPU_GROUP;
            int ng = p->q_tiles - qt0 < CTXPAR_CPU_GROUP ? (int)(p->q_tiles - qt0)
                                                         : CTXPAR_CPU_GROUP;
            ctxpar_bwd_dq_item(a, &w, it / (q_groups * p->heads_q), h, qt0, ng);
        }
#pragma omp for schedule(static, 1)
        for (int64_t it = 0; it < dkv_items; it++) {
            int64_t grp = it % k_groups, hk = (it / k_groups) % p->heads_kv;
            int64_t kt0 = grp * CTXPAR_CPU_GROUP;
            int ng = p->k_tiles - kt0 < CTXPAR_CPU_GROUP ? (int)(p->k_tiles - kt0)
                                                         : CTXPAR_CPU_GROUP;
            ctxpar_bwd_dkv_item(a, &w, it / (k_groups * p->heads_kv), hk, kt0, ng, NULL);
        }
    }
}

ctxpar_status ctxpar_cpu_attn_block_bwd(ctxpar_device *dev, const ctxpar_attn_block *blk,
                                        const ctxpar_tensor *dout, const float *lse,
                                        const float *delta, float *dq_acc, float *dk_acc,
                                        float *dv_acc, ctxpar_stream *stream) {
    (void)stream;
    ctxpar_cpu_device *cpu = dev->impl;
    ctxpar_cpu_plan p;
    CTXPAR_CHECK(ctxpar_cpu_plan_init(blk, "attn_block_bwd", &p));
    ctxpar_status st = CTXPAR_OK; // the dispatch checked dout, lse and delta
    float *ws = NULL;
    double *dq_part = NULL;
    size_t part_bytes = 0;
    if (st != CTXPAR_OK || p.whole == CTXPAR_BLOCK_SKIP || p.seq_q == 0 || p.seq_k == 0 ||
        p.batch * p.heads_q == 0 || (!dq_acc && !dk_acc && !dv_acc))
        goto done; // nothing visible: every gradient contribution is zero
    ctxpar_bwd_args a = {&p,     cpu->kern, dout, lse, delta, blk->lse_lo,     dq_acc,
                         dk_acc, dv_acc,    NULL, 0,   0,     CTXPAR_CPU_GROUP};
    // Fused only when it saves work (dk or dv wanted: dq alone is the dq pass).
    a.chunks = dk_acc || dv_acc ? fused_chunks(&p, cpu->bwd) : 0;
    if (a.chunks > 0) {
        // Chunks are whole CTXPAR_CPU_GROUPs of key tiles whatever a.group is: the dQ partial
        // sums' boundaries (and so dq's bits) do not depend on it.
        a.group = ctxpar_bwd_fused_group(ws_dim(&p));
        const int64_t k_groups = (p.k_tiles + CTXPAR_CPU_GROUP - 1) / CTXPAR_CPU_GROUP;
        a.chunk_tiles = (k_groups + a.chunks - 1) / a.chunks * CTXPAR_CPU_GROUP;
        a.chunks = (p.k_tiles + a.chunk_tiles - 1) / a.chunk_tiles; // none left empty
        if (dq_acc) {
            part_bytes = (size_t)(a.chunks * p.batch * p.heads_q * p.q_tiles * p.dim * 64) *
                         sizeof(double);
            // The device's scratch: kept between calls and counted in the memory statistics.
            st = ctxpar_dev_scratch(dev, part_bytes, (void **)&dq_part);
            if (st != CTXPAR_OK)
                goto done;
            a.dq_part = dq_part;
        }
    }
    const int nt = ctxpar_cpu_threads(cpu);
    size_t per_thread;
    (void)ctxpar_bwd_ws_at(NULL, ws_dim(&p), a.group, &per_thread); // only measures
    ws = ctxpar_cpu_kernel_ws(cpu, (size_t)nt * per_thread * sizeof(float));
    if (!ws) {
        st = CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY,
                          "attn_block_bwd: cannot allocate %d workspaces of %zu bytes", nt,
                          per_thread * sizeof(float));
        goto done;
    }
    if (a.chunks > 0)
        run_fused(&a, ws, per_thread, nt);
    else
        run_two_pass(&a, ws, per_thread, nt);
done:
    ctxpar_cpu_plan_release(&p);
    return st;
}
