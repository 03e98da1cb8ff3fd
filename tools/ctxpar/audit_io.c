// Reading and writing the tensors of `ctxpar audit` (see audit_io.h).
#include "tools/ctxpar/audit_io.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ctxpar_backend.h"
#include "tools/ctxpar/text_ints.h"

static int ends_with(const char *s, const char *tail) {
    size_t n = strlen(s), m = strlen(tail);
    return n >= m && strcmp(s + n - m, tail) == 0;
}

// pattern with {rank} and {name} replaced; 0 when it does not fit.
static int expand(const char *pattern, const char *name, int rank, char *out, size_t n) {
    size_t o = 0;
    for (const char *p = pattern; *p;) {
        char num[16];
        const char *rep = NULL;
        size_t skip = 1;
        if (!strncmp(p, "{rank}", 6)) {
            snprintf(num, sizeof num, "%d", rank);
            rep = num, skip = 6;
        } else if (!strncmp(p, "{name}", 6)) {
            rep = name, skip = 6;
        }
        size_t len = rep ? strlen(rep) : 1;
        if (o + len >= n)
            return 0;
        memcpy(out + o, rep ? rep : p, len);
        o += len;
        p += skip;
    }
    out[o] = '\0';
    return 1;
}

static int file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

// TransformerEngine's THD zigzag: each document in 2P chunks, rank r holding r and 2P-1-r.
static int per_document(const cpt_audit_layout *lay) {
    return lay->format == CPT_TFORMAT_THD && lay->layout == CTXPAR_LAYOUT_ZIGZAG &&
           lay->cu_seqlens && lay->num_docs > 0 && lay->cu_seqlens_rows == 0;
}

ctxpar_status cpt_audit_positions(const cpt_audit_layout *lay, int64_t seq, int rank,
                                     int64_t *pos_out) {
    if (!per_document(lay))
        return ctxpar_positions_assigned(lay->layout, lay->assignment, seq, rank, lay->ranks,
                                         pos_out);
    const int64_t two_p = 2 * (int64_t)lay->ranks;
    int64_t n = 0;
    for (int64_t d = 0; d < lay->num_docs; d++) {
        int64_t start = lay->cu_seqlens[d], len = lay->cu_seqlens[d + 1] - start;
        if (len % two_p != 0)
            return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG,
                                "document %lld has %lld tokens: THD zigzag over %d ranks splits "
                                "each document into %lld equal chunks",
                                (long long)d, (long long)len, lay->ranks, (long long)two_p);
        int64_t c = len / two_p, chunks[2] = {rank, two_p - 1 - rank};
        for (int k = 0; k < 2; k++)
            for (int64_t i = 0; i < c; i++)
                pos_out[n++] = start + chunks[k] * c + i;
    }
    return n == seq / lay->ranks ? CTXPAR_OK
                                 : CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG,
                                                "the documents hold %lld tokens per rank, not %lld",
                                                (long long)n, (long long)(seq / lay->ranks));
}

ctxpar_status cpt_audit_owners(const cpt_audit_layout *lay, int64_t seq, int *owner) {
    int64_t *pos = malloc((size_t)seq * sizeof *pos + 1);
    if (!pos)
        return CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "cannot allocate positions");
    ctxpar_status st = CTXPAR_OK;
    for (int r = 0; st == CTXPAR_OK && r < lay->ranks; r++) {
        // Shards may be uneven (any seq): each rank's own count.
        int64_t n = per_document(lay) ? seq / lay->ranks : 0;
        if (!per_document(lay))
            st = ctxpar_shard_count(lay->layout, lay->assignment, seq, r, lay->ranks, &n);
        if (st == CTXPAR_OK)
            st = cpt_audit_positions(lay, seq, r, pos);
        for (int64_t i = 0; st == CTXPAR_OK && i < n; i++)
            owner[pos[i]] = r;
    }
    free(pos);
    return st;
}

