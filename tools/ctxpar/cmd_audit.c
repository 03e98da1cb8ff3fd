// `ctxpar audit`: context-parallel attention on the user's own tensors (.npy, .safetensors, or
// per-rank shards, in any of tensor_format.h's orders), compared with the fp64 oracle and with
// P = 1 like check; --against judges results computed elsewhere on the same inputs; --save writes
// ctxpar's results stored like the inputs.
#include <stdlib.h>
#include <string.h>

#include "audit.h"
#include "commands.h"
#include "reference/data.h"
#include "report.h"

enum { IN_Q, IN_K, IN_V, IN_DOUT, N_IN };
static const char *const in_names[N_IN] = {"q", "k", "v", "dout"};

void cpt_audit_state_free(cpt_audit_state *a) {
    for (int i = 0; i < N_IN; i++) {
        cpt_audit_tensor_free(&a->in[i]);
        free(a->converted[i]);
        cpt_audit_src_close(&a->files[i]);
    }
    for (int i = 0; i < CPT_RUN_TENSORS; i++)
        cpt_audit_tensor_free(&a->res[i]);
    cpt_audit_src_close(&a->files[N_IN]);
    cpt_audit_src_close(&a->inputs_src);
    cpt_audit_src_close(&a->shards);
    cpt_audit_src_close(&a->against);
    free(a->cu_seqlens);
    free(a->dsinks);
    memset(a, 0, sizeof *a);
}

static int fail(char *msg, size_t n) {
    snprintf(msg, n, "%s", cpt_cli_message(ctxpar_last_error()));
    return 0;
}

static int open_src(cpt_audit_src *s, const char *path, char *msg, size_t n) {
    return !path || cpt_audit_src_open(s, path) == CTXPAR_OK || fail(msg, n);
}

// The source holding `name`: the first of `order` that has it, or NULL.
static const cpt_audit_src *find(const cpt_audit_src *const *order, int count,
                                    const char *name) {
    for (int i = 0; i < count; i++)
        if (order[i] && order[i]->kind != CPT_AUDIT_SRC_NONE &&
            cpt_audit_src_has(order[i], name))
            return order[i];
    return NULL;
}

// PyTorch's SDPA tensors are [B, H, S, D]: read as [B, S, H, D] they show more heads than
// tokens, or as many heads as cu_seqlens has tokens. A warning, not an error: such shapes can
// be meant.
static void warn_bhsd_as_bshd(const cpt_audit_state *a, const cpt_audit_layout *lay) {
    const int64_t *d = a->in[IN_Q].dims; // [B, S, H, D] whatever the files' order
    const int32_t cu_end = a->cu_seqlens ? a->cu_seqlens[a->num_docs] : -1;
    if (lay->format != CPT_TFORMAT_BSHD || (d[2] <= d[1] && cu_end != d[2]))
        return;
    fprintf(stderr,
            "warning: q read as [B, S, H, D] = [%lld, %lld, %lld, %lld] has %s; if the files "
            "are [B, H, S, D] (PyTorch's scaled_dot_product_attention order), pass --format "
            "bhsd\n",
            (long long)d[0], (long long)d[1], (long long)d[2], (long long)d[3],
            d[2] > d[1] ? "more heads than tokens" : "as many heads as cu_seqlens has tokens");
}

