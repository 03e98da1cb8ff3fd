/*
 * npy.c - strict .npy reader and writer (see npy.h for what is accepted).
 *
 * File layout: "\x93NUMPY", major, minor, header length (uint16 LE in 1.0, uint32 LE in 2.0),
 * the header (a Python dict literal padded with spaces and ended by '\n'), then the raw data.
 */
#include "reference/npy.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctxpar_backend.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "npy.c copies little-endian data as is: a big-endian host needs byte swapping here"
#endif

static const unsigned char npy_magic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};

// Longest preamble (format 2.0): magic, version, 4-byte header length.
#define NPY_PREAMBLE_MAX 12

// NumPy aligns the start of the data to this many bytes.
#define NPY_ALIGN 64

size_t cpt_npy_dtype_size(cpt_npy_dtype dtype) {
    switch (dtype) {
    case CPT_NPY_F32:
    case CPT_NPY_I32:
        return 4;
    case CPT_NPY_F16:
    case CPT_NPY_BF16:
        return 2;
    case CPT_NPY_I64:
    case CPT_NPY_F64:
        return 8;
    }
    return 0;
}

const char *cpt_npy_dtype_descr(cpt_npy_dtype dtype) {
    switch (dtype) {
    case CPT_NPY_F32:
        return "<f4";
    case CPT_NPY_F16:
        return "<f2";
    case CPT_NPY_I32:
        return "<i4";
    case CPT_NPY_I64:
        return "<i8";
    case CPT_NPY_BF16:
        return "<V2";
    case CPT_NPY_F64:
        return "<f8";
    }
    return "?";
}

const char *cpt_npy_dtype_text(cpt_npy_dtype dtype) {
    switch (dtype) {
    case CPT_NPY_F32: return "float32";
    case CPT_NPY_F16: return "float16";
    case CPT_NPY_BF16: return "bfloat16";
    case CPT_NPY_I32: return "int32";
    case CPT_NPY_I64: return "int64";
    case CPT_NPY_F64:
        return "float64";
    }
    return "?";
}

// What the header says, and the data size it implies.
typedef struct npy_meta {
    cpt_npy_dtype dtype;
    int ndim;
    int64_t shape[CPT_NPY_MAX_DIMS];
    size_t count;
    size_t data_bytes;
} npy_meta;

/* ---------------------------------------------------------------- sizes */

// count = product of the dimensions, data_bytes = count * element size, without overflow.
static ctxpar_status meta_sizes(npy_meta *m, const char *name) {
    size_t count = 1;
    for (int i = 0; i < m->ndim; i++) {
        if (m->shape[i] < 0)
            return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "%s: negative dimension %lld in shape",
                                name, (long long)m->shape[i]);
        size_t d = (size_t)m->shape[i];
        if (d != 0 && count > SIZE_MAX / d)
            return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "%s: shape overflows the address space",
                                name);
        count *= d;
    }
    size_t es = cpt_npy_dtype_size(m->dtype);
    if (count > SIZE_MAX / es)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "%s: data size overflows (%zu elements)", name,
                            count);
    m->count = count;
    m->data_bytes = count * es;
    return CTXPAR_OK;
}

/* ---------------------------------------------------------------- preamble */

// Reads the preamble from the first `avail` bytes of a `total`-byte file: where the header
// starts and how long it is, checked against the file size.
static ctxpar_status parse_preamble(const unsigned char *b, size_t avail, size_t total,
                                    const char *name, size_t *hdr_off_out, size_t *hdr_len_out) {
    if (avail < sizeof npy_magic || memcmp(b, npy_magic, sizeof npy_magic) != 0)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "%s: not a .npy file (bad magic)", name);
    if (avail < 8)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "%s: truncated before the format version",
                            name);
    int major = b[6], minor = b[7];
    if ((major != 1 && major != 2) || minor != 0)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG,
                            "%s: unsupported .npy format version %d.%d (want 1.0 or 2.0)", name,
                            major, minor);
    size_t off = major == 1 ? 10 : 12;
    if (avail < off)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "%s: truncated in the header length", name);
    size_t len = (size_t)b[8] | (size_t)b[9] << 8;
    if (major == 2)
        len |= (size_t)b[10] << 16 | (size_t)b[11] << 24;
    if (len > total - off)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG,
                            "%s: header length %zu runs past the end of the file (%zu bytes)", name,
                            len, total);
    *hdr_off_out = off;
    *hdr_len_out = len;
    return CTXPAR_OK;
}