ctxpar_status cpt_audit_src_open(cpt_audit_src *src, const char *path) {
    memset(src, 0, sizeof *src);
    src->path = path;
    if (strstr(path, "{rank}")) {
        src->kind = CPT_AUDIT_SRC_SHARDS;
        if (!strstr(path, "{name}") && !ends_with(path, ".safetensors"))
            return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG,
                                "%s: a shard pattern needs {name} unless its files are "
                                ".safetensors",
                                path);
    } else if (ends_with(path, ".safetensors")) {
        src->kind = CPT_AUDIT_SRC_SAFETENSORS;
        CTXPAR_CHECK(cpt_st_read(path, &src->st));
    } else if (ends_with(path, ".npy")) {
        src->kind = CPT_AUDIT_SRC_NPY_FILE;
    } else if (file_exists(path)) {
        src->kind = CPT_AUDIT_SRC_TEXT;
    } else {
        struct stat st;
        if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode))
            return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG,
                                "%s: not a folder of .npy files, a .safetensors file or a pattern "
                                "with {rank}",
                                path);
        src->kind = CPT_AUDIT_SRC_NPY_DIR;
    }
    return CTXPAR_OK;
}

void cpt_audit_src_close(cpt_audit_src *src) {
    cpt_st_free(&src->st);
    memset(src, 0, sizeof *src);
}

// The file holding `name` (of `rank`), and whether it is a safetensors file.
static int file_for(const cpt_audit_src *src, const char *name, int rank, char *out, size_t n,
                    int *st) {
    *st = 0;
    switch (src->kind) {
    case CPT_AUDIT_SRC_NPY_DIR:
        return snprintf(out, n, "%s/%s.npy", src->path, name) < (int)n;
    case CPT_AUDIT_SRC_NPY_FILE:
    case CPT_AUDIT_SRC_TEXT:
        return snprintf(out, n, "%s", src->path) < (int)n;
    case CPT_AUDIT_SRC_SAFETENSORS:
        *st = 1;
        return snprintf(out, n, "%s", src->path) < (int)n;
    case CPT_AUDIT_SRC_SHARDS:
        *st = ends_with(src->path, ".safetensors");
        return expand(src->path, name, rank, out, n);
    case CPT_AUDIT_SRC_NONE:
        break;
    }
    return 0;
}

int cpt_audit_src_has(const cpt_audit_src *src, const char *name) {
    char path[4096];
    int st;
    if (src->kind == CPT_AUDIT_SRC_SAFETENSORS)
        return cpt_st_find(&src->st, name) != NULL;
    if (src->kind == CPT_AUDIT_SRC_NONE || !file_for(src, name, 0, path, sizeof path, &st))
        return 0;
    if (!file_exists(path))
        return 0;
    if (!st || strstr(src->path, "{name}"))
        return 1;
    // One safetensors file per rank holding several tensors: look inside.
    cpt_st_file f;
    if (cpt_st_read(path, &f) != CTXPAR_OK)
        return 1; // let the read report what is wrong with it
    int has = cpt_st_find(&f, name) != NULL;
    cpt_st_free(&f);
    return has;
}

