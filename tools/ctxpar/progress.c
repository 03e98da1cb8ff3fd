// The progress line of long work (see progress.h).
#define _POSIX_C_SOURCE 200809L // clock_gettime, fileno, isatty
#include "progress.h"

#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

static double monotonic_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void cpt_progress_init(cpt_progress *p, const char *cmd, FILE *out, double (*now)(void)) {
    memset(p, 0, sizeof *p);
    p->cmd = cmd;
    p->out = out;
    p->tty = out && isatty(fileno(out));
    // A line wider than the terminal would wrap, and \r would go back to its last row only.
    struct winsize ws;
    if (p->tty && ioctl(fileno(out), TIOCGWINSZ, &ws) == 0 && ws.ws_col > 1)
        p->width = ws.ws_col - 1;
    p->now = now ? now : monotonic_s;
    p->after_s = 2.0;
    // A tests' knob: CTXPAR_PROGRESS_AFTER=0 shows progress from the start ("inf": never).
    const char *env = getenv("CTXPAR_PROGRESS_AFTER");
    char *end = NULL;
    const double after = env ? strtod(env, &end) : -1;
    if (env && end != env && *end == '\0' && after >= 0)
        p->after_s = after;
    // A few times a second on a terminal; a log gets lines it can keep.
    p->tty_every_s = 0.25;
    p->log_every_s = 10.0;
    p->t0 = p->stage_t0 = p->now();
    p->last_line = -1;
}

void cpt_progress_prefix(cpt_progress *p, const char *prefix) {
    snprintf(p->prefix, sizeof p->prefix, "%s", prefix);
    p->stage[0] = '\0';
    p->stage_t0 = p->now();
    p->stage_done0 = p->last_done = 0;
}

// "3.1 s", "2 min 05 s", "1 h 02 min".
static void duration(char *buf, size_t n, double s) {
    s = s < 0 ? 0 : s > 1e9 ? 1e9 : s;
    const long long whole = (long long)s;
    if (s < 60)
        snprintf(buf, n, "%.1f s", s);
    else if (s < 3600)
        snprintf(buf, n, "%lld min %02lld s", whole / 60, whole % 60);
    else
        snprintf(buf, n, "%lld h %02lld min", whole / 3600, whole % 3600 / 60);
}

void cpt_progress_update(void *user, const char *stage, int done, int total) {
    cpt_progress *p = user;
    if (!p->out)
        return;
    const double t = p->now();
    // A stage longer than the buffer is kept cut, and compared as cut.
    if (strncmp(stage, p->stage, sizeof p->stage - 1) != 0 || done < p->last_done) {
        snprintf(p->stage, sizeof p->stage, "%s", stage);
        p->stage_t0 = t;
        p->stage_done0 = done;
    }
    p->last_done = done;
    const double every = p->tty ? p->tty_every_s : p->log_every_s;
    if (t - p->t0 < p->after_s || (p->last_line >= 0 && t - p->last_line < every))
        return;
    p->last_line = t;
    char pct[16] = "", elapsed[32], left[48] = "time left unknown";
    if (total > 0)
        snprintf(pct, sizeof pct, " %d %%", (int)(100.0 * done / total));
    duration(elapsed, sizeof elapsed, t - p->t0);
    // The stage's pace so far, for what remains of it.
    if (total > 0 && done > p->stage_done0) {
        char d[32];
        duration(d, sizeof d, (t - p->stage_t0) * (total - done) / (done - p->stage_done0));
        snprintf(left, sizeof left, "about %s left", d);
    }
    char line[320];
    snprintf(line, sizeof line, "ctxpar %s: %s%s%s (elapsed %s, %s)", p->cmd, p->prefix, p->stage,
             pct, elapsed, left);
    if (p->tty)
        fprintf(p->out, "\r\033[K%.*s", p->width > 0 ? p->width : (int)sizeof line, line);
    else
        fprintf(p->out, "%s\n", line);
    fflush(p->out);
    p->shown = p->tty;
}

void cpt_progress_clear(cpt_progress *p) {
    if (!p->shown)
        return;
    fputs("\r\033[K", p->out); // back to the start of the line, erase it
    fflush(p->out);
    p->shown = 0;
}
