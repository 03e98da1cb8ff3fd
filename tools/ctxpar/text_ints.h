/*
 * text_ints.h - a text file of integers as an array, for the options whose value is a short list
 * (--cu-seqlens): numbers separated by blanks, commas and newlines, one row per line when the
 * lines hold the same several numbers each.
 */
#ifndef CPT_TOOL_TEXT_INTS_H
#define CPT_TOOL_TEXT_INTS_H

#include "ctxpar.h"
#include "reference/npy.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Reads `path` into *out as int64: [lines, n] when its non-empty lines (two or more) hold n > 1
 * numbers each, else [count] (one list). Free with cpt_npy_free. On failure (INVALID_ARG: not an
 * integer, no number; OUT_OF_MEMORY) *out is untouched and the message names the file (and the
 * line). */
ctxpar_status cpt_text_ints_read(const char *path, cpt_npy_array *out);

#ifdef __cplusplus
}
#endif

#endif /* CPT_TOOL_TEXT_INTS_H */
