// The CPU device: its ops table, its constructor, host memory, and the choice of kernel table.
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "backends/cpu/cpu_internal.h"
#include "ctxpar_cpu.h"

// Environment variable that forces a kernel table ("generic", "avx2", "avx512"); for tests and
// for comparing instruction sets. Unset: the best the CPU supports.
#define KERNELS_ENV "CTXPAR_CPU_KERNELS"
// Forces the backward's schedule ("fused", "two-pass"; cpu_attn_bwd.c), for tests that cover
// both on the same inputs and for comparing them. Unset: chosen from the shapes.
#define BWD_ENV "CTXPAR_CPU_BWD"

static ctxpar_status choose_bwd(ctxpar_cpu_bwd_schedule *out) {
    const char *want = getenv(BWD_ENV);
    *out = CTXPAR_CPU_BWD_AUTO;
    if (!want || !*want)
        return CTXPAR_OK;
    if (!strcmp(want, "fused"))
        *out = CTXPAR_CPU_BWD_FUSED;
    else if (!strcmp(want, "two-pass"))
        *out = CTXPAR_CPU_BWD_TWO_PASS;
    else
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "%s=%s: unknown schedule (fused, two-pass)",
                            BWD_ENV, want);
    return CTXPAR_OK;
}

int ctxpar_cpu_threads(const ctxpar_cpu_device *cpu) {
    return cpu->num_threads > 0 ? cpu->num_threads : omp_get_max_threads();
}

static int kernels_supported(const ctxpar_cpu_kernels *k) {
#ifdef CTXPAR_CPU_HAVE_X86_KERNELS
    __builtin_cpu_init(); // harmless if done; needed when called before constructors ran
    if (k == &ctxpar_cpu_kernels_avx512)
        return __builtin_cpu_supports("avx512f");
    if (k == &ctxpar_cpu_kernels_avx2)
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
               __builtin_cpu_supports("f16c");
#endif
    return k == &ctxpar_cpu_kernels_generic;
}

static ctxpar_status choose_kernels(const ctxpar_cpu_kernels **kern_out) {
    static const ctxpar_cpu_kernels *const all[] = {
#ifdef CTXPAR_CPU_HAVE_X86_KERNELS
        &ctxpar_cpu_kernels_avx512,
        &ctxpar_cpu_kernels_avx2,
#endif
        &ctxpar_cpu_kernels_generic,
    };
    const size_t n = sizeof all / sizeof all[0];
    const char *want = getenv(KERNELS_ENV);
    if (want && *want) {
        for (size_t i = 0; i < n; i++) {
            if (strcmp(want, all[i]->name) != 0)
                continue;
            if (!kernels_supported(all[i]))
                return CTXPAR_ERROR(CTXPAR_ERR_NOT_SUPPORTED,
                                    "%s=%s: this CPU does not support these kernels", KERNELS_ENV,
                                    want);
            *kern_out = all[i];
            return CTXPAR_OK;
        }
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG,
                            "%s=%s: unknown kernels (generic, avx2, avx512)", KERNELS_ENV, want);
    }
    for (size_t i = 0; i < n; i++)
        if (kernels_supported(all[i])) {
            *kern_out = all[i];
            return CTXPAR_OK;
        }
    *kern_out = &ctxpar_cpu_kernels_generic;
    return CTXPAR_OK;
}

static void cpu_destroy(ctxpar_device *dev) {
    free(dev->impl);
}

static ctxpar_status cpu_alloc(ctxpar_device *dev, size_t bytes, ctxpar_mem_kind kind,
                               void **ptr_out) {
    (void)dev;
    if (kind != CTXPAR_MEM_DEVICE && kind != CTXPAR_MEM_HOST)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "alloc: unknown memory kind %d", (int)kind);
    if (!ptr_out)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "alloc: ptr_out is NULL");
    if (bytes > SIZE_MAX - 64)
        return CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "alloc: %zu bytes is too large", bytes);
    // Both kinds are ordinary host memory, straight from the C library: nothing is cached here
    // (the context's workspace keeps what the algorithms reuse, and the statistics show it).
    void *p = ctxpar_cpu_aligned_alloc(bytes);
    if (!p)
        return CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "alloc: cannot allocate %zu bytes", bytes);
    *ptr_out = p;
    return CTXPAR_OK;
}

