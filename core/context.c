// Context lifecycle, statistics and tracing hooks.
#include <stdlib.h>
#include <string.h>

#include "context_internal.h"
#include "dispatch.h"

ctxpar_status ctxpar_context_create(ctxpar_device *device, ctxpar_comm *comm,
                                    const ctxpar_context_options *options,
                                    ctxpar_context **ctx_out) {
    if (!device || !comm || !ctx_out)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG,
                            "device (%p), comm (%p) and ctx_out (%p) must not be NULL",
                            (void *)device, (void *)comm, (void *)ctx_out);
    ctxpar_context_options opts = CTXPAR_CONTEXT_OPTIONS_INIT;
    if (options) {
        if (options->struct_size < offsetof(ctxpar_context_options, verify_transfers) + sizeof(int))
            return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG,
                                "options->struct_size (%zu) is too small: initialise options with "
                                "CTXPAR_CONTEXT_OPTIONS_INIT",
                                options->struct_size);
        // Copy only what the caller's version of the struct holds.
        size_t n = options->struct_size < sizeof opts ? options->struct_size : sizeof opts;
        memcpy(&opts, options, n);
        opts.struct_size = sizeof opts;
    }
    ctxpar_context *ctx = calloc(1, sizeof *ctx);
    if (!ctx)
        return CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "cannot allocate a context");
    ctx->dev = device;
    ctx->comm = comm;
    ctx->options = opts;
    ctx->ws.dev = device;
    *ctx_out = ctx;
    return CTXPAR_OK;
}

void ctxpar_context_destroy(ctxpar_context *ctx) {
    if (!ctx)
        return;
    (void)ctxpar_workspace_release(&ctx->ws); // destroy has no caller to tell; release does
    ctxpar_algo_states_release(&ctx->states);
    ctxpar_layout_map_free(&ctx->map);
    free(ctx);
}

ctxpar_status ctxpar_context_release(ctxpar_context *ctx) {
    ctxpar_clear_error();
    if (!ctx)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "ctx is NULL");
    ctxpar_status st = ctxpar_workspace_release(&ctx->ws);
    ctxpar_status st2 = ctxpar_dev_scratch_release(ctx->dev);
    return st != CTXPAR_OK ? st : st2;
}

ctxpar_status ctxpar_context_memory_stats(const ctxpar_context *ctx,
                                          ctxpar_memory_stats *stats_out) {
    if (!ctx || !stats_out)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "ctx (%p) and stats_out (%p) must be set",
                            (const void *)ctx, (void *)stats_out);
    stats_out->current_bytes = ctxpar_dev_books_of(ctx->dev)->mem_current;
    stats_out->peak_bytes = ctxpar_dev_books_of(ctx->dev)->mem_peak;
    return CTXPAR_OK;
}

ctxpar_status ctxpar_context_reset_peak(ctxpar_context *ctx) {
    if (!ctx)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "ctx is NULL");
    ctxpar_dev_books_of(ctx->dev)->mem_peak = ctxpar_dev_books_of(ctx->dev)->mem_current;
    return CTXPAR_OK;
}

ctxpar_status ctxpar_context_bytes_sent(const ctxpar_context *ctx, uint64_t *bytes_out) {
    if (!ctx || !bytes_out)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "ctx (%p) and bytes_out (%p) must be set",
                            (const void *)ctx, (void *)bytes_out);
    *bytes_out = ctxpar_comm_bytes_sent(ctx->comm);
    return CTXPAR_OK;
}

ctxpar_status ctxpar_context_set_trace(ctxpar_context *ctx, ctxpar_trace_fn fn, void *user) {
    if (!ctx)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "ctx is NULL");
    ctx->trace = fn;
    ctx->trace_user = user;
    return CTXPAR_OK;
}

ctxpar_status ctxpar_context_work_stats(const ctxpar_context *ctx, ctxpar_work_stats *stats_out) {
    if (!ctx || !stats_out)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "ctx (%p) and stats_out (%p) must be set",
                            (const void *)ctx, (void *)stats_out);
    *stats_out = ctx->work;
    return CTXPAR_OK;
}

ctxpar_status ctxpar_context_reset_work_stats(ctxpar_context *ctx) {
    if (!ctx)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "ctx is NULL");
    memset(&ctx->work, 0, sizeof ctx->work);
    return CTXPAR_OK;
}
