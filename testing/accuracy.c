/*
 * accuracy.c - one accuracy case: inputs drawn from a distribution, the library through the
 * runner, the fp64 oracle and naive float32 on the same (float) inputs, errors by tensor and by
 * position quartile.
 */
#include "testing/accuracy.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "reference/data.h"
#include "testing/naive_f32.h"
#include "reference/oracle.h"
#include "reference/reference.h"
#include "reference/tolerance.h"

const char *cpt_acc_dist_name(cpt_acc_dist dist) {
    static const char *const names[] = {"uniform01", "normal", "clamped", "sharp"};
    return (unsigned)dist < CPT_DIST_COUNT ? names[dist] : NULL;
}

// A standard normal value from two of the counter-based uniforms (Box-Muller).
static double normal(uint64_t seed, uint64_t id, uint64_t i) {
    double u1 = 0.5 - 0.5 * cpt_test_value(seed, id, 2 * i); // (0, 1]
    double u2 = 0.5 + 0.5 * cpt_test_value(seed, id, 2 * i + 1);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

float cpt_acc_input(cpt_acc_dist dist, int dout_ones, uint64_t seed, int id,
                       uint64_t i) {
    if (id == 4 && dout_ones)
        return 1.0f;
    switch (dist) {
    case CPT_DIST_UNIFORM01:
        return (float)(0.5 + 0.5 * cpt_test_value(seed, (uint64_t)id, i));
    case CPT_DIST_NORMAL:
        return (float)normal(seed, (uint64_t)id, i);
    case CPT_DIST_CLAMPED:
        return (float)fmax(-1.0, fmin(1.0, normal(seed, (uint64_t)id, i)));
    case CPT_DIST_SHARP:
        return (float)((id <= 2 ? 3.0 : 1.0) * normal(seed, (uint64_t)id, i));
    default:
        return NAN;
    }
}

typedef struct acc_bufs {
    float *in[4];              // q, k, v, dout
    double *in64[4];
    double *ref[CPT_RUN_TENSORS];
    double *mag[CPT_RUN_TENSORS];
    float *naive[CPT_RUN_TENSORS];
    uint8_t *vis;
} acc_bufs;

static void bufs_free(acc_bufs *b) {
    for (int i = 0; i < 4; i++) {
        free(b->in[i]);
        free(b->in64[i]);
    }
    for (int i = 0; i < CPT_RUN_TENSORS; i++) {
        free(b->ref[i]);
        free(b->mag[i]);
        free(b->naive[i]);
    }
    free(b->vis);
}

// Max error overall and by quartile of position s; the tensor is [B, S, H, D] (or lse [B, H, S]).
static void measure(const float *got, const double *ref, int64_t B, int64_t S, int64_t H,
                    int64_t D, int lse, double *err, double *quart) {
    *err = 0.0;
    for (int k = 0; k < CPT_ACC_QUARTILES; k++)
        quart[k] = 0.0;
    const int64_t n = B * S * H * D;
    for (int64_t x = 0; x < n; x++) {
        int64_t s = lse ? x % S : x / (H * D) % S;
        double e;
        if (isnan(got[x]) || isnan(ref[x]))
            e = INFINITY;
        else if (isinf(got[x]) || isinf(ref[x]))
            e = got[x] == ref[x] ? 0.0 : INFINITY;
        else
            e = fabs(got[x] - ref[x]);
        int k = (int)(s * CPT_ACC_QUARTILES / S);
        *err = fmax(*err, e);
        quart[k] = fmax(quart[k], e);
    }
}

ctxpar_status cpt_acc_run(const cpt_acc_case *c, cpt_acc_result *r) {
    memset(r, 0, sizeof *r);
    const cpt_run_config *rc = &c->run;
    if (rc->dtype != CTXPAR_DTYPE_F32 || (unsigned)c->dist >= CPT_DIST_COUNT)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "accuracy: F32 and a known distribution only");
    const int64_t B = rc->batch, S = rc->seq, H = rc->heads, Hk = rc->kv_heads, D = rc->head_dim;
    const size_t nq = (size_t)(B * S * H * D), nk = (size_t)(B * S * Hk * D);
    const size_t n_in[4] = {nq, nk, nk, nq};
    const size_t n_out[CPT_RUN_TENSORS] = {nq, (size_t)(B * H * S), nq, nk, nk};
    acc_bufs b;
    memset(&b, 0, sizeof b);
    ctxpar_status st = CTXPAR_OK;
    int ok = 1;
    for (int i = 0; i < 4; i++) {
        ok = ok && (b.in[i] = malloc(n_in[i] * sizeof(float))) &&
             (b.in64[i] = malloc(n_in[i] * sizeof(double)));
        for (size_t x = 0; ok && x < n_in[i]; x++)
            b.in64[i][x] = b.in[i][x] =
                cpt_acc_input(c->dist, c->dout_ones, rc->seed, i + 1, x);
    }
    for (int t = 0; t < CPT_RUN_TENSORS; t++)
        ok = ok && (b.ref[t] = malloc(n_out[t] * sizeof(double))) &&
             (b.mag[t] = malloc(n_out[t] * sizeof(double))) &&
             (b.naive[t] = malloc(n_out[t] * sizeof(float)));
    ok = ok && (b.vis = malloc((size_t)(S * S)));
    if (!ok) {
        bufs_free(&b);
        return CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "accuracy: buffers for seq %lld",
                            (long long)S);
    }
    // The library, through the runner as the tool runs it (no oracle, no P = 1 there).
    cpt_run_config cfg = *rc;
    cpt_run_inputs inputs = {b.in[0], b.in[1], b.in[2], b.in[3]};
    cfg.inputs = &inputs;
    cfg.compare_oracle = 0;
    cfg.compare_single = 0;
    cpt_run_result res;
    st = cpt_run(&cfg, &res);
    if (st == CTXPAR_OK && res.status != CTXPAR_OK)
        st = CTXPAR_ERROR(res.status, "accuracy: %s", res.message);
    if (st != CTXPAR_OK)
        goto done;
    // The oracle and naive float32, with the mask and the float scale the library resolves.
    cpt_oracle_shape sh = {B, S, S, H, Hk, D};
    ctxpar_mask_desc mask = cpt_oracle_mask(&rc->params);
    const float scale = rc->params.softmax_scale != 0.0f ? rc->params.softmax_scale
                                                         : 1.0f / sqrtf((float)D);
    st = cpt_oracle_visibility(&sh, NULL, NULL, &mask, b.vis);
    if (st != CTXPAR_OK)
        goto done;
    cpt_naive_f32_fwd(&sh, b.in[0], b.in[1], b.in[2], b.vis, scale, b.naive[0], b.naive[1]);
    if (rc->backward)
        cpt_naive_f32_bwd(&sh, b.in[0], b.in[1], b.in[2], b.vis, scale, b.naive[0], b.in[3],
                             b.naive[2], b.naive[3], b.naive[4]);
    // The fp64 reference and the bound's magnitudes, in one computation.
    const int bwd = rc->backward;
    cpt_ref_out ro = {{b.ref[0], b.ref[1], bwd ? b.ref[2] : NULL, bwd ? b.ref[3] : NULL,
                       bwd ? b.ref[4] : NULL},
                      {b.mag[0], b.mag[1], bwd ? b.mag[2] : NULL, bwd ? b.mag[3] : NULL,
                       bwd ? b.mag[4] : NULL},
                      {NULL},
                      NULL,
                      NULL,
                      NULL};
    st = cpt_reference(&sh, b.in64[0], b.in64[1], b.in64[2], bwd ? b.in64[3] : NULL, NULL, NULL,
                       &mask, NULL, scale, NULL, NULL, &ro);
    if (st != CTXPAR_OK)
        goto done;
    for (int t = 0; t < CPT_RUN_TENSORS; t++) {
        r->has[t] = res.outputs.t[t] != NULL;
        if (!r->has[t])
            continue;
        const int64_t heads = t >= CPT_T_DK ? Hk : H, dim = t == CPT_T_LSE ? 1 : D;
        measure(res.outputs.t[t], b.ref[t], B, S, heads, dim, t == CPT_T_LSE, &r->err[0][t],
                r->quart[0][t]);
        measure(b.naive[t], b.ref[t], B, S, heads, dim, t == CPT_T_LSE, &r->err[1][t],
                r->quart[1][t]);
        const float *got[2] = {res.outputs.t[t], b.naive[t]};
        for (int s = 0; s < 2; s++) {
            cpt_bound_stats bs = cpt_bound_check(got[s], b.ref[t], b.mag[t], NULL, n_out[t],
                                                       CTXPAR_DTYPE_F32, t == CPT_T_LSE);
            r->bound_ratio[s][t] = bs.max_ratio;
            r->bound_worst[s][t] = bs.worst;
        }
        for (size_t x = 0; x < n_out[t]; x++)
            if (isfinite(b.ref[t][x]))
                r->max_ref[t] = fmax(r->max_ref[t], fabs(b.ref[t][x]));
    }
done:
    cpt_run_result_free(&res); // cpt_run cleared it first: safe on every path
    bufs_free(&b);
    return st;
}
