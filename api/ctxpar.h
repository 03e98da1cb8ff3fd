/*
 * ctxpar.h - context-parallel attention: the user's API.
 *
 * A sequence of S tokens is split across P ranks. Every rank calls the same functions with its
 * local shard of Q, K, V; the library cooperates through a comm (threads, MPI or NCCL) so that the
 * local output equals the matching rows of attention over the full sequence.
 *
 * Conventions (the whole header follows them):
 *  - Every function returns a ctxpar_status. On failure ctxpar_last_error() holds one line naming
 *    the argument and the values, and nothing the caller owns has been written.
 *  - Outputs come last and are named *_out; they are written only on success.
 *  - Objects are opaque handles with create/destroy pairs; destroy(NULL) does nothing.
 *  - Collective calls (attention, context creation) must be made by every rank of the comm with
 *    the same parameters; a mismatch is detected and returned as CTXPAR_ERR_INVALID_USAGE on
 *    every rank.
 */
#ifndef CTXPAR_H
#define CTXPAR_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Marks the functions the library exports: the shared library (//:libctxpar.so) is compiled
 * with -fvisibility=hidden, so nothing else is visible to its users. */
#if defined(__GNUC__)
#define CTXPAR_API __attribute__((visibility("default")))
#else
#define CTXPAR_API
#endif

/* ---------------------------------------------------------------- status */

typedef enum ctxpar_status {
    CTXPAR_OK = 0,
    CTXPAR_ERR_INVALID_ARG = -1,   /* a bad argument: NULL, shape, dtype, size that does not divide */
    CTXPAR_ERR_INVALID_USAGE = -2, /* legal arguments used wrongly, e.g. ranks disagree */
    CTXPAR_ERR_NOT_SUPPORTED = -3, /* a valid combination this algorithm/backend cannot do */
    CTXPAR_ERR_OUT_OF_MEMORY = -4,
    CTXPAR_ERR_DEVICE = -5,        /* the device backend failed (kernel launch, driver) */
    CTXPAR_ERR_COMM = -6,          /* the communication library failed, or a transfer was corrupt */
    CTXPAR_ERR_REMOTE = -7,        /* a peer failed or left */
    CTXPAR_ERR_TIMEOUT = -8,       /* a peer did not arrive within the timeout */
    CTXPAR_ERR_INTERNAL = -9,      /* a bug in ctxpar: please report it */
} ctxpar_status;

/* Short constant name of a status ("CTXPAR_ERR_INVALID_ARG"); never NULL. */
CTXPAR_API const char *ctxpar_status_string(ctxpar_status status);

/* Detail of the last error on the calling thread, prefixed by the source file and line that
 * detected it ("core/validate.c:150: k.shape[3] (64) != q.shape[3] (96): head_dim must match");
 * "" when none. Valid until the next ctxpar call on this thread. */
CTXPAR_API const char *ctxpar_last_error(void);

/* Version of the library as "MAJOR.MINOR.PATCH". */
CTXPAR_API const char *ctxpar_version(void);

/* ---------------------------------------------------------------- tensors */

typedef enum ctxpar_dtype {
    CTXPAR_DTYPE_F32 = 0,
    CTXPAR_DTYPE_F16 = 1,
    CTXPAR_DTYPE_BF16 = 2,
} ctxpar_dtype;

/* Bytes per element; 0 for an unknown dtype. */
CTXPAR_API size_t ctxpar_dtype_size(ctxpar_dtype dtype);
/* "f32", "f16", "bf16"; "?" for an unknown dtype. */
CTXPAR_API const char *ctxpar_dtype_name(ctxpar_dtype dtype);

/* A view of memory the caller owns: [batch, seq, heads, head_dim] (BSHD), strides in elements.
 * The memory lives where the device of the context expects it (host for the CPU backend). */
typedef struct ctxpar_tensor {
    void *data;
    ctxpar_dtype dtype;
    int64_t shape[4];
    int64_t stride[4];
} ctxpar_tensor;

