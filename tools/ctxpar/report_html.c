// The page of --report and its charts (see report_html.h). Nothing here links to anything (not
// even an SVG namespace URL: HTML5 needs none): the file must open offline and from an e-mail
// attachment, so styles and pictures are inline.
#include "report_html.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "ctxpar_backend.h"

static const char *const style =
    "body{font:14px/1.4 sans-serif;margin:24px;color:#222;max-width:1300px}"
    "h1{font-size:22px}h2{font-size:18px;margin-top:28px}h3{font-size:15px}"
    "table{border-collapse:collapse;margin:8px 0}td,th{border:1px solid #ccc;padding:3px 8px;"
    "text-align:right}th{background:#f2f2f2}td.l,th.l{text-align:left}"
    ".bad{color:#b00020;font-weight:bold}.ok{color:#1b7a1b;font-weight:bold}"
    "svg{display:block;margin:8px 0}svg text{font:11px sans-serif;fill:#333}"
    "svg .title{font-size:13px;font-weight:bold}.bar{fill:#4a78b5}.bar.fail{fill:#c62828}"
    ".axis{stroke:#555;stroke-width:1}.grid{stroke:#ddd;stroke-width:1}"
    ".level{stroke:#c62828;stroke-dasharray:5 3;stroke-width:1.5}"
    ".ideal{stroke:#888;stroke-dasharray:4 4;fill:none}.whisker{stroke-width:1.5}"
    ".chunk{stroke:#000;stroke-width:1;stroke-opacity:.55}.rankedge{stroke:#000;stroke-width:2}"
    ".note{color:#555}";

FILE *cpt_html_open(const char *path, const char *title) {
    FILE *f = fopen(path, "w");
    if (!f) {
        CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "%s: cannot write the report: %s", path,
                     strerror(errno));
        return NULL;
    }
    fputs("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
          "<meta name=\"viewport\" content=\"width=device-width\"><title>",
          f);
    cpt_html_text(f, "%s", title);
    fprintf(f, "</title><style>%s</style></head><body>\n<h1>", style);
    cpt_html_text(f, "%s", title);
    fputs("</h1>\n", f);
    return f;
}

ctxpar_status cpt_html_close(FILE *f, const char *path) {
    fputs("</body></html>\n", f);
    const int bad = fflush(f) != 0 || ferror(f);
    const int err = errno;
    if (fclose(f) != 0 || bad) {
        remove(path);
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "%s: cannot write the report: %s", path,
                            strerror(bad ? err : errno));
    }
    return CTXPAR_OK;
}

static void escape(FILE *f, const char *s) {
    for (; *s; s++) {
        const char *e = *s == '&'    ? "&amp;"
                        : *s == '<'  ? "&lt;"
                        : *s == '>'  ? "&gt;"
                        : *s == '"'  ? "&quot;"
                        : *s == '\'' ? "&#39;"
                                     : NULL;
        if (e)
            fputs(e, f);
        else
            fputc(*s, f);
    }
}

static void vtext(FILE *f, const char *fmt, va_list ap) {
    char buf[2048];
    vsnprintf(buf, sizeof buf, fmt, ap);
    escape(f, buf);
}

void cpt_html_text(FILE *f, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vtext(f, fmt, ap);
    va_end(ap);
}

const char *cpt_html_si(double x, char *buf, size_t n) {
    // The prefix always after a space ("512 B", "1.05 MB"): units follow it directly.
    static const char *const big[] = {" ", " k", " M", " G", " T", " P", " E"};
    static const char *const small[] = {" ", " m", " µ", " n", " p"};
    double a = fabs(x);
    int i = 0;
    if (!isfinite(x) || a == 0) {
        snprintf(buf, n, "%g ", x);
        return buf;
    }
    if (a >= 1) {
        for (; a >= 1000 && i < 6; i++)
            a /= 1000;
        snprintf(buf, n, "%.3g%s", x < 0 ? -a : a, big[i]);
    } else {
        for (; a < 1 && i < 4; i++)
            a *= 1000;
        snprintf(buf, n, "%.3g%s", x < 0 ? -a : a, small[i]);
    }
    return buf;
}