// k and v alike but for v's head_dim (MLA: Dv); batch, seq and head_dim as q's; q's heads a
// multiple of k's; dout like q with v's head_dim; one dtype for all.
static int check_inputs(const cpt_audit_state *a, const cpt_audit_layout *lay, char *msg,
                        size_t n) {
    const cpt_audit_tensor *q = &a->in[IN_Q], *k = &a->in[IN_K];
    char s1[160], s2[160];
    int64_t f1[4], f2[4];
    for (int i = IN_K; i < N_IN; i++) {
        const cpt_audit_tensor *t = &a->in[i];
        if (!t->data)
            continue;
        if (t->dtype != q->dtype) {
            snprintf(msg, n, "%s: %s is %s but q is %s (give every input one dtype)", t->where,
                     in_names[i], cpt_npy_dtype_text(t->dtype), cpt_npy_dtype_text(q->dtype));
            return 0;
        }
        const cpt_audit_tensor *like = i == IN_V ? k : q;
        int same = 1;
        for (int d = 0; d < 3; d++)
            same &= t->dims[d] == like->dims[d] || (i == IN_K && d == 2);
        // head_dim: k's is q's, v's its own (MLA), dout's v's.
        same &= i == IN_V || t->dims[3] == (i == IN_DOUT ? a->in[IN_V] : *q).dims[3];
        if (!same) {
            // Shapes as the files hold them (global tensors; a shard pattern's assembled ones).
            int nd = cpt_tformat_shape(lay->format, t->dims, f1);
            cpt_tformat_shape(lay->format, like->dims, f2);
            snprintf(msg, n, "%s: %s has shape %s, which does not match %s's %s%s", t->where,
                     in_names[i], cpt_audit_shape_text(nd, f1, s1, sizeof s1),
                     i == IN_V ? "k" : "q", cpt_audit_shape_text(nd, f2, s2, sizeof s2),
                     i == IN_K      ? " (only the heads may differ)"
                     : i == IN_V    ? " (only the head_dim may differ)"
                     : i == IN_DOUT ? " (with v's head_dim)"
                                    : "");
            return 0;
        }
    }
    if (q->dims[2] % k->dims[2] != 0) {
        snprintf(msg, n, "%s: k has %lld heads, which does not divide q's %lld heads", k->where,
                 (long long)k->dims[2], (long long)q->dims[2]);
        return 0;
    }
    return 1;
}

static int read_cu_seqlens(const cpt_audit_src *src, cpt_audit_state *a, char *where,
                           size_t where_len, char *msg, size_t n) {
    return cpt_audit_read_cu_seqlens(src, where, where_len, &a->cu_seqlens, &a->num_docs,
                                     &a->cu_seqlens_rows) == CTXPAR_OK ||
           fail(msg, n);
}

// dsinks.npy among the results: float32 [heads], judged when the run has sinks and dout.
static int read_dsinks(const cpt_cli *cli, const cpt_audit_src *src, cpt_audit_state *a, char *msg,
                       size_t n) {
    cpt_npy_array d;
    if (cpt_audit_read_raw(src, "dsinks", 0, &d, a->dsinks_where, sizeof a->dsinks_where) !=
        CTXPAR_OK)
        return fail(msg, n);
    const int64_t heads = a->in[IN_Q].dims[2];
    int ok = 0;
    char sh[160];
    if (d.dtype != CPT_NPY_F32 || d.ndim != 1 || (int64_t)d.count != heads)
        snprintf(msg, n, "%s: dsinks is %s %s; want float32 [%lld] (one per query head)",
                 a->dsinks_where, cpt_npy_dtype_text(d.dtype),
                 cpt_audit_shape_text(d.ndim, d.shape, sh, sizeof sh), (long long)heads);
    else if (!cli->sinks_path || !a->in[IN_DOUT].data)
        snprintf(msg, n, "%s: holds dsinks, but the run has no %s", a->dsinks_where,
                 !cli->sinks_path ? "--sinks" : "dout (the backward gives dsinks)");
    else if (!(a->dsinks = malloc(d.count * sizeof(float))))
        snprintf(msg, n, "cannot allocate dsinks");
    else
        ok = 1;
    if (ok) {
        memcpy(a->dsinks, d.data, d.count * sizeof(float));
        a->has_against = 1;
    }
    cpt_npy_free(&d);
    return ok;
}

