/*
 * validate_fuzz.c - libFuzzer target: the public attention API on odd, wrong and hostile
 * arguments (one rank, the CPU device, the local comm).
 *
 * The bytes decode into params and the eight tensors (fuzz_problem.h). Forward runs, and with
 * FUZZ_FLAG_BWD backward after it. Besides "no crash, no ASan/UBSan report", every call must:
 *   - return OK, INVALID_ARG or NOT_SUPPORTED (one rank has no peer to fail), with a message
 *     when it fails; with FUZZ_FLAG_HUGE (shapes near the int64 limits) INVALID_ARG, never a
 *     wrapped size;
 *   - leave every buffer it does not own untouched when it fails, and on success change only the
 *     elements of its outputs (never an input, never the padding between strided elements);
 *   - give back all its memory (the context's current_bytes is the same before and after);
 *   - on success with finite inputs: finite results (lse may be -inf for a fully masked row),
 *     and with 2^-10 <= |scale| <= 1, results within the tolerance table of the float64 oracle
 *     (relative to the size of the terms summed: see expect_close).
 * A broken rule prints what and aborts, which libFuzzer reports as a crash with the input.
 */
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctxpar.h"
#include "ctxpar_backend.h"
#include "ctxpar_cpu.h"
#include "ctxpar_local.h"
#include "reference/data.h"
#include "fuzz_problem.h"
#include "reference/metrics.h"
#include "reference/oracle.h"
#include "reference/tolerance.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static ctxpar_local_group *g_group;
static ctxpar_comm *g_comm;
static ctxpar_device *g_dev;
static ctxpar_context *g_ctx;

static void fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "validate_fuzz: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    abort();
}

static void setup(void) {
    if (g_ctx)
        return;
    ctxpar_cpu_options co = CTXPAR_CPU_OPTIONS_INIT;
    co.num_threads = 1;
    if (ctxpar_local_group_create(1, &g_group) != CTXPAR_OK ||
        ctxpar_comm_create_local(g_group, 0, NULL, &g_comm) != CTXPAR_OK ||
        ctxpar_device_create_cpu(&co, &g_dev) != CTXPAR_OK ||
        ctxpar_context_create(g_dev, g_comm, NULL, &g_ctx) != CTXPAR_OK)
        fail("setup: %s", ctxpar_last_error());
}

// What the context holds once its workspace is given back: the workspace is kept between calls by
// design, so anything left after a release is a leak.
static size_t current_bytes(void) {
    ctxpar_memory_stats ms;
    if (ctxpar_context_release(g_ctx) != CTXPAR_OK)
        fail("release: %s", ctxpar_last_error());
    if (ctxpar_context_memory_stats(g_ctx, &ms) != CTXPAR_OK)
        fail("memory stats: %s", ctxpar_last_error());
    return ms.current_bytes;
}

/* ---------------------------------------------------------------- buffers before and after */

// The caller's buffers besides the eight tensors, and which call may write each.
enum { AUX_LSE, AUX_LSE_LO, AUX_DSINKS, AUX_SINKS, AUX_ASSIGNMENT, AUX_CU_SEQLENS, AUX_COUNT };
enum { BY_NONE, BY_FWD, BY_BWD };
static const char *const aux_names[AUX_COUNT] = {"lse",   "lse_lo",     "dsinks",
                                                 "sinks", "assignment", "cu_seqlens"};
static const int aux_writer[AUX_COUNT] = {BY_FWD, BY_FWD, BY_BWD, BY_NONE, BY_NONE, BY_NONE};

static void aux_buffer(const fuzz_problem *pb, int i, const void **data, size_t *bytes) {
    const size_t hq = (size_t)pb->heads_q * sizeof(float);
    const ctxpar_attn_params *p = &pb->params;
    const int64_t rows = p->cu_seqlens_rows > 0 ? p->cu_seqlens_rows : 1;
    const size_t cu = pb->cu_seqlens ? (size_t)(rows * (p->num_docs + 1)) * sizeof(int32_t) : 0;
    const void *d[AUX_COUNT] = {pb->lse, pb->lse_lo, pb->dsinks,
                                pb->sinks, pb->assignment, pb->cu_seqlens};
    const size_t n[AUX_COUNT] = {pb->lse_count * sizeof(float), pb->lse_count * sizeof(float), hq,
                                 hq, (size_t)pb->assignment_len * sizeof(int32_t), cu};
    *data = d[i];
    *bytes = d[i] ? n[i] : 0;
}