static int by_name(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

// Appends "a, b" (sorted) of names[0..count) to buf; what does not fit ends in "...".
static void join_sorted(const char **names, size_t count, char *buf, size_t n) {
    qsort(names, count, sizeof *names, by_name);
    size_t o = 0;
    for (size_t i = 0; i < count && o < n; i++) {
        int w = snprintf(buf + o, n - o, "%s%s", i ? ", " : "", names[i]);
        o += w > 0 ? (size_t)w : 0;
    }
    if (o >= n && n > 4)
        strcpy(buf + n - 4, "...");
}

// The names of the NAME.npy files in a folder (the names malloc'ed into names, at most cap).
static size_t folder_names(const char *dir, char **names, size_t cap) {
    DIR *d = opendir(dir);
    size_t count = 0;
    for (struct dirent *e; d && count < cap && (e = readdir(d));) {
        size_t len = strlen(e->d_name);
        if (len > 4 && ends_with(e->d_name, ".npy") && (names[count] = malloc(len - 3))) {
            memcpy(names[count], e->d_name, len - 4);
            names[count++][len - 4] = '\0';
        }
    }
    if (d)
        closedir(d);
    return count;
}

const char *cpt_audit_src_list(const cpt_audit_src *src, char *buf, size_t n) {
    enum { CAP = 256 };
    const char *names[CAP];
    char *owned[CAP];
    size_t count = 0, n_owned = 0;
    cpt_st_file shard = {0, NULL};
    const cpt_st_file *f = src->kind == CPT_AUDIT_SRC_SAFETENSORS ? &src->st : NULL;
    char path[4096];
    int st;
    // Per-rank .safetensors without {name}: rank 0's file shows what every rank's holds.
    if (src->kind == CPT_AUDIT_SRC_SHARDS && !strstr(src->path, "{name}") &&
        file_for(src, "", 0, path, sizeof path, &st) && cpt_st_read(path, &shard) == CTXPAR_OK)
        f = &shard;
    for (int i = 0; f && i < f->count && count < CAP; i++)
        names[count++] = f->tensors[i].name;
    if (src->kind == CPT_AUDIT_SRC_NPY_DIR)
        n_owned = folder_names(src->path, owned, CAP);
    for (size_t i = 0; i < n_owned; i++)
        names[count++] = owned[i];
    buf[0] = '\0';
    if (count)
        join_sorted(names, count, buf, n);
    else
        snprintf(buf, n, "no tensors");
    for (size_t i = 0; i < n_owned; i++)
        free(owned[i]);
    cpt_st_free(&shard);
    return buf;
}

static ctxpar_status copy_array(const cpt_npy_array *a, cpt_npy_array *out) {
    size_t bytes = a->count * cpt_npy_dtype_size(a->dtype);
    *out = *a;
    out->data = malloc(bytes ? bytes : 1);
    if (!out->data)
        return CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "cannot allocate %zu bytes", bytes);
    memcpy(out->data, a->data, bytes);
    return CTXPAR_OK;
}

static ctxpar_status read_raw(const cpt_audit_src *src, const char *name, int rank,
                              cpt_npy_array *out, char *where, size_t where_len) {
    int st;
    if (!file_for(src, name, rank, where, where_len, &st))
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "%s: path too long", src->path);
    if (!st)
        return src->kind == CPT_AUDIT_SRC_TEXT ? cpt_text_ints_read(where, out)
                                               : cpt_npy_read(where, out);
    const cpt_st_file *f = &src->st;
    cpt_st_file shard = {0, NULL};
    if (src->kind == CPT_AUDIT_SRC_SHARDS) {
        CTXPAR_CHECK(cpt_st_read(where, &shard));
        f = &shard;
    }
    const cpt_npy_array *a = cpt_st_find(f, name);
    ctxpar_status s =
        a ? copy_array(a, out)
          : CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "%s: holds no tensor '%s'", where, name);
    cpt_st_free(&shard);
    return s;
}

// float64 data (NumPy's default) rounded to float32 in place: ctxpar computes in float32 at
// most, and the oracle judges the results at their own dtype on the inputs ctxpar was given.
// Element i's float lands on bytes an earlier double already gave up, so forward order is safe.
static void f64_to_f32(cpt_npy_array *a) {
    if (a->dtype != CPT_NPY_F64)
        return;
    const double *d = (const double *)a->data;
    float *f = (float *)a->data;
    for (size_t i = 0; i < a->count; i++) {
        const double x = d[i];
        f[i] = (float)x;
    }
    a->dtype = CPT_NPY_F32;
    static int said; // once a run
    if (!said) {
        said = 1;
        fprintf(stderr, "note: float64 tensors are read rounded to float32 (ctxpar computes in "
                        "float32 at most); results are judged at their own dtype\n");
    }
}

ctxpar_status cpt_audit_read_raw(const cpt_audit_src *src, const char *name, int rank,
                                 cpt_npy_array *out, char *where, size_t where_len) {
    ctxpar_status s = read_raw(src, name, rank, out, where, where_len);
    if (s == CTXPAR_OK)
        f64_to_f32(out);
    return s;
}

