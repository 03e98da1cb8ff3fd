// Decoding fuzz bytes into attention arguments (the layout is in fuzz_problem.h).
#include "fuzz_problem.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ctxpar_half.h"

// No tensor buffer larger than this many elements: a fuzz run must stay fast.
#define FUZZ_MAX_ELEMS ((int64_t)1 << 22)

typedef struct reader {
    const uint8_t *d;
    size_t n;
    size_t raw_pos; // next byte of the raw element data (after the records)
} reader;

static uint8_t at(const reader *r, size_t i) {
    return i < r->n ? r->d[i] : 0;
}

static int at_i8(const reader *r, size_t i) {
    return (int8_t)at(r, i);
}

static int at_i16(const reader *r, size_t i) {
    return (int16_t)(uint16_t)(at(r, i) | at(r, i + 1) << 8);
}

// The next raw element byte, cycling over the bytes after the records (0 when there are none).
static uint8_t raw_byte(reader *r) {
    const size_t start = FUZZ_EXT_BASE + FUZZ_EXT_SIZE;
    if (r->n <= start)
        return 0;
    uint8_t b = r->d[start + r->raw_pos % (r->n - start)];
    r->raw_pos++;
    return b;
}

// A deterministic value in [-1, 1) for element i of buffer t (a small integer hash).
static float gen_value(int t, size_t i) {
    uint32_t x = (uint32_t)i * 2654435761u ^ (uint32_t)(t + 1) * 40503u;
    x ^= x >> 15;
    x *= 0x2c1b3c6du;
    x ^= x >> 12;
    return (float)(x >> 8) * 0x1p-23f - 1.0f;
}

static void fill(reader *r, int raw, int t, void *buf, ctxpar_dtype dtype, size_t elems,
                 size_t bytes) {
    if (raw) {
        for (size_t i = 0; i < bytes; i++)
            ((uint8_t *)buf)[i] = raw_byte(r);
        return;
    }
    memset(buf, 0, bytes); // an unknown dtype keeps zeros
    for (size_t i = 0; i < elems; i++) {
        float v = gen_value(t, i);
        if (dtype == CTXPAR_DTYPE_F16)
            ((uint16_t *)buf)[i] = ctxpar_f32_to_f16(v);
        else if (dtype == CTXPAR_DTYPE_BF16)
            ((uint16_t *)buf)[i] = ctxpar_f32_to_bf16(v);
        else if (dtype == CTXPAR_DTYPE_F32)
            ((float *)buf)[i] = v;
    }
}

static ctxpar_dtype dtype_of(int b) {
    return b < 3 ? (ctxpar_dtype)b : (ctxpar_dtype)(int8_t)b;
}

static uint8_t ext(const reader *r, size_t i) {
    return at(r, FUZZ_EXT_BASE + i);
}

// Boundaries of `n` documents ending at seq_global, lengths from the docs bytes starting at
// `shift` (cycled): non-decreasing, so documents past the end come out empty.
static void gen_docs(const reader *r, int64_t seq_global, int64_t n, int shift, int32_t *cu) {
    int64_t cum = 0;
    cu[0] = 0;
    for (int64_t i = 1; i < n; i++) {
        cum += 1 + at(r, FUZZ_HDR_DOCS_BYTES + (size_t)((i - 1 + shift) % 9)) % seq_global;
        cu[i] = (int32_t)(cum < seq_global ? cum : seq_global);
    }
    cu[n] = (int32_t)seq_global;
}

// Documents: none, a count without an array, generated boundaries or raw bytes; with a positive
// FUZZ_EXT_DOC_ROWS, one set per batch row (each generated set shifted by its row).
static void decode_docs(const reader *r, int64_t seq_global, fuzz_problem *pb,
                        ctxpar_attn_params *p) {
    int dm = at(r, FUZZ_HDR_DOCS_MODE) % 4, dn = at(r, FUZZ_HDR_DOCS_N);
    p->cu_seqlens_rows = at_i8(r, FUZZ_EXT_BASE + FUZZ_EXT_DOC_ROWS);
    if (dm == 1)
        p->num_docs = (int8_t)dn;
    if (dm < 2)
        return;
    const int64_t n = 1 + dn % 8, rows = p->cu_seqlens_rows > 0 ? p->cu_seqlens_rows : 1;
    pb->cu_seqlens = calloc((size_t)(rows * (n + 1)), sizeof(int32_t));
    if (!pb->cu_seqlens)
        return; // NULL boundaries with num_docs set: validation must refuse it
    for (int64_t row = 0; row < rows; row++) {
        int32_t *cu = pb->cu_seqlens + row * (n + 1);
        if (dm == 3)
            for (int64_t i = 0; i <= n; i++)
                cu[i] = at_i8(r, FUZZ_HDR_DOCS_BYTES + (size_t)((i + row) % 9));
        else
            gen_docs(r, seq_global, n, (int)row, cu);
    }
    p->cu_seqlens = pb->cu_seqlens;
    p->num_docs = n;
}

