// The public layout helpers: counts, positions, shard and unshard of host tensors.
#include <string.h>

#include "algorithms.h"
#include "validate.h"

static ctxpar_status check_ranks(int rank, int nranks) {
    if (nranks < 1 || rank < 0 || rank >= nranks)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "rank (%d) must be in [0, nranks = %d)", rank,
                            nranks);
    return CTXPAR_OK;
}

// The layout, the ranks, the length and (CUSTOM) the assignment, as the helpers take them.
static ctxpar_status check_layout(ctxpar_layout layout, const int32_t *assignment,
                                  int64_t seq_global, int rank, int nranks) {
    if ((unsigned)layout > CTXPAR_LAYOUT_CUSTOM)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "layout (%d) is not a ctxpar_layout",
                            (int)layout);
    CTXPAR_CHECK(check_ranks(rank, nranks));
    if (seq_global < 1)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "seq_global (%lld) must be >= 1",
                            (long long)seq_global);
    return ctxpar_validate_assignment("assignment", layout, assignment, seq_global, nranks);
}

ctxpar_status ctxpar_shard_count(ctxpar_layout layout, const int32_t *assignment,
                                 int64_t seq_global, int rank, int nranks, int64_t *count_out) {
    ctxpar_clear_error();
    CTXPAR_CHECK(check_layout(layout, assignment, seq_global, rank, nranks));
    if (!count_out)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "count_out is NULL");
    *count_out = ctxpar_layout_count(layout, assignment, seq_global, rank, nranks);
    return CTXPAR_OK;
}

ctxpar_status ctxpar_positions_assigned(ctxpar_layout layout, const int32_t *assignment,
                                        int64_t seq_global, int rank, int nranks,
                                        int64_t *pos_out) {
    ctxpar_clear_error();
    CTXPAR_CHECK(check_layout(layout, assignment, seq_global, rank, nranks));
    if (!pos_out)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "pos_out is NULL");
    ctxpar_layout_map m;
    CTXPAR_CHECK(ctxpar_layout_map_make(layout, assignment, seq_global, nranks, &m));
    ctxpar_spans s = ctxpar_layout_map_spans(&m, rank);
    int64_t n = 0;
    for (int i = 0; i < s.count; i++)
        for (int64_t j = 0; j < s.span[i].len; j++)
            pos_out[n++] = s.span[i].start + j * s.span[i].stride;
    ctxpar_layout_map_free(&m);
    return CTXPAR_OK;
}

ctxpar_status ctxpar_positions(ctxpar_layout layout, int64_t seq_global, int rank, int nranks,
                               int64_t *pos_out) {
    return ctxpar_positions_assigned(layout, NULL, seq_global, rank, nranks, pos_out);
}

// Copies rows between a local tensor and the global one: to_global selects the direction.
static ctxpar_status copy_rows(ctxpar_layout layout, const int32_t *assignment, int rank,
                               int nranks, const ctxpar_tensor *local,
                               const ctxpar_tensor *global, int to_global) {
    CTXPAR_CHECK(ctxpar_validate_tensor("global", global));
    CTXPAR_CHECK(check_layout(layout, assignment, global->shape[1], rank, nranks));
    CTXPAR_CHECK(ctxpar_validate_shard_tensor("local", local));
    if (local->dtype != global->dtype)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "local.dtype (%s) != global.dtype (%s)",
                            ctxpar_dtype_name(local->dtype), ctxpar_dtype_name(global->dtype));
    int64_t count = ctxpar_layout_count(layout, assignment, global->shape[1], rank, nranks);
    int64_t want[4] = {global->shape[0], count, global->shape[2], global->shape[3]};
    for (int d = 0; d < 4; d++)
        if (local->shape[d] != want[d])
            return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG,
                                "local.shape[%d] (%lld) != %lld (global shape with seq = rank "
                                "%d's count of %d ranks)",
                                d, (long long)local->shape[d], (long long)want[d], rank, nranks);
    ctxpar_layout_map m;
    CTXPAR_CHECK(ctxpar_layout_map_make(layout, assignment, global->shape[1], nranks, &m));
    ctxpar_spans s = ctxpar_layout_map_spans(&m, rank);
    size_t es = ctxpar_dtype_size(global->dtype), row = (size_t)global->shape[3] * es;
    int64_t first = 0;
    for (int i = 0; i < s.count; i++) {
        ctxpar_tensor l = ctxpar_tensor_rows(local, first, s.span[i].len);
        ctxpar_tensor g = ctxpar_tensor_span(global, &s.span[i]);
        for (int64_t b = 0; b < l.shape[0]; b++)
            for (int64_t t = 0; t < l.shape[1]; t++)
                for (int64_t h = 0; h < l.shape[2]; h++) {
                    char *lp = (char *)l.data + (size_t)(b * l.stride[0] + t * l.stride[1] +
                                                         h * l.stride[2]) * es;
                    char *gp = (char *)g.data + (size_t)(b * g.stride[0] + t * g.stride[1] +
                                                         h * g.stride[2]) * es;
                    if (to_global)
                        memcpy(gp, lp, row);
                    else
                        memcpy(lp, gp, row);
                }
        first += s.span[i].len;
    }
    ctxpar_layout_map_free(&m);
    return CTXPAR_OK;
}

ctxpar_status ctxpar_shard_assigned(ctxpar_layout layout, const int32_t *assignment, int rank,
                                    int nranks, const ctxpar_tensor *global,
                                    ctxpar_tensor *local_out) {
    ctxpar_clear_error();
    return copy_rows(layout, assignment, rank, nranks, local_out, global, 0);
}

ctxpar_status ctxpar_unshard_assigned(ctxpar_layout layout, const int32_t *assignment, int rank,
                                      int nranks, const ctxpar_tensor *local,
                                      ctxpar_tensor *global_out) {
    ctxpar_clear_error();
    return copy_rows(layout, assignment, rank, nranks, local, global_out, 1);
}

ctxpar_status ctxpar_shard(ctxpar_layout layout, int rank, int nranks,
                           const ctxpar_tensor *global, ctxpar_tensor *local_out) {
    return ctxpar_shard_assigned(layout, NULL, rank, nranks, global, local_out);
}

ctxpar_status ctxpar_unshard(ctxpar_layout layout, int rank, int nranks,
                             const ctxpar_tensor *local, ctxpar_tensor *global_out) {
    return ctxpar_unshard_assigned(layout, NULL, rank, nranks, local, global_out);
}
