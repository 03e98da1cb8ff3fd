// `ctxpar bench`: throughput, memory and the compute / transfer split of context-parallel
// attention, next to full-sequence attention on one rank (the baseline) in the same run; --sweep
// over sequence lengths and rank counts into one markdown table.
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "commands.h"
#include "report.h"

// What bench reports for one run (the P ranks, or the baseline).
typedef struct bench_numbers {
    int ranks, threads;           // threads per rank
    double fwd_s, fwd_bwd_s;      // median seconds per call; fwd_bwd_s NAN without backward
    // The fastest and slowest call of the repeats (the slowest rank's, like the median).
    double fwd_min_s, fwd_max_s, fwd_bwd_min_s, fwd_bwd_max_s;
    int cores;                    // of this machine; ranks x threads above it share cores
    double fwd_flops;             // per call, by the convention in the help
    double fwd_flops_per_s, fwd_bwd_flops_per_s, tokens_per_s, fwd_bwd_tokens_per_s;
    double bwd_s, bwd_flops_per_s; // the backward alone: fwd_bwd_s - fwd_s
    double peak_flops;             // of the cores these ranks use; NAN unknown
    size_t peak_bytes;            // max over ranks
    uint64_t allocations;         // device allocations per timed call, max over ranks
    uint64_t bytes_sent;          // max over ranks, per call
    double compute_s, transfer_s, wait_s; // per call, mean over ranks
    double hidden;                // 1 - wait / transfer; NAN when nothing was transferred
} bench_numbers;

// Visible (query, key) pairs of one batch row with documents cu[0..ndocs] (NULL: one).
static double row_pairs(const cpt_run_config *c, const int32_t *cu, int64_t ndocs) {
    const int64_t S = c->seq, W = c->params.window_left, R = c->params.window_right;
    const int causal = c->params.mask == CTXPAR_MASK_CAUSAL;
    double pairs = 0;
    for (int64_t d = 0; d < ndocs; d++) {
        const int64_t lo = cu ? cu[d] : 0, hi = cu ? cu[d + 1] : S; // [lo, hi)
        for (int64_t i = lo; i < hi; i++) {
            int64_t first = W > 0 && i - W + 1 > lo ? i - W + 1 : lo; // earliest key k <= i
            int64_t last = causal ? i : R > 0 && i + R < hi - 1 ? i + R : hi - 1; // latest key
            pairs += (double)(last - first + 1);
        }
    }
    return pairs;
}

// Visible (query, key) pairs over the batch, by the convention of the help: S^2 a row without
// a mask, S^2 / 2 causal; counted exactly with windows (query i sees keys k with i - k < W and
// k - i <= R; causal: also k <= i) or documents (--docs, or --cu-seqlens with each row's own).
// NAN when the documents cannot be made.
static double visible_pairs(const cpt_run_config *c) {
    const int64_t S = c->seq, B = c->batch;
    const int causal = c->params.mask == CTXPAR_MASK_CAUSAL;
    const ctxpar_attn_params *p = &c->params;
    if (p->cu_seqlens) { // --cu-seqlens: one set for every row, or one per row
        if (p->cu_seqlens_rows == 0)
            return (double)B * row_pairs(c, p->cu_seqlens, p->num_docs);
        double pairs = 0;
        for (int64_t b = 0; b < p->cu_seqlens_rows; b++)
            pairs += row_pairs(c, p->cu_seqlens + b * (p->num_docs + 1), p->num_docs);
        return pairs;
    }
    if (p->window_left <= 0 && p->window_right <= 0 && c->docs <= 0)
        return (double)B * (causal ? (double)S * S / 2 : (double)S * S);
    if (c->docs <= 0)
        return (double)B * row_pairs(c, NULL, 1);
    int32_t *cu = malloc((size_t)(c->docs + 1) * sizeof *cu);
    double pairs = NAN;
    if (cu && cpt_run_docs(c->seed, S, c->docs, cu) == CTXPAR_OK)
        pairs = (double)B * row_pairs(c, cu, c->docs);
    free(cu);
    return pairs;
}

