// The fp64 oracle under the library's one deliberate departure from it (docs/numerics.md,
// "Special values"): a query row that sees keys but whose visible scores are all -inf (from an
// infinite input) is a fully masked row, out 0, lse -inf, dq 0, adding nothing to dk and dv,
// where the oracle's literal softmax gives 0/0 = NaN. Shared by the non-finite cases of the
// public API (nonfinite_test) and of every device (device_conformance.cc).
#ifndef CPT_TESTING_NONFINITE_ORACLE_H
#define CPT_TESTING_NONFINITE_ORACLE_H

#include <cstdint>
#include <vector>

#include "reference/oracle.h"

namespace cpt_nonfinite {

// A query row of one head: batch b, row i (of the rows given), head h.
struct Row {
    int64_t b, i, h;
    bool operator==(const Row &o) const { return b == o.b && i == o.i && h == o.h; }
};

// The problem as the oracle takes it (dense doubles, GQA as the oracle defines it); dout may be
// NULL (forward only). q_pos / k_pos NULL: positions 0..S-1. The mask has no doc_rows.
struct Inputs {
    cpt_oracle_shape shape;
    const double *q, *k, *v, *dout;
    const int64_t *q_pos, *k_pos;
    const ctxpar_mask_desc *mask;
    double scale;
};

// The rows that see at least one key and whose visible scores scale * q.k are all -inf.
std::vector<Row> MinusInfRows(const Inputs &in);

// out, lse (and, with dout, dq, dk, dv) under the convention: the oracle itself when `rows` is
// empty, else each query head against its K/V head with `rows` left out.
void Oracle(const Inputs &in, const std::vector<Row> &rows, std::vector<double> *out,
            std::vector<double> *lse, std::vector<double> *dq, std::vector<double> *dk,
            std::vector<double> *dv);

} // namespace cpt_nonfinite

#endif // CPT_TESTING_NONFINITE_ORACLE_H
