// The CUDA device: construction, the ops table, queries, and the helpers every op uses.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctxpar_cuda_diag.h"
#include "cuda_cudnn.h"
#include "cuda_internal.h"

ctxpar_status ctxpar_cuda_fail(cudaError_t err, const char *file, int line, const char *what) {
    ctxpar_status st =
        err == cudaErrorMemoryAllocation ? CTXPAR_ERR_OUT_OF_MEMORY : CTXPAR_ERR_DEVICE;
    return ctxpar_set_error(st, file, line, "%s failed: %s (%s)", what, cudaGetErrorString(err),
                            cudaGetErrorName(err));
}

ctxpar_status ctxpar_cuda_enter(struct ctxpar_device *dev) {
    CTXPAR_CUDA_CHECK(cudaSetDevice(ctxpar_cuda_impl_of(dev)->ordinal));
    return CTXPAR_OK;
}

ctxpar_status ctxpar_cuda_scratch_alloc(struct ctxpar_device *dev, size_t bytes,
                                        cudaStream_t stream, void **ptr_out) {
    ctxpar_cuda_impl *impl = ctxpar_cuda_impl_of(dev);
    void *p = NULL;
    if (impl->pool)
        CTXPAR_CUDA_CHECK(cudaMallocFromPoolAsync(&p, bytes ? bytes : 1, impl->pool, stream));
    else
        CTXPAR_CUDA_CHECK(cudaMalloc(&p, bytes ? bytes : 1));
    *ptr_out = p;
    return CTXPAR_OK;
}

ctxpar_status ctxpar_cuda_scratch_free(struct ctxpar_device *dev, void *ptr, cudaStream_t stream) {
    if (!ptr)
        return CTXPAR_OK;
    if (ctxpar_cuda_impl_of(dev)->pool)
        CTXPAR_CUDA_CHECK(cudaFreeAsync(ptr, stream));
    else
        CTXPAR_CUDA_CHECK(cudaFree(ptr)); // no pool: cudaFree waits for the device itself
    return CTXPAR_OK;
}

void ctxpar_cuda_drain(ctxpar_cuda_impl *impl) {
    for (struct ctxpar_stream *s = impl->live; s; s = s->next)
        (void)cudaStreamSynchronize(s->stream);
    (void)cudaStreamSynchronize(cudaStreamLegacy);
    if (impl->util_stream)
        (void)cudaStreamSynchronize(impl->util_stream);
    if (impl->alloc_stream)
        (void)cudaStreamSynchronize(impl->alloc_stream);
}

static void impl_release(ctxpar_cuda_impl *impl) {
    if (!impl)
        return;
    (void)cudaSetDevice(impl->ordinal);
    ctxpar_cuda_drain(impl);
    // Streams still wrapped or not destroyed forget the device (their release must not touch it).
    while (impl->live)
        ctxpar_cuda_stream_unregister(impl, impl->live);
    ctxpar_cudnn_destroy(impl->cudnn);
    if (impl->legacy_fence)
        (void)cudaEventDestroy(impl->legacy_fence);
    if (impl->checksum_dev)
        (void)cudaFree(impl->checksum_dev);
    if (impl->checksum_host)
        (void)cudaFreeHost(impl->checksum_host);
    if (impl->util_stream)
        (void)cudaStreamDestroy(impl->util_stream);
    if (impl->alloc_stream)
        (void)cudaStreamDestroy(impl->alloc_stream);
    if (impl->pool)
        (void)cudaMemPoolDestroy(impl->pool);
    free(impl);
}

static void cuda_destroy(struct ctxpar_device *dev) {
    impl_release(ctxpar_cuda_impl_of(dev));
}