ctxpar_status cpt_audit_read_cu_seqlens(const cpt_audit_src *src, char *where, size_t where_len,
                                        int32_t **cu_out, int64_t *docs_out, int64_t *rows_out) {
    cpt_npy_array c;
    CTXPAR_CHECK(cpt_audit_read_raw(src, "cu_seqlens", 0, &c, where, where_len));
    ctxpar_status st = CTXPAR_OK;
    int32_t *cu = NULL;
    if (c.dtype != CPT_NPY_I32 && c.dtype != CPT_NPY_I64) {
        st =
            CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "%s: cu_seqlens has dtype %s; want int32 or int64",
                         where, cpt_npy_dtype_text(c.dtype));
    } else if (c.ndim < 1 || c.ndim > 2 || c.shape[c.ndim - 1] < 2 || c.shape[0] < 1) {
        st = CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG,
                          "%s: cu_seqlens has %d dimensions and %zu entries; want [documents + 1] "
                          "or [batch, documents + 1] with at least 2 entries a row",
                          where, c.ndim, c.count);
    } else if (!(cu = malloc(c.count * sizeof *cu))) {
        st = CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "%s: cannot allocate %zu entries", where,
                          c.count);
    }
    const size_t row = st == CTXPAR_OK ? (size_t)c.shape[c.ndim - 1] : 1;
    for (size_t j = 0; st == CTXPAR_OK && j < c.count; j++) {
        const size_t i = j % row; // the entry within its row
        int64_t v =
            c.dtype == CPT_NPY_I32 ? ((const int32_t *)c.data)[j] : ((const int64_t *)c.data)[j];
        char at[48] = "";
        if (c.ndim == 2)
            snprintf(at, sizeof at, "[%zu]", j / row);
        if (v < INT32_MIN || v > INT32_MAX)
            st = CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG,
                              "%s: cu_seqlens%s[%zu] = %lld does not fit in int32", where, at,
                              i, (long long)v);
        else if ((i == 0 && v != 0) || (i > 0 && v < cu[j - 1]))
            st = CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG,
                              "%s: cu_seqlens%s[%zu] = %lld; want 0 first, then non-decreasing",
                              where, at, i, (long long)v);
        else
            cu[j] = (int32_t)v;
    }
    if (st == CTXPAR_OK) {
        *cu_out = cu;
        *docs_out = (int64_t)row - 1;
        *rows_out = c.ndim == 2 ? c.shape[0] : 0;
    } else {
        free(cu);
    }
    cpt_npy_free(&c);
    return st;
}

void cpt_audit_tensor_free(cpt_audit_tensor *t) {
    free(t->data);
    memset(t, 0, sizeof *t);
}

const char *cpt_audit_shape_text(int ndim, const int64_t *shape, char *buf, size_t n) {
    size_t off = (size_t)snprintf(buf, n, "(");
    for (int d = 0; d < ndim && off < n; d++)
        off += (size_t)snprintf(buf + off, n - off, "%s%lld", d ? ", " : "", (long long)shape[d]);
    if (off < n)
        snprintf(buf + off, n - off, ndim == 1 ? ",)" : ")");
    return buf;
}

// dims (and for lse B, H, S) of a raw array, checked against the conventions of lay.
static ctxpar_status raw_dims(const cpt_npy_array *a, int lse, const cpt_audit_layout *lay,
                              const char *where, const char *name, int shard, int64_t dims[4]) {
    char sh[160];
    ctxpar_dtype dt;
    if (!cpt_dtype_of_npy(a->dtype, &dt))
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG,
                            "%s: %s has dtype %s; want float32, float16 or bfloat16", where, name,
                            cpt_npy_dtype_text(a->dtype));
    int ok = lse ? cpt_lse_dims(lay->lse_layout, a->ndim, a->shape, &dims[0], &dims[1], &dims[2])
                 : cpt_tformat_dims(lay->format, a->ndim, a->shape, dims);
    if (lse)
        dims[3] = 1;
    static const char *const want_t[4] = {
        "4 dimensions [batch, seq, heads, head_dim]", "4 dimensions [batch, heads, seq, head_dim]",
        "4 dimensions [seq, batch, heads, head_dim]", "3 dimensions [tokens, heads, head_dim]"};
    static const char *const want_l[3] = {"3 dimensions [batch, heads, seq]",
                                          "3 dimensions [batch, seq, heads]",
                                          "2 dimensions [heads, tokens]"};
    if (!ok)
        return CTXPAR_ERROR(
            CTXPAR_ERR_INVALID_ARG, "%s: %s has shape %s; want %s (--%s %s)", where, name,
            cpt_audit_shape_text(a->ndim, a->shape, sh, sizeof sh),
            lse ? want_l[lay->lse_layout] : want_t[lay->format], lse ? "lse-layout" : "format",
            lse ? cpt_lse_layout_names[lay->lse_layout] : cpt_tformat_names[lay->format]);
    for (int d = 0; d < 4; d++) // a shard may hold no token (fewer tokens than ranks)
        if (dims[d] == 0 && !(shard && d == (lse ? 2 : 1)))
            return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "%s: %s has an empty dimension: shape %s",
                                where, name,
                                cpt_audit_shape_text(a->ndim, a->shape, sh, sizeof sh));
    return CTXPAR_OK;
}

