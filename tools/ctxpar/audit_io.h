/*
 * audit_io.h - the tensors of `ctxpar audit`, read from and written to the files users have:
 * a folder of .npy files (NAME.npy), one .safetensors file (tensors by NAME), or per-rank shards
 * (a pattern with {rank} and optionally {name}, each file .npy or .safetensors), in any order of
 * tensor_format.h. Everything is brought to one global form: dense [B, S, H, D] in the file's
 * dtype, and LSE as float [B, H, S] in natural log. Shards are placed by the layout's positions.
 *
 * Every failure is CTXPAR_ERR_INVALID_ARG (or OUT_OF_MEMORY) with a ctxpar_last_error() message
 * that names the file (and the rank for a shard) and the problem.
 */
#ifndef CPT_TOOL_AUDIT_IO_H
#define CPT_TOOL_AUDIT_IO_H

#include <stddef.h>

#include "ctxpar.h"
#include "reference/npy.h"
#include "reference/safetensors.h"
#include "reference/tensor_format.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum cpt_audit_src_kind {
    CPT_AUDIT_SRC_NONE = 0,
    CPT_AUDIT_SRC_NPY_DIR = 1,     /* path/NAME.npy */
    CPT_AUDIT_SRC_SAFETENSORS = 2, /* one file, tensors by name */
    CPT_AUDIT_SRC_NPY_FILE = 3,    /* one .npy file for one tensor (--q Q.npy) */
    CPT_AUDIT_SRC_SHARDS = 4,      /* pattern with {rank} (and {name}) */
    CPT_AUDIT_SRC_TEXT = 5, /* any other file: integers as text (--cu-seqlens, text_ints.h) */
} cpt_audit_src_kind;

typedef struct cpt_audit_src {
    cpt_audit_src_kind kind;
    const char *path;  /* folder, file or pattern (borrowed) */
    cpt_st_file st; /* SAFETENSORS: read once at open */
} cpt_audit_src;

/* How the files are laid out, and how shards map to global positions. With format thd, layout
 * zigzag and documents, every document is split into 2 x ranks chunks on its own, rank r holding
 * chunks r and 2 x ranks - 1 - r of each (TransformerEngine's THD DualChunkSwap); otherwise the
 * layout is ctxpar's over the whole sequence. */
typedef struct cpt_audit_layout {
    cpt_tformat format;
    cpt_lse_layout lse_layout;
    int lse_base2;
    int ranks;
    ctxpar_layout layout;
    const int32_t *cu_seqlens; /* NULL: one sequence */
    int64_t num_docs;
    const int32_t *assignment; /* --layout custom's (--assign) */
    int64_t cu_seqlens_rows;   /* > 0: cu_seqlens is [rows, num_docs + 1], one row per batch row */
    int64_t assignment_len;    /* the tokens assignment covers: the global length it fits */
} cpt_audit_layout;

/* The seq / ranks global positions rank `rank` holds, in its local order. */
ctxpar_status cpt_audit_positions(const cpt_audit_layout *lay, int64_t seq, int rank,
                                     int64_t *pos_out);

/* owner[s] for s in [0, seq): the rank holding position s. */
ctxpar_status cpt_audit_owners(const cpt_audit_layout *lay, int64_t seq, int *owner);

/* A tensor in global form. lse: dims = {B, H, S, 1}, data float natural log. */
typedef struct cpt_audit_tensor {
    cpt_npy_dtype dtype; /* as stored (lse: float after loading) */
    int64_t dims[4];
    void *data;      /* NULL: absent */
    char where[512]; /* the file (or shard pattern) it came from, for messages */
} cpt_audit_tensor;

/* Opens a source: a pattern with "{rank}" is SHARDS; a path ending in .safetensors is read now;
 * one ending in .npy is NPY_FILE; another file is TEXT; anything else is a folder. */
ctxpar_status cpt_audit_src_open(cpt_audit_src *src, const char *path);
void cpt_audit_src_close(cpt_audit_src *src);

/* Whether the source holds tensor `name` (SHARDS: rank 0's file for it exists). */
int cpt_audit_src_has(const cpt_audit_src *src, const char *name);

/* What the source holds, for messages: "dout, k, q" (sorted; a folder's NAME.npy files, a
 * .safetensors file's tensors, rank 0's file of per-rank .safetensors), or "no tensors" (also
 * for a pattern with {name}, whose files are looked for one name at a time). Returns buf. */
const char *cpt_audit_src_list(const cpt_audit_src *src, char *buf, size_t n);

/* Reads tensor `name` in global form. `lse` selects the LSE conventions of lay; otherwise the
 * tensor must be F32, F16 or BF16 in lay->format. cu_seqlens-like 1-D integer tensors: use
 * cpt_audit_read_raw. */
ctxpar_status cpt_audit_read(const cpt_audit_src *src, const char *name, int lse,
                                const cpt_audit_layout *lay, cpt_audit_tensor *out);

/* The array `name` as stored (of `rank` for SHARDS); its file in where. */
ctxpar_status cpt_audit_read_raw(const cpt_audit_src *src, const char *name, int rank,
                                    cpt_npy_array *out, char *where, size_t where_len);

/* cu_seqlens from src: int32 or int64 [docs + 1], or [B, docs + 1] (each batch row its own
 * documents; *rows_out = B, else 0), each row 0 first and non-decreasing, every entry in int32.
 * *cu_out is malloc'ed (the caller frees it); where its end is checked against the sequence
 * (and B against the batch) is the caller's. */
ctxpar_status cpt_audit_read_cu_seqlens(const cpt_audit_src *src, char *where, size_t where_len,
                                        int32_t **cu_out, int64_t *docs_out, int64_t *rows_out);

void cpt_audit_tensor_free(cpt_audit_tensor *t);

/* "(1, 4096, 8, 64)" ("(3,)" for one dimension) into buf. */
const char *cpt_audit_shape_text(int ndim, const int64_t *shape, char *buf, size_t n);

/* Writes tensors in global form (names[i], t[i]; lse[i] set for an LSE) the way `like` stores
 * its tensors: NPY_DIR/NPY_FILE -> dir/NAME.npy; SAFETENSORS -> dir/cpt_results.safetensors;
 * SHARDS -> dir/<like's pattern's file part> per rank. `dir` is created if needed. */
ctxpar_status cpt_audit_write(const cpt_audit_src *like, const char *dir, int count,
                                 const char *const *names, const cpt_audit_tensor *t,
                                 const int *lse, const cpt_audit_layout *lay);

#ifdef __cplusplus
}
#endif

#endif /* CPT_TOOL_AUDIT_IO_H */