/* A densely packed BSHD view (stride = [s*h*d, h*d, d, 1]). */
CTXPAR_API ctxpar_tensor ctxpar_tensor_bshd(void *data, ctxpar_dtype dtype, int64_t batch,
                                            int64_t seq, int64_t heads, int64_t head_dim);

/* ---------------------------------------------------------------- attention parameters */

typedef enum ctxpar_algo {
    CTXPAR_ALGO_AUTO = 0,      /* chosen by the library; see docs/ */
    CTXPAR_ALGO_RING = 1,      /* K/V travel around the ring; O(S/P) memory */
    CTXPAR_ALGO_ALLGATHER = 2, /* gather all K/V, then compute; bitwise equal to P = 1 */
    CTXPAR_ALGO_ALLTOALL = 3,  /* Ulysses: re-shard heads; needs heads divisible by P */
    CTXPAR_ALGO_HYBRID = 4,    /* all-to-all in groups of params.ulysses ranks, ring across them */
    CTXPAR_ALGO_DECODE = 5,    /* params.q_len > 0: replicated queries over the sharded K/V, each
                                  rank's partial (out, lse) merged by LSE; forward only */
} ctxpar_algo;

typedef enum ctxpar_layout {
    CTXPAR_LAYOUT_CONTIGUOUS = 0, /* rank r holds tokens [r*S/P, (r+1)*S/P) */
    CTXPAR_LAYOUT_ZIGZAG = 1,     /* 2P chunks; rank r holds chunks r and 2P-1-r */
    CTXPAR_LAYOUT_STRIPED = 2,    /* token t on rank t mod P */
    CTXPAR_LAYOUT_CUSTOM = 3,     /* token t on rank params.assignment[t] */
} ctxpar_layout;
/* Any S >= 1 works with any P: when S does not divide, the built-in layouts give the lowest
 * ranks one token more (ZIGZAG: see docs/algorithms.md), so shards differ by at most one token
 * and a rank may hold none (S < P). ctxpar_shard_count says how many tokens a rank holds. */

typedef enum ctxpar_mask {
    CTXPAR_MASK_NONE = 0,
    CTXPAR_MASK_CAUSAL = 1, /* query at global position i sees keys at positions <= i */
} ctxpar_mask;

/* What to compute. Initialise with CTXPAR_ATTN_PARAMS_INIT, then set fields: new fields are only
 * appended, and struct_size tells the library which ones the caller knows (at least through
 * `algo`); the fields past it take their CTXPAR_ATTN_PARAMS_INIT values and are never read. */
