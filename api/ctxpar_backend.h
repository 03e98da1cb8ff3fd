/*
 * ctxpar_backend.h - for backend authors and for the algorithms.
 *
 * A device is `struct ctxpar_device_ops` + an implementation pointer; a comm likewise. Backends
 * fill an ops table and call ctxpar_device_create / ctxpar_comm_create, which check the table.
 * Nothing else calls through an ops table: the algorithms call the dispatch layer's wrappers
 * (dispatch/, internal to the library and not exported), which own every NULL check and every
 * fallback for an optional op. The few wrappers a backend or a comm may call are declared here.
 *
 * Tables are versioned: they start with `version` and `struct_size`, members are only appended,
 * and CTXPAR_OPS_HAS tells whether a table is new enough to hold a member and sets it.
 */
#ifndef CTXPAR_BACKEND_H
#define CTXPAR_BACKEND_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include "ctxpar.h"
#include "ctxpar_bins.h"
#include "ctxpar_half.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Everything declared here is part of the exported API (backend authors link against it), like
 * the CTXPAR_API functions of ctxpar.h; the rest of the library is hidden. */
#if defined(__GNUC__)
#pragma GCC visibility push(default)
#endif

/* ================================================================ errors */

/* Records `status` with a printf-style message prefixed by file:line as the thread's last error
 * and returns status. The first function that detects an error reports it; callers pass the
 * status up unchanged. */