// A raw array (dims from raw_dims) into global form at `rows` of dst: all rows when pos is NULL,
// else local row i goes to global row pos[i] (dst has dst_seq rows).
static ctxpar_status place(const cpt_npy_array *a, int lse, const cpt_audit_layout *lay,
                           const int64_t dims[4], const int64_t *pos, int64_t dst_seq, void *dst) {
    if (lse) {
        const int64_t B = dims[0], H = dims[1], S = dims[2];
        float *tmp = pos ? malloc((size_t)(B * H * S) * sizeof *tmp + 1) : dst;
        if (!tmp)
            return CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "cannot allocate a shard's lse");
        cpt_lse_to_bhs(a->data, a->dtype, lay->lse_layout, lay->lse_base2, B, H, S, tmp);
        if (pos) {
            for (int64_t bh = 0; bh < B * H; bh++)
                for (int64_t s = 0; s < S; s++)
                    ((float *)dst)[bh * dst_seq + pos[s]] = tmp[bh * S + s];
            free(tmp);
        }
        return CTXPAR_OK;
    }
    ctxpar_dtype dt;
    cpt_dtype_of_npy(a->dtype, &dt);
    ctxpar_tensor src = cpt_tformat_view(lay->format, a->data, dt, dims);
    int64_t gd[4] = {dims[0], dst_seq, dims[2], dims[3]};
    ctxpar_tensor g = ctxpar_tensor_bshd(dst, dt, gd[0], gd[1], gd[2], gd[3]);
    if (!pos) {
        cpt_tensor_copy(&src, &g);
        return CTXPAR_OK;
    }
    for (int64_t i = 0; i < dims[1]; i++) {
        ctxpar_tensor s1 = src, g1 = g;
        s1.shape[1] = g1.shape[1] = 1;
        s1.data = (char *)src.data + i * src.stride[1] * (int64_t)ctxpar_dtype_size(dt);
        g1.data = (char *)g.data + pos[i] * g.stride[1] * (int64_t)ctxpar_dtype_size(dt);
        cpt_tensor_copy(&s1, &g1);
    }
    return CTXPAR_OK;
}

static ctxpar_status alloc_global(cpt_audit_tensor *out, int lse, cpt_npy_dtype dtype) {
    size_t n = (size_t)(out->dims[0] * out->dims[1] * out->dims[2] * out->dims[3]);
    size_t es = lse ? sizeof(float) : cpt_npy_dtype_size(dtype);
    out->dtype = lse ? CPT_NPY_F32 : dtype;
    out->data = malloc(n * es + 1);
    if (!out->data)
        return CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "%s: cannot allocate %zu elements",
                            out->where, n);
    return CTXPAR_OK;
}