typedef struct snapshot {
    void *copy[FUZZ_TENSORS];
    void *aux[AUX_COUNT];
} snapshot;

static void snap_take(const fuzz_problem *pb, snapshot *s) {
    memset(s, 0, sizeof *s);
    for (int i = 0; i < FUZZ_TENSORS; i++)
        if (pb->tensor[i].data) {
            s->copy[i] = malloc(pb->bytes[i]);
            memcpy(s->copy[i], pb->tensor[i].data, pb->bytes[i]);
        }
    for (int i = 0; i < AUX_COUNT; i++) {
        const void *d;
        size_t n;
        aux_buffer(pb, i, &d, &n);
        if (d) {
            s->aux[i] = malloc(n);
            memcpy(s->aux[i], d, n);
        }
    }
}

static void snap_free(snapshot *s) {
    for (int i = 0; i < FUZZ_TENSORS; i++)
        free(s->copy[i]);
    for (int i = 0; i < AUX_COUNT; i++)
        free(s->aux[i]);
}

static const char *const tensor_names[FUZZ_TENSORS] = {"q",    "k",  "v",  "out",
                                                       "dout", "dq", "dk", "dv"};

// Tensor i's buffer is unchanged, except (when `written`) the elements its shape addresses.
static void check_untouched(const char *call, const fuzz_problem *pb, const snapshot *s, int i,
                            int written) {
    const ctxpar_tensor *t = &pb->tensor[i];
    if (!t->data || memcmp(t->data, s->copy[i], pb->bytes[i]) == 0)
        return;
    if (!written)
        fail("%s wrote %s, which it must leave untouched", call, tensor_names[i]);
    const size_t es = ctxpar_dtype_size(t->dtype), n = pb->bytes[i] / es;
    unsigned char *mask = calloc(n, 1);
    fuzz_tensor_mark(t, mask, n);
    for (size_t e = 0; e < n; e++)
        if (!mask[e] && memcmp((char *)t->data + e * es, (char *)s->copy[i] + e * es, es) != 0)
            fail("%s wrote element offset %zu of %s, between its strided elements", call, e,
                 tensor_names[i]);
    free(mask);
}

static void check_buffers(const char *call, const fuzz_problem *pb, const snapshot *s, int ok,
                          const int *outputs, int writer) {
    for (int i = 0; i < FUZZ_TENSORS; i++) {
        int written = 0;
        for (const int *o = outputs; *o >= 0; o++)
            written |= ok && *o == i;
        check_untouched(call, pb, s, i, written);
    }
    for (int i = 0; i < AUX_COUNT; i++) {
        const void *d;
        size_t n;
        aux_buffer(pb, i, &d, &n);
        // dsinks is written only when sinks are given (its gradient); else it stays as it was.
        const int may = ok && aux_writer[i] == writer && (i != AUX_DSINKS || pb->params.sinks);
        if (d && !may && memcmp(d, s->aux[i], n) != 0)
            fail("%s wrote %s, which it must leave untouched", call, aux_names[i]);
    }
}

/* ---------------------------------------------------------------- results */

static float resolved_scale(const fuzz_problem *pb) {
    float s = pb->params.softmax_scale;
    return s != 0.0f ? s : 1.0f / sqrtf((float)pb->tensor[FUZZ_Q].shape[3]);
}

static void check_finite(const char *call, const ctxpar_tensor *t, const char *name) {
    const int64_t *sh = t->shape;
    for (int64_t b = 0; b < sh[0]; b++)
        for (int64_t s = 0; s < sh[1]; s++)
            for (int64_t h = 0; h < sh[2]; h++)
                for (int64_t d = 0; d < sh[3]; d++)
                    if (!isfinite(cpt_test_get(t, b, s, h, d)))
                        fail("%s: %s[%lld, %lld, %lld, %lld] is %g from finite inputs", call, name,
                             (long long)b, (long long)s, (long long)h, (long long)d,
                             cpt_test_get(t, b, s, h, d));
}