// The GPU exists, is new enough for the kernels (sm_80: bf16 mma.sync), and its limits.
static ctxpar_status probe_gpu(ctxpar_cuda_impl *impl) {
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess)
        return CTXPAR_ERROR(CTXPAR_ERR_DEVICE, "no usable CUDA device: %s (%s)",
                            cudaGetErrorString(e), cudaGetErrorName(e));
    if (impl->ordinal < 0 || impl->ordinal >= count)
        return CTXPAR_ERROR(CTXPAR_ERR_DEVICE,
                            "options->device_ordinal (%d) is not a CUDA device (found %d)",
                            impl->ordinal, count);
    CTXPAR_CUDA_CHECK(cudaSetDevice(impl->ordinal));
    CTXPAR_CUDA_CHECK(
        cudaDeviceGetAttribute(&impl->cc_major, cudaDevAttrComputeCapabilityMajor, impl->ordinal));
    CTXPAR_CUDA_CHECK(
        cudaDeviceGetAttribute(&impl->cc_minor, cudaDevAttrComputeCapabilityMinor, impl->ordinal));
    if (impl->cc_major < 8)
        return CTXPAR_ERROR(
            CTXPAR_ERR_DEVICE,
            "CUDA device %d has compute capability %d.%d; ctxpar needs 8.0 or newer", impl->ordinal,
            impl->cc_major, impl->cc_minor);
    int optin = 0;
    CTXPAR_CUDA_CHECK(
        cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, impl->ordinal));
    impl->smem_optin = (size_t)optin;
    return CTXPAR_OK;
}

// Whether to use a memory pool: the GPU and driver must support pools; CTXPAR_CUDA_POOL=0 turns
// it off (the cudaMalloc path, for tests and for environments where pool memory is a problem).
static int want_pool(int ordinal) {
    const char *env = getenv("CTXPAR_CUDA_POOL");
    if (env && strcmp(env, "0") == 0)
        return 0;
    int supported = 0;
    if (cudaDeviceGetAttribute(&supported, cudaDevAttrMemoryPoolsSupported, ordinal) !=
        cudaSuccess) {
        (void)cudaGetLastError(); // an old driver without the attribute: no pools
        return 0;
    }
    return supported;
}

// Pool memory is private to its GPU unless access is granted: every GPU that can reach this one
// (cudaDeviceCanAccessPeer) gets read/write access, so that peers in the same process (NCCL's
// intra-process transport, kernels reading a peer's buffer) can use buffers from it.
static ctxpar_status grant_peers(ctxpar_cuda_impl *impl) {
    int count = 0;
    CTXPAR_CUDA_CHECK(cudaGetDeviceCount(&count));
    for (int peer = 0; peer < count; peer++) {
        int can = 0;
        if (peer == impl->ordinal)
            continue;
        CTXPAR_CUDA_CHECK(cudaDeviceCanAccessPeer(&can, peer, impl->ordinal));
        if (!can)
            continue;
        struct cudaMemAccessDesc access;
        memset(&access, 0, sizeof access);
        access.location.type = cudaMemLocationTypeDevice;
        access.location.id = peer;
        access.flags = cudaMemAccessFlagsProtReadWrite;
        CTXPAR_CUDA_CHECK(cudaMemPoolSetAccess(impl->pool, &access, 1));
        impl->peers_granted++;
    }
    return CTXPAR_OK;
}

// A private pool that keeps freed scratch for reuse instead of returning it to the driver.
static ctxpar_status make_pool(ctxpar_cuda_impl *impl) {
    if (!want_pool(impl->ordinal))
        return CTXPAR_OK; // impl->pool stays NULL: cudaMalloc/cudaFree
    struct cudaMemPoolProps props;
    memset(&props, 0, sizeof props);
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = impl->ordinal;
    CTXPAR_CUDA_CHECK(cudaMemPoolCreate(&impl->pool, &props));
    uint64_t keep = UINT64_MAX;
    CTXPAR_CUDA_CHECK(cudaMemPoolSetAttribute(impl->pool, cudaMemPoolAttrReleaseThreshold, &keep));
    // A synchronous alloc must not wait for unrelated work: the pool may hand out memory whose
    // fenced free has completed (or follows an event the stream already waits on), but may not
    // make the allocating stream wait for a free still pending.
    int no = 0;
    CTXPAR_CUDA_CHECK(
        cudaMemPoolSetAttribute(impl->pool, cudaMemPoolReuseAllowInternalDependencies, &no));
    return grant_peers(impl);
}

