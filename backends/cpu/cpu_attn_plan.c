// The per-call plan of a block pair: global positions and documents of every
// row, the position range of every tile, and the helpers the forward and backward share.
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
    // The dispatch (api/dispatch_device.c) checked the block.
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
    // One allocation: positions, documents, tile ranges of both sides (+1: never malloc(0)).
    size_t n = (size_t)(2 * p.seq_q + 2 * p.seq_k + 2 * p.q_tiles + 2 * p.k_tiles + 1);
    int64_t *mem = malloc(n * sizeof *mem);
    if (!mem)
        return CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "%s: cannot allocate the %zu-byte plan", op,
                            n * sizeof *mem);
    p.q_pos = mem;
    p.k_pos = p.q_pos + p.seq_q;
    p.q_doc = p.k_pos + p.seq_k;
    p.k_doc = p.q_doc + p.seq_q;
    p.q_range = p.k_doc + p.seq_k;
    p.k_range = p.q_range + 2 * p.q_tiles;
    expand_positions(blk->q_pos, p.q_pos);
    expand_positions(blk->k_pos, p.k_pos);
    for (int64_t i = 0; i < p.seq_q; i++)
        p.q_doc[i] = ctxpar_mask_doc_of(&blk->mask, p.q_pos[i]);
    for (int64_t i = 0; i < p.seq_k; i++)
        p.k_doc[i] = ctxpar_mask_doc_of(&blk->mask, p.k_pos[i]);
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
    const ctxpar_mask_desc *m = &plan->blk->mask;
    for (int64_t n = 0; n < rows; n++)
        for (int64_t l = 0; l < lds; l++) {
            int64_t qi = q0 + (keys_in_rows ? l : n), ki = k0 + (keys_in_rows ? n : l);
            int seen = l >= lanes || ctxpar_mask_visible(m, plan->q_pos[qi], plan->k_pos[ki],
                                                         plan->q_doc[qi], plan->k_doc[ki]);
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

// Two lanes in GCC's generic vectors (SSE2, which every x86-64 CPU has; this file is compiled
// for any CPU): the compiler would not vectorise the scalar form (its selects on floats may trap).
typedef double v2d __attribute__((vector_size(16)));
typedef int64_t v2l __attribute__((vector_size(16)));

// tanh(x) in F64 without a library call (libm's scalar tanh made a soft-capped forward ~4x
// slower than a plain one). tanh |x| = e / (e + 2) with e = expm1(2|x|) = 2^k (1 + p) - 1,
// k = round(2|x| / ln 2), p = expm1(r) for the remainder |r| <= ln(2) / 2 (Cody-Waite: ln 2 in
// two parts, k ln2_hi exact), p by its Taylor series to r^13 (truncation < 2e-17 relative).
// Relative error below 1e-15 (a few F64 ulps): (float)(C tanh) is the correctly rounded F32
// value unless C tanh lies within 1e-15 (relative) of the midpoint between two floats, and is
// then at most one F32 ulp off (testing/cpu_ops_test checks it against libm's tanh). |x| >= 20
// gives exactly +-1 (as libm: tanh 20 = 1 - 8.5e-18 rounds to 1); NaN gives NaN; -0 gives -0.
static inline v2d tanh_v2(v2d x) {
    const v2l sign = (v2l)x & (v2l){INT64_MIN, INT64_MIN};
    v2d a = (v2d)((v2l)x ^ sign);
    const v2l big = a > 20.0; // all ones where |x| > 20 (not for NaN, which stays NaN)
    a = (v2d)((big & (v2l)(v2d){20.0, 20.0}) | (~big & (v2l)a));
    const v2d y = 2.0 * a;
    const v2d kt = y * 0x1.71547652b82fep0 + 0x1.8p52; // y / ln 2 rounded, in the low bits
    const v2d k = kt - 0x1.8p52;
    const v2d r = (y - k * 0x1.62e42fee00000p-1) - k * 0x1.a39ef35793c76p-33;
    static const double inv_fact[] = {1.0 / 479001600.0,
                                      1.0 / 39916800.0,
                                      1.0 / 3628800.0,
                                      1.0 / 362880.0,
                                      1.0 / 40320.0,
                                      1.0 / 5040.0,
                                      1.0 / 720.0,
                                      1.0 / 120.0,
                                      1.0 / 24.0,
                                      1.0 / 6.0,
                                      0.5,
                                      1.0};
    v2d p = r * (1.0 / 6227020800.0) + inv_fact[0]; // 1/13! r + 1/12!
    for (int i = 1; i < 12; i++)
        p = p * r + inv_fact[i];
    p = p * r;
    // 2^k (0 <= k <= 58) from kt's low bits, then expm1(y): exact scaling, one rounding.
    const v2d scale = (v2d)(((v2l)kt + 1023) << 52);
    const v2d e = scale * p + (scale - 1.0);
    return (v2d)((v2l)(e / (e + 2.0)) | sign);
}

// Soft-caps m <= 4 scores in place (see ctxpar_cpu_softcap): two independent tanh_v2 chains, so
// that one's latency hides behind the other's.
static inline __attribute__((always_inline)) void
softcap_4(float *s, float *dcap, const uint32_t *vis, int m, double cap, double mul) {
    float x[4] = {0, 0, 0, 0};
    memcpy(x, s, (size_t)m * sizeof(float));
    const v2d lo = tanh_v2((v2d){x[0], x[1]} * mul), hi = tanh_v2((v2d){x[2], x[3]} * mul);
    for (int j = 0; j < m; j++) {
        if (vis && !vis[j]) { // a hidden pair (s is -inf there) is left alone
            if (dcap)
                dcap[j] = 0.0f;
            continue;
        }
        const double t = j < 2 ? lo[j] : hi[j - 2];
        s[j] = (float)(cap * t);
        if (dcap)
            dcap[j] = (float)(1.0 - t * t);
    }
}

void ctxpar_cpu_softcap(const ctxpar_attn_block *blk, float *s, float *dcap, const uint32_t *vis,
                        int64_t lds, int64_t rows) {
    const double cap = blk->softcap;
    const double mul = fabs((double)blk->scale) / cap; // the sign is in the packed operand
    const int64_t n = rows * lds;
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) // m constant: fixed-size copies, no calls
        softcap_4(s + i, dcap ? dcap + i : NULL, vis ? vis + i : NULL, 4, cap, mul);
    if (i < n)
        softcap_4(s + i, dcap ? dcap + i : NULL, vis ? vis + i : NULL, (int)(n - i), cap, mul);
}
