// The verdict of `ctxpar audit --against` on one tensor (see audit_judge.h).
#include "tools/ctxpar/audit_judge.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ctxpar_backend.h"
#include "reference/data.h"
#include "reference/metrics.h"
#include "reference/tolerance.h"

int cpt_audit_within_bound(const cpt_audit_verdict *v, const cpt_audit_bound *bound) {
    return isfinite(v->error) && v->bound_ratio <= 1.0 &&
           (!(bound->max_ratio > 0) || v->ratio <= bound->max_ratio);
}

void cpt_audit_verdict_free(cpt_audit_verdict *v) {
    free(v->rank_error);
    free(v->rank_bound_ratio);
    free(v->heat);
    memset(v, 0, sizeof *v);
}

// Keeps row in the list of the worst rows (sorted by error/bound, worst first).
static void keep_worst(cpt_audit_verdict *v, const cpt_audit_row *row) {
    if (!(row->bound_ratio > 0) && !isnan(row->bound_ratio))
        return;
    int n = v->n_worst, at = n;
    while (at > 0 && !(v->worst[at - 1].bound_ratio >= row->bound_ratio))
        at--;
    if (at >= CPT_AUDIT_WORST_ROWS)
        return;
    if (n == CPT_AUDIT_WORST_ROWS)
        n--;
    memmove(&v->worst[at + 1], &v->worst[at], (size_t)(n - at) * sizeof *row);
    v->worst[at] = *row;
    v->n_worst = n + 1;
}

static double worse(double a, double b) {
    return isnan(a) || isnan(b) ? INFINITY : fmax(a, b);
}

// A failing row extends the run of failing rows that ended on the row before it (`slot` counts
// rows in judging order; a run does not cross batch rows), or starts one: listed while there is
// room, then only counted.
static void extend_ranges(cpt_audit_verdict *v, const cpt_audit_row *row, int64_t failing,
                          int64_t slot, int64_t *last_slot) {
    cpt_audit_range *r = v->n_ranges > 0 && !v->more_ranges ? &v->ranges[v->n_ranges - 1] : NULL;
    const int joins = *last_slot == slot - 1;
    *last_slot = slot;
    if (joins && r && r->batch == row->batch) {
        r->last = row->position;
        r->rank_last = row->rank;
        r->elements += failing;
    } else if (joins && !r && v->more_ranges) {
        // a run past the list goes on
    } else if (v->n_ranges < CPT_AUDIT_RANGES && !v->more_ranges) {
        v->ranges[v->n_ranges++] = (cpt_audit_range){row->batch, row->position, row->position,
                                                     row->rank,  row->rank,     failing};
    } else {
        v->more_ranges++;
    }
}

// The heat map's grid (bound->heat_cols > 0): columns of whole buckets over the positions.
static ctxpar_status heat_alloc(cpt_audit_verdict *v, const cpt_audit_bound *bound, int64_t seq,
                                int64_t heads) {
    if (bound->heat_cols <= 0)
        return CTXPAR_OK;
    const int64_t span = bound->heat_seq > 0 ? bound->heat_seq : seq;
    v->heat_bucket = (span + bound->heat_cols - 1) / bound->heat_cols;
    v->heat_cols = (int)((span + v->heat_bucket - 1) / v->heat_bucket);
    v->heat_heads = (int)heads;
    v->heat = malloc((size_t)(v->heat_cols * heads) * sizeof *v->heat);
    if (!v->heat)
        return CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "cannot allocate a %d x %lld heat map",
                            v->heat_cols, (long long)heads);
    for (int64_t i = 0; i < v->heat_cols * heads; i++)
        v->heat[i] = -1.0;
    return CTXPAR_OK;
}

static void heat_add(cpt_audit_verdict *v, int64_t position, int64_t head, double ratio) {
    double *cell = &v->heat[head * v->heat_cols + position / v->heat_bucket];
    *cell = *cell < 0 ? (isnan(ratio) ? INFINITY : ratio) : worse(*cell, ratio);
}

// Each head's error/bound in one row of H heads (dense ref, mag, mag16 of the row) into the map.
static void heat_row(cpt_audit_verdict *v, const ctxpar_tensor *row, int64_t position,
                     const double *ref, const double *mag, const double *mag16) {
    const int64_t H = row->shape[2], D = row->shape[3];
    for (int64_t h = 0; h < H; h++) {
        ctxpar_tensor one = *row;
        one.shape[2] = 1;
        one.data = (char *)row->data + h * row->stride[2] * (int64_t)ctxpar_dtype_size(row->dtype);
        cpt_bound_stats bs =
            cpt_bound_check_tensor(&one, ref + h * D, mag + h * D, mag16 ? mag16 + h * D : NULL);
        heat_add(v, position, h, bs.max_ratio);
    }
}

