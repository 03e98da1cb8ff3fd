// --report of check and audit: error/bound by position and head per tensor (with the layout's
// chunks and the rank holding each), per-rank worst ratios, the failing runs of rows, the worst
// rows. The verdicts come from audit_judge.c; nothing here judges.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ctxpar_backend.h"
#include "report.h"
#include "report_html.h"

enum { HEAT_COLS = 1000, HEAT_W = 1000, LEFT = 64, STRIP = 18, TOP = 24 };

int cpt_report_heat_cols(const cpt_cli *cli) {
    return cli->report_path ? HEAT_COLS : 0;
}

// What the page shows, gathered by cpt_report_judged.
typedef struct judged_page {
    const char *cmd;     // "check" or "audit"
    const char *subject; // what was judged, for the verdict line
    const cpt_run_config *cfg;
    const cpt_run_result *r;
    const cpt_audit_report *rep;
    const int *owner; // [seq]
    int own;          // the results judged are ctxpar's own
} judged_page;

// Light to mid blue within the bound (by log10 of the ratio from 1e-6 to 1); orange to dark red
// beyond it (1 to 1000 and up); grey where no row was judged; black for a NaN or an infinity.
static void ratio_colour(double ratio, char *buf, size_t n) {
    static const double pass[2][3] = {{247, 251, 255}, {66, 146, 198}};
    static const double fail[3][3] = {{253, 174, 97}, {215, 25, 28}, {103, 0, 13}};
    if (ratio < 0) {
        snprintf(buf, n, "#e6e6e6");
        return;
    }
    if (!isfinite(ratio)) {
        snprintf(buf, n, "#000000");
        return;
    }
    double rgb[3];
    if (ratio <= 1) { // 8 steps, so that neighbouring cells of one step merge into one rect
        const double t = ratio > 0 ? floor(fmin(1, fmax(0, (log10(ratio) + 6) / 6)) * 7) / 7 : 0;
        for (int k = 0; k < 3; k++)
            rgb[k] = pass[0][k] + t * (pass[1][k] - pass[0][k]);
    } else {
        const double t = floor(fmin(1, log10(ratio) / 3) * 6) / 6 * 2; // 0..2 over two segments
        const int seg = t >= 1 ? 1 : 0;
        for (int k = 0; k < 3; k++)
            rgb[k] = fail[seg][k] + (t - seg) * (fail[seg + 1][k] - fail[seg][k]);
    }
    snprintf(buf, n, "#%02x%02x%02x", (int)rgb[0], (int)rgb[1], (int)rgb[2]);
}

static const char *const rank_colours[] = {"#c6dbef", "#fdd0a2", "#c7e9c0", "#dadaeb",
                                           "#fcbba1", "#d9d9d9", "#fde0ef", "#ccebc5"};

// The rank strip over the map: each run of positions one rank holds, in its colour and named;
// the borders between runs (the layout's chunks) as lines through the map when few enough to see.
static void rank_strip(FILE *f, const judged_page *p, const cpt_audit_verdict *v, double cw,
                       int map_h) {
    const int64_t seq = p->cfg->seq;
    int64_t borders = 0;
    for (int64_t s = 1; s < seq; s++)
        borders += p->owner[s] != p->owner[s - 1];
    // Drawn by position while the runs are few; else by column (a striped layout changes rank
    // every token), where -1 marks a column whose positions several ranks hold.
    const int by_col = borders > HEAT_COLS;
    const int64_t units = by_col ? v->heat_cols : seq, per = by_col ? v->heat_bucket : 1;
    int *col = by_col ? malloc((size_t)v->heat_cols * sizeof *col) : NULL;
    if (by_col && !col)
        return; // no strip rather than no page
    for (int64_t s = 0; by_col && s < seq; s++) {
        int *c = &col[s / v->heat_bucket];
        *c = s % v->heat_bucket == 0 || *c == p->owner[s] ? p->owner[s] : -1;
    }
    fputs("<g class=\"ranks\">\n", f);
    for (int64_t u = 0, start = 0; u <= units; u++) {
        const int rank = by_col ? col[start] : p->owner[start];
        if (u < units && (u == start || (by_col ? col[u] : p->owner[u]) == rank))
            continue;
        const double x0 = LEFT + cw * (double)(start * per) / (double)v->heat_bucket;
        const double w = cw * (double)((u - start) * per) / (double)v->heat_bucket;
        const long long last = u * per < seq ? (long long)(u * per) - 1 : (long long)seq - 1;
        fprintf(f,
                "<rect class=\"rankrun\" data-rank=\"%d\" x=\"%.2f\" y=\"%d\" width=\"%.2f\" "
                "height=\"%d\" fill=\"%s\"><title>positions %lld-%lld: ",
                rank, x0, TOP, w, STRIP, rank < 0 ? "#d0d0d0" : rank_colours[rank % 8],
                (long long)(start * per), last);
        fprintf(f, rank < 0 ? "several ranks</title></rect>\n" : "rank %d</title></rect>\n", rank);
        if (w >= 22 && rank >= 0)
            cpt_html_svg_text(f, x0 + w / 2, TOP + 13, "middle", "r%d", rank);
        else if (w >= 160)
            cpt_html_svg_text(f, x0 + w / 2, TOP + 13, "middle", "ranks alternate");
        if (u > 0 && u < units && borders <= 128)
            fprintf(f, "<line class=\"chunk\" x1=\"%.2f\" y1=\"%d\" x2=\"%.2f\" y2=\"%d\"/>\n",
                    x0 + w, TOP, x0 + w, TOP + STRIP + map_h);
        start = u;
    }
    free(col);
    // Zigzag's 2P chunks: rank P-1 holds two neighbours, whose border no change of rank shows.
    const int64_t P = p->cfg->ranks, chunk = seq / (2 * P);
    for (int64_t k = 1; p->cfg->params.layout == CTXPAR_LAYOUT_ZIGZAG &&
                        !p->cfg->params.cu_seqlens && seq % (2 * P) == 0 && k < 2 * P;
         k++)
        if (p->owner[k * chunk] == p->owner[k * chunk - 1])
            fprintf(f,
                    "<line class=\"chunk\" stroke-dasharray=\"4 3\" x1=\"%.2f\" y1=\"%d\" "
                    "x2=\"%.2f\" y2=\"%d\"/>\n",
                    LEFT + cw * (double)(k * chunk) / (double)v->heat_bucket, TOP,
                    LEFT + cw * (double)(k * chunk) / (double)v->heat_bucket, TOP + STRIP + map_h);
    fputs("</g>\n", f);
}

