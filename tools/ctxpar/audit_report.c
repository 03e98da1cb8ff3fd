// `ctxpar audit`: the verdict on results computed elsewhere, the output, and --save.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "audit.h"
#include "commands.h"
#include "ctxpar_backend.h"
#include "reference/metrics.h"
#include "reference/tolerance.h"

// dsinks ([heads], float32 whatever the run's dtype) by the bound the runner holds ctxpar's to.
static ctxpar_status judge_dsinks(const cpt_cli *cli, const cpt_audit_state *a,
                                  const cpt_run_result *r, cpt_audit_report *rep) {
    const cpt_run_config *c = &cli->cfg;
    double *const *o = r->oracle_dsinks;
    if (!o[0] || !o[1])
        return CTXPAR_ERROR(CTXPAR_ERR_INTERNAL, "no oracle for dsinks");
    const size_t n = (size_t)c->heads;
    const int f32 = c->dtype == CTXPAR_DTYPE_F32;
    cpt_bound_stats b = cpt_bound_check(a->dsinks, o[0], o[1], f32 ? NULL : o[2], n, c->dtype, 0);
    rep->has_dsinks = 1;
    rep->dsinks_bound_ratio = b.max_ratio;
    rep->dsinks_worst_head = (int64_t)b.worst;
    rep->dsinks_error = cpt_compare_f32(a->dsinks, o[0], n).rel;
    rep->dsinks_reference_error = r->dsinks_error;
    rep->dsinks_consistent =
        b.max_ratio <= 1.0 &&
        (cli->max_ratio <= 0 || rep->dsinks_error <= cli->max_ratio * r->dsinks_error);
    rep->consistent = rep->consistent && rep->dsinks_consistent;
    return CTXPAR_OK;
}

// The judged rows of a result read from --against: t's rows (positions smp->rows) into out,
// dims {B, n, H, D}, lse {B, H, n, 1}. t->data NULL when out of memory.
static void sample_tensor(const cpt_audit_tensor *t, int lse, const cpt_run_sample *smp,
                          cpt_audit_tensor *out) {
    *out = *t;
    ctxpar_dtype dt = CTXPAR_DTYPE_F32;
    cpt_dtype_of_npy(t->dtype, &dt);
    const size_t es = lse ? sizeof(float) : ctxpar_dtype_size(dt);
    const int64_t outer = lse ? t->dims[0] * t->dims[1] : t->dims[0];
    const int64_t S = lse ? t->dims[2] : t->dims[1], n = smp->n;
    const size_t row = (size_t)(lse ? 1 : t->dims[2] * t->dims[3]) * es;
    out->dims[lse ? 2 : 1] = n;
    out->data = malloc((size_t)(outer * n) * row + 1);
    for (int64_t o = 0; out->data && o < outer; o++)
        for (int64_t x = 0; x < n; x++)
            memcpy((char *)out->data + (size_t)(o * n + x) * row,
                   (const char *)t->data + (size_t)(o * S + smp->rows[x]) * row, row);
}

