// `ctxpar audit`: context-parallel attention on the user's own global tensors (.npy files),
// compared with the fp64 oracle and with P = 1 like check; --save writes the results.
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "commands.h"
#include "data.h"
#include "npy.h"

typedef struct audit_inputs {
    ctxpar_npy_array a[4]; // q, k, v, dout (dout.data NULL when absent)
    ctxpar_npy_array cu;
    ctxpar_dtype file_dtype;
    void *converted[4]; // the arrays in the run's dtype when --dtype differs from the files'
    int32_t *cu_seqlens;
    int64_t num_docs;
    ctxpar_run_inputs inputs;
} audit_inputs;

enum { IN_Q, IN_K, IN_V, IN_DOUT };
static const char *const in_names[4] = {"q", "k", "v", "dout"};

static void inputs_free(audit_inputs *in) {
    for (int i = 0; i < 4; i++) {
        ctxpar_npy_free(&in->a[i]);
        free(in->converted[i]);
    }
    ctxpar_npy_free(&in->cu);
    free(in->cu_seqlens);
    memset(in, 0, sizeof *in);
}

// "(1, 4096, 8, 64)"
static const char *shape_text(const ctxpar_npy_array *a, char *buf, size_t n) {
    size_t off = (size_t)snprintf(buf, n, "(");
    for (int d = 0; d < a->ndim && off < n; d++)
        off += (size_t)snprintf(buf + off, n - off, "%s%lld", d ? ", " : "",
                                (long long)a->shape[d]);
    if (off < n)
        snprintf(buf + off, n - off, a->ndim == 1 ? ",)" : ")");
    return buf;
}

static const char *npy_type_text(ctxpar_npy_dtype t) {
    switch (t) {
    case CTXPAR_NPY_F32: return "float32";
    case CTXPAR_NPY_F16: return "float16";
    case CTXPAR_NPY_I32: return "int32";
    case CTXPAR_NPY_I64: return "int64";
    }
    return "?";
}

// One tensor file: 4 dimensions, float32 or float16, nothing empty. 0 and msg on failure.
static int check_tensor(const char *path, const char *what, const ctxpar_npy_array *a, char *msg,
                        size_t n) {
    char sh[128];
    if (a->dtype != CTXPAR_NPY_F32 && a->dtype != CTXPAR_NPY_F16) {
        snprintf(msg, n, "%s: %s has dtype %s; want float32 ('<f4') or float16 ('<f2')", path,
                 what, npy_type_text(a->dtype));
        return 0;
    }
    if (a->ndim != 4) {
        snprintf(msg, n, "%s: %s has shape %s; want 4 dimensions [batch, seq, heads, head_dim]",
                 path, what, shape_text(a, sh, sizeof sh));
        return 0;
    }
    for (int d = 0; d < 4; d++)
        if (a->shape[d] == 0) {
            snprintf(msg, n, "%s: %s has an empty dimension: shape %s", path, what,
                     shape_text(a, sh, sizeof sh));
            return 0;
        }
    return 1;
}

// The shapes must agree: k and v alike; batch, seq and head_dim as q's; q's heads a multiple of
// k's; dout like q; one dtype for all.
static int check_shapes(const ctxpar_cli *cli, const audit_inputs *in, char *msg, size_t n) {
    const char *paths[4] = {cli->q_path, cli->k_path, cli->v_path, cli->dout_path};
    const ctxpar_npy_array *q = &in->a[IN_Q], *k = &in->a[IN_K];
    char s1[128], s2[128];
    for (int i = IN_K; i <= IN_DOUT; i++) {
        const ctxpar_npy_array *a = &in->a[i];
        if (!a->data)
            continue;
        if (a->dtype != q->dtype) {
            snprintf(msg, n, "%s: %s is %s but q is %s (give every input one dtype)", paths[i],
                     in_names[i], npy_type_text(a->dtype), npy_type_text(q->dtype));
            return 0;
        }
        const ctxpar_npy_array *like = i == IN_V ? k : q;
        const char *like_name = i == IN_V ? "k" : "q";
        int same = 1;
        for (int d = 0; d < 4; d++)
            same &= a->shape[d] == like->shape[d] || (i == IN_K && d == 2);
        if (!same) {
            snprintf(msg, n, "%s: %s has shape %s, which does not match %s's %s%s", paths[i],
                     in_names[i], shape_text(a, s1, sizeof s1), like_name,
                     shape_text(like, s2, sizeof s2),
                     i == IN_K ? " (only the heads may differ)" : "");
            return 0;
        }
    }
    if (q->shape[2] % k->shape[2] != 0) {
        snprintf(msg, n, "%s: k has %lld heads, which does not divide q's %lld heads", paths[IN_K],
                 (long long)k->shape[2], (long long)q->shape[2]);
        return 0;
    }
    return 1;
}

