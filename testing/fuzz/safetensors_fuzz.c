/*
 * safetensors_fuzz.c - libFuzzer target: the .safetensors reader on arbitrary bytes.
 *
 * Besides "no crash, no ASan/UBSan report, no leak": a read that succeeds gives tensors whose
 * counts are the products of their shapes, with names and data set; writing them back and
 * reading that again gives the same tensors (names, dtypes, shapes, bytes); a read that fails
 * says why and leaves the output untouched.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "reference/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void fail(const char *what) {
    fprintf(stderr, "safetensors_fuzz: %s\n", what);
    abort();
}

static int same_tensor(const cpt_st_tensor *x, const cpt_st_tensor *y) {
    return strcmp(x->name, y->name) == 0 && cpt_npy_same(&x->array, &y->array);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    cpt_st_file f, untouched;
    memset(&f, 0xa5, sizeof f);
    untouched = f;
    if (cpt_st_read_mem(data, size, "fuzz", &f) != CTXPAR_OK) {
        if (memcmp(&f, &untouched, sizeof f) != 0)
            fail("a failed read wrote its output");
        if (ctxpar_last_error()[0] == '\0')
            fail("a failed read left no message");
        return 0;
    }
    for (int i = 0; i < f.count; i++) {
        const cpt_npy_array *a = &f.tensors[i].array;
        if (!f.tensors[i].name || !a->data || a->ndim < 0 || a->ndim > CPT_NPY_MAX_DIMS)
            fail("a successful read gave no name, no data or a bad ndim");
        size_t count = 1;
        for (int d = 0; d < a->ndim; d++)
            count *= (size_t)a->shape[d];
        if (count != a->count)
            fail("count is not the product of the shape");
    }
    void *bytes = NULL;
    size_t n = 0;
    cpt_st_file g;
    if (cpt_st_write_mem(f.count, f.tensors, &bytes, &n) != CTXPAR_OK)
        fail("tensors that were read cannot be written back");
    if (cpt_st_read_mem(bytes, n, "rewritten", &g) != CTXPAR_OK)
        fail("a written file cannot be read back");
    if (g.count != f.count)
        fail("write then read changed the number of tensors");
    for (int i = 0; i < f.count; i++)
        if (!same_tensor(&f.tensors[i], &g.tensors[i]))
            fail("write then read changed a tensor");
    free(bytes);
    cpt_st_free(&g);
    cpt_st_free(&f);
    return 0;
}