// Judges res[i] (global tensors; data NULL: not given) against r's oracle, owners by lay.
static ctxpar_status judge_tensors(const cpt_cli *cli, const cpt_audit_layout *lay,
                                   const cpt_audit_tensor *res, const cpt_run_result *r,
                                   int heat_cols, cpt_audit_report *rep) {
    const cpt_run_config *c = &cli->cfg;
    memset(rep, 0, sizeof *rep);
    int *owner = malloc((size_t)c->seq * sizeof *owner);
    if (!owner)
        return CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "cannot allocate %lld owners",
                            (long long)c->seq);
    ctxpar_status st = cpt_audit_owners(lay, c->seq, owner);
    cpt_audit_bound bound = {cli->max_ratio, heat_cols, c->seq};
    const cpt_run_sample *smp = &r->sample; // --rows: the oracle holds the judged rows only
    for (int64_t x = 0; smp->rows && x < smp->n; x++)
        owner[x] = owner[smp->rows[x]]; // rows are sorted: x <= rows[x]
    rep->consistent = 1;
    for (int i = 0; st == CTXPAR_OK && i < CPT_RUN_TENSORS; i++) {
        cpt_audit_tensor sampled;
        const cpt_audit_tensor *t = &res[i];
        if (!t->data)
            continue;
        if (smp->rows) {
            sample_tensor(t, i == CPT_T_LSE, smp, &sampled);
            if (!sampled.data) {
                st = CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "cannot sample %s",
                                  cpt_run_tensor_name((cpt_run_tensor)i));
                break;
            }
            t = &sampled;
        }
        if (!r->oracle[i] || !r->oracle_mag[i] || !r->oracle_mag16[i]) {
            st = CTXPAR_ERROR(CTXPAR_ERR_INTERNAL, "no oracle for %s",
                              cpt_run_tensor_name((cpt_run_tensor)i));
            break;
        }
        ctxpar_dtype dt = CTXPAR_DTYPE_F32;
        cpt_dtype_of_npy(t->dtype, &dt);
        ctxpar_tensor got =
            ctxpar_tensor_bshd(t->data, dt, t->dims[0], t->dims[1], t->dims[2], t->dims[3]);
        int lse = i == CPT_T_LSE;
        st = cpt_audit_judge(lse ? NULL : &got, lse ? t->data : NULL, t->dims, r->oracle[i],
                             r->oracle_mag[i], r->oracle_mag16[i], r->error[i], owner, smp->rows,
                             c->ranks, &bound, &rep->v[i]);
        rep->failing_elements += rep->v[i].failing_elements;
        if (smp->rows)
            free(sampled.data);
        rep->consistent = rep->consistent && rep->v[i].consistent;
    }
    rep->judged = st == CTXPAR_OK;
    free(owner);
    return st;
}

// A wrong mask fails the first row (causal: it sees only itself) and most rows after it;
// a bug of the algorithm fails some ranks' rows, seldom the first and half of them at once.
static int looks_like_mask_mismatch(const cpt_cli *cli, const cpt_run_result *r,
                                    const cpt_audit_verdict *out) {
    const int64_t rows =
        r->sample.rows ? r->sample.n * cli->cfg.batch : cli->cfg.seq * cli->cfg.batch;
    return out->ranks && !out->consistent && out->n_ranges && out->ranges[0].first == 0 &&
           2 * out->failing_rows >= rows;
}

ctxpar_status cpt_audit_judge_all(const cpt_cli *cli, const cpt_audit_state *a,
                                  const cpt_run_result *r, int heat_cols, cpt_audit_report *rep) {
    ctxpar_status st = judge_tensors(cli, &a->lay, a->res, r, heat_cols, rep);
    if (st == CTXPAR_OK && a->dsinks)
        st = judge_dsinks(cli, a, r, rep);
    rep->judged = st == CTXPAR_OK;
    rep->mask_hint = rep->judged && looks_like_mask_mismatch(cli, r, &rep->v[CPT_T_OUT]);
    return st;
}

ctxpar_status cpt_audit_judge_own(const cpt_cli *cli, const cpt_audit_layout *lay,
                                  const cpt_run_result *r, int heat_cols, cpt_audit_report *rep) {
    const cpt_run_config *c = &cli->cfg;
    cpt_audit_tensor own[CPT_RUN_TENSORS];
    memset(own, 0, sizeof own);
    for (int i = 0; i < CPT_RUN_TENSORS; i++) {
        const int lse = i == CPT_T_LSE, kv = i == CPT_T_DK || i == CPT_T_DV;
        const int64_t heads = kv ? c->kv_heads : c->heads;
        const int64_t d = i == CPT_T_OUT || i == CPT_T_DV ? cpt_run_dim_v(c) : c->head_dim;
        const int64_t dims[4] = {c->batch, lse ? c->heads : c->seq, lse ? c->seq : heads,
                                 lse ? 1 : d};
        own[i].data = r->outputs.t[i];
        own[i].dtype = cpt_npy_of_dtype(lse ? CTXPAR_DTYPE_F32 : c->dtype);
        memcpy(own[i].dims, dims, sizeof dims);
    }
    return judge_tensors(cli, lay, own, r, heat_cols, rep);
}