// The SIMT kernels' dynamic shared-memory limit, once for this GPU (cuda_kernels.h).
static ctxpar_status configure_kernels(ctxpar_cuda_impl *impl) {
    CTXPAR_CUDA_CHECK(ctxpar_cuda_simt_fwd_configure(impl->smem_optin, &impl->smem_fwd));
    CTXPAR_CUDA_CHECK(ctxpar_cuda_simt_bwd_configure(impl->smem_optin, &impl->smem_bwd));
    return CTXPAR_OK;
}

static ctxpar_status make_buffers(ctxpar_cuda_impl *impl) {
    CTXPAR_CUDA_CHECK(cudaStreamCreateWithFlags(&impl->util_stream, cudaStreamNonBlocking));
    CTXPAR_CUDA_CHECK(cudaStreamCreateWithFlags(&impl->alloc_stream, cudaStreamNonBlocking));
    CTXPAR_CUDA_CHECK(cudaEventCreateWithFlags(&impl->legacy_fence, cudaEventDisableTiming));
    CTXPAR_CUDA_CHECK(cudaMalloc((void **)&impl->checksum_dev, sizeof(uint64_t)));
    CTXPAR_CUDA_CHECK(cudaMallocHost((void **)&impl->checksum_host, sizeof(uint64_t)));
    return CTXPAR_OK;
}

ctxpar_status ctxpar_device_create_cuda(const ctxpar_cuda_options *options,
                                        ctxpar_device **device_out) {
    ctxpar_cuda_options opt = CTXPAR_CUDA_OPTIONS_INIT;
    if (!device_out)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "device_out is NULL");
    if (options) {
        if (options->struct_size < offsetof(ctxpar_cuda_options, use_cudnn) + sizeof(int))
            return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG,
                                "options->struct_size (%zu) is too small: use "
                                "CTXPAR_CUDA_OPTIONS_INIT",
                                options->struct_size);
        opt.device_ordinal = options->device_ordinal;
        opt.use_cudnn = options->use_cudnn;
    }
    if (opt.use_cudnn != CTXPAR_CUDA_CUDNN_AUTO && opt.use_cudnn != CTXPAR_CUDA_CUDNN_ON &&
        opt.use_cudnn != CTXPAR_CUDA_CUDNN_OFF)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG,
                            "options->use_cudnn (%d) is not a "
                            "ctxpar_cuda_cudnn value",
                            (int)opt.use_cudnn);

    ctxpar_cuda_impl *impl = calloc(1, sizeof *impl);
    if (!impl)
        return CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "cannot allocate the CUDA device state");
    impl->ordinal = opt.device_ordinal;
    ctxpar_status st = probe_gpu(impl);
    if (st != CTXPAR_OK) {
        free(impl); // nothing was created on the GPU yet
        return st;
    }
    ctxpar_device *dev = NULL;
    CTXPAR_CHECK_GOTO(make_pool(impl), st, fail);
    CTXPAR_CHECK_GOTO(make_buffers(impl), st, fail);
    CTXPAR_CHECK_GOTO(configure_kernels(impl), st, fail);
    snprintf(impl->cudnn_reason, sizeof impl->cudnn_reason, "off (use_cudnn = OFF)");
    if (opt.use_cudnn != CTXPAR_CUDA_CUDNN_OFF) {
        st = ctxpar_cudnn_create(impl->ordinal, &impl->cudnn);
        if (st != CTXPAR_OK && opt.use_cudnn == CTXPAR_CUDA_CUDNN_ON)
            goto fail; // the error names why cuDNN is unavailable
        if (st != CTXPAR_OK) {
            // AUTO: run without it, and keep the reason for ctxpar_cuda_device_diag.
            snprintf(impl->cudnn_reason, sizeof impl->cudnn_reason, "unavailable: %s",
                     ctxpar_last_error());
            ctxpar_clear_error();
        } else {
            impl->cudnn_reason[0] = '\0';
        }
        st = CTXPAR_OK;
    }
    CTXPAR_CHECK_GOTO(ctxpar_device_create(&ctxpar_cuda_device_ops, impl, 0, &dev), st, fail);
    *device_out = dev;
    return CTXPAR_OK;
fail:
    impl_release(impl);
    return st;
}