typedef struct ctxpar_attn_params {
    size_t struct_size;
    ctxpar_algo algo;
    ctxpar_layout layout;
    ctxpar_mask mask;
    /* Sliding window: a query at position i sees keys k with i - k < window_left; 0 = none. */
    int64_t window_left;
    /* Packed documents: num_docs + 1 non-decreasing global boundaries (equal ones make an empty
     * document), cu_seqlens[0] = 0 and cu_seqlens[num_docs] = the global sequence length; host
     * memory; NULL = one document. */
    const int32_t *cu_seqlens;
    int64_t num_docs;
    /* Multiplies QK^T; 0 = 1/sqrt(head_dim). */
    float softmax_scale;
    /* Global sequence length; 0 = local seq * P, which is right only for equal shards: set it
     * when S does not divide by P (2P for ZIGZAG) and with CTXPAR_LAYOUT_CUSTOM. Each rank's
     * local seq must be its share of it (ctxpar_shard_count); the ranks must agree on it. */
    int64_t seq_len_global;
    /* Right side of a two-sided window: a query at position i sees keys k with k - i <=
     * window_right; 0 = no limit (a right limit of 0 is CTXPAR_MASK_CAUSAL, and a limit > 0 with
     * the causal mask is INVALID_ARG). With window_left it makes the band
     * i - window_left < k <= i + window_right. */
    int64_t window_right;
    /* Attention sinks: one logit per query head, F32 [Hq] in the context's device memory, in score
     * units (after softmax_scale), added once to every row's softmax denominator; NULL = none.
     * The library reads exactly Hq floats and cannot see a pointer's length: callers holding an
     * array (the tool's --sinks, Python) check it is [Hq] and get INVALID_ARG otherwise. */
    const float *sinks;
    /* Written by ctxpar_attn_bwd when sinks is set: F32 [Hq] in the context's device memory, the
     * gradient of the sinks summed over batch and rows; NULL = not wanted. */
    float *dsinks;
    /* Logit soft-capping: the score is softcap * tanh(scale * q.k / softcap); 0 = none. */
    float softcap;
    /* CTXPAR_LAYOUT_CUSTOM: the rank that holds each global token, int32 [global seq], host
     * memory, the same on every rank; a rank holds its tokens in increasing position order.
     * Positions are derived from it, so they cannot be out of order; a rank out of [0, P) is
     * INVALID_ARG naming the token. */
    const int32_t *assignment;
    /* CTXPAR_ALGO_HYBRID: ranks per all-to-all group (P = ulysses x ring length), consecutive
     * ranks; it must divide P and the q heads, and the k/v heads must divide by it or it by them;
     * at most 16. 0 = chosen by the library (docs/algorithms.md). Only with HYBRID or AUTO. */
    int64_t ulysses;
    /* Documents per batch row: 0 = cu_seqlens is one set of num_docs + 1 boundaries for every
     * row; B (the batch) = cu_seqlens is [B, num_docs + 1], row b's documents for batch row b
     * (pad rows with fewer documents with empty ones). */
    int64_t cu_seqlens_rows;
    /* The LSE's low part, F32 [B, Hq, S/P] in the context's device memory, dense like lse:
     * written by ctxpar_attn_fwd (lse + lse_lo is the LSE to about 48 bits), read by
     * ctxpar_attn_bwd. An F32 lse alone is off by up to |lse| 2^-24, which the backward turns
     * into a relative error of every P of the row (docs/numerics.md); NULL = lse alone. A
     * backend that does not compute it writes 0. */
    float *lse_lo;
    /* Queries shorter than the keys (a prefill chunk or decode steps over a KV cache): 0 = q is
     * this rank's shard of the sequence, like k and v. N > 0 = q holds the N queries at the last
     * N positions S - N .. S - 1 of the global sequence of S keys (N <= S), the same on every
     * rank (replicated, not sharded): q, out and dout are [B, N, Hq, D], lse [B, Hq, N], and
     * every rank's out and lse are the whole result. k and v stay sharded by the layout. Masks
     * keep their meaning in global positions (causal aligned bottom-right, windows, documents).
     * Forward only, with CTXPAR_ALGO_DECODE or CTXPAR_ALGO_ALLGATHER (or AUTO); the other
     * algorithms and ctxpar_attn_bwd return CTXPAR_ERR_NOT_SUPPORTED. */
    int64_t q_len;
    /* Reproducible mode: 1 = out, lse (with lse_lo), dq, dk, dv and dsinks have the same bits for
     * every number of ranks, layout and algorithm (docs/numerics.md, "Reproducible mode"): the
     * sequence is cut into chunks of 256 positions, the same for every P, and their partial
     * results are summed in binned accumulators, whose bits do not depend on the order. 0 = off
     * (the fastest schedules). The ranks must agree. CTXPAR_ERR_NOT_SUPPORTED on a device
     * without binned accumulators, with the decode algorithm and q_len, where a rank's shard is
     * not whole chunks (ring, allgather, hybrid), and where a K/V head would be split between
     * ranks (alltoall with fewer K/V heads than ranks; the hybrid's groups likewise). */
    int64_t reproducible;
} ctxpar_attn_params;

/* A new field is also a line of core/params_table.h (the build fails until it is). */
#define CTXPAR_ATTN_PARAMS_INIT                                                                    \
    {                                                                                              \
        sizeof(ctxpar_attn_params), CTXPAR_ALGO_AUTO, CTXPAR_LAYOUT_CONTIGUOUS, CTXPAR_MASK_NONE,  \
            0, NULL, 0, 0.0f, 0, 0, NULL, NULL, 0.0f, NULL, 0, 0, NULL, 0, 0                       \
    }

