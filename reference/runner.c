// The runner: in-process ranks as threads, global outputs, and the comparison with the oracle.
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ctxpar_backend.h"
#include "data.h"
#include "metrics.h"
#include "oracle.h"
#include "reference.h"
#include "runner_internal.h"
#include "tolerance.h"

const char *cpt_run_tensor_name(cpt_run_tensor t) {
    static const char *const names[CPT_RUN_TENSORS] = {"out", "lse", "dq", "dk", "dv"};
    return (unsigned)t < CPT_RUN_TENSORS ? names[t] : "?";
}

void cpt_run_config_default(cpt_run_config *cfg) {
    memset(cfg, 0, sizeof *cfg);
    ctxpar_attn_params p = CTXPAR_ATTN_PARAMS_INIT;
    p.algo = CTXPAR_ALGO_RING;
    p.layout = CTXPAR_LAYOUT_ZIGZAG;
    p.mask = CTXPAR_MASK_CAUSAL;
    cfg->params = p;
    cfg->ranks = 4;
    cfg->batch = 1;
    cfg->seq = 4096;
    cfg->heads = 4;
    cfg->kv_heads = 4;
    cfg->head_dim = 64;
    cfg->dtype = CTXPAR_DTYPE_F32;
    cfg->seed = 42;
    cfg->compare_single = 1;
    cfg->compare_oracle = 1;
}

void cpt_run_progress(const cpt_run_config *cfg, const char *stage, int done, int total) {
    if (cfg->progress)
        cfg->progress(cfg->progress_user, stage, done, total);
}

int cpt_run_threads_per_rank(const cpt_run_config *cfg, int ranks) {
    if (cfg->threads > 0)
        return cfg->threads;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int t = cores > 0 ? (int)(cores / ranks) : 1;
    return t > 0 ? t : 1;
}

// head_dim of a global tensor: out and dv have v's (MLA).
static int64_t tensor_dim(const cpt_run_config *cfg, int i) {
    return i == CPT_T_OUT || i == CPT_T_DV ? cpt_run_dim_v(cfg) : cfg->head_dim;
}

// Whether every rank holds all of tensor i (the queries' with params.q_len), not its shard.
static int replicated(const cpt_run_config *cfg, int i) {
    return cfg->params.q_len > 0 && (i == CPT_T_OUT || i == CPT_T_LSE || i == CPT_T_DQ);
}

int64_t cpt_run_rows(const cpt_run_config *cfg, int tensor) {
    return replicated(cfg, tensor) ? cfg->params.q_len : cfg->seq;
}

// Element counts of the five global tensors.
static size_t global_count(const cpt_run_config *cfg, int i) {
    int64_t heads = (i == CPT_T_DK || i == CPT_T_DV) ? cfg->kv_heads : cfg->heads;
    if (i == CPT_T_LSE)
        return (size_t)(cfg->batch * cfg->heads * cpt_run_rows(cfg, i));
    return (size_t)(cfg->batch * cpt_run_rows(cfg, i) * heads * tensor_dim(cfg, i));
}

static int has_dsinks(const cpt_run_config *cfg) {
    return cfg->params.sinks && cfg->backward;
}

static int has_tensor(const cpt_run_config *cfg, int i) {
    return i <= CPT_T_LSE || cfg->backward;
}

ctxpar_status cpt_run_outputs_alloc(const cpt_run_config *cfg, cpt_run_outputs *out) {
    memset(out, 0, sizeof *out);
    for (int i = 0; i < CPT_RUN_TENSORS; i++) {
        if (!has_tensor(cfg, i))
            continue;
        size_t es = i == CPT_T_LSE ? sizeof(float) : ctxpar_dtype_size(cfg->dtype);
        out->t[i] = calloc(global_count(cfg, i), es);
        if (!out->t[i]) {
            cpt_run_outputs_free(out);
            return CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "cannot allocate the global %s",
                                cpt_run_tensor_name((cpt_run_tensor)i));
        }
    }
    if (has_dsinks(cfg) && !(out->dsinks = calloc((size_t)cfg->heads, sizeof(float)))) {
        cpt_run_outputs_free(out);
        return CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "cannot allocate dsinks");
    }
    return CTXPAR_OK;
}

void cpt_run_outputs_free(cpt_run_outputs *out) {
    for (int i = 0; i < CPT_RUN_TENSORS; i++) {
        free(out->t[i]);
        out->t[i] = NULL;
    }
    free(out->dsinks);
    out->dsinks = NULL;
}

static ctxpar_tensor global_view(const cpt_run_config *cfg, void *data, int i) {
    int64_t heads = (i == CPT_T_DK || i == CPT_T_DV) ? cfg->kv_heads : cfg->heads;
    return ctxpar_tensor_bshd(data, cfg->dtype, cfg->batch, cpt_run_rows(cfg, i), heads,
                              tensor_dim(cfg, i));
}