static ctxpar_status read_global(const cpt_audit_src *src, const char *name, int lse,
                                 const cpt_audit_layout *lay, cpt_audit_tensor *out) {
    cpt_npy_array a;
    CTXPAR_CHECK(cpt_audit_read_raw(src, name, 0, &a, out->where, sizeof out->where));
    ctxpar_status st = raw_dims(&a, lse, lay, out->where, name, 0, out->dims);
    if (st == CTXPAR_OK)
        st = alloc_global(out, lse, a.dtype);
    if (st == CTXPAR_OK)
        st = place(&a, lse, lay, out->dims, NULL, lse ? out->dims[2] : out->dims[1], out->data);
    cpt_npy_free(&a);
    return st;
}

// Every rank's shard, checked to fit the layout, placed at the rank's positions. Shards may be
// uneven (any global length): the global length is the sum of the shards' rows, and each rank's
// rows must be what the layout gives it of that length (ctxpar_shard_count).
static ctxpar_status read_shards(const cpt_audit_src *src, const char *name, int lse,
                                 const cpt_audit_layout *lay, cpt_audit_tensor *out) {
    const int P = lay->ranks;
    char where[4096], extra[4096];
    int st_kind;
    if (file_for(src, name, P, extra, sizeof extra, &st_kind) && file_exists(extra) &&
        strstr(src->path, "{rank}"))
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG,
                            "%s: a shard for rank %d exists, but --ranks is %d (shards must be "
                            "one per rank)",
                            extra, P, P);
    cpt_npy_array *arr = calloc((size_t)P, sizeof *arr);
    int64_t(*dims)[4] = calloc((size_t)P, sizeof *dims);
    int64_t *pos = NULL, total = 0;
    const int sd = lse ? 2 : 1; // the sequence's dimension
    ctxpar_status st =
        arr && dims ? CTXPAR_OK : CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "cannot allocate shards");
    snprintf(out->where, sizeof out->where, "%s", src->path);
    for (int r = 0; st == CTXPAR_OK && r < P; r++) {
        if (!file_for(src, name, r, where, sizeof where, &st_kind) || !file_exists(where)) {
            st = CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "%s: rank %d's shard of %s is missing", where,
                              r, name);
            break;
        }
        st = cpt_audit_read_raw(src, name, r, &arr[r], where, sizeof where);
        if (st == CTXPAR_OK)
            st = raw_dims(&arr[r], lse, lay, where, name, 1, dims[r]);
        int same = 1;
        for (int d = 0; d < 4; d++)
            same &= d == sd || dims[r][d] == dims[0][d];
        if (st == CTXPAR_OK && (!same || arr[r].dtype != arr[0].dtype))
            st = CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG,
                              "%s: rank %d's shard of %s (%s, dims [%lld, %lld, %lld, %lld]) does "
                              "not fit rank 0's (%s, [%lld, %lld, %lld, %lld]): only the rows may "
                              "differ",
                              where, r, name, cpt_npy_dtype_text(arr[r].dtype),
                              (long long)dims[r][0], (long long)dims[r][1], (long long)dims[r][2],
                              (long long)dims[r][3], cpt_npy_dtype_text(arr[0].dtype),
                              (long long)dims[0][0], (long long)dims[0][1], (long long)dims[0][2],
                              (long long)dims[0][3]);
        if (st == CTXPAR_OK)
            total += dims[r][sd];
    }
    if (st == CTXPAR_OK) {
        memcpy(out->dims, dims[0], sizeof out->dims);
        out->dims[sd] = total;
        st = alloc_global(out, lse, arr[0].dtype);
    }
    // The assignment gives each token a rank: it must cover exactly the tokens the shards hold.
    if (st == CTXPAR_OK && lay->assignment && lay->assignment_len != total)
        st = CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG,
                          "%s: the %d shards of %s hold %lld tokens, but the assignment (--assign) "
                          "gives ranks to %lld",
                          src->path, P, name, (long long)total, (long long)lay->assignment_len);
    if (st == CTXPAR_OK && !(pos = malloc((size_t)total * sizeof *pos + 1)))
        st = CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "cannot allocate positions");
    // Of the shards whose rows the layout would not give them, the one farthest from the mean
    // is named (the odd one out when the others agree).
    int bad = -1;
    int64_t bad_want = 0;
    double bad_off = -1;
    for (int r = 0; st == CTXPAR_OK && r < P; r++) {
        int64_t want = total / P;
        if (!per_document(lay))
            st = ctxpar_shard_count(lay->layout, lay->assignment, total, r, P, &want);
        const double off = fabs((double)dims[r][sd] - (double)total / P);
        if (st == CTXPAR_OK && want != dims[r][sd] && off > bad_off)
            bad = r, bad_want = want, bad_off = off;
    }
    if (st == CTXPAR_OK && bad >= 0) {
        file_for(src, name, bad, where, sizeof where, &st_kind);
        st = CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG,
                          "%s: rank %d's shard of %s has %lld rows, but the %s layout gives rank "
                          "%d %lld of the %lld tokens the %d shards hold",
                          where, bad, name, (long long)dims[bad][sd],
                          ctxpar_layout_name(lay->layout), bad, (long long)bad_want,
                          (long long)total, P);
    }
    for (int r = 0; st == CTXPAR_OK && r < P; r++) {
        st = cpt_audit_positions(lay, total, r, pos);
        if (st == CTXPAR_OK)
            st = place(&arr[r], lse, lay, dims[r], pos, total, out->data);
    }
    for (int r = 0; arr && r < P; r++)
        cpt_npy_free(&arr[r]);
    free(arr);
    free(dims);
    free(pos);
    return st;
}

