/*
 * progress.h - what long work (check, audit, bench, plan) shows on stderr while it runs: nothing
 * for its first 2 s; then on a terminal one line rewritten in place a few times a second, and in
 * a log (not a terminal) one line every 10 s: stage, percent done, elapsed time and the time
 * left, estimated from the fraction of the stage done so far. Never on stdout.
 */
#ifndef CPT_TOOL_PROGRESS_H
#define CPT_TOOL_PROGRESS_H

#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cpt_progress {
    /* Set by cpt_progress_init; a test may change them before the first update. */
    FILE *out;           /* NULL: silent (the MPI ranks other than 0) */
    int tty;             /* rewrite one line in place; else whole lines */
    int width;           /* on a terminal: the line is cut to this many columns; 0: not cut */
    double (*now)(void); /* seconds on a monotonic clock */
    double after_s;      /* nothing until the work has run this long (CTXPAR_PROGRESS_AFTER) */
    double tty_every_s;  /* the least time between two lines on a terminal */
    double log_every_s;  /* and in a log */
    /* The state. */
    const char *cmd;     /* "check", ... */
    char prefix[96];     /* what the command puts before the stage ("ranks 2, seq 8192: ") */
    char stage[64];      /* the stage as the runner names it ("4 ranks") */
    double t0, stage_t0; /* when the work and the stage began */
    int stage_done0;     /* done when the stage began */
    int last_done;       /* done at the last update */
    double last_line;    /* when a line was last printed; < 0: never */
    int shown;           /* a line is on the terminal now */
} cpt_progress;

/* Starts the clock of the work of `cmd` (a string that outlives p). `out` NULL: silent; a
 * terminal: live line; else log lines. `now` NULL: CLOCK_MONOTONIC. */
void cpt_progress_init(cpt_progress *p, const char *cmd, FILE *out, double (*now)(void));

/* Sets the prefix of the stage ("" for none); a new prefix starts a new stage. */
void cpt_progress_prefix(cpt_progress *p, const char *prefix);

/* `done` of `total` items of `stage` (total 0: not counted). Cheap: a clock read, and a line only
 * when one is due. The signature of cpt_run_config.progress, with p as its user pointer; one
 * thread at a time. A new stage text, or done going back, starts a new stage. */
void cpt_progress_update(void *p, const char *stage, int done, int total);

/* Erases the live line (before anything else is printed, and at the end). */
void cpt_progress_clear(cpt_progress *p);

#ifdef __cplusplus
}
#endif

#endif /* CPT_TOOL_PROGRESS_H */