// cu_seqlens: 1-D int32 or int64, 0 = c[0] < c[1] < ... < c[docs] = seq, each fitting int32.
static int check_cu_seqlens(const char *path, audit_inputs *in, int64_t seq, char *msg,
                            size_t n) {
    const ctxpar_npy_array *a = &in->cu;
    char sh[128];
    if (a->dtype != CTXPAR_NPY_I32 && a->dtype != CTXPAR_NPY_I64) {
        snprintf(msg, n, "%s: cu_seqlens has dtype %s; want int32 or int64", path,
                 npy_type_text(a->dtype));
        return 0;
    }
    if (a->ndim != 1 || a->shape[0] < 2) {
        snprintf(msg, n, "%s: cu_seqlens has shape %s; want [documents + 1] with at least 2 "
                         "entries",
                 path, shape_text(a, sh, sizeof sh));
        return 0;
    }
    in->num_docs = a->shape[0] - 1;
    in->cu_seqlens = malloc((size_t)a->shape[0] * sizeof *in->cu_seqlens);
    if (!in->cu_seqlens) {
        snprintf(msg, n, "%s: cannot allocate %lld entries", path, (long long)a->shape[0]);
        return 0;
    }
    for (int64_t i = 0; i < a->shape[0]; i++) {
        int64_t v = a->dtype == CTXPAR_NPY_I32 ? ((const int32_t *)a->data)[i]
                                               : ((const int64_t *)a->data)[i];
        if (v < INT32_MIN || v > INT32_MAX) {
            snprintf(msg, n, "%s: cu_seqlens[%lld] = %lld does not fit in int32", path,
                     (long long)i, (long long)v);
            return 0;
        }
        if ((i == 0 && v != 0) || (i > 0 && v <= in->cu_seqlens[i - 1])) {
            snprintf(msg, n, "%s: cu_seqlens[%lld] = %lld; want 0 first, then increasing", path,
                     (long long)i, (long long)v);
            return 0;
        }
        in->cu_seqlens[i] = (int32_t)v;
    }
    if (in->cu_seqlens[in->num_docs] != seq) {
        snprintf(msg, n, "%s: cu_seqlens ends at %d, but the sequence (q's dimension 1) has %lld "
                         "tokens",
                 path, in->cu_seqlens[in->num_docs], (long long)seq);
        return 0;
    }
    return 1;
}

static ctxpar_dtype npy_to_dtype(ctxpar_npy_dtype t) {
    return t == CTXPAR_NPY_F16 ? CTXPAR_DTYPE_F16 : CTXPAR_DTYPE_F32;
}

// Copies a dense [B, S, H, D] tensor into another dtype (rounding to nearest even).
static void convert(const void *src, ctxpar_dtype from, void *dst, ctxpar_dtype to,
                    const int64_t shape[4]) {
    ctxpar_tensor s = ctxpar_tensor_bshd((void *)src, from, shape[0], shape[1], shape[2],
                                         shape[3]);
    ctxpar_tensor d = ctxpar_tensor_bshd(dst, to, shape[0], shape[1], shape[2], shape[3]);
    for (int64_t b = 0; b < shape[0]; b++)
        for (int64_t t = 0; t < shape[1]; t++)
            for (int64_t h = 0; h < shape[2]; h++)
                for (int64_t e = 0; e < shape[3]; e++)
                    ctxpar_test_set(&d, b, t, h, e, ctxpar_test_get(&s, b, t, h, e));
}