// The map: a row per head, a column per bucket of positions; runs of one colour as one rect.
static void heat_map(FILE *f, const judged_page *p, const char *name, const cpt_audit_verdict *v) {
    const double cw = fmin(8.0, (double)HEAT_W / v->heat_cols);
    const int rh = v->heat_heads >= 40 ? 5 : 200 / v->heat_heads > 28 ? 28 : 200 / v->heat_heads;
    const int map_h = rh * v->heat_heads, w = LEFT + (int)ceil(cw * v->heat_cols) + 20;
    char title[128];
    snprintf(title, sizeof title, "%s: error/bound by position and head", name);
    cpt_html_svg_begin(f, w, TOP + STRIP + map_h + 44, title);
    cpt_html_svg_text(f, LEFT, 14, "start", "%s", title);
    cpt_html_svg_text(f, LEFT - 6, TOP + 13, "end", "rank");
    fprintf(f, "<g class=\"heat\" data-tensor=\"%s\">\n", name);
    const int y0 = TOP + STRIP, titled = (int64_t)v->heat_cols * v->heat_heads <= 32768;
    for (int h = 0; h < v->heat_heads; h++) {
        const double *row = v->heat + (size_t)h * v->heat_cols;
        for (int c = 0, start = 0; c <= v->heat_cols; c++) {
            char a[16], b[16];
            if (c < v->heat_cols) {
                ratio_colour(row[c], a, sizeof a);
                ratio_colour(row[start], b, sizeof b);
                if (c == start || !strcmp(a, b))
                    continue;
            }
            double worst = row[start];
            for (int k = start; k < c; k++)
                worst = row[k] > worst || isnan(row[k]) ? row[k] : worst;
            ratio_colour(row[start], b, sizeof b);
            fprintf(f,
                    "<rect class=\"cell\" x=\"%.2f\" y=\"%d\" width=\"%.2f\" height=\"%d\" "
                    "fill=\"%s\">",
                    LEFT + cw * start, y0 + h * rh, cw * (c - start), rh, b);
            if (titled) // what the mouse shows; left out where it would make the page huge
                fprintf(f, "<title>head %d, positions %lld-%lld: error/bound %.3g</title>", h,
                        (long long)(start * v->heat_bucket),
                        (long long)fmin((double)(c * v->heat_bucket), (double)p->cfg->seq) - 1,
                        worst);
            fputs("</rect>\n", f);
            start = c;
        }
        if (rh >= 9 && (v->heat_heads <= 16 || h % (v->heat_heads / 8) == 0))
            cpt_html_svg_text(f, LEFT - 6, y0 + h * rh + rh / 2.0 + 4, "end", "head %d", h);
    }
    fputs("</g>\n", f);
    rank_strip(f, p, v, cw, map_h);
    for (int k = 0; k <= 8; k++) { // position ticks
        const double x = LEFT + cw * v->heat_cols * k / 8.0;
        cpt_html_svg_text(f, x, y0 + map_h + 14, "middle", "%lld",
                          (long long)((double)p->cfg->seq * k / 8.0));
    }
    cpt_html_svg_text(f, LEFT + cw * v->heat_cols / 2, y0 + map_h + 32, "middle", "position%s",
                      v->heat_bucket > 1 ? " (each column the worst of its bucket)" : "");
    cpt_html_svg_end(f);
    if (v->heat_bucket > 1)
        fprintf(f, "<p class=\"note\">%d columns of %lld positions each.</p>\n", v->heat_cols,
                (long long)v->heat_bucket);
}