void cpt_audit_report_free(cpt_audit_report *rep) {
    for (int i = 0; i < CPT_RUN_TENSORS; i++)
        cpt_audit_verdict_free(&rep->v[i]);
}

/* ---------------------------------------------------------------- --save */

ctxpar_status cpt_audit_save(const cpt_cli *cli, const cpt_audit_state *a,
                                const cpt_run_result *r) {
    const cpt_run_config *c = &cli->cfg;
    cpt_audit_tensor t[CPT_RUN_TENSORS];
    const char *names[CPT_RUN_TENSORS];
    int lse[CPT_RUN_TENSORS], n = 0;
    ctxpar_status st = CTXPAR_OK;
    memset(t, 0, sizeof t);
    for (int i = 0; st == CTXPAR_OK && i < CPT_RUN_TENSORS; i++) {
        if (!r->outputs.t[i])
            continue;
        int64_t heads = i == CPT_T_DK || i == CPT_T_DV ? c->kv_heads : c->heads;
        int64_t d[4] = {c->batch, c->seq, heads,
                        i == CPT_T_OUT || i == CPT_T_DV ? cpt_run_dim_v(c) : c->head_dim};
        lse[n] = i == CPT_T_LSE;
        if (lse[n])
            d[1] = c->heads, d[2] = c->seq, d[3] = 1;
        memcpy(t[n].dims, d, sizeof d);
        names[n] = cpt_run_tensor_name((cpt_run_tensor)i);
        size_t count = (size_t)(d[0] * d[1] * d[2] * d[3]);
        // ctxpar's lse is float; the others go back to the inputs' dtype.
        ctxpar_dtype to = lse[n] ? CTXPAR_DTYPE_F32 : a->file_dtype;
        t[n].dtype = cpt_npy_of_dtype(to);
        t[n].data = malloc(count * ctxpar_dtype_size(to) + 1);
        if (!t[n].data) {
            st = CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "cannot allocate %zu elements", count);
            break;
        }
        if (lse[n]) {
            memcpy(t[n].data, r->outputs.t[i], count * sizeof(float));
        } else {
            ctxpar_tensor s = ctxpar_tensor_bshd(r->outputs.t[i], c->dtype, d[0], d[1], d[2], d[3]);
            ctxpar_tensor o = ctxpar_tensor_bshd(t[n].data, to, d[0], d[1], d[2], d[3]);
            cpt_tensor_copy(&s, &o);
        }
        n++;
    }
    if (st == CTXPAR_OK)
        st = cpt_audit_write(a->like, cli->save_dir, n, names, t, lse, &a->lay);
    if (st == CTXPAR_OK && r->outputs.dsinks) { // float32 [heads], however the rest is stored
        char path[4096];
        int64_t shape[1] = {c->heads};
        if (snprintf(path, sizeof path, "%s/dsinks.npy", cli->save_dir) >= (int)sizeof path)
            st = CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "%s: path too long", cli->save_dir);
        else
            st = cpt_npy_write(path, CPT_NPY_F32, 1, shape, r->outputs.dsinks);
    }
    for (int i = 0; i < CPT_RUN_TENSORS; i++)
        free(t[i].data);
    return st;
}

/* ---------------------------------------------------------------- output */

static const char *against_name(const cpt_cli *cli) {
    return cli->against_path ? cli->against_path : cli->shards_pattern;
}

// "512-639 (rank 3)" or "512-1023 (ranks 3-0)": a run of failing rows.
static void print_range(FILE *f, const cpt_audit_range *r) {
    fprintf(f, "%lld", (long long)r->first);
    if (r->last != r->first)
        fprintf(f, "-%lld", (long long)r->last);
    if (r->rank_first == r->rank_last)
        fprintf(f, " (rank %d)", r->rank_first);
    else
        fprintf(f, " (ranks %d-%d)", r->rank_first, r->rank_last);
}

