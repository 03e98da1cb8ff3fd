/*
 * fuzz_problem.h - turns fuzz bytes into the arguments of ctxpar_attn_fwd / ctxpar_attn_bwd.
 *
 * Input layout (make_corpus.py writes the same layout; keep the two in step):
 *   bytes 0..30    the problem header (FUZZ_HDR_* offsets below)
 *   bytes 31..94   8 tensor records of 8 bytes: q, k, v, out, dout, dq, dk, dv
 *   bytes 95..110  the features block (FUZZ_EXT_* offsets from FUZZ_EXT_BASE): MLA, windows'
 *                  right side, soft-capping, sinks, the LSE's low part, custom assignments,
 *                  documents per batch row, ulysses; all zero is plain attention
 *   the rest       raw element bytes, used when FUZZ_FLAG_RAW_DATA is set (cycled)
 * Missing bytes read as 0, so every input decodes to some problem.
 *
 * Every data buffer is allocated with exactly the bytes its tensor's shape and strides address
 * (when those make sense), so that ASan reports any access the library makes outside them. A
 * tensor whose decoded shape is not positive gets a one-element buffer: validation must reject
 * it before anything reads it.
 */
#ifndef CPT_FUZZ_PROBLEM_H
#define CPT_FUZZ_PROBLEM_H

#include <stddef.h>
#include <stdint.h>

#include "ctxpar.h"