void cpt_html_svg_begin(FILE *f, int w, int h, const char *title) {
    fprintf(f,
            "<svg width=\"%d\" height=\"%d\" "
            "viewBox=\"0 0 %d %d\" role=\"img\"><title>",
            w, h, w, h);
    cpt_html_text(f, "%s", title);
    fputs("</title>\n", f);
}

void cpt_html_svg_end(FILE *f) {
    fputs("</svg>\n", f);
}

void cpt_html_svg_text(FILE *f, double x, double y, const char *anchor, const char *fmt, ...) {
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"%s\">", x, y, anchor);
    va_list ap;
    va_start(ap, fmt);
    vtext(f, fmt, ap);
    va_end(ap);
    fputs("</text>\n", f);
}

// A "nice" step (1, 2 or 5 x 10^k) for about `ticks` ticks up to hi.
static double nice_step(double hi, int ticks) {
    const double raw = hi / ticks, p = pow(10, floor(log10(raw))), m = raw / p;
    return (m <= 1 ? 1 : m <= 2 ? 2 : m <= 5 ? 5 : 10) * p;
}

// Plot area of the charts: left margin for the y labels, room for a title and x labels.
enum { ML = 70, MR = 20, MT = 28, MB = 40 };

// Bars drawn at most: past this many ranks each bar is a bucket of neighbouring ranks at its
// largest value (a bar stays 2 px wide, and the worst rank of a bucket still shows).
#define MAX_BARS 600

// The largest value of ranks [i0, i1) (NaN and inf stand out: they win), and whether any fails.
static double bucket_max(const cpt_html_bars *b, int i0, int i1, int *fail) {
    double m = b->v[i0];
    *fail = 0;
    for (int i = i0; i < i1; i++) {
        const double v = b->v[i];
        if (isfinite(m) && (!isfinite(v) || v > m))
            m = v;
        *fail |= isfinite(b->fail_above) && !(v <= b->fail_above);
    }
    return m;
}