static bench_numbers numbers(const cpt_run_config *c, int ranks, const cpt_run_result *r,
                             const cpt_peak_info *peak) {
    bench_numbers b;
    memset(&b, 0, sizeof b);
    b.ranks = ranks;
    b.threads = cpt_run_threads_per_rank(c, ranks);
    b.peak_flops = cpt_peak_flops(peak, ranks, b.threads);
    b.fwd_s = r->time_fwd_s;
    b.fwd_bwd_s = c->backward ? r->time_s : NAN;
    b.fwd_min_s = r->time_fwd_min_s;
    b.fwd_max_s = r->time_fwd_max_s;
    b.fwd_bwd_min_s = c->backward ? r->time_min_s : NAN;
    b.fwd_bwd_max_s = c->backward ? r->time_max_s : NAN;
    const long online = sysconf(_SC_NPROCESSORS_ONLN);
    b.cores = peak->cores > 0 ? peak->cores : online > 0 ? (int)online : 1;
    // 2 (D + Dv) per visible pair and head (q.k, then p.v): the library's work statistics.
    b.fwd_flops =
        2.0 * (double)(c->head_dim + cpt_run_dim_v(c)) * (double)c->heads * visible_pairs(c);
    const double tokens = (double)c->batch * (double)c->seq;
    b.fwd_flops_per_s = b.fwd_flops / b.fwd_s;
    b.tokens_per_s = tokens / b.fwd_s;
    b.fwd_bwd_flops_per_s = 3.5 * b.fwd_flops / b.fwd_bwd_s; // backward = 2.5 x forward
    b.fwd_bwd_tokens_per_s = tokens / b.fwd_bwd_s;
    b.bwd_s = b.fwd_bwd_s - b.fwd_s;
    b.bwd_flops_per_s = 2.5 * b.fwd_flops / b.bwd_s;
    b.peak_bytes = r->peak_bytes_per_rank;
    double transfer = 0, wait = 0;
    const int n = ranks < 64 ? ranks : 64;
    for (int i = 0; i < n; i++) {
        const cpt_run_rank_stats *s = &r->rank[i];
        if (s->bytes_sent > b.bytes_sent)
            b.bytes_sent = s->bytes_sent;
        if (s->allocations > b.allocations)
            b.allocations = s->allocations;
        b.compute_s += s->compute_s / n;
        transfer += s->transfer_s;
        wait += s->wait_s;
    }
    b.transfer_s = transfer / n;
    b.wait_s = wait / n;
    // A wait lies inside its transfer's interval, so the fraction is in [0, 1] but for rounding.
    b.hidden = transfer > 0 ? fmin(1.0, fmax(0.0, 1.0 - wait / transfer)) : NAN;
    return b;
}

// More threads than cores: the ranks take turns, and times measure the sharing.
static int oversubscribed(const bench_numbers *b) {
    return b->ranks * b->threads > b->cores;
}

static void json_numbers(FILE *f, const bench_numbers *b, int backward) {
    fprintf(f,
            "\"ranks\":%d,\"threads_per_rank\":%d,\"oversubscribed\":%s,\"fwd_time_s\":", b->ranks,
            b->threads, oversubscribed(b) ? "true" : "false");
    cpt_json_num(f, b->fwd_s);
    fputs(",\"fwd_time_min_s\":", f);
    cpt_json_num(f, b->fwd_min_s);
    fputs(",\"fwd_time_max_s\":", f);
    cpt_json_num(f, b->fwd_max_s);
    fputs(",\"fwd_flops\":", f);
    cpt_json_num(f, b->fwd_flops);
    fputs(",\"fwd_flops_per_s\":", f);
    cpt_json_num(f, b->fwd_flops_per_s);
    fputs(",\"peak_flops\":", f);
    cpt_json_num(f, b->peak_flops);
    fputs(",\"fwd_fraction_of_peak\":", f);
    cpt_json_num(f, b->fwd_flops_per_s / b->peak_flops);
    fputs(",\"tokens_per_s\":", f);
    cpt_json_num(f, b->tokens_per_s);
    if (backward) {
        fputs(",\"fwd_bwd_time_s\":", f);
        cpt_json_num(f, b->fwd_bwd_s);
        fputs(",\"fwd_bwd_time_min_s\":", f);
        cpt_json_num(f, b->fwd_bwd_min_s);
        fputs(",\"fwd_bwd_time_max_s\":", f);
        cpt_json_num(f, b->fwd_bwd_max_s);
        fputs(",\"fwd_bwd_flops_per_s\":", f);
        cpt_json_num(f, b->fwd_bwd_flops_per_s);
        fputs(",\"fwd_bwd_tokens_per_s\":", f);
        cpt_json_num(f, b->fwd_bwd_tokens_per_s);
        fputs(",\"fwd_bwd_fraction_of_peak\":", f);
        cpt_json_num(f, b->fwd_bwd_flops_per_s / b->peak_flops);
        fputs(",\"bwd_time_s\":", f);
        cpt_json_num(f, b->bwd_s);
        fputs(",\"bwd_flops_per_s\":", f);
        cpt_json_num(f, b->bwd_flops_per_s);
        fputs(",\"bwd_fraction_of_peak\":", f);
        cpt_json_num(f, b->bwd_flops_per_s / b->peak_flops);
    }
    fprintf(f,
            ",\"peak_bytes_per_rank\":%zu,\"allocations_per_call\":%llu,"
            "\"bytes_sent_per_rank\":%llu,\"compute_s\":",
            b->peak_bytes, (unsigned long long)b->allocations,
            (unsigned long long)b->bytes_sent);
    cpt_json_num(f, b->compute_s);
    fputs(",\"transfer_s\":", f);
    cpt_json_num(f, b->transfer_s);
    fputs(",\"wait_s\":", f);
    cpt_json_num(f, b->wait_s);
    fputs(",\"hidden_transfer_fraction\":", f);
    cpt_json_num(f, b->hidden);
}