/* "auto", "ring", ...;  "contiguous", "zigzag", "striped", "custom";  "none", "causal". */
CTXPAR_API const char *ctxpar_algo_name(ctxpar_algo algo);
CTXPAR_API const char *ctxpar_layout_name(ctxpar_layout lay);
CTXPAR_API const char *ctxpar_mask_name(ctxpar_mask mask);

/* The layout of ctxpar_attn_params, for bindings that mirror it (python/ctxpar/_lib.py is tested
 * against it): field `index` (0 = struct_size, in declaration order) gives its name, byte offset
 * and size. index = the number of fields gives name NULL, offset sizeof(ctxpar_attn_params) and
 * size 0; a larger or negative index is INVALID_ARG. */
CTXPAR_API ctxpar_status ctxpar_attn_params_field(int index, const char **name_out,
                                                  size_t *offset_out, size_t *size_out);

/* ---------------------------------------------------------------- handles */

typedef struct ctxpar_device ctxpar_device;   /* a compute backend instance (see ctxpar_cpu.h) */
typedef struct ctxpar_comm ctxpar_comm;       /* a communicator between ranks (ctxpar_local.h) */
typedef struct ctxpar_stream ctxpar_stream;   /* an ordered queue of work on a device */
typedef struct ctxpar_context ctxpar_context; /* device + comm + the state of attention calls */

/* Destroys a device or a comm made by any backend's constructor; NULL is a no-op. A device or
 * comm must outlive every context that uses it. */
CTXPAR_API void ctxpar_device_destroy(ctxpar_device *device);
CTXPAR_API void ctxpar_comm_destroy(ctxpar_comm *comm);

/* Devices by name. "cpu" (this library's own) is always there, first; other backends add theirs
 * when their library is loaded (libctxpar_cuda.so: "cuda"). Writes up to `capacity` names, and
 * one-line descriptions unless `descriptions` is NULL, in registration order; returns how many
 * devices there are (call with capacity 0 to count). */
CTXPAR_API int ctxpar_device_names(const char **names, const char **descriptions, int capacity);

/* Creates the device registered as `name`, with its default options but `num_threads` (the CPU
 * device's OpenMP threads, 0 = OpenMP's default; ignored by devices without threads). An unknown
 * name is CTXPAR_ERR_NOT_SUPPORTED, and the message lists the names there are. A device that
 * cannot be created here (no GPU) returns its constructor's error. */
CTXPAR_API ctxpar_status ctxpar_device_create_by_name(const char *name, int num_threads,
                                                      ctxpar_device **device_out);

/* Whether the device's memory is host memory (the CPU device): then the tensors passed to a
 * context on it are host arrays. 0 for a NULL device. */
CTXPAR_API int ctxpar_device_host_memory(const ctxpar_device *device);

/* Comms by name. "local" (ranks as threads of this process, this library's own) is always
 * there, first; comm libraries add theirs when loaded (libctxpar_mpi.so: "mpi", one rank per
 * process of MPI_COMM_WORLD). A comm made over the caller's own communicator (NCCL's) is not
 * listed: it needs that communicator. Names and descriptions as ctxpar_device_names. */
CTXPAR_API int ctxpar_comm_names(const char **names, const char **descriptions, int capacity);

/* The ranks this process runs of a job with `nranks` ranks over the comm kind `name`: "local"
 * runs all of them (as threads; nranks >= 1), "mpi" runs one, its rank of MPI_COMM_WORLD (MPI
 * initialised by the caller; nranks 0 or the world's size). An unknown name is
 * CTXPAR_ERR_NOT_SUPPORTED, naming the ones there are. Destroy it after the comms made from it. */
typedef struct ctxpar_comm_world ctxpar_comm_world;
CTXPAR_API ctxpar_status ctxpar_comm_world_create(const char *name, int nranks,
                                                  ctxpar_comm_world **world_out);
/* How many ranks this process runs, and (first_rank_out, may be NULL) the first one's rank. */
CTXPAR_API int ctxpar_comm_world_ranks(const ctxpar_comm_world *world, int *first_rank_out);
/* The comm of this process's i-th rank (rank first + i), each made once and used by its own
 * thread; callable from those threads at once. copy_device: as ctxpar_comm_create_local (NULL:
 * host memory). Destroy with ctxpar_comm_destroy. */
