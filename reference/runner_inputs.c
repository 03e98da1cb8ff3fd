// Where a run's inputs come from: the counter-based generator, or global arrays the caller gave
// (ctxpar audit). Both the ranks' shards and the oracle's global copy are made here, so that the
// two can never disagree about what the library was given.
#include <stdlib.h>

#include "ctxpar_backend.h"
#include "data.h"
#include "runner_internal.h"

int64_t cpt_run_dim_v(const cpt_run_config *cfg) {
    return cfg->head_dim_v > 0 ? cfg->head_dim_v : cfg->head_dim;
}

int64_t cpt_run_input_dim(const cpt_run_config *cfg, int id) {
    return id == CPT_RUN_ID_V || id == CPT_RUN_ID_DOUT ? cpt_run_dim_v(cfg) : cfg->head_dim;
}

// The caller's global array of input `id` as a tensor view, or data NULL when absent.
static ctxpar_tensor input_view(const cpt_run_config *cfg, int id) {
    const cpt_run_inputs *in = cfg->inputs;
    const void *p = id == CPT_RUN_ID_Q   ? in->q
                    : id == CPT_RUN_ID_K ? in->k
                    : id == CPT_RUN_ID_V ? in->v
                                         : in->dout;
    int64_t heads = id == CPT_RUN_ID_K || id == CPT_RUN_ID_V ? cfg->kv_heads : cfg->heads;
    // The view is only read (ctxpar_shard, cpt_test_to_f64 take it const).
    return ctxpar_tensor_bshd((void *)p, cfg->dtype, cfg->batch, cfg->seq, heads,
                              cpt_run_input_dim(cfg, id));
}

int64_t cpt_run_local_seq(const cpt_run_config *cfg, int rank, int nranks) {
    int64_t n = -1;
    if (ctxpar_shard_count(cfg->params.layout, cfg->params.assignment, cfg->seq, rank, nranks,
                           &n) != CTXPAR_OK)
        return -1;
    return n;
}

ctxpar_status cpt_run_fill_local(const cpt_run_config *cfg, int id, int rank, int nranks,
                                 const int64_t *pos, ctxpar_tensor *local) {
    if (!cfg->inputs) {
        cpt_test_fill(local, cfg->seed, (uint64_t)id, cfg->seq, pos);
        return CTXPAR_OK;
    }
    ctxpar_tensor g = input_view(cfg, id);
    return ctxpar_shard_assigned(cfg->params.layout, cfg->params.assignment, rank, nranks, &g,
                                 local);
}

void cpt_run_fill_global_f64(const cpt_run_config *cfg, int id, double *dst) {
    if (!cfg->inputs) {
        int64_t heads =
            id == CPT_RUN_ID_K || id == CPT_RUN_ID_V ? cfg->kv_heads : cfg->heads;
        cpt_test_fill_global_f64(dst, cfg->dtype, cfg->seed, (uint64_t)id, cfg->batch,
                                    cfg->seq, heads, cpt_run_input_dim(cfg, id));
        return;
    }
    ctxpar_tensor g = input_view(cfg, id);
    cpt_test_to_f64(&g, dst);
}

// Weights in [0.25, 1.75).
static double uniform_weight(uint64_t seed, int64_t i, void *user) {
    (void)user;
    return 1.0 + 0.75 * cpt_test_value(seed, 99, (uint64_t)i);
}

ctxpar_status cpt_run_docs(uint64_t seed, int64_t seq, int64_t docs, int32_t *cu_out) {
    return cpt_run_docs_with(seed, seq, docs, uniform_weight, NULL, cu_out);
}

ctxpar_status cpt_run_docs_with(uint64_t seed, int64_t seq, int64_t docs,
                                double (*weight)(uint64_t seed, int64_t i, void *user), void *user,
                                int32_t *cu_out) {
    if (docs < 1 || docs > seq || seq > INT32_MAX)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "docs (%lld) must be in [1, seq (%lld)]",
                            (long long)docs, (long long)seq);
    double *w = malloc((size_t)docs * sizeof *w);
    if (!w)
        return CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "no memory for %lld documents",
                            (long long)docs);
    for (int64_t i = 0; i < docs; i++)
        w[i] = weight(seed, i, user);
    // Boundaries at the weights' running sums, scaled to seq, then kept strictly increasing
    // with room for the documents still to come.
    double total = 0;
    for (int64_t i = 0; i < docs; i++)
        total += w[i];
    double acc = 0;
    cu_out[0] = 0;
    for (int64_t i = 1; i <= docs; i++) {
        acc += w[i - 1];
        int64_t b = (int64_t)(acc / total * (double)seq + 0.5);
        int64_t lo = cu_out[i - 1] + 1, hi = seq - (docs - i);
        cu_out[i] = (int32_t)(b < lo ? lo : b > hi ? hi : b);
    }
    cu_out[docs] = (int32_t)seq;
    free(w);
    return CTXPAR_OK;
}

ctxpar_status cpt_run_resolve_docs(const cpt_run_config *cfg, cpt_run_config *copy_out,
                                   int32_t **cu_out) {
    *copy_out = *cfg;
    *cu_out = NULL;
    // Shards may be uneven: every rank is told the total (params.seq_len_global).
    if (copy_out->params.seq_len_global == 0)
        copy_out->params.seq_len_global = cfg->seq;
    if (cfg->docs <= 0 || cfg->params.cu_seqlens)
        return CTXPAR_OK;
    if (cfg->docs > cfg->seq)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "docs (%lld) must be in [1, seq (%lld)]",
                            (long long)cfg->docs, (long long)cfg->seq);
    int32_t *cu = malloc((size_t)(cfg->docs + 1) * sizeof *cu);
    if (!cu)
        return CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY, "cannot allocate %lld document bounds",
                            (long long)cfg->docs);
    ctxpar_status st = cpt_run_docs(cfg->seed, cfg->seq, cfg->docs, cu);
    if (st != CTXPAR_OK) {
        free(cu);
        return st;
    }
    copy_out->params.cu_seqlens = cu;
    copy_out->params.num_docs = cfg->docs;
    *cu_out = cu;
    return CTXPAR_OK;
}
