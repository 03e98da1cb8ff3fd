/*
 * safetensors.c - strict .safetensors reader and writer (see safetensors.h for what is accepted).
 *
 * Reading parses and checks the whole header first (every tensor's dtype, shape and offsets, the
 * buffer covered exactly once), and only then allocates and copies data, so that a bad file
 * costs no more than its header.
 */
#include "reference/safetensors.h"

#include <errno.h>
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctxpar_backend.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors.c copies little-endian data as is: a big-endian host needs byte swapping"
#endif

// The safetensors library refuses larger headers; so do we.
#define ST_MAX_HEADER 100000000u

static const struct {
    const char *name;
    cpt_npy_dtype dtype;
} st_dtypes[] = {
    {"F32", CPT_NPY_F32}, {"F16", CPT_NPY_F16}, {"BF16", CPT_NPY_BF16},
    {"I32", CPT_NPY_I32}, {"I64", CPT_NPY_I64}, {"F64", CPT_NPY_F64},
};
#define N_ST_DTYPES (sizeof st_dtypes / sizeof st_dtypes[0])

const char *cpt_st_dtype_name(cpt_npy_dtype dtype) {
    for (size_t i = 0; i < N_ST_DTYPES; i++)
        if (st_dtypes[i].dtype == dtype)
            return st_dtypes[i].name;
    return "?";
}

/* ---------------------------------------------------------------- header */

// One entry of the header before its data is read.
typedef struct st_entry {
    const char *name; // points into the parsed JSON
    cpt_npy_array a;
    uint64_t begin, end;
} st_entry;

static int by_begin(const void *x, const void *y) {
    const st_entry *a = x, *b = y;
    if (a->begin != b->begin)
        return a->begin < b->begin ? -1 : 1;
    return (a->end > b->end) - (a->end < b->end);
}

static ctxpar_status parse_dtype(json_t *v, const char *file, const char *tensor,
                                 cpt_npy_dtype *out) {
    const char *s = json_string_value(v);
    if (!s)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "%s: tensor '%s': dtype is not a string", file,
                            tensor);
    for (size_t i = 0; i < N_ST_DTYPES; i++)
        if (strcmp(s, st_dtypes[i].name) == 0) {
            *out = st_dtypes[i].dtype;
            return CTXPAR_OK;
        }
    return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG,
                        "%s: tensor '%s': dtype '%.32s' not supported (want F32, F16, BF16, F64, "
                        "I32 or I64)",
                        file, tensor, s);
}

static ctxpar_status parse_shape(json_t *v, const char *file, const char *tensor,
                                 cpt_npy_array *a) {
    if (!json_is_array(v))
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "%s: tensor '%s': shape is not an array", file,
                            tensor);
    size_t n = json_array_size(v);
    if (n > CPT_NPY_MAX_DIMS)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "%s: tensor '%s': %zu dimensions (at most %d)",
                            file, tensor, n, CPT_NPY_MAX_DIMS);
    size_t count = 1;
    for (size_t i = 0; i < n; i++) {
        json_t *d = json_array_get(v, i);
        json_int_t x = json_is_integer(d) ? json_integer_value(d) : -1;
        if (x < 0)
            return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG,
                                "%s: tensor '%s': shape[%zu] is not a non-negative integer", file,
                                tensor, i);
        if (x != 0 && count > SIZE_MAX / (uint64_t)x)
            return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "%s: tensor '%s': shape overflows", file,
                                tensor);
        count *= (size_t)x;
        a->shape[i] = x;
    }
    a->ndim = (int)n;
    a->count = count;
    return CTXPAR_OK;
}

static ctxpar_status parse_offsets(json_t *v, const char *file, st_entry *e) {
    json_t *b = json_array_get(v, 0), *x = json_array_get(v, 1);
    if (!json_is_array(v) || json_array_size(v) != 2 || !json_is_integer(b) ||
        !json_is_integer(x) || json_integer_value(b) < 0 ||
        json_integer_value(x) < json_integer_value(b))
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG,
                            "%s: tensor '%s': data_offsets must be [begin, end], 0 <= begin <= end",
                            file, e->name);
    e->begin = (uint64_t)json_integer_value(b);
    e->end = (uint64_t)json_integer_value(x);
    return CTXPAR_OK;
}