static void account(cpt_audit_verdict *v, cpt_audit_row *row, double max_abs,
                    double max_ref) {
    row->error = max_ref > 0 ? max_abs / max_ref : max_abs;
    v->rank_error[row->rank] = worse(v->rank_error[row->rank], row->error);
    v->rank_bound_ratio[row->rank] = worse(v->rank_bound_ratio[row->rank], row->bound_ratio);
    v->bound_ratio = worse(v->bound_ratio, row->bound_ratio);
    keep_worst(v, row);
}

ctxpar_status cpt_audit_judge(const ctxpar_tensor *got, const float *got_lse,
                                 const int64_t dims[4], const double *ref, const double *mag,
                                 const double *mag16, double reference_error, const int *owner,
                                 const int64_t *position, int ranks,
                                 const cpt_audit_bound *bound, cpt_audit_verdict *v) {
    memset(v, 0, sizeof *v);
    v->ranks = ranks;
    v->rank_error = calloc((size_t)ranks, sizeof *v->rank_error);
    v->rank_bound_ratio = calloc((size_t)ranks, sizeof *v->rank_bound_ratio);
    if (!v->rank_error || !v->rank_bound_ratio) {
        cpt_audit_verdict_free(v);
        return CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "cannot allocate %d rank errors", ranks);
    }
    ctxpar_status st = heat_alloc(v, bound, got ? dims[1] : dims[2], got ? dims[2] : dims[1]);
    if (st != CTXPAR_OK) {
        cpt_audit_verdict_free(v);
        return st;
    }
    const int64_t B = dims[0], n = dims[0] * dims[1] * dims[2] * dims[3];
    cpt_error_stats all =
        got ? cpt_compare_tensor(got, ref) : cpt_compare_f32(got_lse, ref, (size_t)n);
    v->error = all.rel;
    v->nonfinite = all.nonfinite;
    int64_t last_fail = -2;
    if (got) { // rows of H * D elements: one position, every head
        const int64_t S = dims[1], H = dims[2], D = dims[3];
        for (int64_t b = 0; b < B; b++)
            for (int64_t s = 0; s < S; s++) {
                int64_t off = (b * S + s) * H * D;
                ctxpar_tensor row = *got;
                row.data = (char *)got->data + (b * got->stride[0] + s * got->stride[1]) *
                                                   (int64_t)ctxpar_dtype_size(got->dtype);
                row.shape[0] = row.shape[1] = 1;
                cpt_error_stats e = cpt_compare_tensor(&row, ref + off);
                cpt_bound_stats bs = cpt_bound_check_tensor(&row, ref + off, mag + off, mag16 + off);
                int64_t w = bs.worst < 0 ? 0 : bs.worst;
                cpt_audit_row r = {b, position ? position[s] : s, w / D, owner[s], 0,
                                   bs.max_ratio, 0, ref[off + w]};
                r.got = cpt_test_get(&row, 0, 0, w / D, w % D);
                account(v, &r, e.nonfinite ? INFINITY : e.max_abs, all.max_ref);
                v->failing_elements += bs.failing;
                if (bs.failing) {
                    v->failing_rows++;
                    extend_ranges(v, &r, bs.failing, b * S + s, &last_fail);
                }
                if (v->heat)
                    heat_row(v, &row, r.position, ref + off, mag + off, mag16 ? mag16 + off : NULL);
            }
    } else { // [B, H, S]: one value per row
        const int64_t H = dims[1], S = dims[2];
        for (int64_t b = 0; b < B; b++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t s = 0; s < S; s++) {
                    int64_t i = (b * H + h) * S + s;
                    cpt_error_stats e = cpt_compare_f32(got_lse + i, ref + i, 1);
                    double br = cpt_bound_ratio(got_lse[i], ref[i], mag[i], 0.0, CTXPAR_DTYPE_F32, 1);
                    cpt_audit_row r = {b,  position ? position[s] : s, h, owner[s], 0, br,
                                       got_lse[i], ref[i]};
                    account(v, &r, e.nonfinite ? INFINITY : e.max_abs, all.max_ref);
                    if (!(br <= 1.0)) {
                        v->failing_elements++;
                        v->failing_rows++;
                        extend_ranges(v, &r, 1, (b * H + h) * S + s, &last_fail);
                    }
                    if (v->heat)
                        heat_add(v, r.position, h, br);
                }
    }
    // Once a row fails, the passing ones are no longer among the worst worth naming.
    while (v->failing_rows && v->n_worst > 0 && v->worst[v->n_worst - 1].bound_ratio <= 1.0)
        v->n_worst--;
    v->reference_error = reference_error;
    v->ratio = reference_error > 0 ? v->error / reference_error : (v->error > 0 ? INFINITY : 1.0);
    v->consistent = cpt_audit_within_bound(v, bound);
    return CTXPAR_OK;
}
