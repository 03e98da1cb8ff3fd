// The correctness report that check and audit print (and bench with --check): a table for people,
// JSON members for machines.
#include <math.h>
#include <string.h>

#include "commands.h"

static void json_map(FILE *f, const char *key, const cpt_run_result *r, int what) {
    fprintf(f, "\"%s\":{", key);
    int first = 1;
    for (int i = 0; i < CPT_RUN_TENSORS; i++) {
        if (!r->has[i])
            continue;
        fprintf(f, "%s\"%s\":", first ? "" : ",", cpt_run_tensor_name((cpt_run_tensor)i));
        first = 0;
        if (what == 0)
            cpt_json_num(f, r->error[i]);
        else if (what == 6)
            cpt_json_num(f, r->row_error[i]);
        else if (what == 1)
            cpt_json_num(f, r->ratio[i]);
        else if (what == 2)
            cpt_json_num(f, r->tolerance[i]);
        else if (what == 4)
            cpt_json_num(f, r->bound_ratio[i]);
        else if (what == 5) {
            const cpt_run_where *w = &r->bound_worst[i];
            fprintf(f, "{\"position\":%lld,\"head\":%lld,\"rank\":%d,\"batch\":%lld,\"dim\":%lld,"
                       "\"got\":",
                    (long long)w->position, (long long)w->head, w->rank, (long long)w->batch,
                    (long long)w->dim);
            cpt_json_num(f, w->got);
            fputs(",\"expected\":", f);
            cpt_json_num(f, w->ref);
            fputs(",\"bound\":", f);
            cpt_json_num(f, w->bound);
            fputc('}', f);
        } else
            fprintf(f, "%s", r->bitwise_single[i] ? "true" : "false");
    }
    fprintf(f, "}");
}

void cpt_report_json_errors(FILE *f, const cpt_run_result *r) {
    json_map(f, "errors", r, 0);
    fputc(',', f);
    json_map(f, "row_errors", r, 6);
    fputc(',', f);
    json_map(f, "error_ratio", r, 1);
    fputc(',', f);
    json_map(f, "tolerance", r, 2);
    fputc(',', f);
    json_map(f, "bound_ratio", r, 4);
    fputc(',', f);
    json_map(f, "bound_worst", r, 5);
    fputc(',', f);
    json_map(f, "bitwise_equal_single_rank", r, 3);
    if (r->has_dsinks) {
        fputs(",\"dsinks\":{\"error\":", f);
        cpt_json_num(f, r->dsinks_error);
        fputs(",\"error_1\":", f);
        cpt_json_num(f, r->dsinks_error_1);
        fputs(",\"bound_ratio\":", f);
        cpt_json_num(f, r->dsinks_bound_ratio);
        fprintf(f, ",\"ratio_ok\":%s}", r->dsinks_ratio_ok ? "true" : "false");
    }
}

void cpt_report_json_members(FILE *f, const cpt_run_config *c, const cpt_run_result *r) {
    fprintf(f, "\"ok\":%s,\"status\":\"%s\",", r->ok ? "true" : "false",
            ctxpar_status_string(r->status));
    if (r->status != CTXPAR_OK) {
        fputs("\"message\":", f);
        cpt_json_string(f, r->message);
        fputc(',', f);
    }
    fputs("\"config\":{", f);
    cpt_json_config_members(f, c, r->algo);
    fprintf(f, ",\"backend\":\"%s\"},", cpt_run_backend_name(c->backend));
    cpt_report_json_errors(f, r);
    fprintf(f, ",\"time_s\":");
    cpt_json_num(f, r->time_s);
    fprintf(f, ",\"single_rank_time_s\":");
    cpt_json_num(f, r->time_single_s);
    fprintf(f, ",\"reference_time_s\":");
    cpt_json_num(f, r->reference_time_s);
    // --rows: which rows the errors and bounds cover.
    fprintf(f, ",\"rows_judged\":%lld,\"rows_total\":%lld,\"rows_boundaries\":%lld",
            (long long)(r->sample.rows ? r->sample.n : c->seq), (long long)c->seq,
            (long long)(r->sample.rows ? r->sample.boundaries : c->seq));
    fprintf(f, ",\"peak_bytes_per_rank\":%zu,\"single_rank_peak_bytes\":%zu,",
            r->peak_bytes_per_rank, r->single_rank_peak_bytes);
    fprintf(f, "\"per_rank\":[");
    for (int i = 0; i < c->ranks && i < 64; i++) {
        const cpt_run_rank_stats *s = &r->rank[i];
        fprintf(f,
                "%s{\"rank\":%d,\"peak_bytes\":%zu,\"bytes_sent\":%llu,\"blocks_computed\":%llu,"
                "\"blocks_skipped\":%llu,\"flops\":%.6g}",
                i ? "," : "", i, s->peak_bytes, (unsigned long long)s->bytes_sent,
                (unsigned long long)s->work.blocks_computed,
                (unsigned long long)s->work.blocks_skipped, s->work.flops);
    }
    fprintf(f, "]");
}

