/*
 * dispatch.h - the dispatch layer's wrappers: the only way the algorithms and the front door reach
 * a device or a comm (dispatch/dispatch_*.c are the only files that call through the ops tables,
 * and own every NULL check and every fallback for an optional op). Internal to the library: not
 * exported. Backend authors see ctxpar_backend.h, which declares the few wrappers they may call.
 */
#ifndef CTXPAR_DISPATCH_H
#define CTXPAR_DISPATCH_H

#include "ctxpar_backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ================================================================ device */

/* What the dispatch keeps for each device beside the backend's object: the blocks it handed out
 * (so that frees are checked and the memory statistics are exact) and the scratch block. */
typedef struct ctxpar_dev_books {
    size_t mem_current;   /* bytes allocated through ctxpar_dev_alloc and not yet freed */
    size_t mem_peak;
    uint64_t alloc_count; /* calls of the backend's alloc so far */
    struct ctxpar_dev_block *blocks; /* every live allocation: pointer, size, kind */
    size_t n_blocks, cap_blocks;
    void *scratch; /* ctxpar_dev_scratch's block, scratch_bytes long */
    size_t scratch_bytes;
} ctxpar_dev_books;

/* The books of a device ctxpar_device_create made. */
ctxpar_dev_books *ctxpar_dev_books_of(const ctxpar_device *dev);

/* Allocates and records the block (size and kind), so that the memory statistics and the
 * allocation count (ctxpar_dev_books) are exact. */
ctxpar_status ctxpar_dev_alloc(ctxpar_device *dev, size_t bytes, ctxpar_mem_kind kind,
                               void **ptr_out);
/* Frees a block ctxpar_dev_alloc returned (NULL: nothing). The dispatch knows its size and kind:
 * `bytes` and `kind` must match them (0 bytes: not checked). A pointer the dispatch did not hand
 * out, or a mismatch, is CTXPAR_ERR_INTERNAL and frees nothing; otherwise the result is the
 * backend's free's (a device fault it reports). Callers merge the status into their own.
 * Stream-ordered: the backend's free must not release memory that work already enqueued may
 * still use (the CPU is synchronous; the CUDA backend fences its streams). */
ctxpar_status ctxpar_dev_free(ctxpar_device *dev, void *ptr, size_t bytes, ctxpar_mem_kind kind);
/* Gives the scratch block back (ctxpar_context_release). */
ctxpar_status ctxpar_dev_scratch_release(ctxpar_device *dev);
ctxpar_status ctxpar_dev_memset(ctxpar_device *dev, void *dst, int value, size_t bytes,
                                ctxpar_stream *stream);
ctxpar_status ctxpar_dev_event_create(ctxpar_device *dev, ctxpar_event **event_out);
void ctxpar_dev_event_destroy(ctxpar_device *dev, ctxpar_event *event);
ctxpar_status ctxpar_dev_event_record(ctxpar_device *dev, ctxpar_event *event,
                                      ctxpar_stream *stream);
ctxpar_status ctxpar_dev_stream_wait_event(ctxpar_device *dev, ctxpar_stream *stream,
                                           ctxpar_event *event);
ctxpar_status ctxpar_dev_attn_block_fwd(ctxpar_device *dev, const ctxpar_attn_block *blk,
                                        float *out_acc, float *lse_acc, int merge,
                                        ctxpar_stream *stream);
ctxpar_status ctxpar_dev_attn_merge(ctxpar_device *dev, float *out_acc, float *lse_acc,
                                    const float *out_b, const float *lse_b, int64_t batch,
                                    int64_t seq, int64_t heads, int64_t head_dim,
                                    ctxpar_stream *stream);
ctxpar_status ctxpar_dev_attn_bwd_prep(ctxpar_device *dev, const ctxpar_tensor *out,
                                       const ctxpar_tensor *dout, float *delta,
                                       ctxpar_stream *stream);
ctxpar_status ctxpar_dev_attn_block_bwd(ctxpar_device *dev, const ctxpar_attn_block *blk,
                                        const ctxpar_tensor *dout, const float *lse,
                                        const float *delta, float *dq_acc, float *dk_acc,
                                        float *dv_acc, ctxpar_stream *stream);
ctxpar_status ctxpar_dev_cast(ctxpar_device *dev, const ctxpar_tensor *src, ctxpar_tensor *dst,
                              ctxpar_stream *stream);
