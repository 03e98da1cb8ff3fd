/*
 * report_html.h - the page of `--report FILE.html`: one self-contained file (inline CSS and SVG,
 * no script, nothing fetched), escaped text, and the few charts the reports draw: bars per rank,
 * and lines against a count with a min-max whisker at each point. report_audit.c, report_plan.c
 * and report_bench.c fill them.
 */
#ifndef CPT_TOOL_REPORT_HTML_H
#define CPT_TOOL_REPORT_HTML_H

#include <stdio.h>

#include "ctxpar.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Opens path for writing and writes the page's head, title and heading; NULL with
 * INVALID_ARG ("PATH: cannot write the report: why") when the file cannot be created. */
FILE *cpt_html_open(const char *path, const char *title);
/* Ends the page and closes it: OK, or INVALID_ARG naming path when anything failed to be
 * written (the file is then removed, so that no half page is left). */
ctxpar_status cpt_html_close(FILE *f, const char *path);

/* Text into HTML (&, <, >, " and ' escaped), formatted as printf does first. */
void cpt_html_text(FILE *f, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A number in a few significant digits with an SI prefix ("1.23 G", "512", "4.5 m"). */
const char *cpt_html_si(double x, char *buf, size_t n);

/* An <svg> of w x h pixels with an escaped title for screen readers; and its end. */
void cpt_html_svg_begin(FILE *f, int w, int h, const char *title);
void cpt_html_svg_end(FILE *f);
/* Escaped SVG text at (x, y); anchor "start", "middle" or "end". */
void cpt_html_svg_text(FILE *f, double x, double y, const char *anchor, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

/* One bar per rank (<rect class="bar ..." data-rank="r">), ranks along x. log: a log10 axis
 * (values <= 0 drawn as nothing); line: a dashed level (NAN: none) named line_label; bars above
 * fail_above drawn as failing (NAN: none). */
typedef struct cpt_html_bars {
    const char *title, *unit;
    const double *v;
    int n;
    int log;
    double line;
    const char *line_label;
    double fail_above;
} cpt_html_bars;
void cpt_html_bar_chart(FILE *f, const cpt_html_bars *b);

/* A line through (x[i], y[i]) with a whisker from lo[i] to hi[i] at each point (lo, hi NULL:
 * none). */
typedef struct cpt_html_series {
    const char *name;
    int n;
    const double *x, *y, *lo, *hi;
} cpt_html_series;
/* Series against x on a log2 axis ticked at the x values given (rank counts), y linear from 0;
 * ideal: also the dashed line y = x (a speedup's). */
typedef struct cpt_html_chart {
    const char *title, *xlabel, *ylabel;
    const cpt_html_series *s;
    int ns;
    int ideal;
} cpt_html_chart;
void cpt_html_xy_chart(FILE *f, const cpt_html_chart *c);

#ifdef __cplusplus
}
#endif

#endif /* CPT_TOOL_REPORT_HTML_H */
