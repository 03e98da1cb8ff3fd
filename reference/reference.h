/*
 * reference.h - the fast float64 reference: attention, its gradients and the magnitudes of the
 * per-element bound (tolerance.h) in one blocked, threaded computation whose matrix products go
 * through BLAS (OpenBLAS dgemm).
 *
 * The same inputs, conventions and features as the plain oracle (oracle.h: dense BSHD doubles,
 * positions, the mask and cpt_oracle_features, documents per batch row included), which stays
 * this reference's own oracle in tests. It shares no code with the library, nor with oracle.c:
 * its mask predicate is written again here. Optionally it computes only chosen query rows and key
 * rows (sampling a long sequence): the forward of N query rows costs O(N S); dK and dV of N key
 * rows need every query row's lse and delta, so a backward with a selection also runs the
 * forward (and the bound's forward magnitudes) of every row once.
 *
 * Results do not depend on the number of OpenMP threads: every output element is summed by one
 * work item in a fixed order. BLAS runs single-threaded inside the reference's own threads.
 */
#ifndef CPT_TESTING_REFERENCE_H
#define CPT_TESTING_REFERENCE_H

#include <stdint.h>

#include "ctxpar.h"
#include "ctxpar_backend.h"
#include "reference/oracle.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Which rows to compute: sorted, distinct indices. NULL rows: every row (n ignored). */
typedef struct cpt_ref_select {
    const int64_t *q_rows; /* query rows for out, lse, dq (and their magnitudes) */
    int64_t n_q;
    const int64_t *k_rows; /* key rows for dk, dv (and their magnitudes) */
    int64_t n_k;
} cpt_ref_select;

/* Results, each NULL when not wanted (t[2..4], dsinks: only with dout). Query-row tensors hold
 * the selected rows in selection order: out [B, n_q, Hq, Dv], lse [B, Hq, n_q], dq
 * [B, n_q, Hq, D]; key-row tensors dk [B, n_k, Hkv, D], dv [B, n_k, Hkv, Dv] (n = S without a
 * selection). mag / mag16: the bound's M and M16 of the same elements (tolerance.h; M16 is
 * summed only when mag16[0] is given); dsinks, mdsinks, mdsinks16 [Hq] (over every row,
 * selection or not; zeros without sinks; mdsinks16 NaN without mag16[0]). */
typedef struct cpt_ref_out {
    double *t[5]; /* out, lse, dq, dk, dv */
    double *mag[5];
    double *mag16[5];
    double *dsinks, *mdsinks, *mdsinks16;
} cpt_ref_out;

/* Progress: done of total work items, from one thread at a time (may be NULL). */
typedef struct cpt_ref_progress {
    void (*report)(void *user, int64_t done, int64_t total);
    void *user;
} cpt_ref_progress;

/* Computes what `o` asks for. dout NULL: forward only. sel NULL: every row. On a bad argument or
 * a failed allocation returns the error (ctxpar_last_error() says why) and fills every wanted
 * output with NaN, so that no comparison against it can pass. */
ctxpar_status cpt_reference(const cpt_oracle_shape *shape, const double *q, const double *k,
                            const double *v, const double *dout, const int64_t *q_pos,
                            const int64_t *k_pos, const ctxpar_mask_desc *mask,
                            const cpt_oracle_features *features, double scale,
                            const cpt_ref_select *sel, const cpt_ref_progress *progress,
                            cpt_ref_out *o);

#ifdef __cplusplus
}
#endif

#endif /* CPT_TESTING_REFERENCE_H */