// A tensor every rank holds whole (the queries' results with params.q_len): rank 0's, and NaN
// wherever another rank's bits differ from it (ranks must agree exactly).
static void place_replicated(size_t bytes, size_t elems, int is_f32, int rank, const void *local,
                             void *global) {
    if (rank == 0) {
        memcpy(global, local, bytes);
        return;
    }
    if (memcmp(global, local, bytes) == 0)
        return;
    const size_t es = bytes / elems;
    for (size_t e = 0; e < elems; e++) {
        char *g = (char *)global + e * es;
        if (memcmp(g, (const char *)local + e * es, es) == 0)
            continue;
        if (is_f32)
            *(float *)g = NAN;
        else // all ones: a NaN in F16 and BF16 as in F32
            memset(g, 0xff, es);
    }
}

ctxpar_status cpt_run_outputs_place(const cpt_run_config *cfg, int rank, int nranks,
                                       const cpt_rank_outputs *local,
                                       cpt_run_outputs *global) {
    int64_t seq = cpt_run_local_seq(cfg, rank, nranks);
    if (seq < 0)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "seq %lld cannot be sharded", (long long)cfg->seq);
    if (local->dsinks && global->dsinks) { // rank 0's; any other rank's bits must match it
        const size_t bytes = (size_t)cfg->heads * sizeof(float);
        if (rank == 0)
            memcpy(global->dsinks, local->dsinks, bytes);
        else if (memcmp(global->dsinks, local->dsinks, bytes) != 0)
            for (int64_t h = 0; h < cfg->heads; h++)
                global->dsinks[h] = NAN;
    }
    for (int i = 0; i < CPT_RUN_TENSORS; i++) {
        if (!has_tensor(cfg, i) || !local->t[i])
            continue;
        if (replicated(cfg, i)) {
            const size_t es = i == CPT_T_LSE ? sizeof(float) : ctxpar_dtype_size(cfg->dtype);
            place_replicated(global_count(cfg, i) * es, global_count(cfg, i),
                             i == CPT_T_LSE || cfg->dtype == CTXPAR_DTYPE_F32, rank, local->t[i],
                             global->t[i]);
            continue;
        }
        if (i == CPT_T_LSE) { // [B, H, S]: place by positions
            int64_t *pos = malloc((size_t)seq * sizeof *pos + 1);
            if (!pos)
                return CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "cannot allocate positions");
            ctxpar_status st = ctxpar_positions_assigned(
                cfg->params.layout, cfg->params.assignment, cfg->seq, rank, nranks, pos);
            const float *src = local->t[i];
            float *dst = global->t[i];
            for (int64_t bh = 0; st == CTXPAR_OK && bh < cfg->batch * cfg->heads; bh++)
                for (int64_t s = 0; s < seq; s++)
                    dst[bh * cfg->seq + pos[s]] = src[bh * seq + s];
            free(pos);
            CTXPAR_CHECK(st);
            continue;
        }
        ctxpar_tensor g = global_view(cfg, global->t[i], i);
        ctxpar_tensor l = ctxpar_tensor_bshd(local->t[i], cfg->dtype, cfg->batch, seq, g.shape[2],
                                             g.shape[3]);
        CTXPAR_CHECK(ctxpar_unshard_assigned(cfg->params.layout, cfg->params.assignment, rank,
                                             nranks, &l, &g));
    }
    return CTXPAR_OK;
}

typedef struct thread_job {
    const cpt_run_config *cfg;
    ctxpar_comm_world *world;
    int rank, ranks;
    cpt_rank_report *report;
} thread_job;

static void *thread_main(void *arg) {
    thread_job *job = arg;
    cpt_rank_report *r = job->report;
    ctxpar_device *dev = NULL;
    ctxpar_comm *comm = NULL;
    ctxpar_status st = cpt_run_device_create(
        job->cfg, cpt_run_threads_per_rank(job->cfg, job->ranks), &dev);
    // Host memory moves with memcpy; device memory through the device.
    if (st == CTXPAR_OK)
        st = ctxpar_comm_world_comm(job->world, job->rank,
                                    job->cfg->backend == CPT_RUN_CPU ? NULL : dev, &comm);
    if (st == CTXPAR_OK) {
        cpt_run_rank(job->cfg, dev, comm, r);
    } else {
        r->status = st;
        snprintf(r->message, sizeof r->message, "rank %d: %s", job->rank, ctxpar_last_error());
    }
    ctxpar_comm_destroy(comm);
    ctxpar_device_destroy(dev);
    return NULL;
}