/* ---------------------------------------------------------------- header dict */

typedef struct hparser {
    const char *s;
    size_t n, i;
    const char *name;
} hparser;

static int is_space(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

static void skip_ws(hparser *p) {
    while (p->i < p->n && is_space(p->s[p->i]))
        p->i++;
}

// Consumes c (after whitespace) if it is next.
static int accept(hparser *p, char c) {
    skip_ws(p);
    if (p->i < p->n && p->s[p->i] == c) {
        p->i++;
        return 1;
    }
    return 0;
}

static ctxpar_status expect(hparser *p, char c, const char *where) {
    if (accept(p, c))
        return CTXPAR_OK;
    return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG,
                        "%s: malformed header: expected '%c' %s at byte %zu", p->name, c, where,
                        p->i);
}

// A quoted Python string without escapes, into buf (cap bytes, NUL-terminated).
static ctxpar_status parse_string(hparser *p, char *buf, size_t cap) {
    skip_ws(p);
    char q = p->i < p->n ? p->s[p->i] : '\0';
    if (q != '\'' && q != '"')
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG,
                            "%s: malformed header: expected a quoted string at byte %zu", p->name,
                            p->i);
    size_t len = 0;
    for (p->i++; p->i < p->n && p->s[p->i] != q; p->i++) {
        char c = p->s[p->i];
        if (c == '\\' || c < 0x20 || c > 0x7e || len + 1 >= cap)
            return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG,
                                "%s: malformed header: unsupported string at byte %zu", p->name,
                                p->i);
        buf[len++] = c;
    }
    if (p->i >= p->n)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "%s: malformed header: unterminated string",
                            p->name);
    p->i++;
    buf[len] = '\0';
    return CTXPAR_OK;
}

static int accept_word(hparser *p, const char *w) {
    skip_ws(p);
    size_t len = strlen(w);
    if (p->n - p->i >= len && memcmp(p->s + p->i, w, len) == 0) {
        p->i += len;
        return 1;
    }
    return 0;
}

static ctxpar_status parse_bool(hparser *p, int *out) {
    if (accept_word(p, "True"))
        *out = 1;
    else if (accept_word(p, "False"))
        *out = 0;
    else
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG,
                            "%s: malformed header: fortran_order must be True or False", p->name);
    return CTXPAR_OK;
}

// A non-negative decimal integer as Python writes it (no sign, no leading zeros).
static ctxpar_status parse_dim(hparser *p, int64_t *out) {
    skip_ws(p);
    if (p->i < p->n && p->s[p->i] == '-')
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "%s: negative dimension in shape", p->name);
    size_t start = p->i;
    int64_t v = 0;
    while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9') {
        int digit = p->s[p->i] - '0';
        if (v > (INT64_MAX - digit) / 10)
            return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "%s: dimension too large in shape",
                                p->name);
        v = v * 10 + digit;
        p->i++;
    }
    size_t len = p->i - start;
    if (len == 0 || (len > 1 && p->s[start] == '0'))
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG,
                            "%s: malformed header: bad dimension in shape at byte %zu", p->name,
                            start);
    *out = v;
    return CTXPAR_OK;
}

// A tuple: (), (n,), (n, m) or (n, m,). "(n)" is an int in Python, not a tuple.
static ctxpar_status parse_shape(hparser *p, npy_meta *m) {
    CTXPAR_CHECK(expect(p, '(', "to open the shape tuple"));
    m->ndim = 0;
    if (accept(p, ')'))
        return CTXPAR_OK;
    for (;;) {
        if (m->ndim == CPT_NPY_MAX_DIMS)
            return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "%s: more than %d dimensions", p->name,
                                CPT_NPY_MAX_DIMS);
        CTXPAR_CHECK(parse_dim(p, &m->shape[m->ndim]));
        m->ndim++;
        int comma = accept(p, ',');
        if (accept(p, ')')) {
            if (m->ndim == 1 && !comma)
                return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG,
                                    "%s: malformed header: shape is not a tuple", p->name);
            return CTXPAR_OK;
        }
        if (!comma)
            return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG,
                                "%s: malformed header: expected ',' or ')' in shape at byte %zu",
                                p->name, p->i);
    }
}

