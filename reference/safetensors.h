/*
 * safetensors.h - a strict reader and writer for .safetensors files (several named tensors in
 * one file), as the Hugging Face safetensors library writes them.
 *
 * File layout: an 8-byte little-endian header length N, N bytes of JSON (an object: tensor name
 * -> {"dtype", "shape", "data_offsets": [begin, end]}, and an optional "__metadata__" object of
 * strings; writers pad it with spaces), then the data buffer that the offsets index. The JSON is
 * parsed with jansson (duplicate keys rejected). Supported dtypes: F32, F16, BF16, I32, I64,
 * held as cpt_npy_array (the .npy dtypes, so both formats feed the same code).
 * Rejected, with CTXPAR_ERR_INVALID_ARG and a ctxpar_last_error() message naming the file and the
 * problem: a header length past the end of the file or over 100 MB, JSON that does not parse or
 * is not of that shape, unknown dtypes, more than CPT_NPY_MAX_DIMS dimensions, offsets past
 * the end of the data, a size that does not match dtype and shape, overlapping tensors, and bytes
 * of the buffer that no tensor covers (the format forbids holes). A length is never trusted
 * before it is checked against the bytes that are there.
 */
#ifndef CPT_TESTING_SAFETENSORS_H
#define CPT_TESTING_SAFETENSORS_H

#include <stddef.h>

#include "ctxpar.h"
#include "reference/npy.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One named tensor. Read: name and array.data owned by the file. Write: both borrowed. */
typedef struct cpt_st_tensor {
    char *name;
    cpt_npy_array array;
} cpt_st_tensor;

/* The tensors of a file, in the order of their data in the buffer. */
typedef struct cpt_st_file {
    int count;
    cpt_st_tensor *tensors;
} cpt_st_file;

/* "F32", "F16", "BF16", "I32", "I64"; "?" for a dtype safetensors cannot hold here. */
const char *cpt_st_dtype_name(cpt_npy_dtype dtype);

/* Reads `path`. On failure *file_out is untouched. Free with cpt_st_free. */
ctxpar_status cpt_st_read(const char *path, cpt_st_file *file_out);

/* The same from a file image in memory (fuzzing, tests); `name` in messages (NULL: "<memory>"). */
ctxpar_status cpt_st_read_mem(const void *bytes, size_t size, const char *name,
                                 cpt_st_file *file_out);

/* The tensor called `name`, or NULL. */
const cpt_npy_array *cpt_st_find(const cpt_st_file *file, const char *name);

/* Frees what a read allocated and zeroes the struct; NULL or a freed file is a no-op. */
void cpt_st_free(cpt_st_file *file);

/* Writes `count` tensors (distinct names) to `path`, data in the order given, the header padded
 * with spaces to a multiple of 8 bytes. On failure the file is removed. */
ctxpar_status cpt_st_write(const char *path, int count, const cpt_st_tensor *tensors);

/* The same file image in memory: *bytes_out (malloc'ed, caller frees) of *size_out bytes. */
ctxpar_status cpt_st_write_mem(int count, const cpt_st_tensor *tensors, void **bytes_out,
                                  size_t *size_out);

#ifdef __cplusplus
}
#endif

#endif /* CPT_TESTING_SAFETENSORS_H */