ctxpar_status cpt_run_threads(const cpt_run_config *cfg, int ranks,
                                 cpt_run_outputs *global, cpt_rank_report *reports) {
    ctxpar_comm_world *world = NULL;
    CTXPAR_CHECK(ctxpar_comm_world_create("local", ranks, &world));
    pthread_t *threads = calloc((size_t)ranks, sizeof *threads);
    thread_job *jobs = calloc((size_t)ranks, sizeof *jobs);
    ctxpar_status st = CTXPAR_OK;
    if (!threads || !jobs) {
        st = CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "cannot allocate %d threads", ranks);
        goto done;
    }
    int started = 0;
    for (; started < ranks; started++) {
        jobs[started] = (thread_job){cfg, world, started, ranks, &reports[started]};
        if (pthread_create(&threads[started], NULL, thread_main, &jobs[started]) != 0) {
            st = CTXPAR_ERROR(CTXPAR_ERR_INTERNAL, "cannot start rank thread %d", started);
            break;
        }
    }
    for (int i = 0; i < started; i++)
        pthread_join(threads[i], NULL);
    for (int i = 0; st == CTXPAR_OK && i < ranks; i++)
        if (reports[i].status == CTXPAR_OK)
            st = cpt_run_outputs_place(cfg, i, ranks, &reports[i].out, global);
done:
    free(threads);
    free(jobs);
    ctxpar_comm_world_destroy(world);
    return st;
}

// The oracle on the global inputs, each rounded through the run's dtype first.
typedef struct oracle_result {
    double *t[CPT_RUN_TENSORS];
    double *mag[CPT_RUN_TENSORS];   // the per-element bound's magnitudes
    double *mag16[CPT_RUN_TENSORS]; // its 16-bit ones (16-bit runs and kept oracles), or NULL
    double *dsinks, *mag_dsinks, *mag16_dsinks; // [heads] each (dsinks runs)
    int borrowed; // the arrays are another result's (cfg->reference_from)
} oracle_result;

// The reference kept by an earlier run of the same problem (cfg->reference_from), borrowed.
static ctxpar_status borrow_oracle(const cpt_run_config *cfg, const cpt_run_sample *smp,
                                   oracle_result *o) {
    const cpt_run_result *from = cfg->reference_from;
    memset(o, 0, sizeof *o);
    const int same_rows =
        from->sample.n == smp->n && (!smp->rows) == (!from->sample.rows) &&
        (!smp->rows || memcmp(smp->rows, from->sample.rows, sizeof *smp->rows * smp->n) == 0);
    const int want16 = cfg->dtype != CTXPAR_DTYPE_F32;
    for (int i = 0; i < CPT_RUN_TENSORS; i++)
        if (has_tensor(cfg, i) &&
            (!from->oracle[i] || !from->oracle_mag[i] || (want16 && !from->oracle_mag16[i])))
            return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG,
                                "reference_from has no kept %s (run it with keep_oracle and "
                                "the same problem)",
                                cpt_run_tensor_name((cpt_run_tensor)i));
    if (!same_rows || (has_dsinks(cfg) && !from->oracle_dsinks[0]))
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG,
                            "reference_from judged other rows or no dsinks: not the same problem");
    for (int i = 0; i < CPT_RUN_TENSORS; i++) {
        o->t[i] = from->oracle[i];
        o->mag[i] = from->oracle_mag[i];
        o->mag16[i] = from->oracle_mag16[i];
    }
    o->dsinks = from->oracle_dsinks[0];
    o->mag_dsinks = from->oracle_dsinks[1];
    o->mag16_dsinks = from->oracle_dsinks[2];
    o->borrowed = 1;
    return CTXPAR_OK;
}

static void oracle_free(oracle_result *o) {
    if (o->borrowed)
        return;
    for (int i = 0; i < CPT_RUN_TENSORS; i++) {
        free(o->t[i]);
        free(o->mag[i]);
        free(o->mag16[i]);
    }
    free(o->dsinks);
    free(o->mag_dsinks);
    free(o->mag16_dsinks);
}

// The reference's progress, as the runner's (work steps; the callback takes ints).
static void reference_progress(void *user, int64_t done, int64_t total) {
    const double f = total > 0 ? (double)done / (double)total : 0.0;
    cpt_run_progress(user, "fp64 reference", (int)(f * 10000.0), 10000);
}