// The colour scale, once per page.
static void legend(FILE *f) {
    static const double at[] = {-1, 1e-6, 1e-4, 1e-2, 0.5, 1, 3, 30, 1000, INFINITY};
    static const char *const label[] = {"not judged", "1e-6", "1e-4", "0.01",   "0.5",
                                        "1 (bound)",  "3",    "30",   ">=1000", "NaN/inf"};
    const int n = (int)(sizeof at / sizeof at[0]);
    cpt_html_svg_begin(f, 90 * n + 20, 46, "colour scale: error/bound");
    for (int i = 0; i < n; i++) {
        char c[16];
        ratio_colour(at[i], c, sizeof c);
        fprintf(f,
                "<rect x=\"%d\" y=\"4\" width=\"86\" height=\"16\" fill=\"%s\" "
                "stroke=\"#999\"/>\n",
                10 + 90 * i, c);
        cpt_html_svg_text(f, 10 + 90 * i + 43, 36, "middle", "%s", label[i]);
    }
    cpt_html_svg_end(f);
}

static void ranges_table(FILE *f, const cpt_audit_verdict *v, int sampled) {
    if (!v->n_ranges) {
        fputs("<p class=\"ok\">No row out of its bound.</p>\n", f);
        return;
    }
    const long long runs = v->n_ranges + v->more_ranges;
    fprintf(f, "<h3>Failing rows: %lld elements in %lld rows, in %lld run%s</h3>\n",
            (long long)v->failing_elements, (long long)v->failing_rows, runs, runs > 1 ? "s" : "");
    fprintf(f,
            "<table class=\"ranges\"><tr><th>batch</th><th>positions</th><th>%s</th>"
            "<th>ranks</th><th>failing elements</th></tr>\n",
            sampled ? "span" : "rows");
    for (int k = 0; k < v->n_ranges; k++) {
        const cpt_audit_range *g = &v->ranges[k];
        fprintf(f, "<tr class=\"range\"><td>%lld</td><td>%lld-%lld</td><td>%lld</td><td>",
                (long long)g->batch, (long long)g->first, (long long)g->last,
                (long long)(g->last - g->first + 1));
        if (g->rank_first == g->rank_last)
            fprintf(f, "%d", g->rank_first);
        else
            fprintf(f, "%d-%d", g->rank_first, g->rank_last);
        fprintf(f, "</td><td>%lld</td></tr>\n", (long long)g->elements);
    }
    fputs("</table>\n", f);
    if (v->more_ranges)
        fprintf(f, "<p>... and %lld more runs (counted above, not listed).</p>\n",
                (long long)v->more_ranges);
}

static void worst_table(FILE *f, const cpt_audit_verdict *v) {
    if (!v->n_worst)
        return;
    fputs("<h3>Worst rows</h3><table class=\"worst\"><tr><th>batch</th><th>position</th>"
          "<th>head</th><th>rank</th><th>error/bound</th><th>got</th><th>expected</th></tr>\n",
          f);
    for (int w = 0; w < v->n_worst; w++) {
        const cpt_audit_row *x = &v->worst[w];
        fprintf(f,
                "<tr><td>%lld</td><td>%lld</td><td>%lld</td><td>%d</td><td class=\"%s\">%.3g</td>"
                "<td>%.6g</td><td>%.6g</td></tr>\n",
                (long long)x->batch, (long long)x->position, (long long)x->head, x->rank,
                x->bound_ratio <= 1 ? "ok" : "bad", x->bound_ratio, x->got, x->want);
    }
    fputs("</table>\n", f);
}

static void tensor_section(FILE *f, const judged_page *p, int i) {
    const cpt_audit_verdict *v = &p->rep->v[i];
    const char *name = cpt_run_tensor_name((cpt_run_tensor)i);
    fprintf(f, "<section class=\"tensor\" id=\"%s\"><h2>%s: <span class=\"%s\">%s</span></h2>\n",
            name, name, v->consistent ? "ok" : "bad",
            v->consistent ? "within its bound" : "NOT CONSISTENT");
    fprintf(f,
            "<p>error %.3e (ctxpar's own %.3e, ratio %.3g); worst error/bound %.3g; %lld "
            "elements in %lld rows out of their bound.</p>\n",
            v->error, v->reference_error, v->ratio, v->bound_ratio, (long long)v->failing_elements,
            (long long)v->failing_rows);
    if (v->heat)
        heat_map(f, p, name, v);
    char title[96];
    snprintf(title, sizeof title, "%s: worst error/bound per rank", name);
    cpt_html_bars b = {title, "", v->rank_bound_ratio, v->ranks, 1, 1.0, "bound", 1.0};
    cpt_html_bar_chart(f, &b);
    ranges_table(f, v, p->r->sample.rows != NULL);
    worst_table(f, v);
    fputs("</section>\n", f);
}