static void cpu_free(ctxpar_device *dev, void *ptr, ctxpar_mem_kind kind) {
    (void)dev;
    (void)kind;
    free(ptr);
}

static ctxpar_status cpu_copy(ctxpar_device *dev, void *dst, const void *src, size_t bytes,
                              ctxpar_copy_kind kind, ctxpar_stream *stream) {
    (void)dev;
    (void)stream;
    if (kind < CTXPAR_COPY_D2D || kind > CTXPAR_COPY_H2H)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "copy: unknown copy kind %d", (int)kind);
    if (bytes && (!dst || !src))
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "copy: dst (%p) or src (%p) is NULL", dst, src);
    if (bytes && dst != src) // every kind is host to host; memmove also allows overlap
        memmove(dst, src, bytes);
    return CTXPAR_OK;
}

static ctxpar_status cpu_memset(ctxpar_device *dev, void *dst, int value, size_t bytes,
                                ctxpar_stream *stream) {
    (void)dev;
    (void)stream;
    if (bytes && !dst)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "memset: dst is NULL for %zu bytes", bytes);
    if (bytes)
        memset(dst, value, bytes);
    return CTXPAR_OK;
}

static const struct ctxpar_device_ops cpu_ops = {
    .version = CTXPAR_DEVICE_OPS_VERSION,
    .struct_size = sizeof(struct ctxpar_device_ops),
    .name = "cpu",
    .destroy = cpu_destroy,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .copy = cpu_copy,
    .memset = cpu_memset,
    // streams and events: NULL, the device is synchronous
    .attn_block_fwd = ctxpar_cpu_attn_block_fwd,
    .attn_merge = ctxpar_cpu_attn_merge,
    .attn_bwd_prep = ctxpar_cpu_attn_bwd_prep,
    .attn_block_bwd = ctxpar_cpu_attn_block_bwd,
    .cast = ctxpar_cpu_cast,
    .add = ctxpar_cpu_add,
    .fill = ctxpar_cpu_fill,
};

ctxpar_status ctxpar_device_create_cpu(const ctxpar_cpu_options *options,
                                       ctxpar_device **device_out) {
    if (!device_out)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "device_create_cpu: device_out is NULL");
    ctxpar_cpu_options opt = CTXPAR_CPU_OPTIONS_INIT;
    if (options) {
        size_t need = offsetof(ctxpar_cpu_options, num_threads) + sizeof opt.num_threads;
        if (options->struct_size < need)
            return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG,
                                "device_create_cpu: options->struct_size (%zu) < %zu: initialise "
                                "with CTXPAR_CPU_OPTIONS_INIT",
                                options->struct_size, need);
        opt.num_threads = options->num_threads;
    }
    if (opt.num_threads < 0)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG,
                            "device_create_cpu: options->num_threads (%d) must be >= 0",
                            opt.num_threads);
    const ctxpar_cpu_kernels *kern = NULL;
    CTXPAR_CHECK(choose_kernels(&kern));
    ctxpar_cpu_bwd_schedule bwd;
    CTXPAR_CHECK(choose_bwd(&bwd));
    ctxpar_cpu_device *cpu = calloc(1, sizeof *cpu);
    if (!cpu)
        return CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "device_create_cpu: out of memory");
    cpu->num_threads = opt.num_threads;
    cpu->kern = kern;
    cpu->bwd = bwd;
    ctxpar_status st = ctxpar_device_create(&cpu_ops, cpu, 1, device_out);
    if (st != CTXPAR_OK)
        free(cpu);
    return st;
}

const ctxpar_cpu_device *ctxpar_cpu_device_of(const ctxpar_device *dev) {
    return dev && dev->ops == &cpu_ops ? dev->impl : NULL;
}

const char *ctxpar_cpu_kernels_name(const ctxpar_device *dev) {
    return ((const ctxpar_cpu_device *)dev->impl)->kern->name;
}
