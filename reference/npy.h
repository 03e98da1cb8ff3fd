/*
 * npy.h - a small, strict reader and writer for NumPy .npy files.
 *
 * Formats 1.0 and 2.0. Header: a Python dict literal with exactly the keys 'descr',
 * 'fortran_order' and 'shape'. Supported dtypes: little-endian '<f4', '<f2', '<i4', '<i8', and
 * bfloat16 as ml_dtypes saves it: '<V2' (NumPy has no bfloat16; ml_dtypes' type is stored as a
 * 2-byte void, which no other common type is; '|V2' is read too). The host must be
 * little-endian: data is copied as is. Rejected, with CTXPAR_ERR_INVALID_ARG
 * and a ctxpar_last_error() message naming the file and the problem: bad magic, other versions,
 * truncated header or data, bytes after the data, malformed or duplicate or missing keys,
 * big-endian or other dtypes, fortran_order True, negative dimensions, more than
 * CPT_NPY_MAX_DIMS dimensions, sizes that overflow. A read never trusts a length before
 * checking it against the bytes that are there.
 */
#ifndef CPT_TESTING_NPY_H
#define CPT_TESTING_NPY_H

#include <stddef.h>
#include <stdint.h>

#include "ctxpar.h"

#ifdef __cplusplus
extern "C" {
#endif

#define CPT_NPY_MAX_DIMS 8

typedef enum cpt_npy_dtype {
    CPT_NPY_F32 = 0,  /* '<f4' */
    CPT_NPY_F16 = 1,  /* '<f2' (IEEE half, as uint16_t bits) */
    CPT_NPY_I32 = 2,  /* '<i4' */
    CPT_NPY_I64 = 3,  /* '<i8' */
    CPT_NPY_BF16 = 4, /* '<V2' (bfloat16 bits as uint16_t, as ml_dtypes writes them) */
    CPT_NPY_F64 = 5,  /* '<f8' (read; the audit rounds it to float32: cpt_audit_read_raw) */
} cpt_npy_dtype;

/* Bytes per element (0 for an unknown dtype) and the 'descr' string ("<f4"; "?" if unknown). */
size_t cpt_npy_dtype_size(cpt_npy_dtype dtype);
const char *cpt_npy_dtype_descr(cpt_npy_dtype dtype);
/* "float32", "float16", "bfloat16", "int32", "int64" ("?" if unknown), for messages. */
const char *cpt_npy_dtype_text(cpt_npy_dtype dtype);

/* An array read from a file: C order, `count` elements of `dtype` in `data` (malloc'ed, owned by
 * the struct; never NULL after a successful read, even for zero elements). ndim 0 is a scalar
 * (count 1). */
typedef struct cpt_npy_array {
    cpt_npy_dtype dtype;
    int ndim;
    int64_t shape[CPT_NPY_MAX_DIMS];
    size_t count;
    void *data;
} cpt_npy_array;

/* Reads `path`. On failure *array_out is untouched. Free with cpt_npy_free. */
ctxpar_status cpt_npy_read(const char *path, cpt_npy_array *array_out);

/* Parses a whole .npy file held in memory (for fuzzing and tests); `name` is used in messages
 * (NULL: "<memory>"). The data is copied: bytes may be freed afterwards. */
ctxpar_status cpt_npy_read_mem(const void *bytes, size_t size, const char *name,
                                  cpt_npy_array *array_out);

/* Frees array->data and zeroes the struct; NULL or an already freed array is a no-op. */
void cpt_npy_free(cpt_npy_array *array);

/* 1 when a and b have the same dtype, shape and element bytes. */
int cpt_npy_same(const cpt_npy_array *a, const cpt_npy_array *b);

/* Writes a C-order array of `ndim` (0..CPT_NPY_MAX_DIMS) dimensions to `path`, format 1.0
 * (2.0 when the header does not fit in 65535 bytes), header padded with spaces so that the data
 * starts at a multiple of 64 bytes, as NumPy does. data may be NULL only when the array is
 * empty. On failure the file is removed. */
ctxpar_status cpt_npy_write(const char *path, cpt_npy_dtype dtype, int ndim,
                               const int64_t *shape, const void *data);

/* The same file image in memory: *bytes_out (malloc'ed, caller frees) of *size_out bytes. */
ctxpar_status cpt_npy_write_mem(cpt_npy_dtype dtype, int ndim, const int64_t *shape,
                                   const void *data, void **bytes_out, size_t *size_out);

#ifdef __cplusplus
}
#endif

#endif /* CPT_TESTING_NPY_H */