// With a sample, the oracle's tensors hold the sampled rows only (sizes of a run of seq n).
static ctxpar_status run_oracle(const cpt_run_config *cfg, const cpt_run_sample *smp,
                                oracle_result *o) {
    memset(o, 0, sizeof *o);
    if (cfg->params.q_len > 0 && cfg->backward) // the library refuses it before this
        return CTXPAR_ERROR(CTXPAR_ERR_NOT_SUPPORTED, "no reference backward with q_len");
    // q as generated over every position (its last q_len rows kept below, with params.q_len).
    size_t nq = (size_t)(cfg->batch * cfg->seq * cfg->heads * cfg->head_dim);
    size_t nk = global_count(cfg, CPT_T_DK);
    size_t no = global_count(cfg, CPT_T_OUT), nv = global_count(cfg, CPT_T_DV);
    cpt_run_config cc = *cfg; // the results' sizes
    if (smp->rows)
        cc.seq = smp->n;
    double *q = malloc(nq * sizeof *q), *k = malloc(nk * sizeof *k), *v = malloc(nv * sizeof *v);
    double *dout = cfg->backward ? malloc(no * sizeof *dout) : NULL;
    double *sinks = cfg->params.sinks ? malloc((size_t)cfg->heads * sizeof *sinks) : NULL;
    if (has_dsinks(cfg)) {
        o->dsinks = malloc((size_t)cfg->heads * sizeof(double));
        o->mag_dsinks = malloc((size_t)cfg->heads * sizeof(double));
        o->mag16_dsinks = malloc((size_t)cfg->heads * sizeof(double));
    }
    const int64_t Sq = cpt_run_rows(cfg, CPT_T_OUT);
    int64_t *pos = malloc((size_t)(cfg->seq + Sq) * sizeof *pos), *q_pos = pos + cfg->seq;
    ctxpar_status st = CTXPAR_OK;
    // Results judged at a 16-bit dtype need the 16-bit magnitudes (audit may judge any dtype).
    const int want16 = cfg->dtype != CTXPAR_DTYPE_F32 || cfg->keep_oracle;
    for (int i = 0; i < CPT_RUN_TENSORS; i++)
        if (has_tensor(cfg, i)) {
            o->t[i] = malloc(global_count(&cc, i) * sizeof(double));
            o->mag[i] = malloc(global_count(&cc, i) * sizeof(double));
            if (want16)
                o->mag16[i] = malloc(global_count(&cc, i) * sizeof(double));
        }
    int ok = q && k && v && pos && (!cfg->backward || dout) && (!cfg->params.sinks || sinks) &&
             (!has_dsinks(cfg) || (o->dsinks && o->mag_dsinks && o->mag16_dsinks));
    for (int i = 0; i < CPT_RUN_TENSORS; i++)
        ok = ok && (!has_tensor(cfg, i) || (o->t[i] && o->mag[i] && (!want16 || o->mag16[i])));
    if (!ok) {
        st = CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "cannot allocate the oracle's tensors");
        goto done;
    }
    cpt_run_progress(cfg, "fp64 reference", 0, 0);
    cpt_run_fill_global_f64(cfg, CPT_RUN_ID_Q, q);
    cpt_run_fill_global_f64(cfg, CPT_RUN_ID_K, k);
    cpt_run_fill_global_f64(cfg, CPT_RUN_ID_V, v);
    for (int64_t i = 0; i < cfg->seq; i++)
        pos[i] = i;
    // The queries are the last Sq positions: their rows of the generated q, packed.
    for (int64_t i = 0; i < Sq; i++)
        q_pos[i] = cfg->seq - Sq + i;
    const size_t row = (size_t)(cfg->heads * cfg->head_dim);
    for (int64_t b = 0; Sq < cfg->seq && b < cfg->batch; b++)
        memmove(q + (size_t)(b * Sq) * row, q + (size_t)(b * cfg->seq + cfg->seq - Sq) * row,
                (size_t)Sq * row * sizeof *q);
    double scale = cfg->params.softmax_scale != 0.0f ? (double)cfg->params.softmax_scale
                                                     : 1.0 / sqrt((double)cfg->head_dim);
    // The library resolves the default scale in float; use the same value.
    if (cfg->params.softmax_scale == 0.0f)
        scale = (double)(1.0f / sqrtf((float)cfg->head_dim));
    if (cfg->backward)
        cpt_run_fill_global_f64(cfg, CPT_RUN_ID_DOUT, dout);
    // MLA, soft-capping and sinks as the library was asked for them (the sinks' F32 values).
    for (int64_t h = 0; sinks && h < cfg->heads; h++)
        sinks[h] = (double)cfg->params.sinks[h];
    const int per_row = cfg->params.cu_seqlens && cfg->params.cu_seqlens_rows > 0;
    const cpt_oracle_features feat = {cpt_run_dim_v(cfg), (double)cfg->params.softcap, sinks,
                                      per_row ? cfg->params.cu_seqlens : NULL,
                                      per_row ? cfg->params.num_docs : 0};
    const cpt_oracle_shape shape = {cfg->batch,    Sq,           cfg->seq, cfg->heads,
                                    cfg->kv_heads, cfg->head_dim};
    ctxpar_mask_desc mask = cpt_oracle_mask(&cfg->params);
    if (per_row) // the features carry them
        mask.cu_seqlens = NULL;
    cpt_ref_out ro = {{o->t[0], o->t[1], o->t[2], o->t[3], o->t[4]},
                      {o->mag[0], o->mag[1], o->mag[2], o->mag[3], o->mag[4]},
                      {o->mag16[0], o->mag16[1], o->mag16[2], o->mag16[3], o->mag16[4]},
                      o->dsinks,
                      o->mag_dsinks,
                      o->mag16_dsinks};
    const cpt_ref_progress prog = {reference_progress, (void *)cfg};
    const cpt_ref_select sel = {smp->rows, smp->n, cfg->backward ? smp->rows : NULL, smp->n};
    st = cpt_reference(&shape, q, k, v, dout, q_pos, pos, &mask, &feat, scale,
                       smp->rows ? &sel : NULL, &prog, &ro);
