// The CPU device: its ops table, its constructor, host memory, and the choice of kernel table
// (from its options; the ctxpar tool maps its environment overrides onto them).
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/cpu/cpu_internal.h"
#include "backends/cpu/cpu_uarch.h"
#include "ctxpar_cpu.h"

static const char *const isa_names[] = {"auto", "generic", "avx2", "avx512"};
static const char *const bwd_names[] = {"auto", "fused", "two-pass"};

// Index of `name` in names[0..n), or -1; what says what was parsed, for the message.
static int parse_name(const char *what, const char *const *names, int n, const char *name,
                      const void *out) {
    for (int i = 0; name && out && i < n; i++)
        if (!strcmp(name, names[i]))
            return i;
    char list[128] = "";
    for (int i = 0; i < n; i++) {
        size_t used = strlen(list);
        snprintf(list + used, sizeof list - used, "%s%s", i ? ", " : "", names[i]);
    }
    CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "%s '%s': unknown (%s)%s", what, name ? name : "(null)",
                 list, out ? "" : "; the output pointer is NULL");
    return -1;
}

ctxpar_status ctxpar_cpu_isa_parse(const char *name, ctxpar_cpu_isa *isa_out) {
    int i = parse_name("cpu kernels", isa_names, 4, name, isa_out);
    if (i < 0)
        return CTXPAR_ERR_INVALID_ARG;
    *isa_out = (ctxpar_cpu_isa)i;
    return CTXPAR_OK;
}

ctxpar_status ctxpar_cpu_bwd_schedule_parse(const char *name,
                                            ctxpar_cpu_bwd_schedule *schedule_out) {
    int i = parse_name("cpu backward schedule", bwd_names, 3, name, schedule_out);
    if (i < 0)
        return CTXPAR_ERR_INVALID_ARG;
    *schedule_out = (ctxpar_cpu_bwd_schedule)i;
    return CTXPAR_OK;
}