static float *gen_floats(int t, size_t n, float mul) {
    float *f = malloc(n * sizeof(float));
    for (size_t i = 0; f && i < n; i++)
        f[i] = gen_value(t, i) * mul;
    return f;
}

// The features block: MLA's head_dim is read by the caller; the rest lands in params.
static int decode_features(const reader *r, int64_t seq_global, fuzz_problem *pb,
                           ctxpar_attn_params *p) {
    const int fl = ext(r, FUZZ_EXT_FLAGS);
    p->window_right = at_i16(r, FUZZ_EXT_BASE + FUZZ_EXT_WINDOW_RIGHT);
    const int cap = ext(r, FUZZ_EXT_SOFTCAP);
    p->softcap = cap == 255 ? NAN : cap == 254 ? INFINITY : (int8_t)cap / 4.0f;
    p->ulysses = (int8_t)ext(r, FUZZ_EXT_ULYSSES);
    // Half the inputs keep q a shard (most shapes are drawn for that).
    const int ql = ext(r, FUZZ_EXT_Q_LEN);
    p->q_len = ql < 128 ? 0 : ql - 132;
    const int rp = ext(r, FUZZ_EXT_REPRO);
    p->reproducible = rp < 192 ? 0 : rp - 224;
    const size_t hq = (size_t)pb->heads_q;
    if (fl & FUZZ_EXT_SINKS) {
        const int sc = ext(r, FUZZ_EXT_SINK_SCALE);
        if (!(pb->sinks = gen_floats(FUZZ_TENSORS + 2, hq, 1.0f + (float)sc)))
            return 0;
        if (sc == 255)
            pb->sinks[hq - 1] = NAN;
        p->sinks = pb->sinks;
    }
    if (fl & FUZZ_EXT_DSINKS) {
        if (!(pb->dsinks = gen_floats(FUZZ_TENSORS + 3, hq, 1.0f)))
            return 0;
        p->dsinks = pb->dsinks;
    }
    if (fl & FUZZ_EXT_ASSIGNMENT) {
        // As long as the library reads it: params.seq_len_global entries when that is set.
        const int64_t n = p->seq_len_global > 0 ? p->seq_len_global : seq_global;
        if (!(pb->assignment = calloc((size_t)n, sizeof(int32_t))))
            return 0;
        pb->assignment_len = n;
        pb->assignment[ext(r, FUZZ_EXT_ASSIGN_TOKEN) % n] = (int8_t)ext(r, FUZZ_EXT_ASSIGN_RANK);
        p->assignment = pb->assignment;
    }
    return 1;
}

static int decode_params(const reader *r, int64_t seq_global, fuzz_problem *pb) {
    ctxpar_attn_params p = CTXPAR_ATTN_PARAMS_INIT;
    static const size_t sizes[4] = {sizeof(ctxpar_attn_params), sizeof(ctxpar_attn_params) - 8,
                                    sizeof(ctxpar_attn_params) + 64, 0};
    p.struct_size = sizes[at(r, FUZZ_HDR_STRUCT_SIZE) % 4];
    p.algo = (ctxpar_algo)at_i8(r, FUZZ_HDR_ALGO);
    p.layout = (ctxpar_layout)at_i8(r, FUZZ_HDR_LAYOUT);
    p.mask = (ctxpar_mask)at_i8(r, FUZZ_HDR_MASK);
    p.window_left = at_i16(r, FUZZ_HDR_WINDOW);
    int sm = at(r, FUZZ_HDR_SCALE_MODE);
    if (sm == 3) {
        uint32_t bits = 0;
        for (int i = 0; i < 4; i++)
            bits |= (uint32_t)at(r, FUZZ_HDR_SCALE_BITS + (size_t)i) << (8 * i);
        p.softmax_scale = ctxpar_bits_f32(bits);
    } else {
        p.softmax_scale = sm == 0 ? 0.0f : sm == 1 ? 1.0f : sm == 2 ? 0.125f : (int8_t)sm / 8.0f;
    }
    p.seq_len_global = at_i16(r, FUZZ_HDR_SEQ_GLOBAL);

    decode_docs(r, seq_global, pb, &p);
    if (!decode_features(r, seq_global, pb, &p))
        return 0;
    pb->params = p;
    return 1;
}