// Reads and checks every file, converts to the run's dtype and fills cfg. 0 and msg on failure.
static int load(ctxpar_cli *cli, audit_inputs *in, char *msg, size_t n) {
    const char *paths[4] = {cli->q_path, cli->k_path, cli->v_path, cli->dout_path};
    for (int i = 0; i < 4; i++) {
        if (!paths[i])
            continue;
        if (ctxpar_npy_read(paths[i], &in->a[i]) != CTXPAR_OK) {
            snprintf(msg, n, "%s", ctxpar_cli_message(ctxpar_last_error()));
            return 0;
        }
        if (!check_tensor(paths[i], in_names[i], &in->a[i], msg, n))
            return 0;
    }
    if (!check_shapes(cli, in, msg, n))
        return 0;
    const int64_t *qs = in->a[IN_Q].shape;
    if (cli->cu_seqlens_path) {
        if (ctxpar_npy_read(cli->cu_seqlens_path, &in->cu) != CTXPAR_OK) {
            snprintf(msg, n, "%s", ctxpar_cli_message(ctxpar_last_error()));
            return 0;
        }
        if (!check_cu_seqlens(cli->cu_seqlens_path, in, qs[1], msg, n))
            return 0;
    }
    in->file_dtype = npy_to_dtype(in->a[IN_Q].dtype);
    ctxpar_run_config *c = &cli->cfg;
    if (!cli->dtype_set)
        c->dtype = in->file_dtype;
    const void *data[4];
    for (int i = 0; i < 4; i++) {
        data[i] = in->a[i].data;
        if (!data[i] || c->dtype == in->file_dtype)
            continue;
        size_t count = in->a[i].count;
        in->converted[i] = malloc(count * ctxpar_dtype_size(c->dtype) + 1);
        if (!in->converted[i]) {
            snprintf(msg, n, "cannot allocate %zu elements to convert %s to %s", count,
                     in_names[i], ctxpar_dtype_name(c->dtype));
            return 0;
        }
        convert(data[i], in->file_dtype, in->converted[i], c->dtype, in->a[i].shape);
        data[i] = in->converted[i];
    }
    in->inputs = (ctxpar_run_inputs){data[IN_Q], data[IN_K], data[IN_V], data[IN_DOUT]};
    c->inputs = &in->inputs;
    c->batch = qs[0];
    c->seq = qs[1];
    c->heads = qs[2];
    c->head_dim = qs[3];
    c->kv_heads = in->a[IN_K].shape[2];
    c->backward = in->a[IN_DOUT].data != NULL;
    c->params.cu_seqlens = in->cu_seqlens;
    c->params.num_docs = in->cu_seqlens ? in->num_docs : 0;
    return 1;
}

// Writes one global result to dir/name.npy in the files' dtype. 0 and msg on failure.
static int save_one(const char *dir, const char *name, const ctxpar_run_config *c,
                    ctxpar_dtype file_dtype, const void *data, int64_t heads, char *msg,
                    size_t n) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s.npy", dir, name);
    int64_t shape[4] = {c->batch, c->seq, heads, c->head_dim};
    void *conv = NULL;
    if (c->dtype != file_dtype) {
        size_t count = (size_t)(shape[0] * shape[1] * shape[2] * shape[3]);
        conv = malloc(count * ctxpar_dtype_size(file_dtype) + 1);
        if (!conv) {
            snprintf(msg, n, "cannot allocate %zu elements for %.900s", count, path);
            return 0;
        }
        convert(data, c->dtype, conv, file_dtype, shape);
        data = conv;
    }
    ctxpar_npy_dtype t = file_dtype == CTXPAR_DTYPE_F16 ? CTXPAR_NPY_F16 : CTXPAR_NPY_F32;
    ctxpar_status st = ctxpar_npy_write(path, t, 4, shape, data);
    free(conv);
    if (st != CTXPAR_OK)
        snprintf(msg, n, "%s", ctxpar_cli_message(ctxpar_last_error()));
    return st == CTXPAR_OK;
}