done:
    free(sinks);
    free(q);
    free(k);
    free(v);
    free(dout);
    free(pos);
    if (st != CTXPAR_OK)
        oracle_free(o);
    return st;
}

static double tensor_error(const cpt_run_config *cfg, const cpt_run_outputs *outs, int i,
                           const double *ref) {
    if (i == CPT_T_LSE)
        return cpt_compare_f32(outs->t[i], ref, global_count(cfg, i)).rel;
    ctxpar_tensor t = global_view(cfg, outs->t[i], i);
    return cpt_compare_tensor(&t, ref).rel;
}

static double tensor_row_error(const cpt_run_config *cfg, const cpt_run_outputs *outs, int i,
                               const double *ref) {
    if (i == CPT_T_LSE)
        return NAN;
    const size_t n = global_count(cfg, i);
    double *got64 = malloc(n * sizeof *got64);
    float *got = malloc(n * sizeof *got);
    double e = NAN;
    if (got64 && got) {
        ctxpar_tensor t = global_view(cfg, outs->t[i], i);
        cpt_test_to_f64(&t, got64);
        for (size_t j = 0; j < n; j++)
            got[j] = (float)got64[j]; // exact: the stored values are F32 or 16-bit
        const size_t dim = (size_t)tensor_dim(cfg, i);
        e = cpt_rel_error_rows(got, ref, n / dim, dim, NULL);
    }
    free(got64);
    free(got);
    return e;
}

// The largest error-to-bound ratio of tensor i and where it is: position, head and the rank that
// held the row under the layout.
static ctxpar_status bound_verdict(const cpt_run_config *full, const cpt_run_config *cfg,
                                   const cpt_run_sample *smp, const cpt_run_outputs *outs, int i,
                                   const oracle_result *o, double *ratio, cpt_run_where *w) {
    const size_t n = global_count(cfg, i);
    cpt_bound_stats bs;
    if (i == CPT_T_LSE) {
        bs = cpt_bound_check(outs->t[i], o->t[i], o->mag[i], o->mag16[i], n, cfg->dtype, 1);
    } else {
        ctxpar_tensor t = global_view(cfg, outs->t[i], i);
        bs = cpt_bound_check_tensor(&t, o->t[i], o->mag[i], o->mag16[i]);
    }
    *ratio = bs.max_ratio;
    memset(w, 0, sizeof *w);
    w->rank = -1;
    if (bs.worst < 0)
        return CTXPAR_OK;
    const int64_t x = bs.worst, S = cpt_run_rows(cfg, i), D = tensor_dim(cfg, i);
    const int64_t H = (i == CPT_T_DK || i == CPT_T_DV) ? cfg->kv_heads : cfg->heads;
    if (i == CPT_T_LSE) {
        *w = (cpt_run_where){x / (H * S), x % S, x / S % H, 0, -1,
                             ((const float *)outs->t[i])[x], o->t[i][x], 0};
    } else {
        ctxpar_tensor t = global_view(cfg, outs->t[i], i);
        *w = (cpt_run_where){x / (S * H * D), x / (H * D) % S, x / D % H, x % D, -1, 0,
                             o->t[i][x], 0};
        w->got = cpt_test_get(&t, w->batch, w->position, w->head, w->dim);
    }
    w->bound = cpt_bound_elem(cfg->dtype, i == CPT_T_LSE, o->mag[i][x],
                                 o->mag16[i] ? o->mag16[i][x] : 0.0, o->t[i][x]);
    if (smp->rows) // a sampled row's global position
        w->position = smp->rows[w->position];
    if (replicated(full, i)) { // every rank held this row: none is to blame alone
        w->position += full->seq - S;
        return CTXPAR_OK;
    }
    cfg = full;
    int64_t *pos = malloc((size_t)cfg->seq * sizeof *pos);
    if (!pos)
        return CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "cannot allocate positions");
    ctxpar_status st = CTXPAR_OK;
    for (int r = 0; st == CTXPAR_OK && w->rank < 0 && r < cfg->ranks; r++) {
        st = ctxpar_positions_assigned(cfg->params.layout, cfg->params.assignment, cfg->seq, r,
                                       cfg->ranks, pos);
        const int64_t n = cpt_run_local_seq(cfg, r, cfg->ranks);
        for (int64_t s = 0; st == CTXPAR_OK && s < n; s++)
            if (pos[s] == w->position)
                w->rank = r;
    }
    free(pos);
    return st;
}