void cpt_html_bar_chart(FILE *f, const cpt_html_bars *b) {
    // 24 px a bar, the plot 300 to 1200 px wide; past MAX_BARS ranks a bar is a bucket of ranks.
    const int per = b->n > MAX_BARS ? (b->n + MAX_BARS - 1) / MAX_BARS : 1;
    const int nb = (b->n + per - 1) / per;
    const int pw = nb * 24 < 300 ? 300 : nb * 24 > 1200 ? 1200 : nb * 24, ph = 180;
    const double slot = nb * 24 <= 1200 ? 24 : 1200.0 / nb;
    double hi = 0, lo = INFINITY;
    for (int i = 0; i < b->n; i++)
        if (isfinite(b->v[i]) && b->v[i] > 0) {
            hi = fmax(hi, b->v[i]);
            lo = fmin(lo, b->v[i]);
        }
    if (isfinite(b->line))
        hi = fmax(hi, b->line), lo = fmin(lo, b->line);
    double y0 = 0, y1 = hi > 0 ? hi * 1.1 : 1;
    if (b->log) { // whole decades around the values
        y0 = isfinite(lo) ? floor(log10(lo)) : -1;
        y1 = hi > 0 ? ceil(log10(hi) + 1e-9) : 0;
        if (y1 <= y0)
            y1 = y0 + 1;
    }
    cpt_html_svg_begin(f, ML + pw + MR, MT + ph + MB, b->title);
    cpt_html_svg_text(f, ML, 16, "start", "%s", b->title);
    // y maps a value to a pixel row (values off a log axis go to its floor).
#define YPIX(val)                                                                                  \
    (MT + ph - ph * ((b->log ? ((val) > 0 ? log10(val) : y0) : (val)) - y0) / (y1 - y0))
    const double step = b->log ? 1 : nice_step(y1, 4);
    for (double t = y0; t <= y1 + 1e-9 * fabs(y1); t += step) {
        const double y = MT + ph - ph * (t - y0) / (y1 - y0);
        char lab[32];
        fprintf(f, "<line class=\"grid\" x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\"/>\n", ML, y,
                ML + pw, y);
        if (b->log)
            snprintf(lab, sizeof lab, "1e%+d", (int)t);
        else
            cpt_html_si(t, lab, sizeof lab);
        cpt_html_svg_text(f, ML - 4, y + 4, "end", "%s", lab);
    }
    fprintf(f, "<g class=\"bars\">\n");
    for (int k = 0; k < nb; k++) {
        const int i0 = k * per, i1 = i0 + per < b->n ? i0 + per : b->n;
        int fail;
        const double v = bucket_max(b, i0, i1, &fail);
        const double top = isfinite(v) ? YPIX(v) : MT, x = ML + k * slot + slot * 0.15;
        const double h = MT + ph - top;
        char val[32], attr[40], name[48];
        if (per == 1) {
            snprintf(attr, sizeof attr, "data-rank=\"%d\"", i0);
            snprintf(name, sizeof name, "rank %d", i0);
        } else {
            snprintf(attr, sizeof attr, "data-ranks=\"%d-%d\"", i0, i1 - 1);
            snprintf(name, sizeof name, "ranks %d-%d, the largest", i0, i1 - 1);
        }
        fprintf(f,
                "<rect class=\"bar%s\" %s x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" "
                "height=\"%.1f\"><title>%s: %s%s</title></rect>\n",
                fail ? " fail" : "", attr, x, top, slot * 0.7, h > 0 ? h : 0, name,
                cpt_html_si(v, val, sizeof val), b->unit);
    }
    fputs("</g>\n", f);
    if (isfinite(b->line)) {
        const double y = YPIX(b->line);
        fprintf(f, "<line class=\"level\" x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\"/>\n", ML, y,
                ML + pw, y);
        cpt_html_svg_text(f, ML + pw, y - 4, "end", "%s", b->line_label ? b->line_label : "");
    }
#undef YPIX
    fprintf(f, "<line class=\"axis\" x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\"/>\n", ML, MT + ph,
            ML + pw, MT + ph);
    const int every = nb <= 32 ? 1 : (nb + 15) / 16; // at most about 16 labels
    for (int k = 0; k < nb; k += every)
        cpt_html_svg_text(f, ML + (k + 0.5) * slot, MT + ph + 14, "middle", "%d", k * per);
    if (per == 1)
        cpt_html_svg_text(f, ML + pw / 2.0, MT + ph + 32, "middle", "rank");
    else
        cpt_html_svg_text(f, ML + pw / 2.0, MT + ph + 32, "middle",
                          "rank (a bar: the largest of %d ranks)", per);
    cpt_html_svg_text(f, 12, MT + ph / 2.0, "start", "%s", b->unit);
    cpt_html_svg_end(f);
}

static const char *const palette[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd",
                                      "#ff7f0e", "#8c564b", "#e377c2", "#17becf"};