static int save(const char *dir, const ctxpar_run_config *c, const audit_inputs *in,
                const ctxpar_run_result *r, char *msg, size_t n) {
    if (mkdir(dir, 0777) != 0 && errno != EEXIST) {
        snprintf(msg, n, "%s: cannot create the directory: %s", dir, strerror(errno));
        return 0;
    }
    int64_t lse_shape[3] = {c->batch, c->heads, c->seq};
    char path[4096];
    snprintf(path, sizeof path, "%s/lse.npy", dir);
    if (ctxpar_npy_write(path, CTXPAR_NPY_F32, 3, lse_shape, r->outputs.t[CTXPAR_T_LSE]) !=
        CTXPAR_OK) {
        snprintf(msg, n, "%s", ctxpar_cli_message(ctxpar_last_error()));
        return 0;
    }
    static const char *const names[CTXPAR_RUN_TENSORS] = {"out", "lse", "dq", "dk", "dv"};
    for (int i = 0; i < CTXPAR_RUN_TENSORS; i++) {
        if (i == CTXPAR_T_LSE || !r->outputs.t[i])
            continue;
        int64_t heads = i == CTXPAR_T_DK || i == CTXPAR_T_DV ? c->kv_heads : c->heads;
        if (!save_one(dir, names[i], c, in->file_dtype, r->outputs.t[i], heads, msg, n))
            return 0;
    }
    return 1;
}

static void print_json(const ctxpar_cli *cli, const ctxpar_run_result *r, const char *saved) {
    fputc('{', stdout);
    ctxpar_report_json_members(stdout, &cli->cfg, r);
    const char *paths[5] = {cli->q_path, cli->k_path, cli->v_path, cli->dout_path,
                            cli->cu_seqlens_path};
    static const char *const keys[5] = {"q", "k", "v", "dout", "cu_seqlens"};
    fputs(",\"inputs\":{", stdout);
    for (int i = 0, first = 1; i < 5; i++) {
        if (!paths[i])
            continue;
        printf("%s\"%s\":", first ? "" : ",", keys[i]);
        ctxpar_json_string(stdout, paths[i]);
        first = 0;
    }
    fputs("},\"saved_to\":", stdout);
    if (saved)
        ctxpar_json_string(stdout, saved);
    else
        fputs("null", stdout);
    fputs("}\n", stdout);
}

int ctxpar_cmd_audit(int argc, char **argv) {
    ctxpar_cli cli;
    int rc = ctxpar_cli_parse("audit", argc, argv, &cli, stdout, stderr);
    if (rc >= 0)
        return rc;
    ctxpar_session s;
    if ((rc = ctxpar_session_begin(&s, "audit", &cli)) >= 0)
        return rc;
    audit_inputs in;
    memset(&in, 0, sizeof in);
    char msg[1024] = "";
    // Every rank reads the files (they hold the global tensors and shard them itself).
    if (!ctxpar_session_agree(&s, load(&cli, &in, msg, sizeof msg), msg)) {
        inputs_free(&in);
        return ctxpar_session_end(&s, CTXPAR_EXIT_USAGE);
    }
    ctxpar_run_result r;
    if (ctxpar_session_run(&s, &cli.cfg, 1, &r) != CTXPAR_OK) {
        inputs_free(&in);
        return ctxpar_session_end(&s, CTXPAR_EXIT_USAGE);
    }
    rc = ctxpar_exit_code(&r);
    if (r.status != CTXPAR_OK)
        ctxpar_session_error(&s, "%s", r.message);
    const char *saved = NULL;
    if (s.rank == 0 && r.status == CTXPAR_OK && cli.save_dir) {
        if (save(cli.save_dir, &cli.cfg, &in, &r, msg, sizeof msg)) {
            saved = cli.save_dir;
        } else {
            ctxpar_session_error(&s, "%s", msg);
            rc = CTXPAR_EXIT_USAGE;
        }
    }
    if (s.rank == 0 && r.status == CTXPAR_OK) {
        if (cli.json) {
            print_json(&cli, &r, saved);
        } else {
            ctxpar_report_table(stdout, "audit", &cli.cfg, &r);
            if (saved)
                printf("  saved out.npy, lse.npy%s to %s\n",
                       cli.cfg.backward ? ", dq.npy, dk.npy, dv.npy" : "", saved);
        }
    } else if (s.rank == 0 && cli.json) {
        print_json(&cli, &r, NULL);
    }
    ctxpar_run_result_free(&r);
    inputs_free(&in);
    return ctxpar_session_end(&s, rc);
}