// The verdict on the results judged: always the last line of an audit with --against.
static void print_verdict(FILE *f, const cpt_cli *cli, const cpt_run_result *r,
                          const cpt_audit_report *rep) {
    fprintf(f, "\nverdict on %s: %s", against_name(cli),
            rep->consistent ? "CONSISTENT" : "NOT CONSISTENT");
    if (rep->consistent) {
        fprintf(f, ": every element judged%s is within its bound%s\n",
                r->sample.rows ? " (the sampled rows)" : "",
                cli->max_ratio > 0 ? " and each error within the --max-ratio" : "");
        return;
    }
    int64_t rows = 0, worst_t = -1;
    for (int i = 0; i < CPT_RUN_TENSORS; i++) {
        const cpt_audit_verdict *v = &rep->v[i];
        rows += v->failing_rows;
        if (v->ranks && v->n_worst && !v->consistent &&
            (worst_t < 0 || v->worst[0].bound_ratio > rep->v[worst_t].worst[0].bound_ratio))
            worst_t = i;
    }
    fprintf(f, ": %lld elements in %lld rows out of their bound", (long long)rep->failing_elements,
            (long long)rows);
    if (worst_t >= 0) {
        const cpt_audit_row *w = &rep->v[worst_t].worst[0];
        fprintf(f, "; worst: %s at position %lld, head %lld, rank %d (error/bound %.3g)",
                cpt_run_tensor_name((cpt_run_tensor)worst_t), (long long)w->position,
                (long long)w->head, w->rank, w->bound_ratio);
    } else if (rep->has_dsinks && !rep->dsinks_consistent) {
        fprintf(f, "; dsinks at head %lld (error/bound %.3g)", (long long)rep->dsinks_worst_head,
                rep->dsinks_bound_ratio);
    } else if (cli->max_ratio > 0) {
        fprintf(f, "; an error above --max-ratio %g x ctxpar's own", cli->max_ratio);
    }
    fputc('\n', f);
    if (rep->mask_hint)
        fprintf(f, "hint: %s\n", CPT_AUDIT_MASK_HINT);
}

static void print_table(FILE *f, const cpt_cli *cli, const cpt_audit_report *rep) {
    fprintf(f, "\nresults in %s, each element against its bound (error/bound <= 1", against_name(cli));
    if (cli->max_ratio > 0)
        fprintf(f, "; each error at most %g x ctxpar's own", cli->max_ratio);
    fprintf(f, ")\n  %-6s %-12s %-14s %-9s %-11s %-20s %s\n", "tensor", "error", "ctxpar error",
            "ratio", "error/bound", "out of bound", "worst rows (position, head, rank: error/bound)");
    for (int i = 0; i < CPT_RUN_TENSORS; i++) {
        const cpt_audit_verdict *v = &rep->v[i];
        if (!v->ranks)
            continue;
        char out[48];
        snprintf(out, sizeof out, "%lld el, %lld rows", (long long)v->failing_elements,
                 (long long)v->failing_rows);
        fprintf(f, "  %-6s %-12.3e %-14.3e %-9.3g %-11.3g %-20s", cpt_run_tensor_name((cpt_run_tensor)i),
                v->error, v->reference_error, v->ratio, v->bound_ratio, out);
        for (int w = 0; w < v->n_worst && w < 3; w++)
            fprintf(f, "%s%lld, %lld, %d: %.3g", w ? "; " : " ", (long long)v->worst[w].position,
                    (long long)v->worst[w].head, v->worst[w].rank, v->worst[w].bound_ratio);
        fprintf(f, "  %s\n", v->consistent ? "ok" : "NOT CONSISTENT");
        if (v->n_ranges) {
            fprintf(f, "         failing rows:");
            for (int k = 0; k < v->n_ranges; k++) {
                fputs(k ? ", " : " ", f);
                print_range(f, &v->ranges[k]);
            }
            if (v->more_ranges)
                fprintf(f, " and %lld more runs", (long long)v->more_ranges);
            fputc('\n', f);
        }
        if (!v->consistent) {
            fprintf(f, "         error/bound by rank:");
            for (int k = 0; k < v->ranks; k++)
                fprintf(f, " %d: %.3g", k, v->rank_bound_ratio[k]);
            fprintf(f, "\n         error by rank:");
            for (int k = 0; k < v->ranks; k++)
                fprintf(f, " %d: %.2e", k, v->rank_error[k]);
            fputc('\n', f);
        }
    }
    if (rep->has_dsinks)
        fprintf(f, "  %-6s %-12.3e %-14.3e %-9.3g %-11.3g head %lld  %s\n", "dsinks",
                rep->dsinks_error, rep->dsinks_reference_error,
                rep->dsinks_error / rep->dsinks_reference_error, rep->dsinks_bound_ratio,
                (long long)rep->dsinks_worst_head,
                rep->dsinks_consistent ? "ok" : "NOT CONSISTENT");
}