CTXPAR_API ctxpar_status ctxpar_comm_world_comm(ctxpar_comm_world *world, int i,
                                                ctxpar_device *copy_device,
                                                ctxpar_comm **comm_out);
CTXPAR_API void ctxpar_comm_world_destroy(ctxpar_comm_world *world);

/* Rank of this process/thread in the comm, and the number of ranks. */
CTXPAR_API int ctxpar_comm_rank(const ctxpar_comm *comm);
CTXPAR_API int ctxpar_comm_size(const ctxpar_comm *comm);

/* Seconds a blocking comm operation waits for a peer before returning CTXPAR_ERR_TIMEOUT
 * (default 60). Must be > 0. */
CTXPAR_API ctxpar_status ctxpar_comm_set_timeout(ctxpar_comm *comm, double seconds);

/* Options for a context. Initialise with CTXPAR_CONTEXT_OPTIONS_INIT. */
typedef struct ctxpar_context_options {
    size_t struct_size;
    /* Checksum every block sent and received; a mismatch returns CTXPAR_ERR_COMM naming the step
     * and the peer. Costs one pass over each transferred block. */
    int verify_transfers;
} ctxpar_context_options;

#define CTXPAR_CONTEXT_OPTIONS_INIT { sizeof(ctxpar_context_options), 0 }

/* Creates a context on `device` and `comm` (borrowed: both must outlive the context). Not
 * collective: no communication happens here. options may be NULL for defaults. */
CTXPAR_API ctxpar_status ctxpar_context_create(ctxpar_device *device, ctxpar_comm *comm,
                                               const ctxpar_context_options *options,
                                               ctxpar_context **ctx_out);
CTXPAR_API void ctxpar_context_destroy(ctxpar_context *ctx);

/* ---------------------------------------------------------------- attention */

/*
 * Forward attention on this rank's shard. Collective over the context's comm.
 *
 *   (S/P below is this rank's count of tokens, ctxpar_shard_count: it may differ between ranks
 *   by a token, or be 0 with a non-NULL data pointer, when S does not divide)
 *   q    [B, S/P, Hq,  D]   local queries, in the layout's order (see ctxpar_shard)
 *   k, v [B, S/P, Hkv, D]   local keys and values; Hq is a multiple of Hkv; v may have its own
 *                           head_dim Dv (MLA), which out, dout and dv then have too
 *   out  [B, S/P, Hq,  Dv]  written: the local rows of full-sequence attention (with
 *                           params.sinks: the sink folded in once, and lse includes it)
 *   lse  [B, Hq, S/P] F32   written, densely packed: natural-log sum of exp of the scaled,
 *                           masked scores of each row; -inf for a fully masked row (whose out
 *                           row is 0; with sinks: the row's sink). May be NULL when not needed
 *                           (then bwd cannot use it).
 *
 * q, k, v, out share one dtype. stream may be NULL (the device's default order); the call
 * returns when the work is enqueued on stream (the CPU backend: when it is complete).
 *
 * Errors: INVALID_ARG / NOT_SUPPORTED for this rank's own arguments; INVALID_USAGE when ranks
 * disagree (every rank gets it); these leave the comm usable. A failure after the ranks agreed
 * (COMM, REMOTE, TIMEOUT, DEVICE, OUT_OF_MEMORY) aborts the comm so that peers fail promptly
 * with REMOTE: destroy the context and comm, and make new ones to continue.
 */
CTXPAR_API ctxpar_status ctxpar_attn_fwd(ctxpar_context *ctx, const ctxpar_attn_params *params,
                                         const ctxpar_tensor *q, const ctxpar_tensor *k,
                                         const ctxpar_tensor *v, ctxpar_tensor *out, float *lse,
                                         ctxpar_stream *stream);