// The results to judge: each must have the shape ctxpar's would have; one dtype but for lse.
static int read_results(const cpt_cli *cli, cpt_audit_state *a, char *msg, size_t n) {
    const cpt_audit_src *order[1] = {cli->against_path ? &a->against : &a->shards};
    const cpt_audit_tensor *q = &a->in[IN_Q], *k = &a->in[IN_K];
    for (int i = 0; i < CPT_RUN_TENSORS; i++) {
        const char *name = cpt_run_tensor_name((cpt_run_tensor)i);
        const cpt_audit_src *s = find(order, 1, name);
        if (!s)
            continue;
        int lse = i == CPT_T_LSE;
        cpt_audit_tensor *t = &a->res[i];
        if (cpt_audit_read(s, name, lse, &a->lay, t) != CTXPAR_OK)
            return fail(msg, n);
        a->has_against = 1;
        const cpt_audit_tensor *like = i == CPT_T_DK || i == CPT_T_DV ? k : q;
        int64_t want[4] = {like->dims[0], like->dims[1], like->dims[2], like->dims[3]};
        if (i == CPT_T_OUT || i == CPT_T_DV) // v's head_dim (MLA)
            want[3] = a->in[IN_V].dims[3];
        if (lse)
            want[1] = q->dims[2], want[2] = q->dims[1], want[3] = 1;
        if (memcmp(want, t->dims, sizeof want) != 0) {
            snprintf(msg, n,
                     "%s: %s has dims [%lld, %lld, %lld, %lld], but the inputs give [%lld, %lld, "
                     "%lld, %lld] (%s)",
                     t->where, name, (long long)t->dims[0], (long long)t->dims[1],
                     (long long)t->dims[2], (long long)t->dims[3], (long long)want[0],
                     (long long)want[1], (long long)want[2], (long long)want[3],
                     lse ? "batch, heads, seq" : "batch, seq, heads, dim");
            return 0;
        }
        if (i >= CPT_T_DQ && !a->in[IN_DOUT].data) {
            snprintf(msg, n, "%s: holds %s, but the inputs have no dout to run the backward pass",
                     t->where, name);
            return 0;
        }
        if (!lse && a->result_dtype_set && t->dtype != a->result_dtype) {
            snprintf(msg, n, "%s: %s is %s, but the other results are %s", t->where, name,
                     cpt_npy_dtype_text(t->dtype), cpt_npy_dtype_text(a->result_dtype));
            return 0;
        }
        if (!lse)
            a->result_dtype = t->dtype, a->result_dtype_set = 1;
    }
    const cpt_audit_src *ds = find(order, 1, "dsinks");
    if (ds && !read_dsinks(cli, ds, a, msg, n))
        return 0;
    if (cli->against_path && !a->has_against) {
        char found[1024];
        snprintf(msg, n, "%s: holds none of out, lse, dq, dk, dv, dsinks (found: %s)",
                 cli->against_path, cpt_audit_src_list(&a->against, found, sizeof found));
        return 0;
    }
    return 1;
}

// Converts the inputs to the run's dtype and fills cfg.
static int configure(cpt_cli *cli, cpt_audit_state *a, char *msg, size_t n) {
    cpt_run_config *c = &cli->cfg;
    ctxpar_dtype file_dtype, run;
    cpt_dtype_of_npy(a->in[IN_Q].dtype, &file_dtype);
    a->file_dtype = file_dtype;
    run = file_dtype;
    if (cli->dtype_set)
        run = c->dtype;
    else if (a->result_dtype_set)
        cpt_dtype_of_npy(a->result_dtype, &run); // ctxpar's own error at the results' dtype
    c->dtype = run;
    const void *data[N_IN];
    for (int i = 0; i < N_IN; i++) {
        cpt_audit_tensor *t = &a->in[i];
        data[i] = t->data;
        if (!t->data || run == file_dtype)
            continue;
        a->converted[i] = malloc((size_t)(t->dims[0] * t->dims[1] * t->dims[2] * t->dims[3]) *
                                     ctxpar_dtype_size(run) +
                                 1);
        if (!a->converted[i]) {
            snprintf(msg, n, "cannot allocate memory to convert %s to %s", in_names[i],
                     ctxpar_dtype_name(run));
            return 0;
        }
        ctxpar_tensor s =
            ctxpar_tensor_bshd(t->data, file_dtype, t->dims[0], t->dims[1], t->dims[2], t->dims[3]);
        ctxpar_tensor d = ctxpar_tensor_bshd(a->converted[i], run, t->dims[0], t->dims[1],
                                             t->dims[2], t->dims[3]);
        cpt_tensor_copy(&s, &d);
        data[i] = a->converted[i];
    }
    const int64_t *qd = a->in[IN_Q].dims;
    a->inputs = (cpt_run_inputs){data[IN_Q], data[IN_K], data[IN_V], data[IN_DOUT]};
    c->inputs = &a->inputs;
    c->batch = qd[0];
    c->seq = qd[1];
    c->heads = qd[2];
    c->head_dim = qd[3];
    c->kv_heads = a->in[IN_K].dims[2];
    c->head_dim_v = a->in[IN_V].dims[3] != qd[3] ? a->in[IN_V].dims[3] : 0;
    c->backward = a->in[IN_DOUT].data != NULL;
    c->params.cu_seqlens = a->cu_seqlens;
    c->params.num_docs = a->cu_seqlens ? a->num_docs : 0;
    c->params.cu_seqlens_rows = a->cu_seqlens ? a->cu_seqlens_rows : 0;
    c->keep_oracle = a->has_against || cli->report_path; // --report judges ctxpar's own
    return 1;
}