static void print_row_json(FILE *f, const cpt_audit_row *w) {
    fprintf(f, "{\"position\":%lld,\"head\":%lld,\"rank\":%d,\"batch\":%lld,\"error\":",
            (long long)w->position, (long long)w->head, w->rank, (long long)w->batch);
    cpt_json_num(f, w->error);
    fputs(",\"bound_ratio\":", f);
    cpt_json_num(f, w->bound_ratio);
    fputs(",\"got\":", f);
    cpt_json_num(f, w->got);
    fputs(",\"expected\":", f);
    cpt_json_num(f, w->want);
    fputc('}', f);
}

static void print_against_json(FILE *f, const cpt_cli *cli, const cpt_audit_report *rep) {
    int64_t rows = 0;
    for (int i = 0; i < CPT_RUN_TENSORS; i++)
        rows += rep->v[i].failing_rows;
    fprintf(f,
            ",\"consistent\":%s,\"verdict\":\"per-element bound\",\"failing_elements\":%lld,"
            "\"failing_rows\":%lld,\"max_ratio\":",
            rep->consistent ? "true" : "false", (long long)rep->failing_elements,
            (long long)rows);
    if (cli->max_ratio > 0)
        cpt_json_num(f, cli->max_ratio);
    else
        fputs("null", f);
    if (rep->mask_hint)
        fputs(",\"hint\":\"" CPT_AUDIT_MASK_HINT "\"", f);
    fputs(",\"against\":{", f);
    for (int i = 0, first = 1; i < CPT_RUN_TENSORS; i++) {
        const cpt_audit_verdict *v = &rep->v[i];
        if (!v->ranks)
            continue;
        fprintf(f, "%s\"%s\":{\"error\":", first ? "" : ",",
                cpt_run_tensor_name((cpt_run_tensor)i));
        first = 0;
        cpt_json_num(f, v->error);
        fputs(",\"reference_error\":", f);
        cpt_json_num(f, v->reference_error);
        fputs(",\"ratio\":", f);
        cpt_json_num(f, v->ratio);
        fputs(",\"bound_ratio\":", f);
        cpt_json_num(f, v->bound_ratio);
        fprintf(f,
                ",\"consistent\":%s,\"nonfinite\":%lld,\"failing_elements\":%lld,"
                "\"failing_rows\":%lld,\"failing_ranges\":[",
                v->consistent ? "true" : "false", (long long)v->nonfinite,
                (long long)v->failing_elements, (long long)v->failing_rows);
        for (int k = 0; k < v->n_ranges; k++)
            fprintf(f, "%s{\"batch\":%lld,\"first\":%lld,\"last\":%lld,\"rank_first\":%d,"
                       "\"rank_last\":%d}",
                    k ? "," : "", (long long)v->ranges[k].batch, (long long)v->ranges[k].first,
                    (long long)v->ranges[k].last, v->ranges[k].rank_first,
                    v->ranges[k].rank_last);
        fprintf(f, "],\"more_failing_ranges\":%lld,\"worst\":", (long long)v->more_ranges);
        if (v->n_worst)
            print_row_json(f, &v->worst[0]);
        else
            fputs("null", f);
        fputs(",\"worst_rows\":[", f);
        for (int w = 0; w < v->n_worst; w++) {
            fputs(w ? "," : "", f);
            print_row_json(f, &v->worst[w]);
        }
        fputs("],\"error_by_rank\":[", f);
        for (int k = 0; k < v->ranks; k++) {
            fputs(k ? "," : "", f);
            cpt_json_num(f, v->rank_error[k]);
        }
        fputs("],\"bound_ratio_by_rank\":[", f);
        for (int k = 0; k < v->ranks; k++) {
            fputs(k ? "," : "", f);
            cpt_json_num(f, v->rank_bound_ratio[k]);
        }
        fputs("]}", f);
    }
    if (rep->has_dsinks) {
        fputs(",\"dsinks\":{\"error\":", f);
        cpt_json_num(f, rep->dsinks_error);
        fputs(",\"reference_error\":", f);
        cpt_json_num(f, rep->dsinks_reference_error);
        fputs(",\"ratio\":", f);
        cpt_json_num(f, rep->dsinks_error / rep->dsinks_reference_error);
        fputs(",\"bound_ratio\":", f);
        cpt_json_num(f, rep->dsinks_bound_ratio);
        fprintf(f, ",\"worst_head\":%lld,\"consistent\":%s}", (long long)rep->dsinks_worst_head,
                rep->dsinks_consistent ? "true" : "false");
    }
    fputc('}', f);
}