/*
 * Backward of ctxpar_attn_fwd with the same params, inputs, out and lse.
 *   dout [B, S/P, Hq, Dv]    gradient of out
 *   dq   [B, S/P, Hq, D]     written
 *   dk, dv [B, S/P, Hkv, D|Dv] written: gradients of the local K and V (summed over all ranks'
 *                            queries)
 * Gradients are accumulated in F32 and stored in the dtype of q. With params.sinks and
 * params.dsinks, dsinks (F32 [Hq], the same on every rank) is written last, only on success.
 */
CTXPAR_API ctxpar_status ctxpar_attn_bwd(ctxpar_context *ctx, const ctxpar_attn_params *params,
                                         const ctxpar_tensor *q, const ctxpar_tensor *k,
                                         const ctxpar_tensor *v, const ctxpar_tensor *out,
                                         const float *lse, const ctxpar_tensor *dout,
                                         ctxpar_tensor *dq, ctxpar_tensor *dk, ctxpar_tensor *dv,
                                         ctxpar_stream *stream);

/* The algorithm AUTO resolves to for these params and local shapes on this context, without
 * running it; useful to print. Not collective. */
CTXPAR_API ctxpar_status ctxpar_attn_choose_algo(const ctxpar_context *ctx,
                                                 const ctxpar_attn_params *params,
                                                 const ctxpar_tensor *q, const ctxpar_tensor *k,
                                                 ctxpar_algo *algo_out);

/* Whether this context's device can run forward and backward for these params and local
 * shapes, with the algorithm the call would use (AUTO: the one it resolves to): CTXPAR_OK, or
 * CTXPAR_ERR_NOT_SUPPORTED with the reason (dtype, head_dim, heads, mask, a tile or
 * shared-memory limit) in ctxpar_last_error(); INVALID_ARG for arguments the calls would reject.
 * Not collective: no communication. The attention calls make the same check before the ranks
 * agree, so a NOT_SUPPORTED from them also leaves the comm usable. */
CTXPAR_API ctxpar_status ctxpar_attn_supported(const ctxpar_context *ctx,
                                               const ctxpar_attn_params *params,
                                               const ctxpar_tensor *q, const ctxpar_tensor *k,
                                               const ctxpar_tensor *v);

/* ---------------------------------------------------------------- layouts */

/* For any seq_global >= 1 and nranks >= 1. The _assigned variants take CTXPAR_LAYOUT_CUSTOM's
 * assignment (int32 [seq_global], each a rank in [0, nranks); NULL for the other layouts); the
 * plain ones refuse CUSTOM. */

/* How many tokens `rank` holds (its local seq). */
CTXPAR_API ctxpar_status ctxpar_shard_count(ctxpar_layout layout, const int32_t *assignment,
                                            int64_t seq_global, int rank, int nranks,
                                            int64_t *count_out);

/* Global position of each local token of `rank`, increasing: pos_out[i] for i < its count
 * (ctxpar_shard_count). Host memory. */
CTXPAR_API ctxpar_status ctxpar_positions(ctxpar_layout layout, int64_t seq_global, int rank,
                                          int nranks, int64_t *pos_out);
CTXPAR_API ctxpar_status ctxpar_positions_assigned(ctxpar_layout layout,
                                                   const int32_t *assignment, int64_t seq_global,
                                                   int rank, int nranks, int64_t *pos_out);

/* Copies the rows of `global` ([B, S, H, D], host) that `rank` holds into `local_out`
 * ([B, count, H, D], host, same dtype, caller-allocated). */
CTXPAR_API ctxpar_status ctxpar_shard(ctxpar_layout layout, int rank, int nranks,
                                      const ctxpar_tensor *global, ctxpar_tensor *local_out);
CTXPAR_API ctxpar_status ctxpar_shard_assigned(ctxpar_layout layout, const int32_t *assignment,
                                               int rank, int nranks, const ctxpar_tensor *global,
                                               ctxpar_tensor *local_out);

/* The inverse: copies `local` of `rank` into its rows of `global_out` (host). */
CTXPAR_API ctxpar_status ctxpar_unshard(ctxpar_layout layout, int rank, int nranks,
                                        const ctxpar_tensor *local, ctxpar_tensor *global_out);