// The table bounds max |got - oracle| / max |oracle|, measured at seq 4096. On a few keys a
// tensor can be a small difference of much larger terms (dk of two keys with nearly equal
// probabilities): its rounding error is then set by the terms, not by the result, and even
// delta = rowsum(dout * out) computed from the stored, rounded out moves it. So the error is
// held to the tolerance times the larger of max |oracle| and `unit`, the size of the terms
// (inputs lie in [-1, 1]: 1 for out, lse and dv; |scale| * head_dim for dq and dk). A wrong
// mask, index or stride still shows as an error of the size of the result.
// `tol_name` is the tolerance table's row (dsinks borrows dv's).
static void expect_close_as(const char *call, const char *name, const char *tol_name,
                            ctxpar_dtype dtype, double unit, cpt_error_stats e) {
    double tol = cpt_tolerance(dtype, tol_name);
    if (!(e.nonfinite == 0 && e.max_abs <= tol * fmax(e.max_ref, unit)))
        fail("%s: %s differs from the float64 oracle: max_abs %.3g > %.3g x max(%.3g, %.3g) "
             "(flat index %lld, %lld non-finite)",
             call, name, e.max_abs, tol, e.max_ref, unit, (long long)e.worst,
             (long long)e.nonfinite);
}

static void expect_close(const char *call, const char *name, ctxpar_dtype dtype, double unit,
                         cpt_error_stats e) {
    expect_close_as(call, name, name, dtype, unit, e);
}

static double *to_f64(const ctxpar_tensor *t) {
    const int64_t *sh = t->shape;
    double *d = malloc(sizeof(double) * (size_t)(sh[0] * sh[1] * sh[2] * sh[3]));
    cpt_test_to_f64(t, d);
    return d;
}

static double *f32_to_f64(const float *f, size_t n) {
    double *d = malloc(sizeof(double) * n);
    for (size_t i = 0; i < n; i++)
        d[i] = f[i];
    return d;
}

// Forward (bwd = 0) or backward results against the float64 oracle, with the call's features.
static void check_oracle(fuzz_problem *pb, int bwd) {
    const ctxpar_tensor *q = &pb->tensor[FUZZ_Q], *k = &pb->tensor[FUZZ_K];
    const ctxpar_tensor *v = &pb->tensor[FUZZ_V];
    cpt_oracle_shape sh = {q->shape[0], q->shape[1], k->shape[1],
                           q->shape[2], k->shape[2], q->shape[3]};
    const ctxpar_attn_params *p = &pb->params;
    ctxpar_mask_desc mask = cpt_oracle_mask(p);
    const size_t hq = (size_t)sh.heads_q;
    double *sinks = p->sinks ? f32_to_f64(p->sinks, hq) : NULL;
    cpt_oracle_features f = {v->shape[3], p->softcap, sinks, NULL, 0};
    if (p->cu_seqlens_rows > 0) {
        f.row_cu_seqlens = p->cu_seqlens;
        f.row_num_docs = p->num_docs;
    }
    double *dq = to_f64(q), *dk = to_f64(k), *dv = to_f64(v);
    const int64_t Dv = v->shape[3];
    const size_t nq = (size_t)(sh.batch * sh.seq_q * sh.heads_q * sh.head_dim);
    const size_t nk = (size_t)(sh.batch * sh.seq_k * sh.heads_kv * sh.head_dim);
    const size_t no = (size_t)(sh.batch * sh.seq_q * sh.heads_q * Dv);
    const size_t nv = (size_t)(sh.batch * sh.seq_k * sh.heads_kv * Dv);
    const ctxpar_dtype dt = q->dtype;
    if (!bwd) {
        double *out = malloc(sizeof(double) * no);
        double *lse = malloc(sizeof(double) * (size_t)(sh.batch * sh.heads_q * sh.seq_q));
        // params.q_len (when the struct_size passed reaches it): the last positions of the keys.
        const int q_len =
            p->struct_size >= offsetof(ctxpar_attn_params, q_len) + sizeof p->q_len && p->q_len > 0;
        int64_t *q_pos = q_len ? malloc(sizeof(int64_t) * (size_t)(sh.seq_q + 1)) : NULL;
        for (int64_t i = 0; q_pos && i < sh.seq_q; i++)
            q_pos[i] = sh.seq_k - sh.seq_q + i;
        cpt_oracle_fwd_ex(&sh, dq, dk, dv, q_pos, NULL, &mask, &f, resolved_scale(pb), out, lse);
        free(q_pos);
        expect_close("fwd", "out", dt, 1, cpt_compare_tensor(&pb->tensor[FUZZ_OUT], out));
        if (pb->lse)
            expect_close("fwd", "lse", dt, 1, cpt_compare_f32(pb->lse, lse, pb->lse_count));
        free(out);
        free(lse);
    } else {
        double *dout = to_f64(&pb->tensor[FUZZ_DOUT]);
        const double unit = fabs((double)resolved_scale(pb)) * (double)sh.head_dim;
        double *gq = malloc(sizeof(double) * nq), *gk = malloc(sizeof(double) * nk),
               *gv = malloc(sizeof(double) * nv), *gs = malloc(sizeof(double) * hq);
        cpt_oracle_bwd_ex(&sh, dq, dk, dv, NULL, NULL, &mask, &f, resolved_scale(pb), dout, gq,
                          gk, gv, gs);
        expect_close("bwd", "dq", dt, unit, cpt_compare_tensor(&pb->tensor[FUZZ_DQ], gq));
        expect_close("bwd", "dk", dt, unit, cpt_compare_tensor(&pb->tensor[FUZZ_DK], gk));
        expect_close("bwd", "dv", dt, 1, cpt_compare_tensor(&pb->tensor[FUZZ_DV], gv));
        // dsinks sums every row's sink probability times rowsum(dout * out) (each <= Dv): the
        // terms' size is rows x Dv; judged with dv's tolerance (the same sums of products).
        if (p->sinks && p->dsinks)
            expect_close_as("bwd", "dsinks", "dv", dt, (double)(sh.batch * sh.seq_q) * (double)Dv,
                            cpt_compare_f32(p->dsinks, gs, hq));
        free(dout);
        free(gq);
        free(gk);
        free(gv);
        free(gs);
    }
    free(sinks);
    free(dq);
    free(dk);
    free(dv);
}