static void print_json(FILE *f, const cpt_cli *cli, const cpt_run_result *r,
                       const cpt_audit_report *rep, const char *saved) {
    fputc('{', f);
    cpt_report_json_members(f, &cli->cfg, r);
    const char *paths[8] = {cli->inputs_path,    cli->q_path,      cli->k_path,
                            cli->v_path,         cli->dout_path,   cli->cu_seqlens_path,
                            cli->shards_pattern, cli->against_path};
    static const char *const keys[8] = {"file", "q",          "k",      "v",
                                        "dout", "cu_seqlens", "shards", "against"};
    fputs(",\"inputs\":{", f);
    for (int i = 0, first = 1; i < 8; i++) {
        if (!paths[i])
            continue;
        fprintf(f, "%s\"%s\":", first ? "" : ",", keys[i]);
        cpt_json_string(f, paths[i]);
        first = 0;
    }
    fputs("},\"saved_to\":", f);
    if (saved)
        cpt_json_string(f, saved);
    else
        fputs("null", f);
    if (rep->judged)
        print_against_json(f, cli, rep);
    fputs("}\n", f);
}

void cpt_audit_print(FILE *f, const cpt_cli *cli, const cpt_audit_state *a,
                        const cpt_run_result *r, const cpt_audit_report *rep,
                        const char *saved) {
    if (cli->json) {
        print_json(f, cli, r, rep, saved);
        return;
    }
    if (r->status != CTXPAR_OK)
        return;
    cpt_report_table(f, "audit", &cli->cfg, r, rep->judged);
    if (rep->judged)
        print_table(f, cli, rep);
    if (saved && a->like->kind == CPT_AUDIT_SRC_SAFETENSORS)
        fprintf(f, "  saved out, lse%s to %s/cpt_results.safetensors\n",
                cli->cfg.backward ? ", dq, dk, dv" : "", saved);
    else if (saved && a->like->kind == CPT_AUDIT_SRC_SHARDS)
        fprintf(f, "  saved out, lse%s to %s, one file per rank\n",
                cli->cfg.backward ? ", dq, dk, dv" : "", saved);
    else if (saved)
        fprintf(f, "  saved out.npy, lse.npy%s to %s\n",
                cli->cfg.backward ? ", dq.npy, dk.npy, dv.npy" : "", saved);
    if (saved && r->outputs.dsinks)
        fprintf(f, "  saved dsinks.npy to %s\n", saved);
    if (rep->judged)
        print_verdict(f, cli, r, rep);
}
