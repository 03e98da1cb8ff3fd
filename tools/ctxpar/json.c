// JSON output for the tool: strings, numbers, and the configuration every command echoes.
#include <math.h>

#include "commands.h"

void cpt_json_string(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c < 0x20)
            fprintf(f, "\\u%04x", c);
        else
            fputc(c, f);
    }
    fputc('"', f);
}

void cpt_json_num(FILE *f, double x) {
    if (isfinite(x))
        fprintf(f, "%.12g", x);
    else
        fputs("null", f); // JSON has no NaN or infinity
}

void cpt_json_config_members(FILE *f, const cpt_run_config *c, ctxpar_algo resolved) {
    const ctxpar_attn_params *p = &c->params;
    fprintf(f,
            "\"ranks\":%d,\"batch\":%lld,\"seq\":%lld,\"heads\":%lld,\"kv_heads\":%lld,"
            "\"dim\":%lld,\"v_dim\":%lld,\"dtype\":\"%s\",\"mask\":\"%s\",\"window\":%lld,"
            "\"window_right\":%lld,\"softcap\":%g,\"scale\":",
            c->ranks, (long long)c->batch, (long long)c->seq, (long long)c->heads,
            (long long)c->kv_heads, (long long)c->head_dim, (long long)cpt_run_dim_v(c),
            ctxpar_dtype_name(c->dtype), ctxpar_mask_name(p->mask), (long long)p->window_left,
            (long long)p->window_right, (double)p->softcap);
    // 0: the library's 1/sqrt(head_dim), which is what runs.
    cpt_json_num(f, p->softmax_scale != 0.0f ? (double)p->softmax_scale
                                             : (double)(1.0f / sqrtf((float)c->head_dim)));
    fprintf(f,
            ",\"sinks\":%s,\"q_len\":%lld,\"ulysses\":%lld,\"docs\":%lld,\"docs_per_row\":%s,"
            "\"algo\":\"%s\","
            "\"algo_resolved\":\"%s\",\"layout\":\"%s\",\"backward\":%s,\"seed\":%llu,"
            "\"reproducible\":%s",
            p->sinks ? "true" : "false", (long long)p->q_len, (long long)p->ulysses,
            (long long)(p->num_docs > 0 ? p->num_docs : c->docs),
            p->cu_seqlens_rows > 0 ? "true" : "false", ctxpar_algo_name(p->algo),
            ctxpar_algo_name(resolved), ctxpar_layout_name(p->layout),
            c->backward ? "true" : "false", (unsigned long long)c->seed,
            p->reproducible ? "true" : "false");
}