static ctxpar_status own_impl(const ctxpar_device *device, const char *what,
                              ctxpar_cuda_impl **impl_out) {
    if (!device || device->ops != &ctxpar_cuda_device_ops)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "%s: device (%p) is not a CUDA device", what,
                            (const void *)device);
    *impl_out = (ctxpar_cuda_impl *)device->impl;
    return CTXPAR_OK;
}

ctxpar_status ctxpar_cuda_device_ordinal(const ctxpar_device *device, int *ordinal_out) {
    ctxpar_cuda_impl *impl = NULL;
    CTXPAR_CHECK(own_impl(device, "ctxpar_cuda_device_ordinal", &impl));
    if (!ordinal_out)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "ordinal_out is NULL");
    *ordinal_out = impl->ordinal;
    return CTXPAR_OK;
}

ctxpar_status ctxpar_cuda_device_uses_cudnn(const ctxpar_device *device, int *uses_out) {
    ctxpar_cuda_impl *impl = NULL;
    CTXPAR_CHECK(own_impl(device, "ctxpar_cuda_device_uses_cudnn", &impl));
    if (!uses_out)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "uses_out is NULL");
    *uses_out = impl->cudnn != NULL;
    return CTXPAR_OK;
}

ctxpar_status ctxpar_cuda_device_fwd_counts(const ctxpar_device *device, uint64_t *cudnn_out,
                                            uint64_t *native_out) {
    ctxpar_cuda_impl *impl = NULL;
    CTXPAR_CHECK(own_impl(device, "ctxpar_cuda_device_fwd_counts", &impl));
    if (!cudnn_out || !native_out)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG,
                            "cudnn_out (%p) and native_out (%p) must be "
                            "set",
                            (void *)cudnn_out, (void *)native_out);
    *cudnn_out = impl->fwd_cudnn;
    *native_out = impl->fwd_native;
    return CTXPAR_OK;
}

ctxpar_status ctxpar_cuda_device_diag(const ctxpar_device *device, ctxpar_cuda_diag *out) {
    ctxpar_cuda_impl *impl = NULL;
    CTXPAR_CHECK(own_impl(device, "ctxpar_cuda_device_diag", &impl));
    if (!out)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "out is NULL");
    ctxpar_cuda_diag d;
    memset(&d, 0, sizeof d);
    CTXPAR_CHECK(ctxpar_cuda_enter((ctxpar_device *)device));
    d.uses_pool = impl->pool != NULL;
    d.peers_granted = impl->peers_granted;
    d.smem_fwd_set = impl->smem_fwd;
    d.smem_bwd_set = impl->smem_bwd;
    CTXPAR_CUDA_CHECK(ctxpar_cuda_simt_smem_allowed(&d.smem_fwd_allowed, &d.smem_bwd_allowed));
    d.smem_fwd_need_max = ctxpar_cuda_simt_fwd_smem(CTXPAR_CUDA_MAX_HEAD_DIM);
    d.smem_bwd_need_max = ctxpar_cuda_simt_bwd_smem(CTXPAR_CUDA_MAX_HEAD_DIM);
    d.smem_optin = impl->smem_optin;
    d.cudnn_version = ctxpar_cudnn_runtime_version(impl->cudnn);
    snprintf(d.cudnn_graph, sizeof d.cudnn_graph, "%s",
             impl->cudnn_graph ? impl->cudnn_graph : "");
    snprintf(d.cudnn_reason, sizeof d.cudnn_reason, "%s", impl->cudnn_reason);
    *out = d;
    return CTXPAR_OK;
}

// "cuda GPU 0: forward blocks so far: 12 on cuDNN 9.28.0 (sdpa operation), 4 native; not
// cuDNN: <the latest reason>". No CUDA call: it only reads the device's counters.
static void cuda_describe(const struct ctxpar_device *dev, char *buf, size_t n) {
    const ctxpar_cuda_impl *impl = dev->impl;
    const int v = ctxpar_cudnn_runtime_version(impl->cudnn);
    char lib[96] = "cuDNN off";
    if (impl->cudnn)
        snprintf(lib, sizeof lib, "cuDNN %d.%d.%d%s%s%s", v / 10000, v / 100 % 100, v % 100,
                 impl->cudnn_graph ? " (" : "", impl->cudnn_graph ? impl->cudnn_graph : "",
                 impl->cudnn_graph ? ")" : "");
    snprintf(buf, n, "cuda GPU %d: forward blocks so far: %llu on %s, %llu native%s%s",
             impl->ordinal, (unsigned long long)impl->fwd_cudnn, lib,
             (unsigned long long)impl->fwd_native, impl->cudnn_reason[0] ? "; not cuDNN: " : "",
             impl->cudnn_reason);
}

