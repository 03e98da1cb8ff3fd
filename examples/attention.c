/*
 * attention.c - the README's example as a complete program: P ranks as threads of this process
 * (the local comm) compute causal ring attention over one sequence in the zigzag layout, and the
 * result is checked against attention over the whole sequence computed here in float64.
 *
 * Build against an installed ctxpar (bazel run //:install -- --prefix DIR):
 *   cc -std=c11 attention.c $(pkg-config --cflags --libs ctxpar) -pthread -lm -o attention
 * or with CMake: examples/CMakeLists.txt (find_package(ctxpar)).
 * Prints the largest errors and exits 0 when they are within tolerance, 1 otherwise.
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "ctxpar.h"
#include "ctxpar_cpu.h"
#include "ctxpar_local.h"

enum { P = 4, B = 1, S = 512, H = 4, D = 64 };

// One rank (thread) of P: it holds S/P tokens of q, k, v in the zigzag layout.
static ctxpar_status my_rank(ctxpar_local_group *group, int rank, ctxpar_tensor *q,
                             ctxpar_tensor *k, ctxpar_tensor *v, ctxpar_tensor *out, float *lse) {
    ctxpar_device *dev = NULL;
    ctxpar_comm *comm = NULL;
    ctxpar_context *ctx = NULL;
    // One OpenMP thread per rank: the ranks are already P threads.
    ctxpar_cpu_options opt = CTXPAR_CPU_OPTIONS_INIT;
    opt.num_threads = 1;
    ctxpar_status st = ctxpar_device_create_cpu(&opt, &dev);
    if (st == CTXPAR_OK)
        st = ctxpar_comm_create_local(group, rank, NULL, &comm);
    if (st == CTXPAR_OK)
        st = ctxpar_context_create(dev, comm, NULL, &ctx);
    if (st == CTXPAR_OK) {
        ctxpar_attn_params p = CTXPAR_ATTN_PARAMS_INIT;
        p.algo = CTXPAR_ALGO_RING;
        p.layout = CTXPAR_LAYOUT_ZIGZAG; // shard with ctxpar_shard(), or ctxpar_positions()
        p.mask = CTXPAR_MASK_CAUSAL;
        st = ctxpar_attn_fwd(ctx, &p, q, k, v, out, lse, NULL);
    }
    if (st != CTXPAR_OK)
        fprintf(stderr, "%s: %s\n", ctxpar_status_string(st), ctxpar_last_error());
    ctxpar_context_destroy(ctx);
    ctxpar_comm_destroy(comm);
    ctxpar_device_destroy(dev);
    return st;
}

// What each thread needs: its rank's shards, and where its status goes.
typedef struct rank_job {
    ctxpar_local_group *group;
    int rank;
    ctxpar_tensor q, k, v, out;
    float *lse;
    ctxpar_status status;
} rank_job;

static void *run_rank(void *arg) {
    rank_job *j = arg;
    j->status = my_rank(j->group, j->rank, &j->q, &j->k, &j->v, &j->out, j->lse);
    return NULL;
}

// Deterministic inputs in [-1, 1): a fixed linear congruential sequence.
static void fill(float *x, size_t n, uint32_t seed) {
    uint32_t s = seed;
    for (size_t i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u;
        x[i] = (float)((s >> 8) * (2.0 / 16777216.0) - 1.0);
    }
}

// Causal attention over the whole sequence in float64: out [B, S, H, D] and lse [B, H, S].
static void reference(const float *q, const float *k, const float *v, double *out, double *lse) {
    double *w = malloc(sizeof(double) * S);
    const double scale = 1.0 / sqrt((double)D);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int i = 0; i < S; i++) {
                const float *qi = q + (((size_t)b * S + i) * H + h) * D;
                double m = -INFINITY, sum = 0.0;
                for (int j = 0; j <= i; j++) {
                    const float *kj = k + (((size_t)b * S + j) * H + h) * D;
                    double dot = 0.0;
                    for (int d = 0; d < D; d++)
                        dot += (double)qi[d] * kj[d];
                    w[j] = dot * scale;
                    m = fmax(m, w[j]);
                }
                for (int j = 0; j <= i; j++)
                    sum += (w[j] = exp(w[j] - m));
                double *o = out + (((size_t)b * S + i) * H + h) * D;
                for (int d = 0; d < D; d++) {
                    double acc = 0.0;
                    for (int j = 0; j <= i; j++)
                        acc += w[j] * v[(((size_t)b * S + j) * H + h) * D + d];
                    o[d] = acc / sum;
                }
                lse[((size_t)b * H + h) * S + i] = m + log(sum);
            }
    free(w);
}

int main(void) {
    const size_t n = (size_t)B * S * H * D, n_local = n / P, n_lse = (size_t)B * H * S / P;
    float *q = malloc(sizeof(float) * n), *k = malloc(sizeof(float) * n);
    float *v = malloc(sizeof(float) * n), *out = malloc(sizeof(float) * n);
    float *shards = malloc(sizeof(float) * 4 * n), *lse = malloc(sizeof(float) * B * H * S);
    double *ref_out = malloc(sizeof(double) * n), *ref_lse = malloc(sizeof(double) * B * H * S);
    fill(q, n, 1);
    fill(k, n, 2);
    fill(v, n, 3);

    ctxpar_local_group *group = NULL;
    ctxpar_status st = ctxpar_local_group_create(P, &group);
    rank_job jobs[P];
    pthread_t threads[P];
    ctxpar_tensor gq = ctxpar_tensor_bshd(q, CTXPAR_DTYPE_F32, B, S, H, D);
    ctxpar_tensor gk = ctxpar_tensor_bshd(k, CTXPAR_DTYPE_F32, B, S, H, D);
    ctxpar_tensor gv = ctxpar_tensor_bshd(v, CTXPAR_DTYPE_F32, B, S, H, D);
    for (int r = 0; r < P && st == CTXPAR_OK; r++) {
        float *base = shards + 4 * (size_t)r * n_local;
        jobs[r] =
            (rank_job){group,
                       r,
                       ctxpar_tensor_bshd(base, CTXPAR_DTYPE_F32, B, S / P, H, D),
                       ctxpar_tensor_bshd(base + n_local, CTXPAR_DTYPE_F32, B, S / P, H, D),
                       ctxpar_tensor_bshd(base + 2 * n_local, CTXPAR_DTYPE_F32, B, S / P, H, D),
                       ctxpar_tensor_bshd(base + 3 * n_local, CTXPAR_DTYPE_F32, B, S / P, H, D),
                       lse + r * n_lse,
                       CTXPAR_OK};
        st = ctxpar_shard(CTXPAR_LAYOUT_ZIGZAG, r, P, &gq, &jobs[r].q);
        if (st == CTXPAR_OK)
            st = ctxpar_shard(CTXPAR_LAYOUT_ZIGZAG, r, P, &gk, &jobs[r].k);
        if (st == CTXPAR_OK)
            st = ctxpar_shard(CTXPAR_LAYOUT_ZIGZAG, r, P, &gv, &jobs[r].v);
    }
    if (st != CTXPAR_OK) {
        fprintf(stderr, "setup: %s: %s\n", ctxpar_status_string(st), ctxpar_last_error());
        return 1;
    }
    for (int r = 0; r < P; r++)
        pthread_create(&threads[r], NULL, run_rank, &jobs[r]);
    for (int r = 0; r < P; r++)
        pthread_join(threads[r], NULL);
    ctxpar_local_group_destroy(group);

    // Back to global order: out through ctxpar_unshard, lse through the ranks' positions.
    ctxpar_tensor gout = ctxpar_tensor_bshd(out, CTXPAR_DTYPE_F32, B, S, H, D);
    int64_t pos[S / P];
    double err_out = 0.0, err_lse = 0.0;
    reference(q, k, v, ref_out, ref_lse);
    for (int r = 0; r < P; r++) {
        if (jobs[r].status != CTXPAR_OK)
            return 1;
        if (ctxpar_unshard(CTXPAR_LAYOUT_ZIGZAG, r, P, &jobs[r].out, &gout) != CTXPAR_OK ||
            ctxpar_positions(CTXPAR_LAYOUT_ZIGZAG, S, r, P, pos) != CTXPAR_OK) {
            fprintf(stderr, "unshard: %s\n", ctxpar_last_error());
            return 1;
        }
        for (int bh = 0; bh < B * H; bh++)
            for (int i = 0; i < S / P; i++)
                err_lse = fmax(err_lse, fabs(jobs[r].lse[(size_t)bh * (S / P) + i] -
                                             ref_lse[(size_t)bh * S + pos[i]]));
    }
    for (size_t i = 0; i < n; i++)
        err_out = fmax(err_out, fabs(out[i] - ref_out[i]));
    // F32 inputs, F32 accumulation: errors of a few ulps of the values (|out| < 1, lse ~ 1..7).
    const double tol = 1e-4;
    int ok = err_out <= tol && err_lse <= tol;
    printf("ctxpar %s: P=%d S=%d H=%d D=%d ring zigzag causal f32\n", ctxpar_version(), P, S, H, D);
    printf("max |out - fp64| = %.3g, max |lse - fp64| = %.3g (tolerance %.0e): %s\n", err_out,
           err_lse, tol, ok ? "OK" : "FAIL");
    free(q), free(k), free(v), free(out), free(shards), free(lse), free(ref_out), free(ref_lse);
    return ok ? 0 : 1;
}