static int bitwise_equal(const cpt_run_config *cfg, const cpt_run_outputs *a,
                         const cpt_run_outputs *b, int i) {
    size_t es = i == CPT_T_LSE ? sizeof(float) : ctxpar_dtype_size(cfg->dtype);
    return cpt_bitwise_diff(a->t[i], b->t[i], global_count(cfg, i), es, NULL) == 0;
}

// dsinks ([heads] F32) against the oracle: its per-element bound (computed from the run's dtype,
// which its inputs had), and the P-rank error next to the P = 1 error.
static ctxpar_status evaluate_dsinks(const cpt_run_config *cfg, const cpt_run_outputs *single,
                                     const oracle_result *o, cpt_run_result *res) {
    res->has_dsinks = 1;
    res->dsinks_bound_ratio = res->dsinks_error = res->dsinks_error_1 = NAN;
    res->dsinks_ratio_ok = 1;
    if (!cfg->compare_oracle)
        return CTXPAR_OK;
    const size_t n = (size_t)cfg->heads;
    const int f32 = cfg->dtype == CTXPAR_DTYPE_F32;
    res->dsinks_bound_ratio =
        cpt_bound_check(res->outputs.dsinks, o->dsinks, o->mag_dsinks,
                        f32 ? NULL : o->mag16_dsinks, n, cfg->dtype, 0)
            .max_ratio;
    res->dsinks_error = cpt_compare_f32(res->outputs.dsinks, o->dsinks, n).rel;
    if (single && single->dsinks && cfg->ranks > 1) {
        res->dsinks_error_1 = cpt_compare_f32(single->dsinks, o->dsinks, n).rel;
        res->dsinks_ratio_ok = cpt_error_ratio_ok(res->dsinks_error, res->dsinks_error_1);
    }
    res->ok = res->ok && res->dsinks_bound_ratio <= 1.0 && res->dsinks_ratio_ok;
    return CTXPAR_OK;
}

// The comparison of cpt_run_evaluate on the judged rows: cfg's sizes are theirs (seq = n with
// a sample), outs and single hold them, full is the run's own configuration.
static ctxpar_status evaluate_rows(const cpt_run_config *full, const cpt_run_config *cfg,
                                  const cpt_run_outputs *outs, const cpt_run_outputs *single,
                                  cpt_run_result *res);

ctxpar_status cpt_run_evaluate(const cpt_run_config *cfg, const cpt_run_outputs *single,
                                  cpt_run_result *res) {
    if (!cfg->compare_oracle || cfg->rows <= 0 || cfg->rows >= cfg->seq)
        return evaluate_rows(cfg, cfg, &res->outputs, single, res);
    CTXPAR_CHECK(cpt_run_sample_rows(cfg, &res->sample));
    cpt_run_config cc = *cfg;
    cc.seq = res->sample.n;
    cpt_run_outputs outs = {{0}, NULL}, one = {{0}, NULL};
    ctxpar_status st = cpt_run_outputs_compact(cfg, &res->sample, &res->outputs, &outs);
    if (st == CTXPAR_OK && single)
        st = cpt_run_outputs_compact(cfg, &res->sample, single, &one);
    if (st == CTXPAR_OK)
        st = evaluate_rows(cfg, &cc, &outs, single ? &one : NULL, res);
    // Bits against P = 1: over every row, not only the judged ones.
    for (int i = 0; st == CTXPAR_OK && single && i < CPT_RUN_TENSORS; i++)
        if (res->has[i])
            res->bitwise_single[i] = bitwise_equal(cfg, &res->outputs, single, i);
    cpt_run_outputs_free(&outs);
    cpt_run_outputs_free(&one);
    if (st != CTXPAR_OK) // the caller frees only results it was given
        cpt_run_sample_free(&res->sample);
    return st;
}