// One tensor's object: exactly dtype, shape and data_offsets, the size matching the shape.
static ctxpar_status parse_entry(const char *key, json_t *v, const char *file, st_entry *e) {
    memset(e, 0, sizeof *e);
    e->name = key;
    if (!json_is_object(v))
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "%s: tensor '%s' is not a JSON object", file,
                            key);
    json_t *dt = json_object_get(v, "dtype"), *sh = json_object_get(v, "shape"),
           *off = json_object_get(v, "data_offsets");
    if (!dt || !sh || !off || json_object_size(v) != 3)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG,
                            "%s: tensor '%s' must have exactly dtype, shape and data_offsets", file,
                            key);
    CTXPAR_CHECK(parse_dtype(dt, file, key, &e->a.dtype));
    CTXPAR_CHECK(parse_shape(sh, file, key, &e->a));
    CTXPAR_CHECK(parse_offsets(off, file, e));
    size_t es = cpt_npy_dtype_size(e->a.dtype);
    if (e->a.count > SIZE_MAX / es || e->end - e->begin != (uint64_t)(e->a.count * es))
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG,
                            "%s: tensor '%s': data_offsets span %llu bytes, but %s of %zu "
                            "elements needs %zu",
                            file, key, (unsigned long long)(e->end - e->begin),
                            cpt_st_dtype_name(e->a.dtype), e->a.count,
                            e->a.count <= SIZE_MAX / es ? e->a.count * es : SIZE_MAX);
    return CTXPAR_OK;
}

// Every byte of the data buffer belongs to exactly one tensor (entries sorted by begin).
static ctxpar_status check_coverage(const st_entry *e, size_t n, uint64_t data_size,
                                    const char *file) {
    uint64_t at = 0;
    for (size_t i = 0; i < n; i++) {
        if (e[i].end > data_size)
            return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG,
                                "%s: tensor '%s': data_offsets end at %llu, past the end of the "
                                "data (%llu bytes)",
                                file, e[i].name, (unsigned long long)e[i].end,
                                (unsigned long long)data_size);
        if (e[i].begin < at)
            return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG,
                                "%s: tensors '%s' and '%s' overlap (bytes %llu..%llu)", file,
                                e[i - 1].name, e[i].name, (unsigned long long)e[i].begin,
                                (unsigned long long)at);
        if (e[i].begin > at)
            return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG,
                                "%s: bytes %llu..%llu of the data belong to no tensor", file,
                                (unsigned long long)at, (unsigned long long)e[i].begin);
        at = e[i].end;
    }
    if (at != data_size)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG,
                            "%s: %llu bytes after the last tensor's data (truncated or padded "
                            "file?)",
                            file, (unsigned long long)(data_size - at));
    return CTXPAR_OK;
}

// Parses the JSON header; on success *root_out (decref it) owns the names in *entries_out.
static ctxpar_status parse_header(const char *text, size_t len, uint64_t data_size,
                                  const char *file, json_t **root_out, st_entry **entries_out,
                                  size_t *count_out) {
    json_error_t jerr;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "%s: header is not valid JSON: %s (byte %d)",
                            file, jerr.text, jerr.position);
    ctxpar_status st = CTXPAR_OK;
    st_entry *e = NULL;
    size_t n = 0;
    if (!json_is_object(root)) {
        st = CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "%s: header is not a JSON object", file);
        goto fail;
    }
    e = calloc(json_object_size(root) + 1, sizeof *e);
    if (!e) {
        st = CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "%s: cannot allocate the header", file);
        goto fail;
    }
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
        if (strcmp(key, "__metadata__") == 0) {
            const char *mk;
            json_t *mv;
            int ok = json_is_object(v);
            json_object_foreach(v, mk, mv) ok = ok && json_is_string(mv);
            if (!ok) {
                st = CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG,
                                  "%s: __metadata__ must be an object of strings", file);
                goto fail;
            }
            continue;
        }
        CTXPAR_CHECK_GOTO(parse_entry(key, v, file, &e[n]), st, fail);
        n++;
    }
    qsort(e, n, sizeof *e, by_begin);
    CTXPAR_CHECK_GOTO(check_coverage(e, n, data_size, file), st, fail);
    *root_out = root;
    *entries_out = e;
    *count_out = n;
    return CTXPAR_OK;
fail:
    free(e);
    json_decref(root);
    return st;
}

// The 8-byte length, checked against the file size: where the data starts and its size.
static ctxpar_status parse_length(const unsigned char *b, size_t avail, uint64_t total,
                                  const char *file, size_t *hlen_out, uint64_t *data_size_out) {
    if (avail < 8)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG,
                            "%s: truncated: %zu bytes, not even the 8-byte header length", file,
                            avail);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--)
        n = n << 8 | b[i];
    if (n > total - 8)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG,
                            "%s: header length %llu runs past the end of the file (%llu bytes)",
                            file, (unsigned long long)n, (unsigned long long)total);
    if (n > ST_MAX_HEADER)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "%s: header length %llu exceeds 100 MB", file,
                            (unsigned long long)n);
    *hlen_out = (size_t)n;
    *data_size_out = total - 8 - n;
    return CTXPAR_OK;
}