ctxpar_status ctxpar_dev_fill(ctxpar_device *dev, float *dst, float value, size_t n,
                              ctxpar_stream *stream);
ctxpar_status ctxpar_dev_checksum(ctxpar_device *dev, const void *data, size_t bytes,
                                  ctxpar_stream *stream, uint64_t *sum_out);
ctxpar_status ctxpar_dev_attn_supported(const ctxpar_device *dev, const ctxpar_attn_query *query);
/* Binned accumulators (reproducible mode; dispatch_bins.c): NOT_SUPPORTED on a device without
 * them. Shapes and NULLs are checked here, as for every op. */
int ctxpar_dev_has_bins(const ctxpar_device *dev);
ctxpar_status ctxpar_dev_bins_clear(ctxpar_device *dev, void *bins, int64_t rows, int64_t width,
                                    ctxpar_stream *stream);
ctxpar_status ctxpar_dev_bins_add(ctxpar_device *dev, void *bins, const float *src,
                                  const ctxpar_bins_shape *shape, ctxpar_stream *stream);
ctxpar_status ctxpar_dev_bins_add_attn(ctxpar_device *dev, void *bins, const float *out_b,
                                       const float *lse_b, const float *lse_lo_b,
                                       const ctxpar_bins_shape *shape, ctxpar_stream *stream);
ctxpar_status ctxpar_dev_bins_merge(ctxpar_device *dev, void *dst, const void *src, int64_t rows,
                                    int64_t width, ctxpar_stream *stream);
ctxpar_status ctxpar_dev_bins_finish(ctxpar_device *dev, const void *bins, int64_t rows,
                                     int64_t width, float *dst, ctxpar_stream *stream);
ctxpar_status ctxpar_dev_bins_finish_attn(ctxpar_device *dev, const void *bins,
                                          const ctxpar_bins_shape *shape, float *out, float *lse,
                                          float *lse_lo, ctxpar_stream *stream);
/* The device's describe op into buf (n >= 1), else its name. */
void ctxpar_dev_describe(const ctxpar_device *dev, char *buf, size_t n);

/* ================================================================ comm */

/* Bytes this rank's transfers on `comm` sent so far, as the wrappers count them (0 for NULL). */
uint64_t ctxpar_comm_bytes_sent(const ctxpar_comm *comm);
/* Adds bytes sent on comms derived from `comm` (the hybrid's sub-comms) to its count. */
void ctxpar_comm_count_sent(ctxpar_comm *comm, uint64_t bytes);

ctxpar_status ctxpar_comm_sendrecv(ctxpar_comm *comm, const void *sendbuf, size_t send_bytes,
                                   int dst, void *recvbuf, size_t recv_bytes, int src, int tag,
                                   ctxpar_stream *stream, ctxpar_request **req_out);
ctxpar_status ctxpar_comm_allgather(ctxpar_comm *comm, const void *sendbuf, void *recvbuf,
                                    size_t bytes, ctxpar_stream *stream,
                                    ctxpar_request **req_out);
ctxpar_status ctxpar_comm_reduce_scatter(ctxpar_comm *comm, const float *sendbuf,
                                         float *recvbuf, size_t count, ctxpar_stream *stream,
                                         ctxpar_request **req_out);
ctxpar_status ctxpar_comm_alltoall(ctxpar_comm *comm, const void *sendbuf, void *recvbuf,
                                   size_t bytes, ctxpar_stream *stream, ctxpar_request **req_out);
ctxpar_status ctxpar_comm_wait(ctxpar_comm *comm, ctxpar_request *req, ctxpar_stream *stream);
void ctxpar_comm_cancel(ctxpar_comm *comm, ctxpar_request *req);
ctxpar_status ctxpar_comm_test(ctxpar_comm *comm, ctxpar_request *req, int *done_out);
ctxpar_status ctxpar_comm_barrier(ctxpar_comm *comm);
void ctxpar_comm_abort(ctxpar_comm *comm);
/* Collective: the sub-comm of the ranks passing the same color (see the split op); *comm_out is
 * written only on success (NULL for color < 0). Destroy it with ctxpar_comm_destroy. */
ctxpar_status ctxpar_comm_split(ctxpar_comm *comm, int color, int key, ctxpar_comm **comm_out);
/* Whether the comm has the split op. */
int ctxpar_comm_can_split(const ctxpar_comm *comm);

#ifdef __cplusplus
}
#endif

#endif /* CTXPAR_DISPATCH_H */
