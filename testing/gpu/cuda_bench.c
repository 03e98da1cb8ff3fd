// cuda_bench: throughput of the CUDA device's block forward on full (P = 1) attention, ctxpar's
// own kernels and the cuDNN path, on the shapes of testing/bench/torch_sdpa.py: BF16, batch =
// 16384 / seq, heads * head_dim = 2048, causal and not. FLOPs = 4 * B * H * S^2 * D (half of it
// with the causal mask). One line per shape and path, then a JSON line of the same numbers. A
// cuDNN-path shape that ran natively says why: "native (cuDNN: <reason>)".
//
//   cuda_bench [--quick] [--iters N]
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/cuda/ctxpar_cuda_diag.h"
#include "dispatch.h"
#include "ctxpar_cuda.h"

#define CHECK(call)                                                                                \
    do {                                                                                           \
        ctxpar_status st_ = (call);                                                                \
        if (st_ != CTXPAR_OK) {                                                                    \
            fprintf(stderr, "cuda_bench: %s: %s\n", #call, ctxpar_last_error());                   \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

typedef struct shape {
    int64_t batch, seq, heads, dim;
    int causal;
} shape;

// Random-ish BF16 values in [-1, 1) (bit patterns from a hash; the exact values do not matter).
static void fill_bf16(uint16_t *h, size_t n, uint64_t seed) {
    uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        float f = (float)((x >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
        uint32_t u;
        memcpy(&u, &f, 4);
        h[i] = (uint16_t)(u >> 16);
    }
}

// Milliseconds per call of the whole-sequence block forward.
static int time_fwd(ctxpar_device *dev, const shape *s, int iters, double *ms_out,
                    uint64_t *cudnn_calls) {
    const size_t nq = (size_t)(s->batch * s->seq * s->heads * s->dim);
    void *q = NULL, *k = NULL, *v = NULL, *out = NULL, *lse = NULL;
    uint16_t *host = malloc(nq * 2);
    if (!host)
        return 1;
    CHECK(ctxpar_dev_alloc(dev, nq * 2, CTXPAR_MEM_DEVICE, &q));
    CHECK(ctxpar_dev_alloc(dev, nq * 2, CTXPAR_MEM_DEVICE, &k));
    CHECK(ctxpar_dev_alloc(dev, nq * 2, CTXPAR_MEM_DEVICE, &v));
    CHECK(ctxpar_dev_alloc(dev, nq * 4, CTXPAR_MEM_DEVICE, &out));
    CHECK(
        ctxpar_dev_alloc(dev, (size_t)(s->batch * s->heads * s->seq) * 4, CTXPAR_MEM_DEVICE, &lse));
    void *bufs[3] = {q, k, v};
    for (int i = 0; i < 3; i++) {
        fill_bf16(host, nq, (uint64_t)i + 1);
        CHECK(ctxpar_dev_copy(dev, bufs[i], host, nq * 2, CTXPAR_COPY_H2D, NULL));
    }
    free(host);
    ctxpar_span span = {0, s->seq, 1};
    ctxpar_attn_block blk;
    memset(&blk, 0, sizeof blk);
    blk.q = ctxpar_tensor_bshd(q, CTXPAR_DTYPE_BF16, s->batch, s->seq, s->heads, s->dim);
    blk.k = ctxpar_tensor_bshd(k, CTXPAR_DTYPE_BF16, s->batch, s->seq, s->heads, s->dim);
    blk.v = ctxpar_tensor_bshd(v, CTXPAR_DTYPE_BF16, s->batch, s->seq, s->heads, s->dim);
    blk.q_pos = (ctxpar_spans){&span, 1};
    blk.k_pos = (ctxpar_spans){&span, 1};
    blk.mask.causal = s->causal;
    blk.scale = 1.0f / sqrtf((float)s->dim);

    for (int i = 0; i < 3; i++) // warm-up: plan building, clocks
        CHECK(ctxpar_dev_attn_block_fwd(dev, &blk, out, lse, 0, NULL));
    CHECK(ctxpar_dev_stream_sync(dev, NULL));
    uint64_t n_cudnn0 = 0, n_native = 0, n_cudnn1 = 0;
    CHECK(ctxpar_cuda_device_fwd_counts(dev, &n_cudnn0, &n_native));
    // Three rounds of `iters` back-to-back calls timed on the host around a sync (what CUDA
    // events would measure, plus microseconds); the median round's mean.
    double t[3];
    for (int r = 0; r < 3; r++) {
        double t0 = ctxpar_now();
        for (int i = 0; i < iters; i++)
            CHECK(ctxpar_dev_attn_block_fwd(dev, &blk, out, lse, 0, NULL));
        CHECK(ctxpar_dev_stream_sync(dev, NULL));
        t[r] = (ctxpar_now() - t0) * 1e3 / iters;
    }
    CHECK(ctxpar_cuda_device_fwd_counts(dev, &n_cudnn1, &n_native));
    *cudnn_calls = n_cudnn1 - n_cudnn0;
    double lo = fmin(t[0], fmin(t[1], t[2])), hi = fmax(t[0], fmax(t[1], t[2]));
    *ms_out = t[0] + t[1] + t[2] - lo - hi;
    ctxpar_dev_free(dev, q, nq * 2, CTXPAR_MEM_DEVICE);
    ctxpar_dev_free(dev, k, nq * 2, CTXPAR_MEM_DEVICE);
    ctxpar_dev_free(dev, v, nq * 2, CTXPAR_MEM_DEVICE);
    ctxpar_dev_free(dev, out, nq * 4, CTXPAR_MEM_DEVICE);
    ctxpar_dev_free(dev, lse, (size_t)(s->batch * s->heads * s->seq) * 4, CTXPAR_MEM_DEVICE);
    return 0;
}

int main(int argc, char **argv) {
    int iters = 10, quick = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick"))
            quick = 1;
        else if (!strcmp(argv[i], "--iters") && i + 1 < argc)
            iters = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: cuda_bench [--quick] [--iters N]\n");
            return 2;
        }
    }
    if (iters < 1)
        iters = 1;
    const int dims[2] = {64, 128};
    const int64_t seqs[3] = {4096, 8192, 16384};
    const char *paths[2] = {"ctxpar_native", "ctxpar_cudnn"};
    for (int p = 0; p < 2; p++) {
        ctxpar_cuda_options opt = CTXPAR_CUDA_OPTIONS_INIT;
        opt.use_cudnn = p == 0 ? CTXPAR_CUDA_CUDNN_OFF : CTXPAR_CUDA_CUDNN_ON;
        ctxpar_device *dev = NULL;
        if (ctxpar_device_create_cuda(&opt, &dev) != CTXPAR_OK) {
            printf("%s unavailable: %s\n", paths[p], ctxpar_last_error());
            continue;
        }
        for (int di = 0; di < 2; di++)
            for (int si = 0; si < (quick ? 1 : 3); si++)
                for (int causal = 0; causal < 2; causal++) {
                    shape s = {16384 / seqs[si], seqs[si], 2048 / dims[di], dims[di], causal};
                    double ms = 0;
                    uint64_t cudnn_calls = 0;
                    if (time_fwd(dev, &s, iters, &ms, &cudnn_calls) != 0) {
                        printf("%s d=%d s=%lld causal=%d failed\n", paths[p], dims[di],
                               (long long)seqs[si], causal);
                        continue;
                    }
                    double flops = 4.0 * (double)s.batch * (double)s.heads * (double)s.seq *
                                   (double)s.seq * (double)s.dim * (causal ? 0.5 : 1.0);
                    double tflops = flops / (ms * 1e-3) / 1e12;
                    // The cuDNN device runs blocks cuDNN rejects on the native kernels: say so,
                    // and why.
                    char ran[400];
                    ctxpar_cuda_diag dg;
                    if (p == 0)
                        snprintf(ran, sizeof ran, "native");
                    else if (ctxpar_cuda_device_diag(dev, &dg) != CTXPAR_OK)
                        snprintf(ran, sizeof ran, "%s (diag failed: %s)",
                                 cudnn_calls ? "cudnn" : "native", ctxpar_last_error());
                    else if (cudnn_calls)
                        snprintf(ran, sizeof ran, "cudnn %d, %s", dg.cudnn_version,
                                 dg.cudnn_graph);
                    else
                        snprintf(ran, sizeof ran, "native (cuDNN: %s)", dg.cudnn_reason);
                    printf("%-14s bf16 d=%-3d s=%-5lld b=%-2lld h=%-2lld causal=%d  %8.3f ms  "
                           "%6.1f TFLOP/s  (ran: %s)\n",
                           paths[p], dims[di], (long long)s.seq, (long long)s.batch,
                           (long long)s.heads, causal, ms, tflops, ran);
                    for (char *c = ran; *c; c++) // keep the JSON line valid
                        if (*c == '"' || *c == '\\' || (unsigned char)*c < 0x20)
                            *c = '\'';
                    printf("{\"impl\": \"%s\", \"ran\": \"%s\", \"dtype\": \"bf16\", \"head_dim\": "
                           "%d, \"seq\": %lld, \"batch\": %lld, \"heads\": %lld, \"causal\": %d, "
                           "\"ms\": %.4f, \"tflops\": %.2f}\n",
                           paths[p], ran, dims[di], (long long)s.seq, (long long)s.batch,
                           (long long)s.heads, causal, ms, tflops);
                    fflush(stdout);
                }
        ctxpar_device_destroy(dev);
    }
    return 0;
}