void cpt_report_rows(FILE *f, const cpt_run_result *r) {
    // The verdict is the per-element bound: error/bound <= 1 everywhere (docs/numerics.md); the
    // worst element's position, head and the rank that held its row say where to look. Beside
    // the per-tensor error, the worst row's (|err| / |ref| at the row's own scale).
    fprintf(f, "  %-6s %-13s %-11s %-11s %-26s %-13s %-8s %s\n", "tensor", "error vs fp64",
            "worst row", "error/bound", "worst at (pos, head, rank)", "error at P=1", "ratio",
            "bits == P=1");
    for (int i = 0; i < CPT_RUN_TENSORS; i++) {
        if (!r->has[i])
            continue;
        // No P = 1 error or ratio for a P = 1 run (it would compare the run with itself).
        char e1[32] = "-", ratio[32] = "-", where[64] = "-", row[32] = "-";
        if (!isnan(r->row_error[i]))
            snprintf(row, sizeof row, "%.3e", r->row_error[i]);
        if (!isnan(r->ratio[i])) {
            snprintf(e1, sizeof e1, "%.3e", r->error_1[i]);
            snprintf(ratio, sizeof ratio, "%.3g", r->ratio[i]);
        }
        if (!isnan(r->bound_ratio[i]))
            snprintf(where, sizeof where, "%lld, %lld, %d", (long long)r->bound_worst[i].position,
                     (long long)r->bound_worst[i].head, r->bound_worst[i].rank);
        fprintf(f, "  %-6s %-13.3e %-11s %-11.3g %-26s %-13s %-8s %s%s\n",
                cpt_run_tensor_name((cpt_run_tensor)i), r->error[i], row, r->bound_ratio[i],
                where, e1, ratio, r->bitwise_single[i] ? "yes" : "no",
                r->within_tol[i] && r->ratio_ok[i] ? "" : "   <-- out of tolerance");
    }
    if (r->has_dsinks) { // [heads], the same on every rank (NaN here when not)
        char e1[32] = "-";
        if (!isnan(r->dsinks_error_1))
            snprintf(e1, sizeof e1, "%.3e", r->dsinks_error_1);
        fprintf(f, "  %-6s %-13.3e %-11s %-11.3g %-26s %-13s %-8s %s%s\n", "dsinks",
                r->dsinks_error, "-", r->dsinks_bound_ratio, "-", e1, "-", "-",
                r->dsinks_bound_ratio <= 1.0 && r->dsinks_ratio_ok ? "" : "   <-- out of tolerance");
    }
}

void cpt_report_table(FILE *f, const char *cmd, const cpt_run_config *c,
                      const cpt_run_result *r, int yardstick) {
    fprintf(f,
            "ctxpar %s: %s (%s), %s layout, %s mask%s, %s, %d ranks x %lld tokens\n"
            "%*s batch %lld, heads %lld/%lld, dim %lld (v %lld)%s%s, %s, %s backend\n\n",
            cmd, ctxpar_algo_name(r->algo), ctxpar_algo_name(c->params.algo),
            ctxpar_layout_name(c->params.layout), ctxpar_mask_name(c->params.mask),
            c->params.num_docs > 0 || c->docs > 0 ? " + documents" : "",
            ctxpar_dtype_name(c->dtype), c->ranks,
            (long long)((c->seq + c->ranks - 1) / c->ranks), (int)strlen(cmd) + 8, "",
            (long long)c->batch, (long long)c->heads, (long long)c->kv_heads,
            (long long)c->head_dim, (long long)cpt_run_dim_v(c),
            c->params.softcap > 0.0f ? ", soft-capped" : "", c->params.sinks ? ", sinks" : "",
            c->backward ? "forward + backward" : "forward",
            cpt_run_backend_name(c->backend));
    cpt_report_rows(f, r);
    if (r->sample.rows)
        fprintf(f,
                "  judged %lld of %lld rows (query rows, and key rows for dk, dv): %lld first or "
                "last of a rank's shard or layout chunk, %lld random (--seed %llu)\n",
                (long long)r->sample.n, (long long)c->seq, (long long)r->sample.boundaries,
                (long long)(r->sample.n - r->sample.boundaries), (unsigned long long)c->seed);
    fprintf(f,
            "\n  time %.3f s (P=1: %.3f s; fp64 reference: %.3f s)   peak memory per rank %.2f MiB "
            "(P=1: %.2f MiB)\n",
            r->time_s, r->time_single_s, r->reference_time_s, r->peak_bytes_per_rank / 1048576.0,
            r->single_rank_peak_bytes / 1048576.0);
    fprintf(f, "  work per rank (blocks computed/skipped):");
    for (int i = 0; i < c->ranks && i < 64; i++)
        fprintf(f, " %llu/%llu", (unsigned long long)r->rank[i].work.blocks_computed,
                (unsigned long long)r->rank[i].work.blocks_skipped);
    // Useful FLOPs (visible query-key pairs) per rank, and the worst rank's distance from the
    // mean: how well the layout balances the mask.
    int n = c->ranks < 64 ? c->ranks : 64;
    double mean = 0, worst = 0;
    for (int i = 0; i < n; i++)
        mean += r->rank[i].work.flops / n;
    fprintf(f, "\n  useful GFLOP per rank:");
    for (int i = 0; i < n; i++) {
        fprintf(f, " %.3f", r->rank[i].work.flops / 1e9);
        if (mean > 0 && fabs(r->rank[i].work.flops - mean) / mean > worst)
            worst = fabs(r->rank[i].work.flops - mean) / mean;
    }
    fprintf(f, "   (largest deviation from the mean: %.1f %%)\n", 100.0 * worst);
    if (yardstick) // an audit of other results: ctxpar's run is what they are held against
        fprintf(f, "\n  yardstick: ctxpar's own run is %s\n",
                r->ok ? "within its bound (the errors above)"
                      : "NOT within its bound: its errors are no fair yardstick");
    else
        fprintf(f, "\n  result: %s\n", r->ok ? "OK" : "FAILED");
}