static ctxpar_status parse_descr(hparser *p, npy_meta *m) {
    char descr[16];
    CTXPAR_CHECK(parse_string(p, descr, sizeof descr));
    if (strcmp(descr, "|V2") == 0) { // the same 2-byte void, written without a byte order
        m->dtype = CPT_NPY_BF16;
        return CTXPAR_OK;
    }
    for (int t = CPT_NPY_F32; t <= CPT_NPY_F64; t++) {
        if (strcmp(descr, cpt_npy_dtype_descr((cpt_npy_dtype)t)) == 0) {
            m->dtype = (cpt_npy_dtype)t;
            return CTXPAR_OK;
        }
    }
    if (descr[0] == '>')
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG,
                            "%s: big-endian dtype '%s' not supported (want '<f4', '<f2', '<V2', "
                            "'<f8', '<i4' or '<i8')",
                            p->name, descr);
    return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG,
                        "%s: dtype '%s' not supported (want '<f4', '<f2', '<V2' (bfloat16), "
                        "'<f8', '<i4' or '<i8')",
                        p->name, descr);
}

// The dict: exactly the keys descr, fortran_order, shape, in any order, each once.
static ctxpar_status parse_header(const char *s, size_t n, const char *name, npy_meta *m) {
    hparser p = {s, n, 0, name};
    int seen_descr = 0, seen_order = 0, seen_shape = 0;
    CTXPAR_CHECK(expect(&p, '{', "at the start of the header"));
    while (!accept(&p, '}')) {
        char key[32];
        CTXPAR_CHECK(parse_string(&p, key, sizeof key));
        CTXPAR_CHECK(expect(&p, ':', "after a key"));
        int *seen;
        if (strcmp(key, "descr") == 0) {
            seen = &seen_descr;
            CTXPAR_CHECK(parse_descr(&p, m));
        } else if (strcmp(key, "fortran_order") == 0) {
            int fortran = 0;
            seen = &seen_order;
            CTXPAR_CHECK(parse_bool(&p, &fortran));
            if (fortran)
                return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG,
                                    "%s: fortran_order True not supported (save C order)", name);
        } else if (strcmp(key, "shape") == 0) {
            seen = &seen_shape;
            CTXPAR_CHECK(parse_shape(&p, m));
        } else {
            return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "%s: unexpected header key '%s'", name,
                                key);
        }
        if ((*seen)++)
            return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "%s: duplicate header key '%s'", name, key);
        if (!accept(&p, ',')) {
            CTXPAR_CHECK(expect(&p, '}', "to close the header"));
            break;
        }
    }
    skip_ws(&p);
    if (p.i != p.n)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG,
                            "%s: malformed header: unexpected text after the dict at byte %zu",
                            name, p.i);
    if (!seen_descr || !seen_order || !seen_shape)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "%s: header lacks the key '%s'", name,
                            !seen_descr   ? "descr"
                            : !seen_order ? "fortran_order"
                                          : "shape");
    return meta_sizes(m, name);
}

// The data must be exactly what the header promises: no less, no more.
static ctxpar_status check_data_size(const npy_meta *m, size_t avail, const char *name) {
    if (avail < m->data_bytes)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG,
                            "%s: truncated data: header promises %zu bytes, file holds %zu", name,
                            m->data_bytes, avail);
    if (avail > m->data_bytes)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG,
                            "%s: %zu unexpected bytes after the %zu bytes of data", name,
                            avail - m->data_bytes, m->data_bytes);
    return CTXPAR_OK;
}

static ctxpar_status alloc_data(const npy_meta *m, const char *name, void **data_out) {
    // malloc(0) may return NULL: an empty array still gets a valid pointer.
    void *d = malloc(m->data_bytes ? m->data_bytes : 1);
    if (!d)
        return CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "%s: cannot allocate %zu bytes of data", name,
                            m->data_bytes);
    *data_out = d;
    return CTXPAR_OK;
}

static void array_from_meta(const npy_meta *m, void *data, cpt_npy_array *a) {
    memset(a, 0, sizeof *a);
    a->dtype = m->dtype;
    a->ndim = m->ndim;
    memcpy(a->shape, m->shape, sizeof(int64_t) * (size_t)m->ndim);
    a->count = m->count;
    a->data = data;
}