static const char *const flops_convention =
    "forward 4*batch*heads*head_dim*pairs, pairs = seq^2 (seq^2/2 causal; counted exactly with a "
    "window or documents); backward 2.5x forward";

// The call that bench times: forward + backward with --backward, else forward.
static double timed_s(const bench_numbers *b, int backward) {
    return backward ? b->fwd_bwd_s : b->fwd_s;
}

// The speedup's spread over the repeats: the baseline's fastest over this run's slowest, and
// its slowest over this run's fastest.
static void speedup_range(const bench_numbers *p, const bench_numbers *base, int backward,
                          double *lo, double *hi) {
    *lo = (backward ? base->fwd_bwd_min_s : base->fwd_min_s) /
          (backward ? p->fwd_bwd_max_s : p->fwd_max_s);
    *hi = (backward ? base->fwd_bwd_max_s : base->fwd_max_s) /
          (backward ? p->fwd_bwd_min_s : p->fwd_min_s);
}

// reproducible / default of one quantity, NAN where the default's is 0 or not finite.
static double over(double repro, double dflt) {
    return dflt != 0 && isfinite(dflt) ? repro / dflt : NAN;
}

// --reproducible: the default mode's numbers (the same ranks, in the same run) and the ratios.
static void json_default(FILE *f, const bench_numbers *p, const bench_numbers *d, int backward) {
    fputs(",\"default_mode\":{", f);
    json_numbers(f, d, backward);
    fputs("},\"reproducible_over_default\":{\"fwd_time\":", f);
    cpt_json_num(f, over(p->fwd_s, d->fwd_s));
    if (backward) {
        fputs(",\"fwd_bwd_time\":", f);
        cpt_json_num(f, over(p->fwd_bwd_s, d->fwd_bwd_s));
    }
    fputs(",\"peak_bytes_per_rank\":", f);
    cpt_json_num(f, over((double)p->peak_bytes, (double)d->peak_bytes));
    fputs(",\"bytes_sent_per_rank\":", f);
    cpt_json_num(f, over((double)p->bytes_sent, (double)d->bytes_sent));
    fputc('}', f);
}

static void print_json(const cpt_run_config *c, const char *comm, const cpt_run_result *r,
                       const bench_numbers *p, const bench_numbers *base, const bench_numbers *dflt,
                       const cpt_peak_info *peak) {
    fprintf(stdout, "{\"ok\":%s,\"status\":\"%s\",\"config\":{", r->ok ? "true" : "false",
            ctxpar_status_string(r->status));
    cpt_json_config_members(stdout, c, r->algo);
    fprintf(stdout, ",\"comm\":\"%s\",\"backend\":\"%s\",\"warmup\":%d,\"repeat\":%d},", comm,
            cpt_run_backend_name(c->backend), c->warmup, c->repeat);
    fputs("\"device\":", stdout); // what the P-rank run computed with (rank 0's device)
    cpt_json_string(stdout, r->device);
    fputc(',', stdout);
    cpt_peak_json_members(stdout, peak);
    fputc(',', stdout);
    json_numbers(stdout, p, c->backward);
    fputs(",\"speedup\":", stdout);
    cpt_json_num(stdout, timed_s(base, c->backward) / timed_s(p, c->backward));
    double lo, hi;
    speedup_range(p, base, c->backward, &lo, &hi);
    fputs(",\"speedup_min\":", stdout);
    cpt_json_num(stdout, lo);
    fputs(",\"speedup_max\":", stdout);
    cpt_json_num(stdout, hi);
    fputs(",\"baseline\":{", stdout);
    json_numbers(stdout, base, c->backward);
    fputc('}', stdout);
    if (dflt)
        json_default(stdout, p, dflt, c->backward);
    fputs(",\"flops_convention\":", stdout);
    cpt_json_string(stdout, flops_convention);
    if (c->compare_oracle) {
        fputc(',', stdout);
        cpt_report_json_errors(stdout, r);
    }
    fputs("}", stdout);
}