ctxpar_status ctxpar_set_error(ctxpar_status status, const char *file, int line, const char *fmt,
                               ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;
void ctxpar_clear_error(void);

#define CTXPAR_ERROR(status, ...) ctxpar_set_error((status), __FILE__, __LINE__, __VA_ARGS__)

/* Returns from the calling function when expr fails. */
#define CTXPAR_CHECK(expr)                                                                        \
    do {                                                                                          \
        ctxpar_status ctxpar_check_st_ = (expr);                                                  \
        if (ctxpar_check_st_ != CTXPAR_OK)                                                        \
            return ctxpar_check_st_;                                                              \
    } while (0)

/* Stores the failure in `st` and jumps to the cleanup label. */
#define CTXPAR_CHECK_GOTO(expr, st, label)                                                        \
    do {                                                                                          \
        (st) = (expr);                                                                            \
        if ((st) != CTXPAR_OK)                                                                    \
            goto label;                                                                           \
    } while (0)

/* Monotonic clock in seconds. */
double ctxpar_now(void);

/* ================================================================ positions and masks */

/* Global positions start + i*stride for i < len. A shard is a short list of spans. */
typedef struct ctxpar_span {
    int64_t start;
    int64_t len;
    int64_t stride;
} ctxpar_span;

typedef struct ctxpar_spans {
    const ctxpar_span *span;
    int count;
} ctxpar_spans;

/* Number of positions in a span list. */
static inline int64_t ctxpar_spans_total(ctxpar_spans s) {
    int64_t n = 0;
    for (int i = 0; i < s.count; i++)
        n += s.span[i].len;
    return n;
}

/* The mask as a function of global positions. Host memory. */
typedef struct ctxpar_mask_desc {
    int causal;                /* k <= q */
    int64_t window_left;       /* q - k < window_left; 0 = none */
    const int32_t *cu_seqlens; /* num_docs + 1 global document boundaries; NULL = one document */
    int64_t num_docs;
    int64_t window_right; /* k - q <= window_right; 0 = none */
    /* > 0: documents per batch row: cu_seqlens holds doc_rows rows of num_docs + 1 boundaries,
     * row b for batch row b (doc_rows = batch). The dispatch hands a backend one batch row at a
     * time with that row's boundaries and doc_rows 0, so kernels never see it. */
    int64_t doc_rows;
} ctxpar_mask_desc;

/* The mask of batch row b alone (its documents; doc_rows 0). */
static inline ctxpar_mask_desc ctxpar_mask_row(const ctxpar_mask_desc *m, int64_t b) {
    ctxpar_mask_desc r = *m;
    if (m->cu_seqlens && m->doc_rows > 0)
        r.cu_seqlens = m->cu_seqlens + b * (m->num_docs + 1);
    r.doc_rows = 0;
    return r;
}

/* Index of the document holding global position pos (0 without documents). */
static inline int64_t ctxpar_mask_doc_of(const ctxpar_mask_desc *m, int64_t pos) {
    if (!m->cu_seqlens)
        return 0;
    int64_t lo = 0, hi = m->num_docs - 1; // find the last doc whose start <= pos
    while (lo < hi) {
        int64_t mid = (lo + hi + 1) / 2;
        if (m->cu_seqlens[mid] <= pos)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

/* The positions [*first, *last] of pos's document (ctxpar_mask_doc_of). The first document
 * reaches down to INT64_MIN and the last up to INT64_MAX (one document without cu_seqlens), so k
 * lies in them exactly when ctxpar_mask_doc_of(m, k) is pos's document, for any position. */
static inline void ctxpar_mask_doc_bounds(const ctxpar_mask_desc *m, int64_t pos, int64_t *first,
                                          int64_t *last) {
    *first = INT64_MIN;
    *last = INT64_MAX;
    if (!m->cu_seqlens)
        return;
    const int64_t d = ctxpar_mask_doc_of(m, pos);
    if (d > 0)
        *first = m->cu_seqlens[d];
    if (d + 1 < m->num_docs)
        *last = m->cu_seqlens[d + 1] - 1;
}

/* nvcc compiles what is marked so for the device as well: the kernels share the rule below. */
#if defined(__CUDACC__)
#define CTXPAR_HOST_DEVICE __host__ __device__
#else
#define CTXPAR_HOST_DEVICE
#endif

/* The mask rule, the one definition of every mask kind: query position q sees exactly the keys
 * k in [*lo, *hi], the positions of its document [doc_first, doc_last] (which holds q) that
 * causal (k <= q), window_left (q - k < window_left) and window_right (k - q <= window_right)
 * leave; a window of 0 is none. Never empty (it holds q); both ends are non-decreasing in q. */
CTXPAR_HOST_DEVICE static inline void ctxpar_mask_interval(int causal, int64_t window_left,
                                                           int64_t window_right, int64_t doc_first,
                                                           int64_t doc_last, int64_t q, int64_t *lo,
                                                           int64_t *hi) {
    *lo = doc_first;
    *hi = doc_last;
    if (causal && q < *hi)
        *hi = q;
    if (window_left > 0 && q - window_left + 1 > *lo)
        *lo = q - window_left + 1;
    if (window_right > 0 && q < *hi - window_right) // not q + window_right: it may overflow
        *hi = q + window_right;
}

/* The keys query position q sees under m, one batch row (doc_rows 0): [*lo, *hi]. */
static inline void ctxpar_mask_keys_of(const ctxpar_mask_desc *m, int64_t q, int64_t *lo,
                                       int64_t *hi) {
    int64_t first, last;
    ctxpar_mask_doc_bounds(m, q, &first, &last);
    ctxpar_mask_interval(m->causal, m->window_left, m->window_right, first, last, q, lo, hi);
}

/* Whether query position q sees key position k, one batch row. A lookup per call: kernels take
 * each query row's interval once (ctxpar_mask_keys_of). */
static inline int ctxpar_mask_visible(const ctxpar_mask_desc *m, int64_t q, int64_t k) {
    int64_t lo, hi;
    ctxpar_mask_keys_of(m, q, &lo, &hi);
    return lo <= k && k <= hi;
}

typedef enum ctxpar_block_class {
    CTXPAR_BLOCK_SKIP = 0,    /* no (q, k) pair visible: no compute */
    CTXPAR_BLOCK_PARTIAL = 1, /* apply the mask element by element */
    CTXPAR_BLOCK_FULL = 2,    /* every pair visible: no mask needed */
} ctxpar_block_class;

/* Class of the keys [kmin, kmax] for the queries from one that sees [lo0, hi0] to one that sees
 * [lo1, hi1] (ctxpar_mask_interval, one document row). The ends only grow with the query: no
 * query between sees a key outside [lo0, hi1], and every one sees [lo1, hi0]. */
CTXPAR_HOST_DEVICE static inline ctxpar_block_class
ctxpar_mask_classify_keys(int64_t lo0, int64_t hi0, int64_t lo1, int64_t hi1, int64_t kmin,
                          int64_t kmax) {
    if (kmin > hi1 || kmax < lo0)
        return CTXPAR_BLOCK_SKIP;
    if (lo1 <= kmin && kmax <= hi0)
        return CTXPAR_BLOCK_FULL;
    return CTXPAR_BLOCK_PARTIAL;
}

/* ctxpar_mask_classify for one batch row (doc_rows 0). */
static inline ctxpar_block_class ctxpar_mask_classify_row(const ctxpar_mask_desc *m, int64_t qmin,
                                                          int64_t qmax, int64_t kmin,
                                                          int64_t kmax) {
    int64_t lo0, hi0, lo1, hi1;
    ctxpar_mask_keys_of(m, qmin, &lo0, &hi0);
    ctxpar_mask_keys_of(m, qmax, &lo1, &hi1);
    return ctxpar_mask_classify_keys(lo0, hi0, lo1, hi1, kmin, kmax);
}

/* Classifies every (q, k) pair with q in [qmin, qmax] and k in [kmin, kmax] (qmin <= qmax,
 * kmin <= kmax). Conservative: FULL and SKIP are exact claims about the whole rectangle; anything
 * else is PARTIAL. */
static inline ctxpar_block_class ctxpar_mask_classify(const ctxpar_mask_desc *m, int64_t qmin,
                                                      int64_t qmax, int64_t kmin, int64_t kmax) {
    // Documents only narrow the intervals: a SKIP without them holds, and spares the lookups.
    ctxpar_mask_desc none = *m;
    none.cu_seqlens = NULL;
    none.doc_rows = 0;
    ctxpar_block_class c = ctxpar_mask_classify_row(&none, qmin, qmax, kmin, kmax);
    if (!m->cu_seqlens || c == CTXPAR_BLOCK_SKIP)
        return c;
    // With documents per batch row: SKIP only if every row skips, FULL only if every row is.
    int skip = 1, full = 1;
    for (int64_t b = 0; b < (m->doc_rows > 0 ? m->doc_rows : 1); b++) {
        const ctxpar_mask_desc r = ctxpar_mask_row(m, b);
        c = ctxpar_mask_classify_row(&r, qmin, qmax, kmin, kmax);
        skip = skip && c == CTXPAR_BLOCK_SKIP;
        full = full && c == CTXPAR_BLOCK_FULL;
    }
    return skip ? CTXPAR_BLOCK_SKIP : full ? CTXPAR_BLOCK_FULL : CTXPAR_BLOCK_PARTIAL;
}

/* Smallest and largest position of a span list (count >= 1, every len >= 1). */
static inline void ctxpar_spans_range(ctxpar_spans s, int64_t *min_out, int64_t *max_out) {
    int64_t lo = INT64_MAX, hi = INT64_MIN;
    for (int i = 0; i < s.count; i++) {
        const ctxpar_span *p = &s.span[i];
        if (p->len <= 0)
            continue;
        int64_t a = p->start, b = p->start + (p->len - 1) * p->stride;
        if (a > b) {
            int64_t t = a;
            a = b;
            b = t;
        }
        if (a < lo)
            lo = a;
        if (b > hi)
            hi = b;
    }
    *min_out = lo;
    *max_out = hi;
}

/* ================================================================ device */

/* 3: blocks carry struct_size (ctxpar_attn_block); a table of an earlier version was built
 * against the earlier block layout and is refused. */
#define CTXPAR_DEVICE_OPS_VERSION 3u

typedef enum ctxpar_mem_kind {
    CTXPAR_MEM_DEVICE = 0, /* where the device computes (host memory for the CPU backend) */
    CTXPAR_MEM_HOST = 1,   /* host memory the device can copy to and from fast (pinned) */
} ctxpar_mem_kind;

typedef enum ctxpar_copy_kind {
    CTXPAR_COPY_D2D = 0,
    CTXPAR_COPY_H2D = 1,
    CTXPAR_COPY_D2H = 2,
    CTXPAR_COPY_H2H = 3,
} ctxpar_copy_kind;

typedef struct ctxpar_event ctxpar_event; /* defined by each backend */

/* One (Q block, K/V block) pair for the block kernels.
 *   q    [B, Sq, Hq,  D]  any strides, innermost stride 1
 *   k    [B, Sk, Hkv, D]  any strides, innermost stride 1; Hq % Hkv == 0 (GQA: query head h
 *                         uses K/V head h / (Hq / Hkv)); q, k, v share one dtype
 *   v    [B, Sk, Hkv, Dv] Dv may differ from D (MLA); out, dout and dV have Dv
 *   q_pos, k_pos          global positions of the Sq query rows and the Sk key rows
 * Zero-initialise it ({0}) before setting fields: optional fields are added at the end, NULL or
 * 0 meaning "none". The dispatch sets struct_size on every block it hands a backend: a backend
 * built against a later header reads a field this library may not know of only where
 * CTXPAR_BLOCK_HAS says the block holds it.
 */
typedef struct ctxpar_attn_block {
    size_t struct_size; /* sizeof(ctxpar_attn_block) as the library that made it was compiled */
    ctxpar_tensor q, k, v;
    ctxpar_spans q_pos, k_pos;
    ctxpar_mask_desc mask;
    float scale; /* multiplies QK^T (already resolved: never 0) */
    /* > 0: soft-capping, the score is softcap * tanh(scale * q.k / softcap); 0: none. */
    float softcap;
    /* (optional) The LSE's low part, F32 [B, Hq, Sq] dense beside lse_acc / lse: the LSE is
     * lse + lse_lo, about 48 bits, where an F32 LSE alone is off by up to |lse| 2^-24 (a
     * relative error of every recomputed P of its row; docs/numerics.md). attn_block_fwd writes
     * it with lse_acc (and reads it when merging); attn_block_bwd reads it. NULL: none. A device
     * that does not keep it leaves it as it is: the algorithms fill it with 0 first. */
    float *lse_lo;
} ctxpar_attn_block;

/* Whether a block (from the dispatch) holds `member`: fields added after a library was built are
 * past its struct_size. */
#define CTXPAR_BLOCK_HAS(blk, member)                                                             \
    ((blk)->struct_size >= offsetof(ctxpar_attn_block, member) + sizeof((blk)->member))

/* A problem as a device is asked about it (attn_supported): the blocks the algorithm will pass
 * have at most seq_q query rows and seq_k key rows, heads_q / heads_kv heads (Hq % Hkv == 0),
 * this dtype, head_dim and mask (cu_seqlens, if any, in host memory); backward != 0: the
 * backward blocks too. */
typedef struct ctxpar_attn_query {
    ctxpar_dtype dtype;
    int64_t batch, seq_q, seq_k, heads_q, heads_kv, head_dim;
    ctxpar_mask_desc mask;
    int backward;
    int64_t head_dim_v; /* of V and out (MLA when != head_dim) */
    float softcap;      /* > 0: the blocks soft-cap their scores (ctxpar_attn_block) */
    int sinks;          /* the algorithm folds attention sinks into the rows (merge ops) */
} ctxpar_attn_query;

struct ctxpar_device;

/*
 * The device vtable. Every op receives the device (its `impl` is the backend's state) and, where
 * it says so, a stream: the op is ordered on that stream (NULL = the device's default order). A
 * synchronous backend (the CPU) completes every op before returning.
 * F32 accumulators are densely packed:  out_acc [B, Sq, Hq, Dv]; dq_acc [B, Sq, Hq, D];
 * lse/delta [B, Hq, Sq]; dk_acc [B, Sk, Hkv, D]; dv_acc [B, Sk, Hkv, Dv] (Dv: v's head_dim).
 */
struct ctxpar_device_ops {
    uint32_t version;   /* CTXPAR_DEVICE_OPS_VERSION */
    size_t struct_size; /* sizeof(struct ctxpar_device_ops) as the backend was compiled */
    const char *name;   /* "cpu", "cuda" */

    /* Frees impl and everything the backend holds. */
    void (*destroy)(struct ctxpar_device *dev);

    /* ---- memory */
    ctxpar_status (*alloc)(struct ctxpar_device *dev, size_t bytes, ctxpar_mem_kind kind,
                           void **ptr_out);
    /* Releases a block alloc returned, stream-ordered (after work already enqueued that may use
     * it). Returns what the release reported (a fault of the device surfacing here included): the
     * dispatch merges it into the result of the call that freed. */
    ctxpar_status (*free)(struct ctxpar_device *dev, void *ptr, ctxpar_mem_kind kind);
    ctxpar_status (*copy)(struct ctxpar_device *dev, void *dst, const void *src, size_t bytes,
                          ctxpar_copy_kind kind, ctxpar_stream *stream);
    ctxpar_status (*memset)(struct ctxpar_device *dev, void *dst, int value, size_t bytes,
                            ctxpar_stream *stream);

    /* ---- streams and events: (optional, all or none) default: everything is synchronous, a
     * NULL stream is the only stream, events are no-ops. */
    ctxpar_status (*stream_create)(struct ctxpar_device *dev, ctxpar_stream **stream_out);
    void (*stream_destroy)(struct ctxpar_device *dev, ctxpar_stream *stream);
    ctxpar_status (*stream_sync)(struct ctxpar_device *dev, ctxpar_stream *stream);
    ctxpar_status (*event_create)(struct ctxpar_device *dev, ctxpar_event **event_out);
    void (*event_destroy)(struct ctxpar_device *dev, ctxpar_event *event);
    ctxpar_status (*event_record)(struct ctxpar_device *dev, ctxpar_event *event,
                                  ctxpar_stream *stream);
    ctxpar_status (*stream_wait_event)(struct ctxpar_device *dev, ctxpar_stream *stream,
                                       ctxpar_event *event);

    /* ---- attention blocks */

    /* out_b, lse_b = softmax(scale*QK^T + mask) V over this block's keys, then
     *   merge == 0: out_acc, lse_acc = out_b, lse_b
     *   merge == 1: lse' = logaddexp(lse_acc, lse_b); out_acc = e^(lse_acc-lse') out_acc +
     *               e^(lse_b-lse') out_b
     * A row with no visible key has out_b = 0, lse_b = -inf (and merging it changes nothing).
     * Key tiles are visited in increasing k index, so a call over a whole sequence gives the same
     * bits whichever query rows it is given. */
    ctxpar_status (*attn_block_fwd)(struct ctxpar_device *dev, const ctxpar_attn_block *blk,
                                    float *out_acc, float *lse_acc, int merge,
                                    ctxpar_stream *stream);

    /* out_acc, lse_acc = merge of (out_acc, lse_acc) with (out_b, lse_b), as above, for
     * [B, S, H, D] / [B, H, S] densely packed F32. */
    ctxpar_status (*attn_merge)(struct ctxpar_device *dev, float *out_acc, float *lse_acc,
                                const float *out_b, const float *lse_b, int64_t batch,
                                int64_t seq, int64_t heads, int64_t head_dim,
                                ctxpar_stream *stream);

    /* delta [B, H, S] = rowsum(dout * out) over D, for out and dout [B, S, H, D]. */
    ctxpar_status (*attn_bwd_prep)(struct ctxpar_device *dev, const ctxpar_tensor *out,
                                   const ctxpar_tensor *dout, float *delta,
                                   ctxpar_stream *stream);

    /* With P = exp(scale*QK^T + mask - lse) (lse: the final forward LSE of the query rows),
     * dP = dout V^T, dS = P * (dP - delta):
     *   dq_acc += scale * dS K,  dk_acc += scale * dS^T Q,  dv_acc += P^T dout
     * dout is [B, Sq, Hq, D] in the dtype of q. Any of dq_acc, dk_acc, dv_acc may be NULL (not
     * wanted). Deterministic: no atomics, no thread-count-dependent sums. */
    ctxpar_status (*attn_block_bwd)(struct ctxpar_device *dev, const ctxpar_attn_block *blk,
                                    const ctxpar_tensor *dout, const float *lse,
                                    const float *delta, float *dq_acc, float *dk_acc,
                                    float *dv_acc, ctxpar_stream *stream);

    /* ---- elementwise */

    /* dst = src converted to dst's dtype, element by element over the 4-D shape (equal shapes;
     * any strides with innermost stride 1). */
    ctxpar_status (*cast)(struct ctxpar_device *dev, const ctxpar_tensor *src, ctxpar_tensor *dst,
                          ctxpar_stream *stream);
    /* dst[i] += src[i], F32, i < n. */
    ctxpar_status (*add)(struct ctxpar_device *dev, float *dst, const float *src, size_t n,
                         ctxpar_stream *stream);
    /* dst[i] = value, F32, i < n. */
    ctxpar_status (*fill)(struct ctxpar_device *dev, float *dst, float value, size_t n,
                          ctxpar_stream *stream);

    /* (optional) 64-bit checksum of bytes in device memory, complete when it returns.
     * default: copy to the host and hash there. */
    ctxpar_status (*checksum)(struct ctxpar_device *dev, const void *data, size_t bytes,
                              ctxpar_stream *stream, uint64_t *sum_out);

    /* (optional) Whether the device can run the blocks of this problem (dtype, head_dim, head
     * counts, mask, block shapes, any tile or shared-memory limit): OK, or NOT_SUPPORTED with the
     * reason as the error message. The front door asks before the ranks agree, and AUTO asks for
     * each algorithm it considers, so a problem the device cannot run fails with the comm still
     * usable; a block op may then assume what this op accepted. No work, no side effects.
     * default: OK (whatever the front door accepts). */
    ctxpar_status (*attn_supported)(const struct ctxpar_device *dev,
                                    const ctxpar_attn_query *query);

    /* (optional) What the device computes its blocks with, for people (tools print it beside
     * timings): its kernels or library, how many forward blocks went which way so far, and why
     * a faster path was not taken. A NUL-terminated line in buf (n bytes, n >= 1); no side
     * effects. default: the ops table's name. */
    void (*describe)(const struct ctxpar_device *dev, char *buf, size_t n);

    /* ---- binned accumulators (optional, all six or none): reproducible mode
     * (params.reproducible, docs/numerics.md). Without them that mode is NOT_SUPPORTED. Each
     * op works on a block laid out as ctxpar_bins_bytes says and must give exactly the bits
     * ctxpar_bins.h's reference functions give (the conformance suite compares them). */

    /* Every row of the block empty (top -inf, bins and specials 0). */
    ctxpar_status (*bins_clear)(struct ctxpar_device *dev, void *bins, int64_t rows, int64_t width,
                                ctxpar_stream *stream);
    /* Adds src [B, len, H, width] (F32, dense) into the rows (b*seq + off + s)*H + h of a block
     * of B*seq*H rows: every value one term. */
    ctxpar_status (*bins_add)(struct ctxpar_device *dev, void *bins, const float *src,
                              const ctxpar_bins_shape *shape, ctxpar_stream *stream);
    /* Adds one forward partial per row: with L = lse_b + lse_lo_b (lse_lo_b may be NULL),
     * value d < width - 1 gets out_b[d] e^L and value width - 1 gets e^L, for out_b
     * [B, len, H, width - 1] and lse_b, lse_lo_b [B, H, len] (F32, dense; rows as bins_add). */
    ctxpar_status (*bins_add_attn)(struct ctxpar_device *dev, void *bins, const float *out_b,
                                   const float *lse_b, const float *lse_lo_b,
                                   const ctxpar_bins_shape *shape, ctxpar_stream *stream);
    /* dst += src, row by row (two blocks of the same rows and width). */
    ctxpar_status (*bins_merge)(struct ctxpar_device *dev, void *dst, const void *src, int64_t rows,
                                int64_t width, ctxpar_stream *stream);
    /* dst [rows, width] F32 = each sum, rounded once. */
    ctxpar_status (*bins_finish)(struct ctxpar_device *dev, const void *bins, int64_t rows,
                                 int64_t width, float *dst, ctxpar_stream *stream);
    /* The attention rows of a bins_add_attn block of B*seq*H rows: out [B, seq, H, width - 1]
     * = value d / value width-1; lse, lse_lo [B, H, seq] = log(value width - 1) as
     * ctxpar_attn_block.lse_lo splits it (lse_lo may be NULL). An empty row: out 0, lse -inf. */
    ctxpar_status (*bins_finish_attn)(struct ctxpar_device *dev, const void *bins,
                                      const ctxpar_bins_shape *shape, float *out, float *lse,
                                      float *lse_lo, ctxpar_stream *stream);
};

/* The base object a backend's ops receive. The dispatch layer creates it (ctxpar_device_create)
 * and keeps its own books beside it, out of the backend's sight. A device is used by one rank
 * (one thread) at a time. */
struct ctxpar_device {
    const struct ctxpar_device_ops *ops;
    void *impl;      /* the backend's state */
    int host_memory; /* device memory is host-addressable (the CPU backend) */
};

/* A backend's entry in the registry of devices by name (ctxpar_device_names): a device with the
 * backend's default options but num_threads (0 = default; ignore it without threads). */
typedef ctxpar_status (*ctxpar_device_factory)(int num_threads, ctxpar_device **device_out);

/* Adds a backend to the registry; its library calls it when loaded (a constructor function), so
 * that ctxpar_device_create_by_name finds it. A name already there, an empty or NULL name, a NULL
 * factory or a full registry (16) is CTXPAR_ERR_INVALID_ARG and changes nothing. The strings must
 * live as long as the process (string literals). Thread-safe. */
ctxpar_status ctxpar_device_register(const char *name, const char *description,
                                     ctxpar_device_factory create);

/* Whether an ops table (struct_size as compiled by its author) holds `member` and sets it. */
#define CTXPAR_OPS_HAS(ops, type, member)                                                         \
    ((ops)->struct_size >= offsetof(type, member) + sizeof((ops)->member) &&                      \
     (ops)->member != NULL)

/* Checks the table (version, size, every required op, streams all-or-none), then wraps it.
 * On failure the caller still owns impl. */
ctxpar_status ctxpar_device_create(const struct ctxpar_device_ops *ops, void *impl,
                                   int host_memory, ctxpar_device **device_out);

/* Services of the dispatch layer that a backend or a comm may call: a comm moves data between
 * buffers of its device and orders that on the device's streams; a backend op takes the device's
 * scratch block for its own temporaries. */
/* A device-owned scratch block of at least `bytes` for a backend op's own temporaries (the CPU
 * backward's dQ partial sums): it grows to the largest request and is kept, so that steady-state
 * calls allocate nothing; counted in the memory statistics. One user at a time: an op takes it
 * and is done with it before it returns (synchronous backends), or orders its use on one stream. */
ctxpar_status ctxpar_dev_scratch(ctxpar_device *dev, size_t bytes, void **ptr_out);
ctxpar_status ctxpar_dev_copy(ctxpar_device *dev, void *dst, const void *src, size_t bytes,
                              ctxpar_copy_kind kind, ctxpar_stream *stream);
int ctxpar_dev_has_streams(const ctxpar_device *dev);
ctxpar_status ctxpar_dev_stream_create(ctxpar_device *dev, ctxpar_stream **stream_out);
void ctxpar_dev_stream_destroy(ctxpar_device *dev, ctxpar_stream *stream);
ctxpar_status ctxpar_dev_stream_sync(ctxpar_device *dev, ctxpar_stream *stream);
ctxpar_status ctxpar_dev_add(ctxpar_device *dev, float *dst, const float *src, size_t n,
                             ctxpar_stream *stream);

/* ================================================================ comm */

#define CTXPAR_COMM_OPS_VERSION 2u

typedef struct ctxpar_request ctxpar_request; /* defined by each comm */

typedef enum ctxpar_reduce_op {
    CTXPAR_REDUCE_SUM = 0,
    CTXPAR_REDUCE_MIN = 1,
    CTXPAR_REDUCE_MAX = 2,
} ctxpar_reduce_op;

struct ctxpar_comm;

/*
 * The comm vtable. Buffers are device memory of the device the comm was made for (host memory
 * for the CPU backend). Nonblocking ops return a request that must be retired by exactly one
 * wait (success or not) or cancel; after wait returns OK, work ordered on `stream` sees the data
 * and the send buffer may be reused. Blocking ops honour comm->timeout_s: a peer that does not
 * arrive gives CTXPAR_ERR_TIMEOUT, a peer known to have failed CTXPAR_ERR_REMOTE.
 * Ops are issued by all ranks in the same order (as MPI and NCCL require).
 */
struct ctxpar_comm_ops {
    uint32_t version;   /* CTXPAR_COMM_OPS_VERSION */
    size_t struct_size; /* sizeof(struct ctxpar_comm_ops) as the comm was compiled */
    const char *name;   /* "local", "mpi", "nccl" */

    void (*destroy)(struct ctxpar_comm *comm);

    /* Sends send_bytes from sendbuf to rank dst and receives recv_bytes into recvbuf from rank
     * src, as one operation. dst < 0 or src < 0 skips that half. tag (>= 0) names the transfer:
     * a send meets only a receive of the same tag, so that a lost or extra message is an error
     * (or a timeout) rather than data delivered to the wrong buffer. A comm whose transport
     * cannot drop or reorder messages (NCCL) may ignore it. */
    ctxpar_status (*sendrecv)(struct ctxpar_comm *comm, const void *sendbuf, size_t send_bytes,
                              int dst, void *recvbuf, size_t recv_bytes, int src, int tag,
                              ctxpar_stream *stream, ctxpar_request **req_out);
    /* recvbuf[r*bytes .. (r+1)*bytes) = rank r's sendbuf, for every rank r. */
    ctxpar_status (*allgather)(struct ctxpar_comm *comm, const void *sendbuf, void *recvbuf,
                               size_t bytes, ctxpar_stream *stream, ctxpar_request **req_out);
    /* recvbuf[i] = sum over ranks r of r's sendbuf[rank*count + i], i < count; F32. The sum is
     * taken in rank order 0..P-1 so that it is deterministic. */
    ctxpar_status (*reduce_scatter)(struct ctxpar_comm *comm, const float *sendbuf,
                                    float *recvbuf, size_t count, ctxpar_stream *stream,
                                    ctxpar_request **req_out);
    /* Block j of sendbuf (bytes each) goes to rank j; block i of recvbuf comes from rank i. */
    ctxpar_status (*alltoall)(struct ctxpar_comm *comm, const void *sendbuf, void *recvbuf,
                              size_t bytes, ctxpar_stream *stream, ctxpar_request **req_out);
    /* Retires req (also on failure); then `stream` is ordered after the transfer. */
    ctxpar_status (*wait)(struct ctxpar_comm *comm, ctxpar_request *req, ctxpar_stream *stream);
    /* Abandons req after an error elsewhere: when it returns the comm no longer touches the
     * request's buffers and req is freed. Peers may then see TIMEOUT or REMOTE. (MPI cannot
     * cancel a send: the MPI comm keeps such a send and may read its buffer until the comm is
     * destroyed; see comm/mpi.) */
    void (*cancel)(struct ctxpar_comm *comm, ctxpar_request *req);
    /* Blocking, host memory, small: in-place reduction of count int64 values over all ranks. */
    ctxpar_status (*allreduce_i64)(struct ctxpar_comm *comm, int64_t *buf, size_t count,
                                   ctxpar_reduce_op op);
    /* Blocking barrier. */
    ctxpar_status (*barrier)(struct ctxpar_comm *comm);

    /* (optional) Drives progress and reports whether req is complete, without retiring it.
     * default: reports not complete (the algorithm then relies on wait). */
    ctxpar_status (*test)(struct ctxpar_comm *comm, ctxpar_request *req, int *done_out);
    /* (optional) Tells peers this rank has failed, so that they return CTXPAR_ERR_REMOTE
     * promptly rather than after the timeout. default: nothing (peers time out). */
    void (*abort)(struct ctxpar_comm *comm);

    /* ---- version 2 */

    /* (optional) Collective over all ranks: the ranks passing the same color >= 0 form a new
     * comm, ranked by (key, rank in this comm); color < 0 joins none (*comm_out = NULL). The new
     * comm is of the same kind, for the same device, independent of this one (destroy it on its
     * own) and fails the same way (TIMEOUT for a peer that does not arrive, REMOTE for one that
     * failed). The dispatch gives it this comm's timeout. default: NOT_SUPPORTED. */
    ctxpar_status (*split)(struct ctxpar_comm *comm, int color, int key,
                           struct ctxpar_comm **comm_out);
};

/* The base object a comm's ops receive. The dispatch creates it (ctxpar_comm_create: rank and
 * size as given) and keeps its own counts beside it, out of the comm's sight. */
struct ctxpar_comm {
    const struct ctxpar_comm_ops *ops;
    void *impl;
    int rank;
    int size;
    double timeout_s; /* for blocking waits (ctxpar_comm_set_timeout); default 60 */
};

/* Checks the table and wraps it. On failure the caller still owns impl. */
ctxpar_status ctxpar_comm_create(const struct ctxpar_comm_ops *ops, void *impl, int rank,
                                 int size, ctxpar_comm **comm_out);

/* A comm kind's entry in the registry of comms by name (ctxpar_comm_world_create). */
typedef struct ctxpar_comm_world_ops {
    /* This process's share of a job of nranks ranks (0: the kind decides, as MPI's world size):
     * its state, the first rank it runs and how many. Nothing to free on failure. */
    ctxpar_status (*create)(int nranks, void **impl_out, int *first_rank_out, int *count_out);
    /* The comm of the process's i-th rank (0 <= i < count, checked by the registry); called from
     * several threads at once for different i. */
    ctxpar_status (*comm)(void *impl, int i, ctxpar_device *copy_device, ctxpar_comm **comm_out);
    void (*destroy)(void *impl);
} ctxpar_comm_world_ops;

/* Adds a comm kind to the registry, from its library's constructor, as ctxpar_device_register
 * (same rules; `ops` must live as long as the process and set all three functions). */
ctxpar_status ctxpar_comm_register(const char *name, const char *description,
                                   const ctxpar_comm_world_ops *ops);

/* A service for comm authors: a comm that builds its split on its own allreduce (the local comm)
 * calls it through the dispatch, which checks the arguments. */
ctxpar_status ctxpar_comm_allreduce_i64(ctxpar_comm *comm, int64_t *buf, size_t count,
                                        ctxpar_reduce_op op);

#if defined(__GNUC__)
#pragma GCC visibility pop
#endif

#ifdef __cplusplus
}
#endif

#endif /* CTXPAR_BACKEND_H */
