// --report of bench: time and speedup against ranks, one line per sequence length, with the
// spread of the repeats (min to max) drawn as whiskers around the median.
#include <string.h>

#include "report.h"
#include "report_html.h"

void cpt_bench_report_add(cpt_bench_report *b, const cpt_run_config *cfg, const cpt_run_result *r,
                          const cpt_run_result *base, int threads) {
    const int cap = (int)(sizeof b->points / sizeof b->points[0]);
    if (!b->path || b->n >= cap)
        return;
    b->points[b->n++] =
        (cpt_bench_point){cfg->seq,      cfg->ranks,       threads,      r->time_min_s,   r->time_s,
                          r->time_max_s, base->time_min_s, base->time_s, base->time_max_s};
}

// One sequence length's series: the baseline at 1 rank, then its points by rank count.
typedef struct line {
    int64_t seq;
    char name[48];
    int n;
    double x[CPT_CLI_MAX_LIST + 1], t[3][CPT_CLI_MAX_LIST + 1], s[3][CPT_CLI_MAX_LIST + 1];
} line;

static void add(line *l, double ranks, double lo, double med, double hi, double base_med) {
    int at = l->n;
    for (int i = 0; i < l->n; i++)
        if (l->x[i] == ranks)
            return; // one rank measured twice (the baseline and --ranks 1): the first
    while (at > 0 && l->x[at - 1] > ranks) { // kept sorted by ranks
        l->x[at] = l->x[at - 1];
        for (int k = 0; k < 3; k++)
            l->t[k][at] = l->t[k][at - 1], l->s[k][at] = l->s[k][at - 1];
        at--;
    }
    const double t[3] = {lo, med, hi};
    l->x[at] = ranks;
    for (int k = 0; k < 3; k++) {
        l->t[k][at] = t[k] * 1e3;
        l->s[k][at] = base_med / t[2 - k]; // the fastest call gives the highest speedup
    }
    l->n++;
}

static void table(FILE *f, const cpt_bench_report *b) {
    fputs("<table class=\"points\"><tr><th>seq</th><th>ranks</th><th>threads/rank</th>"
          "<th>min ms</th><th>median ms</th><th>max ms</th><th>speedup (median)</th>"
          "<th>speedup range</th></tr>\n",
          f);
    for (int i = 0; i < b->n; i++) {
        const cpt_bench_point *p = &b->points[i];
        fprintf(f,
                "<tr><td>%lld</td><td>%d</td><td>%d</td><td>%.3f</td><td>%.3f</td><td>%.3f</td>"
                "<td>%.2fx</td><td>%.2fx-%.2fx</td></tr>\n",
                (long long)p->seq, p->ranks, p->threads, p->t_min * 1e3, p->t_med * 1e3,
                p->t_max * 1e3, p->base_med / p->t_med, p->base_med / p->t_max,
                p->base_med / p->t_min);
    }
    fputs("</table>\n", f);
}

static void write_page(FILE *f, const cpt_bench_report *b, const cpt_run_config *c) {
    line lines[CPT_CLI_MAX_LIST];
    int nl = 0;
    for (int i = 0; i < b->n; i++) {
        const cpt_bench_point *p = &b->points[i];
        int k = 0;
        while (k < nl && lines[k].seq != p->seq)
            k++;
        if (k == nl) {
            if (nl == CPT_CLI_MAX_LIST)
                continue;
            memset(&lines[nl], 0, sizeof lines[nl]);
            lines[nl].seq = p->seq;
            snprintf(lines[nl++].name, sizeof lines[0].name, "seq %lld", (long long)p->seq);
        }
        add(&lines[k], 1, p->base_min, p->base_med, p->base_max, p->base_med);
        add(&lines[k], p->ranks, p->t_min, p->t_med, p->t_max, p->base_med);
    }
    fputs("<p class=\"config\">", f);
    cpt_html_text(f,
                  "%s, %s layout, %s mask, %s, batch %lld, heads %lld/%lld, dim %lld, %s "
                  "backend; each point the median of %d timed calls after %d warm-up, the "
                  "whiskers their fastest and slowest (of the slowest rank). Speedup: the "
                  "one-rank baseline's median over the time.",
                  ctxpar_algo_name(c->params.algo), ctxpar_layout_name(c->params.layout),
                  ctxpar_mask_name(c->params.mask), c->backward ? "forward + backward" : "forward",
                  (long long)c->batch, (long long)c->heads, (long long)c->kv_heads,
                  (long long)c->head_dim, cpt_run_backend_name(c->backend), c->repeat, c->warmup);
    fputs("</p>\n", f);
    cpt_html_series ts[CPT_CLI_MAX_LIST], ss[CPT_CLI_MAX_LIST];
    for (int k = 0; k < nl; k++) {
        line *l = &lines[k];
        ts[k] = (cpt_html_series){l->name, l->n, l->x, l->t[1], l->t[0], l->t[2]};
        ss[k] = (cpt_html_series){l->name, l->n, l->x, l->s[1], l->s[0], l->s[2]};
    }
    cpt_html_chart time = {"time per call against ranks", "ranks", "ms", ts, nl, 0};
    cpt_html_chart speed = {"speedup over one rank (dashed: ideal)", "ranks", "x", ss, nl, 1};
    cpt_html_xy_chart(f, &time);
    cpt_html_xy_chart(f, &speed);
    table(f, b);
}

int cpt_bench_report_write(cpt_session *s, const cpt_bench_report *b, const cpt_run_config *cfg,
                           int rc) {
    if (!b->path || s->rank != 0 || rc != CPT_EXIT_OK)
        return rc;
    FILE *f = cpt_html_open(b->path, "ctxpar bench report");
    ctxpar_status st = CTXPAR_ERR_INVALID_ARG; // cpt_html_open said why
    if (f) {
        write_page(f, b, cfg);
        st = cpt_html_close(f, b->path);
    }
    if (st == CTXPAR_OK)
        return rc;
    cpt_session_error(s, "--report: %s", cpt_cli_message(ctxpar_last_error()));
    return CPT_EXIT_USAGE;
}