static void ms_cell(char *buf, size_t n, double s) {
    if (isfinite(s))
        snprintf(buf, n, "%.3f ms", s * 1e3);
    else
        snprintf(buf, n, "-");
}

// "11.902 - 13.047 ms": the fastest and slowest of the repeats.
static void spread_cell(char *buf, size_t n, double lo, double hi) {
    if (isfinite(lo) && isfinite(hi))
        snprintf(buf, n, "%.3f - %.3f ms", lo * 1e3, hi * 1e3);
    else
        snprintf(buf, n, "-");
}

// "62.1 %" of the peak, or "-" without one.
static void pct_cell(char *buf, size_t n, double flops_per_s, double peak) {
    if (isfinite(flops_per_s / peak))
        snprintf(buf, n, "%.1f %%", 100 * flops_per_s / peak);
    else
        snprintf(buf, n, "-");
}

// One row of the table: the P-rank and the baseline cell.
static void row(const char *label, const char *a, const char *b) {
    printf("  %-26s %-16s %s\n", label, a, b);
}

// --reproducible: the reproducible run against the default mode's on the same ranks, measured in
// the same bench.
static void print_default_block(const cpt_run_config *c, const bench_numbers *p,
                                const bench_numbers *d) {
    char a[32], b[32], q[32];
    printf("\n  reproducible against the default mode (%d rank%s each, same run):\n", p->ranks,
           p->ranks > 1 ? "s" : "");
    printf("  %-26s %-16s %-16s %s\n", "", "reproducible", "default", "reproducible/default");
    ms_cell(a, sizeof a, p->fwd_s);
    ms_cell(b, sizeof b, d->fwd_s);
    snprintf(q, sizeof q, "%.2fx", over(p->fwd_s, d->fwd_s));
    printf("  %-26s %-16s %-16s %s\n", "forward (median)", a, b, q);
    if (c->backward) {
        ms_cell(a, sizeof a, p->fwd_bwd_s);
        ms_cell(b, sizeof b, d->fwd_bwd_s);
        snprintf(q, sizeof q, "%.2fx", over(p->fwd_bwd_s, d->fwd_bwd_s));
        printf("  %-26s %-16s %-16s %s\n", "forward + backward", a, b, q);
    }
    snprintf(a, sizeof a, "%.2f", p->peak_bytes / 1048576.0);
    snprintf(b, sizeof b, "%.2f", d->peak_bytes / 1048576.0);
    snprintf(q, sizeof q, "%.2fx", over((double)p->peak_bytes, (double)d->peak_bytes));
    printf("  %-26s %-16s %-16s %s\n", "peak memory per rank, MiB", a, b, q);
    snprintf(a, sizeof a, "%.2f", p->bytes_sent / 1048576.0);
    snprintf(b, sizeof b, "%.2f", d->bytes_sent / 1048576.0);
    if (d->bytes_sent > 0)
        snprintf(q, sizeof q, "%.2fx", over((double)p->bytes_sent, (double)d->bytes_sent));
    else
        snprintf(q, sizeof q, "-");
    printf("  %-26s %-16s %-16s %s\n", "sent per rank, MiB", a, b, q);
}