static ctxpar_status evaluate_rows(const cpt_run_config *full, const cpt_run_config *cfg,
                                  const cpt_run_outputs *outs, const cpt_run_outputs *single,
                                  cpt_run_result *res) {
    oracle_result o;
    ctxpar_status st_dsinks;
    memset(&o, 0, sizeof o);
    if (cfg->compare_oracle && full->reference_from) {
        CTXPAR_CHECK(borrow_oracle(full, &res->sample, &o));
    } else if (cfg->compare_oracle) {
        const double t0 = ctxpar_now();
        CTXPAR_CHECK(run_oracle(full, &res->sample, &o));
        res->reference_time_s = ctxpar_now() - t0;
    }
    res->ok = res->status == CTXPAR_OK;
    for (int i = 0; i < CPT_RUN_TENSORS; i++) {
        res->has[i] = has_tensor(cfg, i);
        res->error[i] = res->row_error[i] = res->error_1[i] = res->ratio[i] =
            res->bound_ratio[i] = NAN;
        res->tolerance[i] = cpt_tolerance_for_seq(cfg->dtype, cpt_run_tensor_name(i),
                                                     full->seq);
        res->within_tol[i] = res->ratio_ok[i] = 1;
        if (!res->has[i])
            continue;
        if (single)
            res->bitwise_single[i] = bitwise_equal(cfg, outs, single, i);
        if (!cfg->compare_oracle)
            continue;
        res->error[i] = tensor_error(cfg, outs, i, o.t[i]);
        res->row_error[i] = tensor_row_error(cfg, outs, i, o.t[i]);
        ctxpar_status st = bound_verdict(full, cfg, &res->sample, outs, i, &o,
                                         &res->bound_ratio[i], &res->bound_worst[i]);
        if (st != CTXPAR_OK) {
            oracle_free(&o);
            return st;
        }
        res->within_tol[i] = res->bound_ratio[i] <= 1.0;
        // At P = 1 the single-rank run is the same computation: a ratio would compare a run with
        // itself (the bitwise check above covers reproducibility).
        if (single && cfg->ranks > 1) {
            res->error_1[i] = tensor_error(cfg, single, i, o.t[i]);
            res->ratio[i] = res->error_1[i] > 0 ? res->error[i] / res->error_1[i]
                                                : (res->error[i] > 0 ? INFINITY : 1.0);
            res->ratio_ok[i] = cpt_error_ratio_ok(res->error[i], res->error_1[i]);
        }
        res->ok = res->ok && res->within_tol[i] && res->ratio_ok[i];
    }
    if (has_dsinks(cfg) && (st_dsinks = evaluate_dsinks(cfg, single, &o, res)) != CTXPAR_OK) {
        oracle_free(&o);
        return st_dsinks;
    }
    if (cfg->keep_oracle && !o.borrowed) // handed over to the result
        for (int i = 0; i < CPT_RUN_TENSORS; i++) {
            res->oracle[i] = o.t[i];
            res->oracle_mag[i] = o.mag[i];
            res->oracle_mag16[i] = o.mag16[i];
            o.t[i] = o.mag[i] = o.mag16[i] = NULL;
        }
    if (cfg->keep_oracle && !o.borrowed) { // dsinks's too (NULL without sinks)
        res->oracle_dsinks[0] = o.dsinks;
        res->oracle_dsinks[1] = o.mag_dsinks;
        res->oracle_dsinks[2] = o.mag16_dsinks;
        o.dsinks = o.mag_dsinks = o.mag16_dsinks = NULL;
    }
    oracle_free(&o);
    return CTXPAR_OK;
}

ctxpar_status cpt_run_check_config(const cpt_run_config *cfg) {
    if (cfg->ranks < 1 || cfg->ranks > 1024)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "ranks (%d) must be in [1, 1024]", cfg->ranks);
    if (cfg->batch < 1 || cfg->seq < 1 || cfg->heads < 1 || cfg->kv_heads < 1 ||
        cfg->head_dim < 1 || cfg->head_dim_v < 0)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "batch, seq, heads, kv-heads and dim must "
                                                    "be >= 1 (v-dim >= 0)");
    if (cfg->heads % cfg->kv_heads != 0)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "heads (%lld) is not a multiple of kv-heads "
                                                    "(%lld)",
                            (long long)cfg->heads, (long long)cfg->kv_heads);
    if (cfg->repeat < 0 || cfg->warmup < 0)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "repeat (%d) and warmup (%d) must be >= 0",
                            cfg->repeat, cfg->warmup);
    if (cfg->inputs && (!cfg->inputs->q || !cfg->inputs->k || !cfg->inputs->v ||
                        (cfg->backward && !cfg->inputs->dout)))
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "inputs: q, k, v%s must be given",
                            cfg->backward ? " and dout" : "");
    if (cfg->params.q_len > 0 && (cfg->inputs || (cfg->rows > 0 && cfg->rows < cfg->seq)))
        return CTXPAR_ERROR(CTXPAR_ERR_NOT_SUPPORTED,
                            "q_len (%lld) is not supported yet with given inputs or sampled rows",
                            (long long)cfg->params.q_len);
    if (!cpt_run_backend_available(cfg->backend))
        return CTXPAR_ERROR(CTXPAR_ERR_NOT_SUPPORTED, "backend '%s' is not built into this binary",
                            cpt_run_backend_name(cfg->backend));
    return CTXPAR_OK;
}