cpt_audit_layout cpt_audit_layout_of(const cpt_cli *cli) {
    return (cpt_audit_layout){(cpt_tformat)cli->format,
                              (cpt_lse_layout)cli->lse_layout,
                              cli->lse_base2,
                              cli->cfg.ranks,
                              cli->cfg.params.layout,
                              NULL,
                              0,
                              cli->cfg.params.assignment,
                              0,
                              cli->assign_len};
}

int cpt_audit_load(cpt_cli *cli, cpt_audit_state *a, char *msg, size_t n) {
    a->lay = cpt_audit_layout_of(cli);
    const char *paths[N_IN + 1] = {cli->q_path, cli->k_path, cli->v_path, cli->dout_path,
                                   cli->cu_seqlens_path};
    for (int i = 0; i <= N_IN; i++)
        if (!open_src(&a->files[i], paths[i], msg, n))
            return 0;
    if (!open_src(&a->inputs_src, cli->inputs_path, msg, n) ||
        !open_src(&a->shards, cli->shards_pattern, msg, n) ||
        !open_src(&a->against, cli->against_path, msg, n))
        return 0;
    // One .npy file holds one tensor: it cannot stand for the several that these name.
    const cpt_audit_src *several[2] = {&a->inputs_src, &a->against};
    for (int i = 0; i < 2; i++)
        if (several[i]->kind == CPT_AUDIT_SRC_NPY_FILE || several[i]->kind == CPT_AUDIT_SRC_TEXT) {
            snprintf(msg, n, "%s: give a folder of NAME.npy files or a .safetensors file",
                     several[i]->path);
            return 0;
        }
    const cpt_audit_src *cu_order[2] = {&a->files[N_IN], &a->inputs_src};
    const cpt_audit_src *cu =
        cli->cu_seqlens_path ? &a->files[N_IN] : find(cu_order, 2, "cu_seqlens");
    char cu_where[4096] = "";
    if (cu && !read_cu_seqlens(cu, a, cu_where, sizeof cu_where, msg, n))
        return 0;
    a->lay.cu_seqlens = a->cu_seqlens;
    a->lay.num_docs = a->cu_seqlens ? a->num_docs : 0;
    a->lay.cu_seqlens_rows = a->cu_seqlens ? a->cu_seqlens_rows : 0;
    for (int i = 0; i < N_IN; i++) {
        const cpt_audit_src *order[3] = {&a->files[i], &a->inputs_src, &a->shards};
        const cpt_audit_src *s = find(order, 3, in_names[i]);
        if (!s && paths[i])
            s = &a->files[i]; // let the read say what is wrong with the file
        if (!s && i == IN_DOUT)
            continue;
        if (!s) {
            const cpt_audit_src *where = cli->inputs_path ? &a->inputs_src : &a->shards;
            char found[1024];
            snprintf(msg, n, "%s: no %s here%s%s (found: %s; name it %s, or give --%s FILE)",
                     where->path, in_names[i],
                     cli->inputs_path && cli->shards_pattern ? " nor in " : "",
                     cli->inputs_path && cli->shards_pattern ? cli->shards_pattern : "",
                     cpt_audit_src_list(where, found, sizeof found), in_names[i], in_names[i]);
            return 0;
        }
        if (i == IN_Q)
            a->like = s;
        if (cpt_audit_read(s, in_names[i], 0, &a->lay, &a->in[i]) != CTXPAR_OK)
            return fail(msg, n);
    }
    if (!check_inputs(a, &a->lay, msg, n))
        return 0;
    warn_bhsd_as_bshd(a, &a->lay);
    if (cli->sinks_path && !cpt_cli_load_sinks(cli, a->in[IN_Q].dims[2], msg, n))
        return 0;
    for (int64_t r = 0; a->cu_seqlens && r < (a->cu_seqlens_rows ? a->cu_seqlens_rows : 1); r++)
        if (a->cu_seqlens[r * (a->num_docs + 1) + a->num_docs] != a->in[IN_Q].dims[1]) {
            char row[48] = "";
            if (a->cu_seqlens_rows)
                snprintf(row, sizeof row, " row %lld", (long long)r);
            snprintf(msg, n,
                     "%s: cu_seqlens%s ends at %d, but the sequence (q's dimension 1) has %lld "
                     "tokens",
                     cu_where, row, a->cu_seqlens[r * (a->num_docs + 1) + a->num_docs],
                     (long long)a->in[IN_Q].dims[1]);
            return 0;
        }
    if (a->cu_seqlens_rows && a->cu_seqlens_rows != a->in[IN_Q].dims[0]) {
        snprintf(msg, n, "%s: cu_seqlens has %lld rows, but the batch (q's dimension 0) is %lld",
                 cu_where, (long long)a->cu_seqlens_rows, (long long)a->in[IN_Q].dims[0]);
        return 0;
    }
    if (cli->assign_path && cli->assign_len != a->in[IN_Q].dims[1]) {
        snprintf(msg, n, "%s: holds %lld ranks, but the sequence (q's dimension 1) has %lld tokens",
                 cli->assign_path, (long long)cli->assign_len, (long long)a->in[IN_Q].dims[1]);
        return 0;
    }
    if ((cli->against_path || cli->shards_pattern) && !read_results(cli, a, msg, n))
        return 0;
    return configure(cli, a, msg, n);
}