static void print_table(const cpt_run_config *c, const char *comm, const cpt_run_result *r,
                        const bench_numbers *p, const bench_numbers *base,
                        const bench_numbers *dflt, const cpt_peak_info *peak) {
    printf("ctxpar bench: %s (%s), %s layout, %s mask, %s, %s%s\n"
           "              batch %lld, seq %lld, heads %lld/%lld, dim %lld; %d ranks x %lld "
           "tokens\n"
           "              %s backend, %s comm; median of %d calls after %d warm-up\n\n",
           ctxpar_algo_name(r->algo), ctxpar_algo_name(c->params.algo),
           ctxpar_layout_name(c->params.layout), ctxpar_mask_name(c->params.mask),
           ctxpar_dtype_name(c->dtype), c->backward ? "forward + backward" : "forward",
           c->params.reproducible ? ", reproducible" : "", (long long)c->batch, (long long)c->seq,
           (long long)c->heads, (long long)c->kv_heads, (long long)c->head_dim, c->ranks,
           (long long)((c->seq + c->ranks - 1) / c->ranks), cpt_run_backend_name(c->backend), comm,
           c->repeat, c->warmup);
    printf("              device: %s\n\n", r->device);
    if (peak->have)
        printf("              peak: %.1f GFLOP/s per core (%s FMA, measured), %d cores; core "
               "class %s, tiles %s\n\n",
               peak->core.flops_per_core * 1e-9, peak->core.kernels, peak->cores,
               peak->core.uarch, peak->core.tiles);
    char h[32];
    snprintf(h, sizeof h, "%d rank%s", p->ranks, p->ranks > 1 ? "s" : "");
    printf("  %-26s %-16s %s\n", "", h, "1 rank (baseline)");
    char a[32], b[32];
    snprintf(a, sizeof a, "%d", p->threads);
    snprintf(b, sizeof b, "%d", base->threads);
    printf("  %-26s %-16s %s\n", "threads per rank", a, b);
    ms_cell(a, sizeof a, p->fwd_s);
    ms_cell(b, sizeof b, base->fwd_s);
    printf("  %-26s %-16s %s\n", "forward (median)", a, b);
    spread_cell(a, sizeof a, p->fwd_min_s, p->fwd_max_s);
    spread_cell(b, sizeof b, base->fwd_min_s, base->fwd_max_s);
    row("  min - max", a, b);
    if (c->backward) {
        ms_cell(a, sizeof a, p->fwd_bwd_s);
        ms_cell(b, sizeof b, base->fwd_bwd_s);
        printf("  %-26s %-16s %s\n", "forward + backward", a, b);
        spread_cell(a, sizeof a, p->fwd_bwd_min_s, p->fwd_bwd_max_s);
        spread_cell(b, sizeof b, base->fwd_bwd_min_s, base->fwd_bwd_max_s);
        row("  min - max", a, b);
    }
    printf("  %-26s %-16.2f %.2f\n", "forward GFLOP/s", p->fwd_flops_per_s / 1e9,
           base->fwd_flops_per_s / 1e9);
    if (c->backward)
        printf("  %-26s %-16.2f %.2f\n", "fwd + bwd GFLOP/s", p->fwd_bwd_flops_per_s / 1e9,
               base->fwd_bwd_flops_per_s / 1e9);
    pct_cell(a, sizeof a, p->fwd_flops_per_s, p->peak_flops);
    pct_cell(b, sizeof b, base->fwd_flops_per_s, base->peak_flops);
    row("forward % of peak", a, b);
    if (c->backward) {
        snprintf(a, sizeof a, "%.2f", p->bwd_flops_per_s / 1e9);
        snprintf(b, sizeof b, "%.2f", base->bwd_flops_per_s / 1e9);
        row("backward GFLOP/s", a, b);
        pct_cell(a, sizeof a, p->bwd_flops_per_s, p->peak_flops);
        pct_cell(b, sizeof b, base->bwd_flops_per_s, base->peak_flops);
        row("backward % of peak", a, b);
        pct_cell(a, sizeof a, p->fwd_bwd_flops_per_s, p->peak_flops);
        pct_cell(b, sizeof b, base->fwd_bwd_flops_per_s, base->peak_flops);
        row("fwd + bwd % of peak", a, b);
    }
    printf("  %-26s %-16.0f %.0f\n", "tokens/s (forward)", p->tokens_per_s, base->tokens_per_s);
    printf("  %-26s %-16.2f %.2f\n", "peak memory per rank, MiB", p->peak_bytes / 1048576.0,
           base->peak_bytes / 1048576.0);
    printf("  %-26s %-16llu %llu\n", "allocations per call", (unsigned long long)p->allocations,
           (unsigned long long)base->allocations);
    printf("  %-26s %-16.2f %.2f\n", "sent per rank, MiB", p->bytes_sent / 1048576.0,
           base->bytes_sent / 1048576.0);
    ms_cell(a, sizeof a, p->compute_s);
    ms_cell(b, sizeof b, base->compute_s);
    printf("  %-26s %-16s %s\n", "compute per call", a, b);
    ms_cell(a, sizeof a, p->transfer_s);
    ms_cell(b, sizeof b, base->transfer_s);
    printf("  %-26s %-16s %s\n", "transfers in flight", a, b);
    ms_cell(a, sizeof a, p->wait_s);
    ms_cell(b, sizeof b, base->wait_s);
    printf("  %-26s %-16s %s\n", "waiting on transfers", a, b);
    if (isfinite(p->hidden))
        snprintf(a, sizeof a, "%.1f %%", 100 * p->hidden);
    else
        snprintf(a, sizeof a, "-");
    printf("  %-26s %-16s %s\n", "transfer time hidden", a, "-");
    double lo, hi;
    speedup_range(p, base, c->backward, &lo, &hi);
    printf("\n  speedup over 1 rank: %.2fx (%s; %.2fx - %.2fx from the repeats' min and max)\n",
           timed_s(base, c->backward) / timed_s(p, c->backward),
           c->backward ? "forward + backward" : "forward", lo, hi);
    if (dflt)
        print_default_block(c, p, dflt);
    if (oversubscribed(p))
        printf("  warning: %d ranks x %d threads on %d cores: the ranks share cores, so these "
               "times measure the sharing\n",
               p->ranks, p->threads, p->cores);
    if (c->compare_oracle) {
        printf("\n");
        cpt_report_rows(stdout, r);
        printf("\n  result: %s\n", r->ok ? "OK" : "FAILED");
    }
    printf("  FLOPs: %s\n", flops_convention);
}