void cpt_html_xy_chart(FILE *f, const cpt_html_chart *c) {
    const int pw = 520, ph = 260;
    double xlo = INFINITY, xhi = 0, yhi = 0;
    for (int k = 0; k < c->ns; k++)
        for (int i = 0; i < c->s[k].n; i++) {
            const cpt_html_series *s = &c->s[k];
            xlo = fmin(xlo, s->x[i]);
            xhi = fmax(xhi, s->x[i]);
            yhi = fmax(yhi, s->hi && isfinite(s->hi[i]) ? s->hi[i] : s->y[i]);
        }
    if (!(xlo > 0))
        xlo = 1;
    if (!(xhi > xlo))
        xhi = xlo * 2;
    if (c->ideal)
        yhi = fmax(yhi, xhi);
    const double step = nice_step(yhi > 0 ? yhi : 1, 5);
    const double ytop = step * ceil((yhi > 0 ? yhi : 1) / step);
    const double lx0 = log2(xlo), lx1 = log2(xhi);
#define XPIX(x) (ML + 20 + (pw - 40) * (log2(x) - lx0) / (lx1 - lx0))
#define YPIX(y) (MT + ph - ph * (y) / ytop)
    cpt_html_svg_begin(f, ML + pw + MR + 150, MT + ph + MB, c->title);
    cpt_html_svg_text(f, ML, 16, "start", "%s", c->title);
    for (double t = 0; t <= ytop + step * 1e-9; t += step) {
        fprintf(f, "<line class=\"grid\" x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\"/>\n", ML,
                YPIX(t), ML + pw, YPIX(t));
        cpt_html_svg_text(f, ML - 4, YPIX(t) + 4, "end", "%g", t); // ms and speedups: no prefix
    }
    for (int k = 0; k < c->ns; k++) // x ticks at every x given
        for (int i = 0; i < c->s[k].n; i++)
            cpt_html_svg_text(f, XPIX(c->s[k].x[i]), MT + ph + 14, "middle", "%g", c->s[k].x[i]);
    fprintf(f, "<line class=\"axis\" x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\"/>\n", ML, MT + ph,
            ML + pw, MT + ph);
    fprintf(f, "<line class=\"axis\" x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\"/>\n", ML, MT, ML,
            MT + ph);
    cpt_html_svg_text(f, ML + pw / 2.0, MT + ph + 32, "middle", "%s", c->xlabel);
    cpt_html_svg_text(f, 8, MT - 8, "start", "%s", c->ylabel);
    if (c->ideal)
        fprintf(f, "<line class=\"ideal\" x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>\n",
                XPIX(xlo), YPIX(xlo), XPIX(xhi), YPIX(xhi));
    for (int k = 0; k < c->ns; k++) {
        const cpt_html_series *s = &c->s[k];
        const char *col = palette[k % 8];
        fprintf(f, "<g class=\"series\" data-name=\"");
        cpt_html_text(f, "%s", s->name);
        fprintf(f, "\"><polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\" points=\"", col);
        for (int i = 0; i < s->n; i++)
            fprintf(f, "%s%.1f,%.1f", i ? " " : "", XPIX(s->x[i]), YPIX(s->y[i]));
        fputs("\"/>\n", f);
        for (int i = 0; i < s->n; i++) {
            const double x = XPIX(s->x[i]);
            if (s->lo && s->hi && isfinite(s->lo[i]) && isfinite(s->hi[i]))
                fprintf(f,
                        "<path class=\"whisker\" stroke=\"%s\" d=\"M%.1f %.1fV%.1fM%.1f "
                        "%.1fH%.1fM%.1f %.1fH%.1f\"/>\n",
                        col, x, YPIX(s->lo[i]), YPIX(s->hi[i]), x - 5, YPIX(s->lo[i]), x + 5, x - 5,
                        YPIX(s->hi[i]), x + 5);
            fprintf(f,
                    "<circle class=\"point\" cx=\"%.1f\" cy=\"%.1f\" r=\"3.5\" fill=\"%s\">"
                    "<title>",
                    x, YPIX(s->y[i]), col);
            cpt_html_text(f, "%s: %g -> %.4g", s->name, s->x[i], s->y[i]);
            fputs("</title></circle>\n", f);
        }
        fputs("</g>\n", f);
        fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"12\" height=\"12\" fill=\"%s\"/>\n",
                ML + pw + 16, MT + 18 * k, col);
        cpt_html_svg_text(f, ML + pw + 32, MT + 18 * k + 10, "start", "%s", s->name);
    }
#undef XPIX
#undef YPIX
    cpt_html_svg_end(f);
}
