#include "testing/nonfinite_oracle.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace cpt_nonfinite {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

int64_t Pos(const int64_t *pos, int64_t i) {
    return pos ? pos[i] : i;
}

} // namespace

std::vector<Row> MinusInfRows(const Inputs &in) {
    const cpt_oracle_shape &sh = in.shape;
    const int64_t Sq = sh.seq_q, Sk = sh.seq_k, Hq = sh.heads_q, Hkv = sh.heads_kv, D = sh.head_dim;
    // A score of finite inputs is finite unless it overflows: no need to look at each.
    double max_q = 0, max_k = 0;
    for (int64_t e = 0; e < sh.batch * Sq * Hq * D; e++)
        max_q = std::isnan(in.q[e]) ? max_q : std::fmax(max_q, std::fabs(in.q[e]));
    for (int64_t e = 0; e < sh.batch * Sk * Hkv * D; e++)
        max_k = std::isnan(in.k[e]) ? max_k : std::fmax(max_k, std::fabs(in.k[e]));
    if (std::fabs(in.scale) * max_q * max_k * (double)D < 1e300)
        return {};
    // The oracle's own mask, so that "visible" means what it means there.
    std::vector<uint8_t> vis((size_t)(Sq * Sk));
    const cpt_oracle_shape one = {1, Sq, Sk, 1, 1, 1};
    if (cpt_oracle_visibility(&one, in.q_pos, in.k_pos, in.mask, vis.data()) != CTXPAR_OK)
        return {{-1, -1, -1}}; // no such row: a comparison against it fails
    std::vector<Row> rows;
    for (int64_t b = 0; b < sh.batch; b++)
        for (int64_t i = 0; i < Sq; i++)
            for (int64_t h = 0; h < Hq; h++) {
                const int64_t g = h / (Hq / Hkv);
                const double *qi = in.q + ((b * Sq + i) * Hq + h) * D;
                int64_t seen = 0;
                bool all_minus_inf = true; // until a visible score says otherwise
                for (int64_t j = 0; j < Sk && all_minus_inf; j++) {
                    if (!vis[(size_t)(i * Sk + j)])
                        continue;
                    const double *kj = in.k + ((b * Sk + j) * Hkv + g) * D;
                    double dot = 0;
                    for (int64_t d = 0; d < D; d++)
                        dot += qi[d] * kj[d];
                    seen++;
                    all_minus_inf = in.scale * dot == -kInf;
                }
                if (seen > 0 && all_minus_inf)
                    rows.push_back({b, i, h});
            }
    return rows;
}

void Oracle(const Inputs &in, const std::vector<Row> &rows, std::vector<double> *out,
            std::vector<double> *lse, std::vector<double> *dq, std::vector<double> *dk,
            std::vector<double> *dv) {
    const cpt_oracle_shape &sh = in.shape;
    const int64_t B = sh.batch, Sq = sh.seq_q, Sk = sh.seq_k, Hq = sh.heads_q, Hkv = sh.heads_kv,
                  D = sh.head_dim;
    const size_t nq = (size_t)(B * Sq * Hq * D), nk = (size_t)(B * Sk * Hkv * D);
    if (rows.empty()) {
        out->assign(nq, 0.0);
        lse->assign((size_t)(B * Hq * Sq), 0.0);
        cpt_oracle_fwd(&sh, in.q, in.k, in.v, in.q_pos, in.k_pos, in.mask, in.scale, out->data(),
                       lse->data());
        if (in.dout) {
            dq->assign(nq, 0.0), dk->assign(nk, 0.0), dv->assign(nk, 0.0);
            cpt_oracle_bwd(&sh, in.q, in.k, in.v, in.q_pos, in.k_pos, in.mask, in.scale, in.dout,
                           dq->data(), dk->data(), dv->data());
        }
        return;
    }
    // The convention's rows keep these values; every other row gets the oracle's.
    out->assign(nq, 0.0);
    lse->assign((size_t)(B * Hq * Sq), -kInf);
    if (in.dout)
        dq->assign(nq, 0.0), dk->assign(nk, 0.0), dv->assign(nk, 0.0);
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < Hq; h++) {
            const int64_t g = h / (Hq / Hkv);
            std::vector<int64_t> keep, pos;
            for (int64_t i = 0; i < Sq; i++)
                if (std::find(rows.begin(), rows.end(), Row{b, i, h}) == rows.end()) {
                    keep.push_back(i);
                    pos.push_back(Pos(in.q_pos, i));
                }
            const int64_t n = (int64_t)keep.size();
            if (n == 0)
                continue;
            std::vector<double> q((size_t)(n * D)), g_out((size_t)(n * D)), k((size_t)(Sk * D)),
                v((size_t)(Sk * D));
            for (int64_t r = 0; r < n; r++)
                for (int64_t d = 0; d < D; d++) {
                    const int64_t e = ((b * Sq + keep[(size_t)r]) * Hq + h) * D + d;
                    q[(size_t)(r * D + d)] = in.q[e];
                    g_out[(size_t)(r * D + d)] = in.dout ? in.dout[e] : 0.0;
                }
            for (int64_t j = 0; j < Sk; j++)
                for (int64_t d = 0; d < D; d++) {
                    k[(size_t)(j * D + d)] = in.k[((b * Sk + j) * Hkv + g) * D + d];
                    v[(size_t)(j * D + d)] = in.v[((b * Sk + j) * Hkv + g) * D + d];
                }
            const cpt_oracle_shape one = {1, n, Sk, 1, 1, D};
            std::vector<double> o((size_t)(n * D)), l((size_t)n);
            cpt_oracle_fwd(&one, q.data(), k.data(), v.data(), pos.data(), in.k_pos, in.mask,
                           in.scale, o.data(), l.data());
            for (int64_t r = 0; r < n; r++) {
                (*lse)[(size_t)((b * Hq + h) * Sq + keep[(size_t)r])] = l[(size_t)r];
                for (int64_t d = 0; d < D; d++)
                    (*out)[(size_t)(((b * Sq + keep[(size_t)r]) * Hq + h) * D + d)] =
                        o[(size_t)(r * D + d)];
            }
            if (!in.dout)
                continue;
            std::vector<double> gq((size_t)(n * D)), gk((size_t)(Sk * D)), gv((size_t)(Sk * D));
            cpt_oracle_bwd(&one, q.data(), k.data(), v.data(), pos.data(), in.k_pos, in.mask,
                           in.scale, g_out.data(), gq.data(), gk.data(), gv.data());
            for (int64_t r = 0; r < n; r++)
                for (int64_t d = 0; d < D; d++)
                    (*dq)[(size_t)(((b * Sq + keep[(size_t)r]) * Hq + h) * D + d)] =
                        gq[(size_t)(r * D + d)];
            for (int64_t j = 0; j < Sk; j++)
                for (int64_t d = 0; d < D; d++) {
                    (*dk)[(size_t)(((b * Sk + j) * Hkv + g) * D + d)] += gk[(size_t)(j * D + d)];
                    (*dv)[(size_t)(((b * Sk + j) * Hkv + g) * D + d)] += gv[(size_t)(j * D + d)];
                }
        }
}

} // namespace cpt_nonfinite