/* ---------------------------------------------------------------- reading */

// Where the bytes come from: memory, or an open file.
typedef struct st_source {
    const unsigned char *mem;
    FILE *f;
    const char *name;
} st_source;

static ctxpar_status source_read(const st_source *s, uint64_t off, void *dst, size_t n) {
    if (n == 0)
        return CTXPAR_OK;
    if (s->mem) {
        memcpy(dst, s->mem + off, n);
        return CTXPAR_OK;
    }
    if (fseek(s->f, (long)off, SEEK_SET) != 0 || fread(dst, 1, n, s->f) != n)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "%s: read error at byte %llu: %s", s->name,
                            (unsigned long long)off,
                            ferror(s->f) ? strerror(errno) : "unexpected end of file");
    return CTXPAR_OK;
}

static void free_tensors(cpt_st_tensor *t, int n) {
    for (int i = 0; t && i < n; i++) {
        free(t[i].name);
        cpt_npy_free(&t[i].array);
    }
    free(t);
}

// Reads a whole image of `total` bytes from src into *out.
static ctxpar_status read_source(const st_source *src, uint64_t total, cpt_st_file *out) {
    unsigned char pre[8];
    size_t npre = total < 8 ? (size_t)total : 8, hlen = 0;
    uint64_t data_size = 0;
    CTXPAR_CHECK(source_read(src, 0, pre, npre));
    CTXPAR_CHECK(parse_length(pre, npre, total, src->name, &hlen, &data_size));
    char *text = malloc(hlen + 1);
    if (!text)
        return CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "%s: cannot allocate a %zu-byte header",
                            src->name, hlen);
    json_t *root = NULL;
    st_entry *e = NULL;
    size_t n = 0;
    cpt_st_tensor *t = NULL;
    int done = 0;
    ctxpar_status st = source_read(src, 8, text, hlen);
    if (st == CTXPAR_OK)
        st = parse_header(text, hlen, data_size, src->name, &root, &e, &n);
    if (st == CTXPAR_OK && !(t = calloc(n + 1, sizeof *t)))
        st =
            CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "%s: cannot allocate %zu tensors", src->name, n);
    for (; st == CTXPAR_OK && (size_t)done < n; done++) {
        size_t bytes = (size_t)(e[done].end - e[done].begin);
        size_t nlen = strlen(e[done].name) + 1; // strdup is not C11
        t[done].name = malloc(nlen);
        if (t[done].name)
            memcpy(t[done].name, e[done].name, nlen);
        t[done].array = e[done].a;
        t[done].array.data = malloc(bytes ? bytes : 1);
        if (!t[done].name || !t[done].array.data) {
            free(t[done].name);
            free(t[done].array.data);
            st = CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "%s: cannot allocate tensor '%s'",
                              src->name, e[done].name);
            break;
        }
        st = source_read(src, 8 + hlen + e[done].begin, t[done].array.data, bytes);
        if (st != CTXPAR_OK) {
            done++; // this one is allocated: free it below
            break;
        }
    }
    if (st == CTXPAR_OK) {
        out->count = (int)n;
        out->tensors = t;
    } else {
        free_tensors(t, done);
    }
    free(e);
    json_decref(root);
    free(text);
    return st;
}

ctxpar_status cpt_st_read_mem(const void *bytes, size_t size, const char *name,
                                 cpt_st_file *file_out) {
    if (!name)
        name = "<memory>";
    if ((!bytes && size) || !file_out)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "%s: bytes or file_out is NULL", name);
    st_source src = {bytes, NULL, name};
    return read_source(&src, size, file_out);
}

ctxpar_status cpt_st_read(const char *path, cpt_st_file *file_out) {
    if (!path || !file_out)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "safetensors read: path or file_out is NULL");
    FILE *f = fopen(path, "rb");
    if (!f)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "%s: cannot open: %s", path, strerror(errno));
    ctxpar_status st;
    long end = -1;
    if (fseek(f, 0, SEEK_END) == 0)
        end = ftell(f);
    if (end < 0) {
        st = CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "%s: cannot determine the file size (%s)", path,
                          strerror(errno));
    } else {
        st_source src = {NULL, f, path};
        st = read_source(&src, (uint64_t)end, file_out);
    }
    fclose(f);
    return st;
}

const cpt_npy_array *cpt_st_find(const cpt_st_file *file, const char *name) {
    for (int i = 0; file && i < file->count; i++)
        if (strcmp(file->tensors[i].name, name) == 0)
            return &file->tensors[i].array;
    return NULL;
}

void cpt_st_free(cpt_st_file *file) {
    if (!file)
        return;
    free_tensors(file->tensors, file->count);
    memset(file, 0, sizeof *file);
}