const struct ctxpar_device_ops ctxpar_cuda_device_ops = {
    .version = CTXPAR_DEVICE_OPS_VERSION,
    .struct_size = sizeof(struct ctxpar_device_ops),
    .name = "cuda",
    .destroy = cuda_destroy,
    .alloc = ctxpar_cuda_alloc,
    .free = ctxpar_cuda_free,
    .copy = ctxpar_cuda_copy,
    .memset = ctxpar_cuda_memset,
    .stream_create = ctxpar_cuda_stream_create,
    .stream_destroy = ctxpar_cuda_stream_destroy,
    .stream_sync = ctxpar_cuda_stream_sync,
    .event_create = ctxpar_cuda_event_create,
    .event_destroy = ctxpar_cuda_event_destroy,
    .event_record = ctxpar_cuda_event_record,
    .stream_wait_event = ctxpar_cuda_stream_wait_event,
    .attn_block_fwd = ctxpar_cuda_attn_block_fwd,
    .attn_merge = ctxpar_cuda_attn_merge,
    .attn_bwd_prep = ctxpar_cuda_attn_bwd_prep,
    .attn_block_bwd = ctxpar_cuda_attn_block_bwd,
    .cast = ctxpar_cuda_cast,
    .add = ctxpar_cuda_add,
    .fill = ctxpar_cuda_fill,
    .checksum = ctxpar_cuda_checksum,
    .attn_supported = ctxpar_cuda_attn_supported,
    .describe = cuda_describe,
    .bins_clear = ctxpar_cuda_bins_clear,
    .bins_add = ctxpar_cuda_bins_add,
    .bins_add_attn = ctxpar_cuda_bins_add_attn,
    .bins_merge = ctxpar_cuda_bins_merge,
    .bins_finish = ctxpar_cuda_bins_finish,
    .bins_finish_attn = ctxpar_cuda_bins_finish_attn,
};

// CTXPAR_CUDNN's value: unset or empty is AUTO.
static ctxpar_status cudnn_from_env(const char *value, ctxpar_cuda_cudnn *out) {
    static const char *const names[] = {"auto", "on", "off"};
    static const ctxpar_cuda_cudnn modes[] = {CTXPAR_CUDA_CUDNN_AUTO, CTXPAR_CUDA_CUDNN_ON,
                                              CTXPAR_CUDA_CUDNN_OFF};
    *out = CTXPAR_CUDA_CUDNN_AUTO;
    if (!value || !*value)
        return CTXPAR_OK;
    for (int i = 0; i < 3; i++)
        if (!strcmp(value, names[i])) {
            *out = modes[i];
            return CTXPAR_OK;
        }
    return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "CTXPAR_CUDNN is '%s': auto, on or off", value);
}

// The registry's "cuda": GPU 0, cuDNN as CTXPAR_CUDNN says (auto when unset; threads do not
// apply), so that a tool choosing devices by name can run the native kernels alone.
static ctxpar_status create_default(int num_threads, ctxpar_device **device_out) {
    (void)num_threads;
    ctxpar_cuda_options opt = CTXPAR_CUDA_OPTIONS_INIT;
    CTXPAR_CHECK(cudnn_from_env(getenv("CTXPAR_CUDNN"), &opt.use_cudnn));
    return ctxpar_device_create_cuda(&opt, device_out);
}

// Loading this library (or linking it in) makes "cuda" a device name (ctxpar_device_names).
__attribute__((constructor)) static void register_cuda(void) {
    if (ctxpar_device_register("cuda", "NVIDIA GPU 0 (CUDA kernels, cuDNN where built)",
                               create_default) != CTXPAR_OK)
        ctxpar_clear_error(); // already there: the first registration stands
}