static void print_sweep_header(const cpt_run_config *c, const char *comm,
                               const cpt_peak_info *peak) {
    printf("ctxpar bench --sweep: %s, %s layout, %s mask, %s, batch %lld, heads %lld/%lld, dim "
           "%lld, %s backend, %s comm, median of %d calls after %d warm-up. GFLOP/s: %s. "
           "Speedup: one rank's time / this time (%s).\n\n",
           ctxpar_algo_name(c->params.algo), ctxpar_layout_name(c->params.layout),
           ctxpar_mask_name(c->params.mask), ctxpar_dtype_name(c->dtype), (long long)c->batch,
           (long long)c->heads, (long long)c->kv_heads, (long long)c->head_dim,
           cpt_run_backend_name(c->backend), comm, c->repeat, c->warmup, flops_convention,
           c->backward ? "forward + backward" : "forward");
    if (peak->have)
        printf("Peak: %.1f GFLOP/s per core (%s FMA, measured) x the cores in use (at most %d). "
               "Core class %s, tiles %s.\n\n",
               peak->core.flops_per_core * 1e-9, peak->core.kernels, peak->cores,
               peak->core.uarch, peak->core.tiles);
    printf(
        "| seq | ranks | threads/rank | fwd ms | fwd ms min - max | fwd GFLOP/s | fwd %% of peak "
        "|%s tokens/s | speedup | speedup min - max | peak MiB/rank | MiB sent/rank | hidden "
        "|%s\n",
        c->backward ? " fwd+bwd ms | fwd+bwd ms min - max | fwd+bwd GFLOP/s | fwd+bwd % of "
                      "peak |"
                    : "",
        !c->params.reproducible ? ""
        : c->backward
            ? " default fwd ms | reproducible/default fwd | default fwd+bwd ms | "
              "reproducible/default fwd+bwd | default peak MiB/rank | default MiB sent/rank |"
            : " default fwd ms | reproducible/default fwd | default peak MiB/rank | default MiB "
              "sent/rank |");
    printf("|---:|---:|---:|---:|---:|---:|---:|%s---:|---:|---:|---:|---:|---:|%s\n",
           c->backward ? "---:|---:|---:|---:|" : "",
           !c->params.reproducible ? ""
           : c->backward           ? "---:|---:|---:|---:|---:|---:|"
                                   : "---:|---:|---:|---:|");
}

