// The planner's hardware model (see plan_model.h).
#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "plan_model.h"

int cpt_plan_model_builtin(const char *name, cpt_plan_model *m) {
    memset(m, 0, sizeof *m);
    snprintf(m->name, sizeof m->name, "%s", name);
    m->bwd_factor = 2.5;
    if (!strcmp(name, "h200")) {
        // ~40% of the H200's 989 TFLOP/s dense BF16 in attention kernels; NVLink 4 about 360 GB/s
        // per direction achieved per GPU; 400 Gb/s InfiniBand per GPU about 45 GB/s achieved.
        m->flops_per_s = 4.0e14;
        m->group_size = 8;
        m->bandwidth[CPT_LINK_GROUP] = 3.6e11;
        m->latency[CPT_LINK_GROUP] = 3e-6;
        m->bandwidth[CPT_LINK_ACROSS] = 4.5e10;
        m->latency[CPT_LINK_ACROSS] = 8e-6;
        return 1;
    }
    if (!strcmp(name, "cpu")) {
        // The 2-core test machine, calibrated with `ctxpar bench` (docs/performance.md): ranks
        // are threads sharing the cores, transfers are memory copies.
        m->machine_flops_per_s = 2.19e10; // bench: 4 heads, dim 64, causal, 2 ranks
        m->flops_per_s = m->machine_flops_per_s;
        m->bwd_factor = 2.63;
        m->group_size = 1 << 20;
        m->bandwidth[CPT_LINK_GROUP] = m->bandwidth[CPT_LINK_ACROSS] = 5.0e9;
        m->latency[CPT_LINK_GROUP] = m->latency[CPT_LINK_ACROSS] = 2e-5;
        return 1;
    }
    return 0;
}

static int get_num(json_t *obj, const char *key, double *out) {
    json_t *v = json_object_get(obj, key);
    if (!v)
        return 1; // keeps the default
    if (!json_is_number(v) || !(json_number_value(v) > 0))
        return 0;
    *out = json_number_value(v);
    return 1;
}

ctxpar_status cpt_plan_model_load(const char *path, cpt_plan_model *m) {
    (void)cpt_plan_model_builtin("h200", m);
    json_error_t err;
    json_t *root = json_load_file(path, 0, &err);
    if (!root)
        return CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "model %s: line %d: %s", path, err.line,
                            err.text);
    ctxpar_status st = CTXPAR_OK;
    const char *bad = NULL;
    double group = m->group_size;
    json_t *name = json_object_get(root, "name");
    if (json_is_string(name))
        snprintf(m->name, sizeof m->name, "%s", json_string_value(name));
    if (!get_num(root, "flops_per_s", &m->flops_per_s))
        bad = "flops_per_s";
    else if (!get_num(root, "bwd_factor", &m->bwd_factor))
        bad = "bwd_factor";
    else if (!get_num(root, "group_size", &group))
        bad = "group_size";
    else if (!get_num(root, "machine_flops_per_s", &m->machine_flops_per_s))
        bad = "machine_flops_per_s";
    json_t *links = json_object_get(root, "links");
    const char *const link_names[CPT_LINKS] = {"group", "across"};
    for (int l = 0; l < CPT_LINKS && !bad && links; l++) {
        json_t *o = json_object_get(links, link_names[l]);
        if (!o)
            continue;
        if (!get_num(o, "bandwidth_Bps", &m->bandwidth[l]))
            bad = l ? "links.across.bandwidth_Bps" : "links.group.bandwidth_Bps";
        else if (!get_num(o, "latency_s", &m->latency[l]))
            bad = l ? "links.across.latency_s" : "links.group.latency_s";
    }
    if (bad)
        st = CTXPAR_ERROR(CTXPAR_ERR_INVALID_ARG, "model %s: %s must be a number > 0", path, bad);
    m->group_size = (int)group;
    json_decref(root);
    return st;
}

double cpt_plan_rank_time(const cpt_plan_model *m, const cpt_plan_rank *r, int ranks) {
    const double rate =
        m->machine_flops_per_s > 0 ? m->machine_flops_per_s / ranks : m->flops_per_s;
    const double compute = (r->flops_fwd + m->bwd_factor * r->flops_bwd) / rate;
    double p2p = 0, coll = 0;
    for (int l = 0; l < CPT_LINKS; l++) {
        p2p += (double)r->traffic.p2p_bytes[l] / m->bandwidth[l] +
               (double)r->traffic.p2p_msgs[l] * m->latency[l];
        coll += (double)r->traffic.coll_bytes[l] / m->bandwidth[l] +
                (double)r->traffic.coll_msgs[l] * m->latency[l];
    }
    return (compute > p2p ? compute : p2p) + coll;
}

double cpt_plan_time(const cpt_plan_model *m, const cpt_plan_result *res) {
    double worst = 0;
    for (int r = 0; r < res->nranks; r++) {
        const double t = cpt_plan_rank_time(m, &res->rank[r], res->nranks);
        if (t > worst)
            worst = t;
    }
    return worst;
}