CTXPAR_API ctxpar_status ctxpar_unshard_assigned(ctxpar_layout layout, const int32_t *assignment,
                                                 int rank, int nranks, const ctxpar_tensor *local,
                                                 ctxpar_tensor *global_out);

/* ---------------------------------------------------------------- memory and counters */

typedef struct ctxpar_memory_stats {
    size_t current_bytes; /* bytes the library holds now on the context's device */
    size_t peak_bytes;    /* high-water mark since creation or the last reset */
} ctxpar_memory_stats;

/* Memory the library allocated through the context's device (buffers of the calls); the
 * caller's tensors are not counted. */
CTXPAR_API ctxpar_status ctxpar_context_memory_stats(const ctxpar_context *ctx,
                                                     ctxpar_memory_stats *stats_out);
/* Sets peak_bytes to current_bytes. */
CTXPAR_API ctxpar_status ctxpar_context_reset_peak(ctxpar_context *ctx);

/* The context's workspace: the buffers of the attention calls come from one block the context
 * owns, which grows to the largest call seen and is kept, so that calls after the first allocate
 * nothing. Reuse is stream-ordered: a call on another stream waits (on the device) for the
 * previous call's work first. It is counted in ctxpar_context_memory_stats.
 *
 * reserve sizes it up front for forward and backward of these params and local shapes (not
 * collective; q, k, v are only looked at); release gives it back (and the device's kernel
 * scratch): the next call allocates again. */
CTXPAR_API ctxpar_status ctxpar_context_reserve(ctxpar_context *ctx,
                                                const ctxpar_attn_params *params,
                                                const ctxpar_tensor *q, const ctxpar_tensor *k,
                                                const ctxpar_tensor *v);
CTXPAR_API ctxpar_status ctxpar_context_release(ctxpar_context *ctx);

/* Bytes this rank has sent through the context's comm since creation. */
CTXPAR_API ctxpar_status ctxpar_context_bytes_sent(const ctxpar_context *ctx, uint64_t *bytes_out);

/* ---------------------------------------------------------------- tracing and work counters */

typedef enum ctxpar_event_kind {
    CTXPAR_EVENT_COMPUTE = 0,  /* a block kernel (or a batch of them) ran */
    CTXPAR_EVENT_TRANSFER = 1, /* a transfer was in flight: from its post to its completion */
    CTXPAR_EVENT_WAIT = 2,     /* the rank blocked waiting for a transfer (the unhidden part) */
} ctxpar_event_kind;

typedef struct ctxpar_trace_event {
    ctxpar_event_kind kind;
    const char *name; /* "fwd", "bwd", "kv", "dkv", "allgather_kv", ... static storage */
    int step;         /* ring step (0..P-1) or -1 */
    int peer;         /* rank sent to / received from, or -1 */
    double t_begin;   /* seconds, CLOCK_MONOTONIC */
    double t_end;
    uint64_t bytes; /* bytes sent by this rank in a TRANSFER event; 0 otherwise */
} ctxpar_trace_event;

/* Called on the rank's own thread, synchronously, once per event; NULL fn turns tracing off. */
typedef void (*ctxpar_trace_fn)(void *user, const ctxpar_trace_event *event);
CTXPAR_API ctxpar_status ctxpar_context_set_trace(ctxpar_context *ctx, ctxpar_trace_fn fn,
                                                  void *user);

/* Work this rank did since creation (or the last reset): how it was load-balanced. */
typedef struct ctxpar_work_stats {
    uint64_t blocks_computed; /* (Q block, K/V block) pairs a kernel ran on */
    uint64_t blocks_skipped;  /* pairs skipped as fully masked */
    double flops; /* useful FLOPs: 2*(D + Dv) per visible (query, key) pair forward (4*D without MLA) */
} ctxpar_work_stats;

CTXPAR_API ctxpar_status ctxpar_context_work_stats(const ctxpar_context *ctx,
                                                   ctxpar_work_stats *stats_out);
CTXPAR_API ctxpar_status ctxpar_context_reset_work_stats(ctxpar_context *ctx);

#ifdef __cplusplus
}
#endif

#endif /* CTXPAR_H */