ctxpar_status cpt_audit_read(const cpt_audit_src *src, const char *name, int lse,
                                const cpt_audit_layout *lay, cpt_audit_tensor *out) {
    memset(out, 0, sizeof *out);
    ctxpar_status st = src->kind == CPT_AUDIT_SRC_SHARDS ? read_shards(src, name, lse, lay, out)
                                                            : read_global(src, name, lse, lay, out);
    if (st != CTXPAR_OK) {
        free(out->data);
        out->data = NULL;
    }
    return st;
}

/* ---------------------------------------------------------------- writing */

// A global tensor as it is stored: file shape and bytes (malloc'ed) of rows `pos` (all: NULL).
static ctxpar_status to_file(const cpt_audit_tensor *t, int lse, const cpt_audit_layout *lay,
                             const int64_t *pos, int64_t rows, cpt_npy_array *a) {
    memset(a, 0, sizeof *a);
    int64_t d[4] = {t->dims[0], t->dims[1], t->dims[2], t->dims[3]};
    d[lse ? 2 : 1] = rows;
    a->dtype = t->dtype;
    a->ndim = lse ? cpt_lse_shape(lay->lse_layout, d[0], d[1], d[2], a->shape)
                  : cpt_tformat_shape(lay->format, d, a->shape);
    a->count = (size_t)(d[0] * d[1] * d[2] * d[3]);
    a->data = malloc(a->count * cpt_npy_dtype_size(a->dtype) + 1);
    if (!a->data)
        return CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "cannot allocate %zu elements", a->count);
    if (lse) {
        const int64_t BH = d[0] * d[1], S = t->dims[2];
        float *tmp = malloc((size_t)(BH * rows) * sizeof *tmp + 1);
        if (!tmp) {
            cpt_npy_free(a);
            return CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "cannot allocate the lse");
        }
        for (int64_t bh = 0; bh < BH; bh++)
            for (int64_t s = 0; s < rows; s++)
                tmp[bh * rows + s] = ((const float *)t->data)[bh * S + (pos ? pos[s] : s)];
        cpt_lse_from_bhs(tmp, lay->lse_layout, lay->lse_base2, d[0], d[1], rows, a->data);
        free(tmp);
        return CTXPAR_OK;
    }
    ctxpar_dtype dt;
    cpt_dtype_of_npy(t->dtype, &dt);
    size_t es = ctxpar_dtype_size(dt);
    ctxpar_tensor g =
        ctxpar_tensor_bshd(t->data, dt, t->dims[0], t->dims[1], t->dims[2], t->dims[3]);
    ctxpar_tensor f = cpt_tformat_view(lay->format, a->data, dt, d);
    for (int64_t i = 0; i < rows; i++) {
        ctxpar_tensor g1 = g, f1 = f;
        g1.shape[1] = f1.shape[1] = 1;
        g1.data = (char *)g.data + (pos ? pos[i] : i) * g.stride[1] * (int64_t)es;
        f1.data = (char *)f.data + i * f.stride[1] * (int64_t)es;
        cpt_tensor_copy(&g1, &f1);
    }
    return CTXPAR_OK;
}