// Strides for a record's mode, from the tensor's (possibly mutated) shape.
static void decode_strides(const reader *r, size_t rec, int mode, ctxpar_tensor *t) {
    const int64_t *sh = t->shape;
    int64_t *st = t->stride;
    st[3] = 1;
    switch (mode) {
    case 0: // dense; wrapping (unsigned) for the huge shapes of FUZZ_FLAG_HUGE
        st[2] = sh[3];
        st[1] = (int64_t)((uint64_t)sh[2] * (uint64_t)st[2]);
        st[0] = (int64_t)((uint64_t)sh[1] * (uint64_t)st[1]);
        break;
    case 1:
        st[2] = sh[3] + at(r, rec + 4) % 5;
        st[1] = sh[2] * st[2] + at(r, rec + 5) % 3;
        st[0] = sh[1] * st[1] + at(r, rec + 6) % 7;
        break;
    case 2: // [B, H, S, D] in memory, as a BSHD view
        st[1] = sh[3] + at(r, rec + 4) % 3;
        st[2] = sh[1] * st[1];
        st[0] = sh[2] * st[2];
        break;
    default:
        for (int d = 0; d < 4; d++)
            st[d] = at_i8(r, rec + 4 + (size_t)d);
    }
}

// Elements the shape and strides address, counting only the steps validation can accept (a
// library that accepts anything else reads outside the buffer, and ASan says so). 0: too big.
static int64_t buffer_elems(const ctxpar_tensor *t) {
    int64_t n = 1;
    for (int d = 0; d < 4; d++)
        if (t->shape[d] <= 0)
            return 1;
    for (int d = 0; d < 4; d++) {
        if (t->shape[d] > 1 && t->stride[d] > 0)
            n += (t->shape[d] - 1) * t->stride[d];
        if (n > FUZZ_MAX_ELEMS)
            return 0;
    }
    return n;
}

static int decode_tensor(reader *r, int i, const int64_t base[4], ctxpar_dtype dtype, int raw,
                         fuzz_problem *pb) {
    const size_t rec = FUZZ_HDR_SIZE + (size_t)i * FUZZ_TENSOR_RECORD;
    const int mode = at(r, rec);
    ctxpar_tensor *t = &pb->tensor[i];
    memset(t, 0, sizeof *t);
    t->dtype = mode & 4 ? dtype_of(at(r, rec + 1)) : dtype;
    memcpy(t->shape, base, sizeof t->shape);
    if (mode & 8)
        t->shape[at(r, rec + 2) % 4] = at_i8(r, rec + 3);
    const int huge = pb->flags & FUZZ_FLAG_HUGE;
    decode_strides(r, rec, huge ? 0 : (mode >> 4) & 3, t);
    pb->is_null[i] = (mode & 3) == 1;
    if ((mode & 3) == 2 || pb->is_null[i])
        return 1;
    int64_t elems = huge ? 1 : buffer_elems(t); // nothing may read it: validation must refuse
    if (elems == 0)
        return 0;
    size_t es = ctxpar_dtype_size(t->dtype);
    if (es == 0)
        es = 4;
    pb->bytes[i] = (size_t)elems * es;
    t->data = malloc(pb->bytes[i]);
    if (!t->data)
        return 0;
    fill(r, raw, i, t->data, t->dtype, (size_t)elems, pb->bytes[i]);
    return 1;
}