static void write_page(FILE *f, const judged_page *p) {
    const cpt_run_config *c = p->cfg;
    const cpt_audit_report *rep = p->rep;
    int64_t rows = 0;
    for (int i = 0; i < CPT_RUN_TENSORS; i++)
        rows += rep->v[i].failing_rows;
    fputs("<p class=\"verdict\">", f);
    cpt_html_text(f, "%s", p->subject); // a path the user chose
    fprintf(f, ": <span class=\"%s\">", rep->consistent ? "ok" : "bad");
    if (rep->consistent)
        fputs("CONSISTENT</span>: every element judged is within its bound", f);
    else
        fprintf(f, "NOT CONSISTENT</span>: %lld elements in %lld rows out of their bound",
                (long long)rep->failing_elements, (long long)rows);
    fputs(" (docs/numerics.md).</p>\n<p class=\"config\">", f);
    cpt_html_text(f,
                  "%d ranks, batch %lld, seq %lld, heads %lld/%lld, dim %lld, %s, %s mask, %s "
                  "layout, algorithm %s (%s), %s%s",
                  c->ranks, (long long)c->batch, (long long)c->seq, (long long)c->heads,
                  (long long)c->kv_heads, (long long)c->head_dim, ctxpar_dtype_name(c->dtype),
                  ctxpar_mask_name(c->params.mask), ctxpar_layout_name(c->params.layout),
                  ctxpar_algo_name(p->r->algo), ctxpar_algo_name(c->params.algo),
                  c->backward ? "forward + backward" : "forward",
                  p->r->sample.rows ? "; sampled rows only (--rows)" : "");
    fputs("</p>\n", f);
    if (!p->own) { // ctxpar's own run: the yardstick the results were held next to
        fputs("<p>Yardstick, ctxpar's own run:", f);
        for (int i = 0; i < CPT_RUN_TENSORS; i++)
            if (rep->v[i].ranks)
                fprintf(f, " %s error %.3e, error/bound %.3g;",
                        cpt_run_tensor_name((cpt_run_tensor)i), p->r->error[i],
                        p->r->bound_ratio[i]);
        fputs("</p>\n", f);
    }
    legend(f);
    for (int i = 0; i < CPT_RUN_TENSORS; i++)
        if (rep->v[i].ranks)
            tensor_section(f, p, i);
}

int cpt_report_judged(cpt_session *s, const cpt_cli *cli, const cpt_audit_layout *lay,
                      const cpt_run_result *r, const cpt_audit_report *rep, int rc) {
    if (!cli->report_path || s->rank != 0 || r->status != CTXPAR_OK)
        return rc;
    const cpt_run_config *c = &cli->cfg;
    cpt_audit_report own;
    memset(&own, 0, sizeof own);
    int *owner = malloc((size_t)c->seq * sizeof *owner);
    ctxpar_status st = owner ? cpt_audit_owners(lay, c->seq, owner)
                             : CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "no memory for owners");
    if (st == CTXPAR_OK && !rep) {
        st = cpt_audit_judge_own(cli, lay, r, HEAT_COLS, &own);
        rep = &own;
    }
    const char *cmd = cli->cmd == CPT_CMD_AUDIT ? "audit" : "check";
    char title[64], subject[600];
    snprintf(title, sizeof title, "ctxpar %s report", cmd);
    if (rep == &own)
        snprintf(subject, sizeof subject, "ctxpar's own run on %d ranks against float64", c->ranks);
    else
        snprintf(subject, sizeof subject, "verdict on %s",
                 cli->against_path ? cli->against_path : cli->shards_pattern);
    FILE *f = st == CTXPAR_OK ? cpt_html_open(cli->report_path, title) : NULL;
    if (f) {
        judged_page p = {cmd, subject, c, r, rep, owner, rep == &own};
        write_page(f, &p);
        st = cpt_html_close(f, cli->report_path);
    } else if (st == CTXPAR_OK) {
        st = CTXPAR_ERR_INVALID_ARG; // cpt_html_open said why
    }
    cpt_audit_report_free(&own);
    free(owner);
    if (st == CTXPAR_OK)
        return rc;
    cpt_session_error(s, "--report: %s", cpt_cli_message(ctxpar_last_error()));
    return CPT_EXIT_USAGE;
}
