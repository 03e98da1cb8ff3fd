// --report of plan: per-rank FLOPs, bytes sent and received and predicted time, each against
// its mean, with the imbalance (max / mean - 1) stated.
#include <math.h>
#include <stdlib.h>

#include "ctxpar_backend.h"
#include "report.h"
#include "report_html.h"
#include "units.h"

// One per-rank quantity of the plan: its values, largest and mean, and how a value reads in the
// titles and the table (the tool's units: KiB/MiB/GiB, s/ms/us).
typedef struct per_rank {
    const char *title, *unit;
    const char *(*text)(double v, char *buf, size_t n);
    double *v, max, mean;
} per_rank;

static const char *flop_text(double v, char *buf, size_t n) {
    char si[32];
    snprintf(buf, n, "%sFLOP", cpt_html_si(v, si, sizeof si));
    return buf;
}

static void stats(per_rank *q, int n) {
    double sum = 0;
    q->max = 0;
    for (int i = 0; i < n; i++) {
        sum += q->v[i];
        q->max = fmax(q->max, q->v[i]);
    }
    q->mean = sum / n;
}

static double imbalance(const per_rank *q) {
    return q->mean > 0 ? q->max / q->mean - 1 : 0;
}

static void chart(FILE *f, const per_rank *q, int n) {
    char title[160], mean[32];
    snprintf(title, sizeof title, "%s per rank: max %s, imbalance %.2f%%", q->title,
             q->text(q->max, mean, sizeof mean), 100 * imbalance(q));
    snprintf(mean, sizeof mean, "mean");
    cpt_html_bars b = {title, q->unit, q->v, n, 0, q->mean, mean, NAN};
    cpt_html_bar_chart(f, &b);
}

static void write_page(FILE *f, const cpt_plan_config *cfg, const cpt_plan_result *r,
                       const cpt_plan_model *m, per_rank *q, int nq) {
    const int n = r->nranks;
    char t[32];
    fputs("<p class=\"verdict\">", f);
    cpt_html_text(f,
                  "%s on %d ranks%s: FLOPs imbalance %.2f%% (max / mean - 1), predicted time %s"
                  " on model %s; coverage %s.",
                  ctxpar_algo_name(r->algo), n, r->ulysses ? " (hybrid groups)" : "",
                  100 * r->imbalance, cpt_seconds_text(cpt_plan_time(m, r), t, sizeof t), m->name,
                  !r->coverage_checked ? "not checked"
                  : r->coverage_ok     ? "ok, every visible pair computed once"
                                       : "FAILED");
    fputs("</p>\n<p class=\"config\">", f);
    cpt_html_text(f,
                  "batch %lld, seq %lld, heads %lld/%lld, dim %lld, %s, %s mask, %s layout, "
                  "algorithm %s, %s; dry run %.2f s",
                  (long long)cfg->batch, (long long)cfg->seq, (long long)cfg->heads,
                  (long long)cfg->kv_heads, (long long)cfg->head_dim, ctxpar_dtype_name(cfg->dtype),
                  ctxpar_mask_name(cfg->params.mask), ctxpar_layout_name(cfg->params.layout),
                  ctxpar_algo_name(cfg->params.algo),
                  cfg->backward ? "forward + backward" : "forward", r->seconds);
    fputs("</p>\n", f);
    for (int k = 0; k < nq; k++)
        chart(f, &q[k], n);
    if (n > 64)
        return;
    fputs("<table class=\"per-rank\"><tr><th>rank</th>", f);
    for (int k = 0; k < nq; k++)
        fprintf(f, "<th>%s</th>", q[k].title);
    fputs("</tr>\n", f);
    for (int i = 0; i < n; i++) {
        fprintf(f, "<tr><td>%d</td>", i);
        for (int k = 0; k < nq; k++)
            fprintf(f, "<td>%s</td>", q[k].text(q[k].v[i], t, sizeof t));
        fputs("</tr>\n", f);
    }
    fputs("</table>\n", f);
}

int cpt_report_plan(const char *path, const cpt_plan_config *cfg, const cpt_plan_result *r,
                    const cpt_plan_model *m, int rc) {
    if (!path)
        return rc;
    const int n = r->nranks;
    per_rank q[4] = {{"FLOPs", "FLOP", flop_text, NULL, 0, 0},
                     {"bytes sent", "B", cpt_bytes_text, NULL, 0, 0},
                     {"bytes received", "B", cpt_bytes_text, NULL, 0, 0},
                     {"predicted time", "s", cpt_seconds_text, NULL, 0, 0}};
    double *all = malloc((size_t)n * 4 * sizeof *all);
    ctxpar_status st = CTXPAR_OK;
    if (!all) {
        st = CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "no memory for %d ranks", n);
    } else {
        for (int k = 0; k < 4; k++)
            q[k].v = all + (size_t)k * n;
        for (int i = 0; i < n; i++) {
            const cpt_plan_rank *x = &r->rank[i];
            q[0].v[i] = x->flops_fwd + x->flops_bwd;
            q[1].v[i] = (double)x->bytes_sent;
            q[2].v[i] = (double)x->bytes_received;
            q[3].v[i] = cpt_plan_rank_time(m, x, n);
        }
        for (int k = 0; k < 4; k++)
            stats(&q[k], n);
        FILE *f = cpt_html_open(path, "ctxpar plan report");
        if (f) {
            write_page(f, cfg, r, m, q, 4);
            st = cpt_html_close(f, path);
        } else {
            st = CTXPAR_ERR_INVALID_ARG;
        }
    }
    free(all);
    if (st == CTXPAR_OK)
        return rc;
    fprintf(stderr, "ctxpar plan: --report: %s\n", cpt_cli_message(ctxpar_last_error()));
    return CPT_EXIT_USAGE;
}