int cpt_cmd_audit(int argc, char **argv) {
    cpt_cli cli;
    int rc = cpt_cli_parse("audit", argc, argv, &cli, stdout, stderr);
    if (rc >= 0)
        return rc;
    cpt_session s;
    if ((rc = cpt_session_begin(&s, "audit", &cli)) >= 0)
        return rc;
    cpt_audit_state a;
    memset(&a, 0, sizeof a);
    char msg[1024] = "";
    // Every rank reads the files (they hold the global tensors and shard them itself).
    if (!cpt_session_agree(&s, cpt_audit_load(&cli, &a, msg, sizeof msg), msg)) {
        cpt_audit_state_free(&a);
        return cpt_session_end(&s, CPT_EXIT_USAGE);
    }
    cpt_run_result r;
    if (cpt_session_run(&s, &cli.cfg, 1, &r) != CTXPAR_OK) {
        cpt_audit_state_free(&a);
        return cpt_session_end(&s, CPT_EXIT_USAGE);
    }
    rc = cpt_exit_code(&r);
    if (r.status != CTXPAR_OK)
        cpt_session_error(&s, "%s", r.message);
    cpt_audit_report rep;
    memset(&rep, 0, sizeof rep);
    if (s.rank == 0 && r.status == CTXPAR_OK && a.has_against) {
        if (cpt_audit_judge_all(&cli, &a, &r, cpt_report_heat_cols(&cli), &rep) != CTXPAR_OK) {
            cpt_session_error(&s, "%s", cpt_cli_message(ctxpar_last_error()));
            rc = CPT_EXIT_FAIL;
        } else if (!rep.consistent && rc == CPT_EXIT_OK) {
            rc = CPT_EXIT_FAIL;
        }
    }
    const char *saved = NULL;
    if (s.rank == 0 && r.status == CTXPAR_OK && cli.save_dir) {
        if (cpt_audit_save(&cli, &a, &r) == CTXPAR_OK) {
            saved = cli.save_dir;
        } else {
            cpt_session_error(&s, "%s", cpt_cli_message(ctxpar_last_error()));
            rc = CPT_EXIT_USAGE;
        }
    }
    if (s.rank == 0)
        cpt_audit_print(stdout, &cli, &a, &r, &rep, saved);
    rc = cpt_report_judged(&s, &cli, &a.lay, &r, rep.judged ? &rep : NULL, rc);
    cpt_audit_report_free(&rep);
    cpt_run_result_free(&r);
    cpt_audit_state_free(&a);
    return cpt_session_end(&s, rc);
}