static void print_sweep_row(const cpt_run_config *c, const bench_numbers *p,
                            const bench_numbers *base, const bench_numbers *dflt) {
    char pct[16];
    pct_cell(pct, sizeof pct, p->fwd_flops_per_s, p->peak_flops);
    // An oversubscribed row's threads are marked: its times measure cores shared between ranks.
    printf("| %lld | %d | %d%s | %.2f | %.2f - %.2f | %.2f | %s |", (long long)c->seq, p->ranks,
           p->threads, oversubscribed(p) ? " (over the cores)" : "", p->fwd_s * 1e3,
           p->fwd_min_s * 1e3, p->fwd_max_s * 1e3, p->fwd_flops_per_s / 1e9, pct);
    if (c->backward) {
        pct_cell(pct, sizeof pct, p->fwd_bwd_flops_per_s, p->peak_flops);
        printf(" %.2f | %.2f - %.2f | %.2f | %s |", p->fwd_bwd_s * 1e3, p->fwd_bwd_min_s * 1e3,
               p->fwd_bwd_max_s * 1e3, p->fwd_bwd_flops_per_s / 1e9, pct);
    }
    char hidden[16] = "-";
    if (isfinite(p->hidden))
        snprintf(hidden, sizeof hidden, "%.0f %%", 100 * p->hidden);
    double lo, hi;
    speedup_range(p, base, c->backward, &lo, &hi);
    printf(" %.0f | %.2fx | %.2fx - %.2fx | %.2f | %.2f | %s |", p->tokens_per_s,
           timed_s(base, c->backward) / timed_s(p, c->backward), lo, hi, p->peak_bytes / 1048576.0,
           p->bytes_sent / 1048576.0, hidden);
    if (dflt) {
        printf(" %.2f | %.2fx |", dflt->fwd_s * 1e3, over(p->fwd_s, dflt->fwd_s));
        if (c->backward)
            printf(" %.2f | %.2fx |", dflt->fwd_bwd_s * 1e3, over(p->fwd_bwd_s, dflt->fwd_bwd_s));
        printf(" %.2f | %.2f |", dflt->peak_bytes / 1048576.0, dflt->bytes_sent / 1048576.0);
    }
    printf("\n");
    fflush(stdout);
}

// The baseline of one sequence length: one rank, the same backend, as many threads in all as
// the P ranks have. Run once per seq and kept for every rank count of a sweep.
typedef struct baseline {
    int have;
    cpt_run_result r; // rank 0's result (outputs freed)
    bench_numbers n;
} baseline;

static int run_baseline(cpt_session *s, const cpt_run_config *cfg, baseline *b,
                        const cpt_peak_info *peak, const char *of) {
    if (b->have)
        return CPT_EXIT_OK;
    char stage[96];
    snprintf(stage, sizeof stage, "seq %lld%s, baseline: ", (long long)cfg->seq, of);
    cpt_session_stage(s, stage);
    cpt_run_config c1 = cpt_run_config_one_rank(cfg);
    c1.threads = cfg->threads > 0 ? cfg->threads * cfg->ranks : 0;
    c1.compare_oracle = c1.compare_single = 0;
    if (cpt_session_run_single(s, &c1, &b->r) != CTXPAR_OK)
        return CPT_EXIT_USAGE;
    cpt_run_result_free(&b->r); // the outputs are not looked at
    if (b->r.status != CTXPAR_OK) {
        cpt_session_error(s, "single-rank baseline: %s", b->r.message);
        return cpt_exit_code(&b->r);
    }
    b->n = numbers(&c1, 1, &b->r, peak);
    b->have = 1;
    return CPT_EXIT_OK;
}

