// Status names, the thread-local last error, enum names and the monotonic clock.
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "ctxpar_backend.h"

#define CTXPAR_ERROR_LEN 512

static _Thread_local char last_error[CTXPAR_ERROR_LEN];

const char *ctxpar_status_string(ctxpar_status status) {
    switch (status) {
    case CTXPAR_OK: return "CTXPAR_OK";
    case CTXPAR_ERR_INVALID_ARG: return "CTXPAR_ERR_INVALID_ARG";
    case CTXPAR_ERR_INVALID_USAGE: return "CTXPAR_ERR_INVALID_USAGE";
    case CTXPAR_ERR_NOT_SUPPORTED: return "CTXPAR_ERR_NOT_SUPPORTED";
    case CTXPAR_ERR_OUT_OF_MEMORY: return "CTXPAR_ERR_OUT_OF_MEMORY";
    case CTXPAR_ERR_DEVICE: return "CTXPAR_ERR_DEVICE";
    case CTXPAR_ERR_COMM: return "CTXPAR_ERR_COMM";
    case CTXPAR_ERR_REMOTE: return "CTXPAR_ERR_REMOTE";
    case CTXPAR_ERR_TIMEOUT: return "CTXPAR_ERR_TIMEOUT";
    case CTXPAR_ERR_INTERNAL: return "CTXPAR_ERR_INTERNAL";
    }
    return "CTXPAR_ERR_UNKNOWN";
}

const char *ctxpar_last_error(void) { return last_error; }

void ctxpar_clear_error(void) { last_error[0] = '\0'; }

ctxpar_status ctxpar_set_error(ctxpar_status status, const char *file, int line, const char *fmt,
                               ...) {
    // Keep the path from the repository root: "algorithms/ring.c:88: ...".
    const char *rel = NULL;
    const char *roots[] = {"core/",  "dispatch/",  "algorithms/", "backends/",
                           "comm/",  "reference/", "testing/",    "tools/"};
    for (size_t i = 0; !rel && i < sizeof roots / sizeof roots[0]; i++)
        rel = strstr(file, roots[i]);
    int n = snprintf(last_error, sizeof last_error, "%s:%d: ", rel ? rel : file, line);
    if (n < 0 || (size_t)n >= sizeof last_error)
        n = 0;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error + n, sizeof last_error - (size_t)n, fmt, ap);
    va_end(ap);
    return status;
}

const char *ctxpar_version(void) { return "0.1.0"; }

size_t ctxpar_dtype_size(ctxpar_dtype dtype) {
    switch (dtype) {
    case CTXPAR_DTYPE_F32: return 4;
    case CTXPAR_DTYPE_F16:
    case CTXPAR_DTYPE_BF16: return 2;
    }
    return 0;
}

const char *ctxpar_dtype_name(ctxpar_dtype dtype) {
    switch (dtype) {
    case CTXPAR_DTYPE_F32: return "f32";
    case CTXPAR_DTYPE_F16: return "f16";
    case CTXPAR_DTYPE_BF16: return "bf16";
    }
    return "?";
}

const char *ctxpar_layout_name(ctxpar_layout layout) {
    switch (layout) {
    case CTXPAR_LAYOUT_CONTIGUOUS: return "contiguous";
    case CTXPAR_LAYOUT_ZIGZAG: return "zigzag";
    case CTXPAR_LAYOUT_STRIPED: return "striped";
    case CTXPAR_LAYOUT_CUSTOM: return "custom";
    }
    return "?";
}

const char *ctxpar_mask_name(ctxpar_mask mask) {
    switch (mask) {
    case CTXPAR_MASK_NONE: return "none";
    case CTXPAR_MASK_CAUSAL: return "causal";
    }
    return "?";
}

ctxpar_tensor ctxpar_tensor_bshd(void *data, ctxpar_dtype dtype, int64_t batch, int64_t seq,
                                 int64_t heads, int64_t head_dim) {
    ctxpar_tensor t;
    t.data = data;
    t.dtype = dtype;
    t.shape[0] = batch;
    t.shape[1] = seq;
    t.shape[2] = heads;
    t.shape[3] = head_dim;
    t.stride[3] = 1;
    t.stride[2] = head_dim;
    t.stride[1] = heads * head_dim;
    t.stride[0] = seq * heads * head_dim;
    return t;
}

double ctxpar_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void ctxpar_restore_error(const char *message) {
    snprintf(last_error, sizeof last_error, "%s", message);
}