/* ---------------------------------------------------------------- reading */

ctxpar_status cpt_npy_read_mem(const void *bytes, size_t size, const char *name,
                                  cpt_npy_array *array_out) {
    if (!name)
        name = "<memory>";
    if ((!bytes && size) || !array_out)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "%s: bytes or array_out is NULL", name);
    const unsigned char *b = bytes;
    size_t off, len;
    npy_meta m = {0};
    void *data = NULL;
    CTXPAR_CHECK(parse_preamble(b, size, size, name, &off, &len));
    CTXPAR_CHECK(parse_header((const char *)b + off, len, name, &m));
    CTXPAR_CHECK(check_data_size(&m, size - off - len, name));
    CTXPAR_CHECK(alloc_data(&m, name, &data));
    if (m.data_bytes)
        memcpy(data, b + off + len, m.data_bytes);
    array_from_meta(&m, data, array_out);
    return CTXPAR_OK;
}

// Reads exactly n bytes at offset off.
static ctxpar_status read_at(FILE *f, size_t off, void *dst, size_t n, const char *name) {
    if (n == 0)
        return CTXPAR_OK;
    if (fseek(f, (long)off, SEEK_SET) != 0 || fread(dst, 1, n, f) != n)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "%s: read error at byte %zu: %s", name, off,
                            ferror(f) ? strerror(errno) : "unexpected end of file");
    return CTXPAR_OK;
}

ctxpar_status cpt_npy_read(const char *path, cpt_npy_array *array_out) {
    if (!path || !array_out)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "npy read: path or array_out is NULL");
    FILE *f = fopen(path, "rb");
    if (!f)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "%s: cannot open: %s", path, strerror(errno));
    ctxpar_status st = CTXPAR_OK;
    char *hdr = NULL;
    void *data = NULL;
    unsigned char pre[NPY_PREAMBLE_MAX];
    size_t off, len;
    npy_meta m = {0};
    long end = -1;
    if (fseek(f, 0, SEEK_END) == 0)
        end = ftell(f);
    if (end < 0) {
        st = CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "%s: cannot determine the file size (%s)", path,
                          strerror(errno));
        goto done;
    }
    const size_t total = (size_t)end;
    const size_t npre = total < sizeof pre ? total : sizeof pre;
    CTXPAR_CHECK_GOTO(read_at(f, 0, pre, npre, path), st, done);
    CTXPAR_CHECK_GOTO(parse_preamble(pre, npre, total, path, &off, &len), st, done);
    // len was checked against the file size, so this allocation is bounded by the file.
    hdr = malloc(len + 1);
    if (!hdr) {
        st = CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "%s: cannot allocate a %zu-byte header", path,
                          len);
        goto done;
    }
    CTXPAR_CHECK_GOTO(read_at(f, off, hdr, len, path), st, done);
    CTXPAR_CHECK_GOTO(parse_header(hdr, len, path, &m), st, done);
    CTXPAR_CHECK_GOTO(check_data_size(&m, total - off - len, path), st, done);
    CTXPAR_CHECK_GOTO(alloc_data(&m, path, &data), st, done);
    CTXPAR_CHECK_GOTO(read_at(f, off + len, data, m.data_bytes, path), st, done);
    array_from_meta(&m, data, array_out);
    data = NULL; // now owned by the caller
done:
    free(data);
    free(hdr);
    fclose(f);
    return st;
}

void cpt_npy_free(cpt_npy_array *array) {
    if (!array)
        return;
    free(array->data);
    memset(array, 0, sizeof *array);
}

int cpt_npy_same(const cpt_npy_array *a, const cpt_npy_array *b) {
    if (a->dtype != b->dtype || a->ndim != b->ndim || a->count != b->count)
        return 0;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i])
            return 0;
    return memcmp(a->data, b->data, a->count * cpt_npy_dtype_size(a->dtype)) == 0;
}

/* ---------------------------------------------------------------- writing */