/* ---------------------------------------------------------------- writing */

// The padded header (length prefix included) for the tensors: *head_out of *head_len_out bytes.
static ctxpar_status build_head(int count, const cpt_st_tensor *t, char **head_out,
                                size_t *head_len_out, size_t *data_bytes_out) {
    if (count < 0 || (count > 0 && !t))
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "safetensors write: %d tensors", count);
    json_t *root = json_object();
    if (!root)
        return CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "safetensors write: out of memory");
    ctxpar_status st = CTXPAR_OK;
    size_t at = 0;
    for (int i = 0; st == CTXPAR_OK && i < count; i++) {
        const cpt_npy_array *a = &t[i].array;
        size_t es = cpt_npy_dtype_size(a->dtype);
        if (!t[i].name || !strcmp(t[i].name, "__metadata__") || json_object_get(root, t[i].name) ||
            es == 0 || a->ndim < 0 || a->ndim > CPT_NPY_MAX_DIMS || (!a->data && a->count)) {
            st = CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG,
                              "safetensors write: tensor %d ('%s'): missing, reserved or "
                              "duplicate name, bad dtype, ndim or data",
                              i, t[i].name ? t[i].name : "(null)");
            break;
        }
        json_t *shape = json_array(), *off = json_array(), *e = json_object();
        for (int d = 0; d < a->ndim; d++)
            json_array_append_new(shape, json_integer(a->shape[d]));
        json_array_append_new(off, json_integer((json_int_t)at));
        at += a->count * es;
        json_array_append_new(off, json_integer((json_int_t)at));
        json_object_set_new(e, "dtype", json_string(cpt_st_dtype_name(a->dtype)));
        json_object_set_new(e, "shape", shape);
        json_object_set_new(e, "data_offsets", off);
        if (json_object_set_new(root, t[i].name, e) != 0)
            st = CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG,
                              "safetensors write: tensor name '%s' is not valid UTF-8", t[i].name);
    }
    char *text = st == CTXPAR_OK ? json_dumps(root, JSON_COMPACT) : NULL;
    json_decref(root);
    if (st != CTXPAR_OK)
        return st;
    if (!text)
        return CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "safetensors write: cannot format header");
    size_t len = strlen(text), padded = (len + 7) / 8 * 8;
    char *head = malloc(8 + padded);
    if (!head) {
        free(text);
        return CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "safetensors write: out of memory");
    }
    for (int i = 0; i < 8; i++)
        head[i] = (char)((uint64_t)padded >> (8 * i) & 0xff);
    memcpy(head + 8, text, len);
    memset(head + 8 + len, ' ', padded - len);
    free(text);
    *head_out = head;
    *head_len_out = 8 + padded;
    *data_bytes_out = at;
    return CTXPAR_OK;
}

static size_t tensor_bytes(const cpt_st_tensor *t) {
    return t->array.count * cpt_npy_dtype_size(t->array.dtype);
}

ctxpar_status cpt_st_write_mem(int count, const cpt_st_tensor *tensors, void **bytes_out,
                                  size_t *size_out) {
    if (!bytes_out || !size_out)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "safetensors write: NULL output");
    char *head;
    size_t hlen, dbytes;
    CTXPAR_CHECK(build_head(count, tensors, &head, &hlen, &dbytes));
    char *out = realloc(head, hlen + dbytes + 1);
    if (!out) {
        free(head);
        return CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "safetensors write: out of memory");
    }
    size_t at = hlen;
    for (int i = 0; i < count; i++) {
        size_t n = tensor_bytes(&tensors[i]);
        if (n)
            memcpy(out + at, tensors[i].array.data, n);
        at += n;
    }
    *bytes_out = out;
    *size_out = hlen + dbytes;
    return CTXPAR_OK;
}

ctxpar_status cpt_st_write(const char *path, int count, const cpt_st_tensor *tensors) {
    if (!path)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "safetensors write: path is NULL");
    char *head;
    size_t hlen, dbytes;
    CTXPAR_CHECK(build_head(count, tensors, &head, &hlen, &dbytes));
    FILE *f = fopen(path, "wb");
    if (!f) {
        free(head);
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "%s: cannot open for writing: %s", path,
                            strerror(errno));
    }
    int ok = fwrite(head, 1, hlen, f) == hlen;
    for (int i = 0; ok && i < count; i++) {
        size_t n = tensor_bytes(&tensors[i]);
        ok = n == 0 || fwrite(tensors[i].array.data, 1, n, f) == n;
    }
    ok = (fclose(f) == 0) && ok;
    free(head);
    if (!ok) {
        remove(path);
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "%s: write failed: %s", path, strerror(errno));
    }
    return CTXPAR_OK;
}