#ifdef __cplusplus
extern "C" {
#endif

enum {
    FUZZ_HDR_FLAGS = 0,
    FUZZ_HDR_DTYPE = 1,
    FUZZ_HDR_BATCH = 2,       /* 1 + b % 3 */
    FUZZ_HDR_SEQ = 3,         /* local seq: 1 + b % 24 */
    FUZZ_HDR_HKV = 4,         /* 1 + b % 4 */
    FUZZ_HDR_GROUP = 5,       /* Hq = Hkv * (1 + b % 3) */
    FUZZ_HDR_DIM = 6,         /* 1 + b % 80 */
    FUZZ_HDR_ALGO = 7,        /* int8 */
    FUZZ_HDR_LAYOUT = 8,      /* int8 */
    FUZZ_HDR_MASK = 9,        /* int8 */
    FUZZ_HDR_WINDOW = 10,     /* int16 LE */
    FUZZ_HDR_SCALE_MODE = 12, /* 0: 0, 1: 1, 2: 1/8, 3: float bits at 13..16, else int8 / 8 */
    FUZZ_HDR_SCALE_BITS = 13,
    FUZZ_HDR_SEQ_GLOBAL = 17, /* int16 LE */
    FUZZ_HDR_DOCS_MODE = 19,  /* 0 none, 1 num_docs without array, 2 lengths, 3 raw boundaries */
    FUZZ_HDR_DOCS_N = 20,
    FUZZ_HDR_DOCS_BYTES = 21,  /* 9 bytes */
    FUZZ_HDR_STRUCT_SIZE = 30, /* 0 exact, 1 too small, 2 larger, 3 zero */
    FUZZ_HDR_SIZE = 31,
};

/* The features block. */
enum {
    FUZZ_EXT_BASE = 95,
    FUZZ_EXT_FLAGS = 0,        /* FUZZ_EXT_* bits below */
    FUZZ_EXT_VDIM = 1,         /* 0: v's head_dim is q's; else 1 + (b - 1) % 80 (MLA) */
    FUZZ_EXT_WINDOW_RIGHT = 2, /* int16 LE */
    FUZZ_EXT_SOFTCAP = 4,      /* 0 none, 255 NaN, 254 +inf, else int8 / 4 (negatives too) */
    FUZZ_EXT_ULYSSES = 5,      /* int8 */
    FUZZ_EXT_DOC_ROWS = 6,     /* int8 cu_seqlens_rows; > 0: that many rows of boundaries */
    FUZZ_EXT_ASSIGN_TOKEN = 7, /* with FUZZ_EXT_ASSIGNMENT: token b % S gets rank (int8) */
    FUZZ_EXT_ASSIGN_RANK = 8,  /*   this byte; every other token is on rank 0 (the only one) */
    FUZZ_EXT_SINK_SCALE = 9,   /* sinks are [-1, 1) values times 1 + b; 255: one is NaN */
    FUZZ_EXT_Q_LEN = 10,       /* below 128: q_len 0; else q_len = b - 132 (negatives too) */
    FUZZ_EXT_REPRO = 11,       /* below 192: reproducible 0; else b - 224 (negatives, > 1 too) */
    FUZZ_EXT_SIZE = 16,
};

enum {
    FUZZ_EXT_SINKS = 1,      /* params.sinks [Hq] */
    FUZZ_EXT_DSINKS = 2,     /* params.dsinks [Hq] (asked for even without sinks) */
    FUZZ_EXT_LSE_LO = 4,     /* params.lse_lo, like lse */
    FUZZ_EXT_ASSIGNMENT = 8, /* params.assignment [S] (whatever the layout) */
};

/* Bits of the flags byte. */
enum {
    FUZZ_FLAG_BWD = 1,      /* forward, then backward with its out and lse */
    FUZZ_FLAG_RAW_DATA = 2, /* element bytes from the input (NaN, Inf, anything) */
    FUZZ_FLAG_NULL_CTX = 4,
    FUZZ_FLAG_NULL_PARAMS = 8,
    FUZZ_FLAG_NULL_LSE = 16,
    /* Sizes near the int64 limits: dimension (flags >> 6) of every tensor's shape becomes
     * INT64_MAX >> (byte FUZZ_HDR_DIM % 4), strides dense (wrapping); buffers of one element.
     * The problem's byte counts cannot fit: every call must return INVALID_ARG. */
    FUZZ_FLAG_HUGE = 32,
};

/* A tensor record: mode (bits 0-1: 0/3 normal, 1 NULL tensor, 2 NULL data; bit 2: dtype from
 * byte 1 as int8; bit 3: shape[byte 2 % 4] = int8 byte 3; bits 4-5 strides: 0 dense, 1 padded
 * by bytes 4..6, 2 heads outside seq, 3 int8 bytes 4..7 as is). */
enum { FUZZ_TENSOR_RECORD = 8, FUZZ_TENSORS = 8 };

enum { FUZZ_Q, FUZZ_K, FUZZ_V, FUZZ_OUT, FUZZ_DOUT, FUZZ_DQ, FUZZ_DK, FUZZ_DV };

typedef struct fuzz_problem {
    int flags;
    ctxpar_attn_params params;
    int32_t *cu_seqlens; /* owned; max(cu_seqlens_rows, 1) x (num_docs + 1) entries */
    int64_t heads_q;       /* Hq as decoded (before a record changes a shape) */
    int64_t head_dim_v;    /* of v, out, dout, dv, likewise */
    float *sinks, *dsinks; /* owned; heads_q floats each, or NULL */
    float *lse_lo;         /* owned; lse_count floats, or NULL */
    int32_t *assignment;   /* owned; assignment_len entries, or NULL */
    int64_t assignment_len; /* params.seq_len_global when set, else S */
    ctxpar_tensor tensor[FUZZ_TENSORS];
    int is_null[FUZZ_TENSORS];  /* pass NULL instead of &tensor[i] */
    size_t bytes[FUZZ_TENSORS]; /* size of tensor[i].data's buffer (owned) */
    float *lse;                 /* owned; lse_count floats, or NULL */
    size_t lse_count;           /* rows of lse and lse_lo (B x S x Hq of q's shape, or 1) */
} fuzz_problem;

/* Decodes the input. Returns 0 when the input asks for more memory than a fuzz run should use
 * (the caller skips it); the problem must be freed either way. */
int fuzz_problem_decode(const uint8_t *data, size_t size, fuzz_problem *pb);
void fuzz_problem_free(fuzz_problem *pb);

/* Pointer to pass for tensor i (NULL when the record asks for it). */
ctxpar_tensor *fuzz_problem_arg(fuzz_problem *pb, int i);

/* Sets mask[off] = 1 for every element offset that an index of t's shape addresses (t must have
 * passed validation: positive shape, offsets inside its buffer of n elements). */
void fuzz_tensor_mark(const ctxpar_tensor *t, unsigned char *mask, size_t n);

#ifdef __cplusplus
}
#endif

#endif /* CPT_FUZZ_PROBLEM_H */