// Checks the arguments and builds preamble + header: *head_out (malloc'ed) of *head_len_out
// bytes, a multiple of NPY_ALIGN; *data_bytes_out is the size of the data that follows.
static ctxpar_status build_head(cpt_npy_dtype dtype, int ndim, const int64_t *shape,
                                const void *data, const char *name, char **head_out,
                                size_t *head_len_out, size_t *data_bytes_out) {
    npy_meta m = {0};
    if (cpt_npy_dtype_size(dtype) == 0)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "%s: unknown npy dtype %d", name, (int)dtype);
    if (ndim < 0 || ndim > CPT_NPY_MAX_DIMS || (ndim > 0 && !shape))
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "%s: ndim %d (0..%d, shape not NULL)", name,
                            ndim, CPT_NPY_MAX_DIMS);
    m.dtype = dtype;
    m.ndim = ndim;
    for (int i = 0; i < ndim; i++)
        m.shape[i] = shape[i];
    CTXPAR_CHECK(meta_sizes(&m, name));
    if (!data && m.data_bytes)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "%s: data is NULL for %zu elements", name,
                            m.count);

    char dict[64 + 24 * CPT_NPY_MAX_DIMS];
    int n = snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': (",
                     cpt_npy_dtype_descr(dtype));
    for (int i = 0; i < ndim; i++)
        n += snprintf(dict + n, sizeof dict - (size_t)n, i == 0 ? "%lld," : " %lld,",
                      (long long)shape[i]);
    if (ndim > 1)
        n--; // NumPy writes (3,) but (2, 3)
    n += snprintf(dict + n, sizeof dict - (size_t)n, "), }");

    // Preamble + dict + spaces + '\n' is a multiple of NPY_ALIGN. Format 2.0 only when 1.0's
    // 16-bit length might not hold the padded header (the dims limit keeps headers far smaller).
    size_t pre = (size_t)n + 1 + NPY_ALIGN > 65535 ? 12 : 10;
    size_t total = (pre + (size_t)n + 1 + NPY_ALIGN - 1) / NPY_ALIGN * NPY_ALIGN;
    size_t hlen = total - pre;
    char *head = malloc(total);
    if (!head)
        return CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "%s: cannot allocate the header", name);
    memcpy(head, npy_magic, sizeof npy_magic);
    head[6] = pre == 10 ? 1 : 2;
    head[7] = 0;
    for (size_t i = 0; i < pre - 8; i++)
        head[8 + i] = (char)(hlen >> (8 * i) & 0xff);
    memcpy(head + pre, dict, (size_t)n);
    memset(head + pre + n, ' ', hlen - (size_t)n - 1);
    head[total - 1] = '\n';
    *head_out = head;
    *head_len_out = total;
    *data_bytes_out = m.data_bytes;
    return CTXPAR_OK;
}

ctxpar_status cpt_npy_write_mem(cpt_npy_dtype dtype, int ndim, const int64_t *shape,
                                   const void *data, void **bytes_out, size_t *size_out) {
    const char *name = "<memory>";
    if (!bytes_out || !size_out)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "%s: bytes_out or size_out is NULL", name);
    char *head;
    size_t hlen, dbytes;
    CTXPAR_CHECK(build_head(dtype, ndim, shape, data, name, &head, &hlen, &dbytes));
    if (dbytes > SIZE_MAX - hlen) {
        free(head);
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "%s: file size overflows", name);
    }
    char *out = realloc(head, hlen + dbytes);
    if (!out) {
        free(head);
        return CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "%s: cannot allocate %zu bytes", name,
                            hlen + dbytes);
    }
    if (dbytes)
        memcpy(out + hlen, data, dbytes);
    *bytes_out = out;
    *size_out = hlen + dbytes;
    return CTXPAR_OK;
}

ctxpar_status cpt_npy_write(const char *path, cpt_npy_dtype dtype, int ndim,
                               const int64_t *shape, const void *data) {
    if (!path)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "npy write: path is NULL");
    char *head;
    size_t hlen, dbytes;
    CTXPAR_CHECK(build_head(dtype, ndim, shape, data, path, &head, &hlen, &dbytes));
    ctxpar_status st = CTXPAR_OK;
    FILE *f = fopen(path, "wb");
    if (!f) {
        st = CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "%s: cannot open for writing: %s", path,
                          strerror(errno));
        free(head);
        return st;
    }
    int ok =
        fwrite(head, 1, hlen, f) == hlen && (dbytes == 0 || fwrite(data, 1, dbytes, f) == dbytes);
    ok = (fclose(f) == 0) && ok;
    free(head);
    if (!ok) {
        st = CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "%s: write failed: %s", path, strerror(errno));
        remove(path);
    }
    return st;
}
