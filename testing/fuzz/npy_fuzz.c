/*
 * npy_fuzz.c - libFuzzer target: the .npy reader on arbitrary bytes.
 *
 * Besides "no crash, no ASan/UBSan report, no leak": a read that succeeds gives an array whose
 * count is the product of its shape and whose data is set; writing it back and reading that
 * again gives the same array (dtype, shape, bytes); a read that fails says why and leaves the
 * output untouched.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "reference/npy.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void fail(const char *what) {
    fprintf(stderr, "npy_fuzz: %s\n", what);
    abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    cpt_npy_array a, untouched;
    memset(&a, 0xa5, sizeof a);
    untouched = a;
    if (cpt_npy_read_mem(data, size, "fuzz", &a) != CTXPAR_OK) {
        if (memcmp(&a, &untouched, sizeof a) != 0)
            fail("a failed read wrote its output");
        if (ctxpar_last_error()[0] == '\0')
            fail("a failed read left no message");
        return 0;
    }
    if (!a.data || a.ndim < 0 || a.ndim > CPT_NPY_MAX_DIMS)
        fail("a successful read gave no data or a bad ndim");
    size_t count = 1;
    for (int i = 0; i < a.ndim; i++)
        count *= (size_t)a.shape[i];
    if (count != a.count)
        fail("count is not the product of the shape");

    void *bytes = NULL;
    size_t n = 0;
    cpt_npy_array b;
    if (cpt_npy_write_mem(a.dtype, a.ndim, a.shape, a.data, &bytes, &n) != CTXPAR_OK)
        fail("an array that was read cannot be written back");
    if (cpt_npy_read_mem(bytes, n, "rewritten", &b) != CTXPAR_OK)
        fail("a written array cannot be read back");
    if (!cpt_npy_same(&a, &b))
        fail("write then read changed the array");
    free(bytes);
    cpt_npy_free(&b);
    cpt_npy_free(&a);
    return 0;
}