// One measurement: the baseline (if not yet), then cfg's ranks, unless that is one rank with no
// oracle to compare, which the baseline already measured. Prints the table, a sweep row or a JSON
// object (`sep` before it). `of` ends the progress line's configuration (" (3 of 8)" or "").
// Returns the exit code.
static int bench_one(cpt_session *s, const cpt_cli *cli, const cpt_run_config *cfg, baseline *base,
                     const cpt_peak_info *peak, const char *sep, const char *of,
                     cpt_bench_report *report) {
    int rc = run_baseline(s, cfg, base, peak, of);
    if (rc != CPT_EXIT_OK)
        return rc;
    cpt_run_result own, *r = &base->r;
    const int reuse = cfg->ranks == 1 && !cfg->compare_oracle;
    if (!reuse) {
        char stage[96];
        snprintf(stage, sizeof stage, "ranks %d, seq %lld%s: ", cfg->ranks, (long long)cfg->seq,
                 of);
        cpt_session_stage(s, stage);
        r = &own;
        if (cpt_session_run(s, cfg, 1, r) != CTXPAR_OK)
            return CPT_EXIT_USAGE;
        if (r->status != CTXPAR_OK) {
            cpt_session_error(s, "%s", r->message);
            rc = cpt_exit_code(r);
            cpt_run_result_free(r);
            return rc;
        }
        rc = cfg->compare_oracle && !r->ok ? CPT_EXIT_FAIL : CPT_EXIT_OK;
    }
    // --reproducible: the default mode on the same ranks, in the same run, for the ratios.
    bench_numbers dn, *dflt = NULL;
    if (cfg->params.reproducible) {
        char stage[96];
        snprintf(stage, sizeof stage, "ranks %d, seq %lld%s, default mode: ", cfg->ranks,
                 (long long)cfg->seq, of);
        cpt_session_stage(s, stage);
        cpt_run_config c0 = *cfg;
        c0.params.reproducible = 0;
        c0.compare_oracle = c0.compare_single = c0.keep_oracle = 0;
        cpt_run_result d;
        int drc = CPT_EXIT_USAGE;
        if (cpt_session_run(s, &c0, 0, &d) == CTXPAR_OK) {
            drc = CPT_EXIT_OK;
            if (d.status != CTXPAR_OK) {
                cpt_session_error(s, "default mode: %s", d.message);
                drc = cpt_exit_code(&d);
            } else {
                dn = numbers(&c0, c0.ranks, &d, peak);
                dflt = &dn;
            }
            cpt_run_result_free(&d);
        }
        if (drc != CPT_EXIT_OK) {
            if (!reuse)
                cpt_run_result_free(r);
            return drc;
        }
    }
    if (s->rank == 0) {
        const char *comm = s->mpi ? "mpi" : "local";
        bench_numbers p = reuse ? base->n : numbers(cfg, cfg->ranks, r, peak);
        cpt_bench_report_add(report, cfg, r, &base->r, p.threads);
        if (oversubscribed(&p))
            cpt_session_error(s,
                              "warning: %d ranks x %d threads on %d cores: the ranks share "
                              "cores; times and speedups measure the sharing (--ranks, "
                              "--threads)",
                              p.ranks, p.threads, p.cores);
        if (cli->json) {
            fputs(sep, stdout);
            print_json(cfg, comm, r, &p, &base->n, dflt, peak);
            fputs("\n", stdout);
        } else if (cli->sweep) {
            print_sweep_row(cfg, &p, &base->n, dflt);
        } else {
            print_table(cfg, comm, r, &p, &base->n, dflt, peak);
        }
        fflush(stdout);
    }
    if (!reuse)
        cpt_run_result_free(r);
    return rc;
}

int cpt_cmd_bench(int argc, char **argv) {
    cpt_cli cli;
    int rc = cpt_cli_parse("bench", argc, argv, &cli, stdout, stderr);
    if (rc >= 0)
        return rc;
    cpt_session s;
    if ((rc = cpt_session_begin(&s, "bench", &cli)) >= 0)
        return rc;
    // Rank 0 measures and reports (the others wait). Without a peak (not the CPU backend, or
    // the probe failed: said on stderr) the percentages are left out and the bench goes on.
    cpt_peak_info peak = {0};
    const int probed = cli.cfg.backend == CPT_RUN_CPU &&
                       cpt_peak_measure(&s, cli.peak, &peak) == 0;
    if (cli.peak) {
        if (probed)
            cpt_peak_print(stdout, &peak, cli.json);
        // Rank 0's verdict is everyone's (cpt_session_end).
        return cpt_session_end(&s, probed || s.rank ? CPT_EXIT_OK : CPT_EXIT_FAIL);
    }
    rc = CPT_EXIT_OK;
    if (s.rank == 0 && cli.sweep) {
        if (cli.json)
            fputs("{\"sweep\":[\n", stdout);
        else
            print_sweep_header(&cli.cfg, s.mpi ? "mpi" : "local", &peak);
        fflush(stdout);
    }
    int n = 0;
    static cpt_bench_report report; // --report: every point measured (static: 18 KiB)
    report.path = cli.report_path;
    report.n = 0;
    for (int i = 0; i < cli.n_seqs && rc == CPT_EXIT_OK; i++) {
        baseline base;
        memset(&base, 0, sizeof base);
        for (int j = 0; j < cli.n_ranks && rc == CPT_EXIT_OK; j++) {
            cpt_run_config c = cli.cfg;
            c.seq = cli.seqs[i];
            c.ranks = cli.ranks[j];
            char of[32] = ""; // which configuration of the sweep, on the progress line
            if (cli.n_seqs * cli.n_ranks > 1)
                snprintf(of, sizeof of, " (%d of %d)", n + 1, cli.n_seqs * cli.n_ranks);
            rc = bench_one(&s, &cli, &c, &base, &peak, n++ ? "," : "", of, &report);
        }
    }
    if (s.rank == 0 && cli.sweep && cli.json)
        fputs("]}\n", stdout);
    rc = cpt_bench_report_write(&s, &report, &cli.cfg, rc);
    return cpt_session_end(&s, rc);
}