int fuzz_problem_decode(const uint8_t *data, size_t size, fuzz_problem *pb) {
    memset(pb, 0, sizeof *pb);
    reader r = {data, size, 0};
    pb->flags = at(&r, FUZZ_HDR_FLAGS);
    const int raw = pb->flags & FUZZ_FLAG_RAW_DATA;
    const ctxpar_dtype dtype = dtype_of(at(&r, FUZZ_HDR_DTYPE));
    const int64_t B = 1 + at(&r, FUZZ_HDR_BATCH) % 3, S = 1 + at(&r, FUZZ_HDR_SEQ) % 24;
    const int64_t Hkv = 1 + at(&r, FUZZ_HDR_HKV) % 4, D = 1 + at(&r, FUZZ_HDR_DIM) % 80;
    const int64_t Hq = Hkv * (1 + at(&r, FUZZ_HDR_GROUP) % 3);
    const int vd = ext(&r, FUZZ_EXT_VDIM);
    const int64_t Dv = vd == 0 ? D : 1 + (vd - 1) % 80;
    pb->heads_q = Hq;
    pb->head_dim_v = Dv;
    int64_t qshape[4] = {B, S, Hq, D}, kshape[4] = {B, S, Hkv, D};
    int64_t oshape[4] = {B, S, Hq, Dv}, vshape[4] = {B, S, Hkv, Dv};
    if (pb->flags & FUZZ_FLAG_HUGE) {
        const int d = (pb->flags >> 6) & 3;
        qshape[d] = kshape[d] = oshape[d] = vshape[d] = INT64_MAX >> (at(&r, FUZZ_HDR_DIM) % 4);
    }
    // One rank: the global sequence is the local one.
    if (!decode_params(&r, S, pb))
        return 0;
    const int64_t *shapes[FUZZ_TENSORS] = {qshape, kshape, vshape, oshape,
                                           oshape, qshape, kshape, vshape};
    for (int i = 0; i < FUZZ_TENSORS; i++)
        if (!decode_tensor(&r, i, shapes[i], dtype, raw, pb))
            return 0;
    const int64_t *qs = pb->tensor[FUZZ_Q].shape;
    const int64_t rows = qs[0] > 0 && qs[1] > 0 && qs[2] > 0 && !(pb->flags & FUZZ_FLAG_HUGE)
                             ? qs[0] * qs[1] * qs[2]
                             : 1;
    pb->lse_count = (size_t)rows;
    if (!(pb->flags & FUZZ_FLAG_NULL_LSE)) {
        pb->lse = malloc(pb->lse_count * sizeof(float));
        if (!pb->lse)
            return 0;
        fill(&r, raw, FUZZ_TENSORS, pb->lse, CTXPAR_DTYPE_F32, pb->lse_count,
             pb->lse_count * sizeof(float));
    }
    if (ext(&r, FUZZ_EXT_FLAGS) & FUZZ_EXT_LSE_LO) {
        if (!(pb->lse_lo = gen_floats(FUZZ_TENSORS + 1, pb->lse_count, 0x1p-30f)))
            return 0;
        pb->params.lse_lo = pb->lse_lo;
    }
    return 1;
}

void fuzz_problem_free(fuzz_problem *pb) {
    for (int i = 0; i < FUZZ_TENSORS; i++)
        free(pb->tensor[i].data);
    free(pb->lse);
    free(pb->lse_lo);
    free(pb->cu_seqlens);
    free(pb->sinks);
    free(pb->dsinks);
    free(pb->assignment);
    memset(pb, 0, sizeof *pb);
}

ctxpar_tensor *fuzz_problem_arg(fuzz_problem *pb, int i) {
    return pb->is_null[i] ? NULL : &pb->tensor[i];
}

void fuzz_tensor_mark(const ctxpar_tensor *t, unsigned char *mask, size_t n) {
    for (int64_t b = 0; b < t->shape[0]; b++)
        for (int64_t s = 0; s < t->shape[1]; s++)
            for (int64_t h = 0; h < t->shape[2]; h++)
                for (int64_t d = 0; d < t->shape[3]; d++) {
                    int64_t off =
                        b * t->stride[0] + s * t->stride[1] + h * t->stride[2] + d * t->stride[3];
                    if (off >= 0 && (size_t)off < n)
                        mask[off] = 1;
                }
}