static const char *base_name(const char *path) {
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

// Writes one file: .safetensors with `count` arrays, else one .npy (count 1).
static ctxpar_status write_file(const char *path, int count, const char *const *names,
                                const cpt_npy_array *arrays) {
    if (!ends_with(path, ".safetensors"))
        return cpt_npy_write(path, arrays[0].dtype, arrays[0].ndim, arrays[0].shape,
                                arrays[0].data);
    cpt_st_tensor t[16];
    for (int i = 0; i < count && i < 16; i++)
        t[i] = (cpt_st_tensor){(char *)names[i], arrays[i]};
    return cpt_st_write(path, count < 16 ? count : 16, t);
}

// The tensors of `rank` (-1: global) into `path_pattern`; one file per name when it has {name}.
static ctxpar_status write_group(const char *pattern, int rank, int count, const char *const *names,
                                 const cpt_audit_tensor *t, const int *lse,
                                 const cpt_audit_layout *lay) {
    cpt_npy_array arrays[16];
    int n = 0;
    ctxpar_status st = CTXPAR_OK;
    int per_name = strstr(pattern, "{name}") != NULL || !ends_with(pattern, ".safetensors");
    int64_t *pos = NULL;
    for (int i = 0; st == CTXPAR_OK && i < count && i < 16; i++) {
        int64_t seq = lse[i] ? t[i].dims[2] : t[i].dims[1], rows = seq;
        if (rank >= 0) {
            rows = seq / lay->ranks;
            if (!per_document(lay)) // any seq: the rank's own count
                st = ctxpar_shard_count(lay->layout, lay->assignment, seq, rank, lay->ranks,
                                        &rows);
            free(pos);
            pos = malloc((size_t)rows * sizeof *pos + 1);
            st = pos ? cpt_audit_positions(lay, seq, rank, pos)
                     : CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "cannot allocate positions");
        }
        if (st == CTXPAR_OK)
            st = to_file(&t[i], lse[i], lay, pos, rows, &arrays[n]);
        if (st != CTXPAR_OK)
            break;
        n++;
        if (per_name) {
            char path[4096];
            if (!expand(pattern, names[i], rank, path, sizeof path))
                st = CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "%s: path too long", pattern);
            else
                st = write_file(path, 1, &names[i], &arrays[n - 1]);
        }
    }
    if (st == CTXPAR_OK && !per_name) {
        char path[4096];
        if (!expand(pattern, "", rank, path, sizeof path))
            st = CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "%s: path too long", pattern);
        else
            st = write_file(path, n, names, arrays);
    }
    for (int i = 0; i < n; i++)
        cpt_npy_free(&arrays[i]);
    free(pos);
    return st;
}

ctxpar_status cpt_audit_write(const cpt_audit_src *like, const char *dir, int count,
                                 const char *const *names, const cpt_audit_tensor *t,
                                 const int *lse, const cpt_audit_layout *lay) {
    if (mkdir(dir, 0777) != 0 && errno != EEXIST)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "%s: cannot create the directory: %s", dir,
                            strerror(errno));
    char pattern[4096];
    const char *file = like->kind == CPT_AUDIT_SRC_SAFETENSORS ? "cpt_results.safetensors"
                       : like->kind == CPT_AUDIT_SRC_SHARDS    ? base_name(like->path)
                                                                  : "{name}.npy";
    if (snprintf(pattern, sizeof pattern, "%s/%s", dir, file) >= (int)sizeof pattern)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "%s: path too long", dir);
    if (like->kind != CPT_AUDIT_SRC_SHARDS)
        return write_group(pattern, -1, count, names, t, lse, lay);
    for (int r = 0; r < lay->ranks; r++)
        CTXPAR_CHECK(write_group(pattern, r, count, names, t, lse, lay));
    return CTXPAR_OK;
}
