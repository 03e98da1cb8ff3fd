// Which rows a sampled check judges (cfg->rows): every boundary a distributed run can get wrong
// first, then uniform random rows.
#include <stdlib.h>
#include <string.h>

#include "ctxpar_backend.h"
#include "data.h"
#include "runner_internal.h"

// Marks the first and last position of rank r's shard and of every run of consecutive positions
// in it (a layout chunk: zigzag's two, striped's single tokens, a custom assignment's runs).
static ctxpar_status mark_rank(const cpt_run_config *cfg, int r, int64_t *pos, uint8_t *mark) {
    const int64_t n = cpt_run_local_seq(cfg, r, cfg->ranks);
    if (n < 0)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "seq %lld cannot be sharded",
                            (long long)cfg->seq);
    CTXPAR_CHECK(ctxpar_positions_assigned(cfg->params.layout, cfg->params.assignment, cfg->seq,
                                           r, cfg->ranks, pos));
    for (int64_t s = 0; s < n; s++)
        if (s == 0 || s == n - 1 || pos[s] != pos[s - 1] + 1 || pos[s + 1] != pos[s] + 1)
            mark[pos[s]] = 1;
    return CTXPAR_OK;
}

ctxpar_status cpt_run_sample_rows(const cpt_run_config *cfg, cpt_run_sample *out) {
    memset(out, 0, sizeof *out);
    const int64_t S = cfg->seq, want = cfg->rows;
    if (want <= 0 || want >= S)
        return CTXPAR_OK; // every row
    uint8_t *mark = calloc((size_t)S, 1);
    int64_t *pos = malloc(sizeof *pos * (size_t)(S + 1));
    int64_t *rows = malloc(sizeof *rows * (size_t)want);
    ctxpar_status st = mark && pos && rows ? CTXPAR_OK
                                           : CTXPAR_ERROR(CTXPAR_ERR_OUT_OF_MEMORY,
                                                          "cannot allocate %lld row marks",
                                                          (long long)S);
    for (int r = 0; st == CTXPAR_OK && r < cfg->ranks; r++)
        st = mark_rank(cfg, r, pos, mark);
    if (st == CTXPAR_OK) {
        int64_t bounds = 0;
        for (int64_t s = 0; s < S; s++)
            bounds += mark[s];
        // More boundaries than rows to judge (striped, many ranks): every k-th of them.
        if (bounds > want) {
            int64_t seen = 0, kept = 0;
            for (int64_t s = 0; s < S; s++) {
                if (!mark[s])
                    continue;
                const int keep = seen * want / bounds != (seen + 1) * want / bounds;
                mark[s] = (uint8_t)keep;
                kept += keep;
                seen++;
            }
            bounds = kept;
        }
        out->boundaries = bounds;
        // Uniform random rows among the others, from the run's seed.
        int64_t chosen = bounds;
        for (uint64_t i = 0; chosen < want; i++) {
            const double u = 0.5 * (cpt_test_value(cfg->seed, 0x5a3e, i) + 1.0); // [0, 1)
            const int64_t s = (int64_t)(u * (double)S);
            if (s < S && !mark[s]) {
                mark[s] = 1;
                chosen++;
            }
        }
        int64_t n = 0;
        for (int64_t s = 0; s < S; s++)
            if (mark[s])
                rows[n++] = s;
        out->rows = rows;
        out->n = n;
        rows = NULL;
    }
    free(mark);
    free(pos);
    free(rows);
    return st;
}

void cpt_run_sample_free(cpt_run_sample *s) {
    free(s->rows);
    memset(s, 0, sizeof *s);
}

// Copies `n` rows (positions rows[]) of each global output into compact ones of cfg->seq = n.
ctxpar_status cpt_run_outputs_compact(const cpt_run_config *cfg, const cpt_run_sample *smp,
                                      const cpt_run_outputs *full, cpt_run_outputs *out) {
    cpt_run_config cc = *cfg;
    cc.seq = smp->n;
    CTXPAR_CHECK(cpt_run_outputs_alloc(&cc, out));
    const int64_t B = cfg->batch, S = cfg->seq, n = smp->n;
    for (int i = 0; i < CPT_RUN_TENSORS; i++) {
        if (!full->t[i] || !out->t[i])
            continue;
        if (i == CPT_T_LSE) { // [B, H, S] floats
            const float *src = full->t[i];
            float *dst = out->t[i];
            for (int64_t bh = 0; bh < B * cfg->heads; bh++)
                for (int64_t x = 0; x < n; x++)
                    dst[bh * n + x] = src[bh * S + smp->rows[x]];
            continue;
        }
        const int64_t heads = i == CPT_T_DK || i == CPT_T_DV ? cfg->kv_heads : cfg->heads;
        const int64_t dim = i == CPT_T_OUT || i == CPT_T_DV ? cpt_run_dim_v(cfg) : cfg->head_dim;
        const size_t row = (size_t)(heads * dim) * ctxpar_dtype_size(cfg->dtype);
        for (int64_t b = 0; b < B; b++)
            for (int64_t x = 0; x < n; x++)
                memcpy((char *)out->t[i] + (size_t)(b * n + x) * row,
                       (const char *)full->t[i] + (size_t)(b * S + smp->rows[x]) * row, row);
    }
    if (full->dsinks && out->dsinks)
        memcpy(out->dsinks, full->dsinks, sizeof(float) * (size_t)cfg->heads);
    return CTXPAR_OK;
}