ctxpar_status ctxpar_cpu_uarch_parse(const char *name, ctxpar_cpu_uarch *uarch_out) {
    const char *names[CTXPAR_CPU_UARCH_INTEL_2FMA + 1];
    for (int i = 0; i <= CTXPAR_CPU_UARCH_INTEL_2FMA; i++)
        names[i] = ctxpar_cpu_uarch_name((ctxpar_cpu_uarch)i);
    int i = parse_name("cpu uarch", names, CTXPAR_CPU_UARCH_INTEL_2FMA + 1, name, uarch_out);
    if (i < 0)
        return CTXPAR_ERR_INVALID_ARG;
    *uarch_out = (ctxpar_cpu_uarch)i;
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

static ctxpar_status choose_kernels(ctxpar_cpu_isa want, const ctxpar_cpu_kernels **kern_out) {
    static const ctxpar_cpu_kernels *const all[] = {
#ifdef CTXPAR_CPU_HAVE_X86_KERNELS
        &ctxpar_cpu_kernels_avx512,
        &ctxpar_cpu_kernels_avx2,
#endif
        &ctxpar_cpu_kernels_generic,
    };
    const size_t n = sizeof all / sizeof all[0];
    if (want != CTXPAR_CPU_ISA_AUTO) {
        for (size_t i = 0; i < n; i++) {
            if (strcmp(isa_names[want], all[i]->name) != 0)
                continue;
            if (!kernels_supported(all[i]))
                break;
            *kern_out = all[i];
            return CTXPAR_OK;
        }
        return CTXPAR_ERROR(CTXPAR_ERR_NOT_SUPPORTED,
                            "device_create_cpu: this CPU (or this build) cannot run the %s kernels",
                            isa_names[want]);
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
    free(((ctxpar_cpu_device *)dev->impl)->kernel_ws);
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

static ctxpar_status cpu_free(ctxpar_device *dev, void *ptr, ctxpar_mem_kind kind) {
    (void)dev;
    (void)kind;
    free(ptr);
    return CTXPAR_OK;
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

// The kernels take any shape, mask and head count the front door accepts, in the three dtypes
// (the plan checks the same per block).
static ctxpar_status cpu_attn_supported(const ctxpar_device *dev, const ctxpar_attn_query *q) {
    (void)dev;
    if (q->dtype != CTXPAR_DTYPE_F32 && q->dtype != CTXPAR_DTYPE_F16 &&
        q->dtype != CTXPAR_DTYPE_BF16)
        return CTXPAR_ERROR(CTXPAR_ERR_NOT_SUPPORTED,
                            "the cpu device computes f32, f16 and bf16, not dtype %d",
                            (int)q->dtype);
    return CTXPAR_OK;
}

// "cpu: avx512 kernels (intel-2fma cores), 2 threads".
static void cpu_describe(const ctxpar_device *dev, char *buf, size_t n) {
    const ctxpar_cpu_device *cpu = dev->impl;
    const int threads = ctxpar_cpu_threads(cpu);
    snprintf(buf, n, "cpu: %s kernels (%s cores), %d thread%s", cpu->kern->name,
             ctxpar_cpu_uarch_name(cpu->uarch), threads, threads == 1 ? "" : "s");
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
    .attn_supported = cpu_attn_supported,
    .describe = cpu_describe,
    .bins_clear = ctxpar_cpu_bins_clear,
    .bins_add = ctxpar_cpu_bins_add,
    .bins_add_attn = ctxpar_cpu_bins_add_attn,
    .bins_merge = ctxpar_cpu_bins_merge,
    .bins_finish = ctxpar_cpu_bins_finish,
    .bins_finish_attn = ctxpar_cpu_bins_finish_attn,
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
        // Fields past the caller's struct_size (an older header) keep their defaults. The first
        // version (struct_size, num_threads) is 16 bytes, its tail padding where `kernels` now
        // lies: from such a caller, only num_threads is a value.
        const size_t v1_size = (need + sizeof(size_t) - 1) / sizeof(size_t) * sizeof(size_t);
        if (options->struct_size <= v1_size)
            opt.num_threads = options->num_threads;
        else
            memcpy(&opt, options,
                   options->struct_size < sizeof opt ? options->struct_size : sizeof opt);
        opt.struct_size = sizeof opt;
    }
    if (opt.num_threads < 0)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG,
                            "device_create_cpu: options->num_threads (%d) must be >= 0",
                            opt.num_threads);
    if ((unsigned)opt.kernels > CTXPAR_CPU_ISA_AVX512)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG,
                            "device_create_cpu: options->kernels (%d) is not a ctxpar_cpu_isa",
                            (int)opt.kernels);
    if ((unsigned)opt.bwd_schedule > CTXPAR_CPU_BWD_TWO_PASS)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG,
                            "device_create_cpu: options->bwd_schedule (%d) is not a "
                            "ctxpar_cpu_bwd_schedule",
                            (int)opt.bwd_schedule);
    if ((unsigned)opt.uarch > CTXPAR_CPU_UARCH_INTEL_2FMA)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG,
                            "device_create_cpu: options->uarch (%d) is not a ctxpar_cpu_uarch",
                            (int)opt.uarch);
    const ctxpar_cpu_kernels *kern = NULL;
    CTXPAR_CHECK(choose_kernels(opt.kernels, &kern));
    // The instruction set decides the bits; the core class only the register tile.
    const ctxpar_cpu_uarch uarch =
        opt.uarch == CTXPAR_CPU_UARCH_AUTO ? ctxpar_cpu_uarch_detect() : opt.uarch;
    kern = ctxpar_cpu_kernels_for(kern, uarch);
    ctxpar_cpu_bwd_schedule bwd = opt.bwd_schedule;
    ctxpar_cpu_device *cpu = calloc(1, sizeof *cpu);
    if (!cpu)
        return CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "device_create_cpu: out of memory");
    cpu->num_threads = opt.num_threads;
    cpu->kern = kern;
    cpu->bwd = bwd;
    cpu->uarch = uarch;
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

// The registry's "cpu": the default options but the thread count.
static ctxpar_status create_default(int num_threads, ctxpar_device **device_out) {
    ctxpar_cpu_options options = CTXPAR_CPU_OPTIONS_INIT;
    options.num_threads = num_threads;
    return ctxpar_device_create_cpu(&options, device_out);
}

// "cpu" is a device name wherever this backend is linked in; the priority registers it before
// any other backend linked into the same binary, so that it is always the registry's first.
__attribute__((constructor(101))) static void register_cpu(void) {
    if (ctxpar_device_register("cpu", "the CPU device (OpenMP, deterministic)", create_default) !=
        CTXPAR_OK)
        ctxpar_clear_error(); // already there: the first registration stands
}