ctxpar_status cpt_run_collect(const cpt_run_config *cfg, int ranks, cpt_run_outputs *g,
                                 cpt_run_result *res, double *time_out, double *time_fwd_out,
                                 size_t *peak_out) {
    cpt_rank_report *reports = calloc((size_t)ranks, sizeof *reports);
    if (!reports)
        return CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "cannot allocate rank reports");
    ctxpar_status st = cpt_run_outputs_alloc(cfg, g);
    if (st == CTXPAR_OK)
        st = cpt_run_threads(cfg, ranks, g, reports);
    *time_out = *time_fwd_out = 0;
    *peak_out = 0;
    for (int i = 0; st == CTXPAR_OK && i < ranks; i++) {
        cpt_rank_report *r = &reports[i];
        if (r->status != CTXPAR_OK && res->status == CTXPAR_OK) {
            res->status = r->status;
            snprintf(res->message, sizeof res->message, "%s", r->message);
        }
        if (r->time_s > *time_out)
            *time_out = r->time_s;
        if (r->time_fwd_s > *time_fwd_out)
            *time_fwd_out = r->time_fwd_s;
        res->time_min_s = fmax(res->time_min_s, r->time_min_s);
        res->time_max_s = fmax(res->time_max_s, r->time_max_s);
        res->time_fwd_min_s = fmax(res->time_fwd_min_s, r->time_fwd_min_s);
        res->time_fwd_max_s = fmax(res->time_fwd_max_s, r->time_fwd_max_s);
        if (r->stats.peak_bytes > *peak_out)
            *peak_out = r->stats.peak_bytes;
        if (ranks == cfg->ranks && i < 64)
            res->rank[i] = r->stats;
        if (i == 0)
            res->algo = r->algo;
        if (i == 0 && ranks == cfg->ranks)
            snprintf(res->device, sizeof res->device, "%s", r->device);
    }
    for (int i = 0; i < ranks; i++)
        cpt_rank_outputs_free(&reports[i].out);
    free(reports);
    return st;
}

cpt_run_config cpt_run_config_one_rank(const cpt_run_config *cfg) {
    cpt_run_config c1 = *cfg;
    c1.ranks = 1;
    c1.params.ulysses = 0; // one rank: a group of one (the hybrid's only choice)
    if (c1.params.layout == CTXPAR_LAYOUT_CUSTOM) {
        c1.params.layout = CTXPAR_LAYOUT_CONTIGUOUS;
        c1.params.assignment = NULL;
    }
    return c1;
}

ctxpar_status cpt_run_finish(const cpt_run_config *cfg, cpt_run_result *res) {
    cpt_run_outputs single = {{0}, NULL};
    ctxpar_status st = CTXPAR_OK;
    if (res->status == CTXPAR_OK && cfg->compare_single) {
        cpt_run_result r1;
        memset(&r1, 0, sizeof r1);
        cpt_run_config c1 = cpt_run_config_one_rank(cfg);
        c1.trace = NULL;
        double fwd_1;
        st = cpt_run_collect(&c1, 1, &single, &r1, &res->time_single_s, &fwd_1,
                                &res->single_rank_peak_bytes);
        if (st == CTXPAR_OK && r1.status != CTXPAR_OK) {
            res->status = r1.status;
            snprintf(res->message, sizeof res->message, "single rank: %.500s", r1.message);
        }
    }
    if (st == CTXPAR_OK && res->status == CTXPAR_OK)
        st = cpt_run_evaluate(cfg, cfg->compare_single ? &single : NULL, res);
    cpt_run_outputs_free(&single);
    return st;
}

ctxpar_status cpt_run(const cpt_run_config *cfg_in, cpt_run_result *res) {
    memset(res, 0, sizeof *res);
    CTXPAR_CHECK(cpt_run_check_config(cfg_in));
    cpt_run_config copy, *cfg = &copy;
    int32_t *cu = NULL;
    CTXPAR_CHECK(cpt_run_resolve_docs(cfg_in, &copy, &cu));
    ctxpar_status st = cpt_run_collect(cfg, cfg->ranks, &res->outputs, res, &res->time_s,
                                          &res->time_fwd_s, &res->peak_bytes_per_rank);
    if (st == CTXPAR_OK)
        st = cpt_run_finish(cfg, res);
    if (st != CTXPAR_OK) // the caller frees only results it was given
        cpt_run_outputs_free(&res->outputs);
    free(cu);
    return st;
}

void cpt_run_result_free(cpt_run_result *res) {
    cpt_run_outputs_free(&res->outputs);
    cpt_run_sample_free(&res->sample);
    for (int i = 0; i < CPT_RUN_TENSORS; i++) {
        free(res->oracle[i]);
        free(res->oracle_mag[i]);
        free(res->oracle_mag16[i]);
        res->oracle[i] = res->oracle_mag[i] = res->oracle_mag16[i] = NULL;
    }
    for (int i = 0; i < 3; i++) {
        free(res->oracle_dsinks[i]);
        res->oracle_dsinks[i] = NULL;
    }
}