static void check_results(fuzz_problem *pb, int bwd) {
    if (pb->flags & FUZZ_FLAG_RAW_DATA)
        return; // any bits: NaN and Inf are legitimate results
    const float scale = resolved_scale(pb);
    if (fabsf(scale) <= 1e4f) {
        if (!bwd) {
            check_finite("fwd", &pb->tensor[FUZZ_OUT], "out");
            for (size_t i = 0; pb->lse && i < pb->lse_count; i++)
                if (isnan(pb->lse[i]) || pb->lse[i] == INFINITY)
                    fail("fwd: lse[%zu] is %g from finite inputs", i, (double)pb->lse[i]);
            for (size_t i = 0; pb->params.lse_lo && i < pb->lse_count; i++)
                if (!isfinite(pb->params.lse_lo[i]))
                    fail("fwd: lse_lo[%zu] is %g from finite inputs", i,
                         (double)pb->params.lse_lo[i]);
        } else {
            check_finite("bwd", &pb->tensor[FUZZ_DQ], "dq");
            check_finite("bwd", &pb->tensor[FUZZ_DK], "dk");
            check_finite("bwd", &pb->tensor[FUZZ_DV], "dv");
            for (int64_t h = 0; pb->params.sinks && pb->params.dsinks && h < pb->heads_q; h++)
                if (!isfinite(pb->params.dsinks[h]))
                    fail("bwd: dsinks[%lld] is %g from finite inputs", (long long)h,
                         (double)pb->params.dsinks[h]);
        }
    }
    // Below 2^-10 gradients scale down into the 16-bit formats' subnormals and zero.
    if (fabsf(scale) <= 1.0f && fabsf(scale) >= 0x1p-10f)
        check_oracle(pb, bwd);
}

/* ---------------------------------------------------------------- the calls */

static void check_status(const char *call, const fuzz_problem *pb, ctxpar_status st) {
    // CTXPAR_FUZZ_VERBOSE=1 prints every call's outcome (to see what a seed reaches).
    static int verbose = -1;
    if (verbose < 0)
        verbose = getenv("CTXPAR_FUZZ_VERBOSE") && atoi(getenv("CTXPAR_FUZZ_VERBOSE")) > 0;
    if (verbose)
        fprintf(stderr, "validate_fuzz: %s: %s%s%s\n", call, ctxpar_status_string(st),
                st == CTXPAR_OK ? "" : ": ", st == CTXPAR_OK ? "" : ctxpar_last_error());
    if ((pb->flags & FUZZ_FLAG_HUGE) && st != CTXPAR_ERR_INVALID_ARG)
        fail("%s returned %s (%d) for shapes near the int64 limits, not INVALID_ARG: %s", call,
             ctxpar_status_string(st), (int)st, ctxpar_last_error());
    if (st != CTXPAR_OK && st != CTXPAR_ERR_INVALID_ARG && st != CTXPAR_ERR_NOT_SUPPORTED)
        fail("%s returned %s (%d) on one rank: %s", call, ctxpar_status_string(st), (int)st,
             ctxpar_last_error());
    if (st != CTXPAR_OK && ctxpar_last_error()[0] == '\0')
        fail("%s returned %s without a message", call, ctxpar_status_string(st));
}

static ctxpar_status run_fwd(fuzz_problem *pb) {
    ctxpar_context *ctx = pb->flags & FUZZ_FLAG_NULL_CTX ? NULL : g_ctx;
    const ctxpar_attn_params *params = pb->flags & FUZZ_FLAG_NULL_PARAMS ? NULL : &pb->params;
    snapshot s;
    snap_take(pb, &s);
    size_t before = current_bytes();
    ctxpar_status st = ctxpar_attn_fwd(ctx, params, fuzz_problem_arg(pb, FUZZ_Q),
                                       fuzz_problem_arg(pb, FUZZ_K), fuzz_problem_arg(pb, FUZZ_V),
                                       fuzz_problem_arg(pb, FUZZ_OUT), pb->lse, NULL);
    check_status("fwd", pb, st);
    if (current_bytes() != before)
        fail("fwd (%s) kept %zu bytes", ctxpar_status_string(st), current_bytes() - before);
    static const int outputs[] = {FUZZ_OUT, -1};
    check_buffers("fwd", pb, &s, st == CTXPAR_OK, outputs, BY_FWD);
    snap_free(&s);
    if (st == CTXPAR_OK)
        check_results(pb, 0);
    return st;
}

static void run_bwd(fuzz_problem *pb, int fwd_ok) {
    ctxpar_context *ctx = pb->flags & FUZZ_FLAG_NULL_CTX ? NULL : g_ctx;
    const ctxpar_attn_params *params = pb->flags & FUZZ_FLAG_NULL_PARAMS ? NULL : &pb->params;
    snapshot s;
    snap_take(pb, &s);
    size_t before = current_bytes();
    ctxpar_status st =
        ctxpar_attn_bwd(ctx, params, fuzz_problem_arg(pb, FUZZ_Q), fuzz_problem_arg(pb, FUZZ_K),
                        fuzz_problem_arg(pb, FUZZ_V), fuzz_problem_arg(pb, FUZZ_OUT), pb->lse,
                        fuzz_problem_arg(pb, FUZZ_DOUT), fuzz_problem_arg(pb, FUZZ_DQ),
                        fuzz_problem_arg(pb, FUZZ_DK), fuzz_problem_arg(pb, FUZZ_DV), NULL);
    check_status("bwd", pb, st);
    if (current_bytes() != before)
        fail("bwd (%s) kept %zu bytes", ctxpar_status_string(st), current_bytes() - before);
    static const int outputs[] = {FUZZ_DQ, FUZZ_DK, FUZZ_DV, -1};
    check_buffers("bwd", pb, &s, st == CTXPAR_OK, outputs, BY_BWD);
    snap_free(&s);
    // Only gradients of a real forward mean anything (a failed one left out and lse as filled).
    if (st == CTXPAR_OK && fwd_ok)
        check_results(pb, 1);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    setup();
    fuzz_problem pb;
    if (fuzz_problem_decode(data, size, &pb)) {
        ctxpar_status st = run_fwd(&pb);
        if (pb.flags & FUZZ_FLAG_BWD)
            run_bwd(&pb, st == CTXPAR_OK);
    }
    fuzz_problem_free(&pb);
    return 0;
}
