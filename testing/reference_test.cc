// The fast reference against its own oracle: the plain fp64 oracle (values, dsinks) and the
// plain bound (magnitudes M, M16), feature by feature, at sizes that cross several tiles; the
// selection of rows against the whole computation; thread-count invariance; non-finite inputs.
#include "reference/reference.h"
#include "reference/reference_gemm.h"

#include <omp.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "reference/data.h"
#include "reference/oracle.h"
#include "reference/tolerance.h"

namespace {

using Vec = std::vector<double>;

struct Case {
    std::string name;
    cpt_oracle_shape sh;
    ctxpar_mask_desc mask = {};
    int64_t dv = 0;       // MLA
    double softcap = 0.0; // soft-capping
    bool sinks = false;
    std::vector<int32_t> cu;  // documents (the mask's, or per batch row when per_row)
    int64_t num_docs = 0;
    bool per_row = false;
    std::vector<int64_t> q_pos, k_pos; // empty: 0..S-1
    bool backward = true;
};

int64_t DimV(const Case &c) { return c.dv > 0 ? c.dv : c.sh.head_dim; }

Vec Random(uint64_t id, size_t n, double mul = 1.0) {
    Vec x(n);
    for (size_t i = 0; i < n; i++)
        x[i] = mul * cpt_test_value(7, id, i);
    return x;
}

struct Problem {
    Case c;
    Vec q, k, v, dout, sinks;
    ctxpar_mask_desc mask;
    cpt_oracle_features f = {};
    explicit Problem(const Case &cs) : c(cs), mask(cs.mask) {
        const cpt_oracle_shape &s = c.sh;
        q = Random(1, s.batch * s.seq_q * s.heads_q * s.head_dim, 2.0);
        k = Random(2, s.batch * s.seq_k * s.heads_kv * s.head_dim);
        v = Random(3, s.batch * s.seq_k * s.heads_kv * DimV(c));
        dout = Random(4, s.batch * s.seq_q * s.heads_q * DimV(c));
        if (c.sinks)
            sinks = Random(5, s.heads_q, 2.0);
        f.head_dim_v = DimV(c);
        f.softcap = c.softcap;
        f.sinks = c.sinks ? sinks.data() : nullptr;
        if (!c.cu.empty() && c.per_row) {
            f.row_cu_seqlens = c.cu.data();
            f.row_num_docs = c.num_docs;
        } else if (!c.cu.empty()) {
            mask.cu_seqlens = c.cu.data();
            mask.num_docs = c.num_docs;
        }
    }
    const int64_t *qp() const { return c.q_pos.empty() ? nullptr : c.q_pos.data(); }
    const int64_t *kp() const { return c.k_pos.empty() ? nullptr : c.k_pos.data(); }
    const double *dO() const { return c.backward ? dout.data() : nullptr; }
};

// Element counts of out, lse, dq, dk, dv for n_q query rows and n_k key rows.
std::vector<size_t> Counts(const Case &c, int64_t nq, int64_t nk) {
    const cpt_oracle_shape &s = c.sh;
    return {size_t(s.batch * nq * s.heads_q * DimV(c)), size_t(s.batch * s.heads_q * nq),
            size_t(s.batch * nq * s.heads_q * s.head_dim),
            size_t(s.batch * nk * s.heads_kv * s.head_dim),
            size_t(s.batch * nk * s.heads_kv * DimV(c))};
}

struct Full {
    Vec t[5], mag[5], mag16[5], ds, mds, mds16;
};

Full Fast(const Problem &pr, const cpt_ref_select *sel = nullptr) {
    const Case &c = pr.c;
    const int64_t nq = sel && sel->q_rows ? sel->n_q : c.sh.seq_q;
    const int64_t nk = sel && sel->k_rows ? sel->n_k : c.sh.seq_k;
    std::vector<size_t> n = Counts(c, nq, nk);
    Full r;
    cpt_ref_out o = {};
    for (int i = 0; i < 5; i++) {
        if (i >= 2 && !c.backward)
            continue;
        r.t[i].assign(n[i], -7.0);
        r.mag[i].assign(n[i], -7.0);
        r.mag16[i].assign(n[i], -7.0);
        o.t[i] = r.t[i].data();
        o.mag[i] = r.mag[i].data();
        o.mag16[i] = r.mag16[i].data();
    }
    if (c.backward) {
        r.ds.assign(c.sh.heads_q, -7.0);
        r.mds = r.ds;
        r.mds16 = r.ds;
        o.dsinks = r.ds.data();
        o.mdsinks = r.mds.data();
        o.mdsinks16 = r.mds16.data();
    }
    ctxpar_status st = cpt_reference(&c.sh, pr.q.data(), pr.k.data(), pr.v.data(), pr.dO(),
                                     pr.qp(), pr.kp(), &pr.mask, &pr.f, 0.7, sel, nullptr, &o);
    EXPECT_EQ(st, CTXPAR_OK) << ctxpar_last_error();
    return r;
}

// The plain oracle and the plain bound; the bound takes per-row documents one batch row at a time.
Full Plain(const Problem &pr) {
    const Case &c = pr.c;
    const cpt_oracle_shape &s = c.sh;
    std::vector<size_t> n = Counts(c, s.seq_q, s.seq_k);
    Full r;
    for (int i = 0; i < 5; i++) {
        r.t[i].assign(n[i], 0.0);
        r.mag[i].assign(n[i], 0.0);
        r.mag16[i].assign(n[i], 0.0);
    }
    r.ds.assign(s.heads_q, 0.0);
    r.mds = r.ds;
    r.mds16 = r.ds;
    cpt_oracle_fwd_ex(&s, pr.q.data(), pr.k.data(), pr.v.data(), pr.qp(), pr.kp(), &pr.mask,
                      &pr.f, 0.7, r.t[0].data(), r.t[1].data());
    if (c.backward)
        cpt_oracle_bwd_ex(&s, pr.q.data(), pr.k.data(), pr.v.data(), pr.qp(), pr.kp(), &pr.mask,
                          &pr.f, 0.7, pr.dout.data(), r.t[2].data(), r.t[3].data(),
                          r.t[4].data(), r.ds.data());
    const int64_t rows = c.per_row ? s.batch : 1;
    cpt_oracle_shape one = s;
    one.batch = c.per_row ? 1 : s.batch;
    for (int64_t b = 0; b < rows; b++) {
        ctxpar_mask_desc m = pr.mask;
        cpt_oracle_features f = pr.f;
        if (c.per_row) {
            m.cu_seqlens = c.cu.data() + b * (c.num_docs + 1);
            m.num_docs = c.num_docs;
            f.row_cu_seqlens = nullptr;
        }
        const int64_t D = s.head_dim, Dv = DimV(c), H = s.heads_q, Hk = s.heads_kv;
        const size_t off[5] = {size_t(b * s.seq_q * H * Dv), size_t(b * H * s.seq_q),
                               size_t(b * s.seq_q * H * D), size_t(b * s.seq_k * Hk * D),
                               size_t(b * s.seq_k * Hk * Dv)};
        cpt_magnitudes mag;
        for (int i = 0; i < 5; i++) {
            mag.t[i] = r.mag[i].data() + off[i];
            mag.t16[i] = r.mag16[i].data() + off[i];
        }
        Vec mds(H, 0.0), mds16(H, 0.0);
        ctxpar_status st = cpt_bound_magnitudes_ex(
            &one, pr.q.data() + off[2], pr.k.data() + off[3], pr.v.data() + off[4],
            c.backward ? pr.dout.data() + off[0] : nullptr, pr.qp(), pr.kp(), &m, &f, 0.7, &mag,
            mds.data(), mds16.data());
        EXPECT_EQ(st, CTXPAR_OK) << ctxpar_last_error();
        for (int64_t h = 0; h < H; h++) {
            r.mds[h] += mds[h];
            r.mds16[h] += mds16[h];
        }
    }
    return r;
}

// Equal to fp64 rounding: every element within 1e-12 of the tensor's largest magnitude, for
// values that cancel (out, dq, ...), and of its own size for magnitudes (sums of |terms|).
void ExpectClose(const Vec &got, const Vec &want, bool relative_each, const std::string &what) {
    ASSERT_EQ(got.size(), want.size()) << what;
    double scale = 0.0;
    for (double x : want)
        if (std::isfinite(x))
            scale = std::fmax(scale, std::fabs(x));
    size_t bad = 0;
    for (size_t i = 0; i < got.size(); i++) {
        if (std::isinf(want[i]) || std::isnan(want[i])) {
            if (!(got[i] == want[i] || (std::isnan(got[i]) && std::isnan(want[i]))) && bad++ < 3)
                ADD_FAILURE() << what << "[" << i << "]: " << got[i] << " vs " << want[i];
            continue;
        }
        const double tol = 1e-12 * (relative_each ? std::fabs(want[i]) : scale) + 1e-300;
        if (!(std::fabs(got[i] - want[i]) <= tol) && bad++ < 3)
            ADD_FAILURE() << what << "[" << i << "]: " << got[i] << " vs " << want[i];
    }
    EXPECT_EQ(bad, 0u) << what;
}

const char *kNames[5] = {"out", "lse", "dq", "dk", "dv"};

void ExpectSameAsPlain(const Case &c) {
    SCOPED_TRACE(c.name);
    Problem pr(c);
    Full fast = Fast(pr), plain = Plain(pr);
    for (int i = 0; i < (c.backward ? 5 : 2); i++) {
        ExpectClose(fast.t[i], plain.t[i], false, std::string(kNames[i]));
        ExpectClose(fast.mag[i], plain.mag[i], true, std::string("M ") + kNames[i]);
        ExpectClose(fast.mag16[i], plain.mag16[i], true, std::string("M16 ") + kNames[i]);
    }
    if (c.backward) {
        ExpectClose(fast.ds, plain.ds, false, "dsinks");
        ExpectClose(fast.mds, plain.mds, true, "M dsinks");
        ExpectClose(fast.mds16, plain.mds16, true, "M16 dsinks");
    }
    // The comparison saw real numbers: some output is far from zero.
    double top = 0.0;
    for (double x : plain.t[0])
        top = std::fmax(top, std::fabs(x));
    EXPECT_GT(top, 0.1);
}

// 300 rows: two full tiles of 128 and a partial one, so masks cross tile boundaries.
Case Base(const std::string &name) {
    Case c;
    c.name = name;
    c.sh = {2, 300, 300, 4, 2, 16};
    return c;
}

TEST(Reference, NoMaskGqa) { ExpectSameAsPlain(Base("no mask, GQA 4/2")); }

TEST(Reference, Causal) {
    Case c = Base("causal");
    c.mask.causal = 1;
    ExpectSameAsPlain(c);
}

TEST(Reference, ForwardOnly) {
    Case c = Base("forward only");
    c.mask.causal = 1;
    c.backward = false;
    ExpectSameAsPlain(c);
}

TEST(Reference, SlidingAndTwoSidedWindows) {
    Case c = Base("causal window 70");
    c.mask.causal = 1;
    c.mask.window_left = 70;
    ExpectSameAsPlain(c);
    c = Base("two-sided window 50 / 9");
    c.mask.window_left = 50;
    c.mask.window_right = 9;
    ExpectSameAsPlain(c);
}

TEST(Reference, DocumentsWithEmptyOnes) {
    Case c = Base("documents, empty ones");
    c.mask.causal = 1;
    c.cu = {0, 0, 100, 129, 129, 290, 300};
    c.num_docs = 6;
    ExpectSameAsPlain(c);
}

TEST(Reference, DocumentsPerBatchRow) {
    Case c = Base("documents per batch row");
    c.cu = {0, 5, 200, 200, 300, /* row 1 */ 0, 0, 0, 131, 300};
    c.num_docs = 4;
    c.per_row = true;
    c.mask.causal = 1;
    ExpectSameAsPlain(c);
}

TEST(Reference, MlaSoftcapSinks) {
    Case c = Base("MLA 16/12, softcap 1.5, sinks, causal");
    c.dv = 12;
    c.softcap = 1.5;
    c.sinks = true;
    c.mask.causal = 1;
    ExpectSameAsPlain(c);
}

TEST(Reference, MqaUnevenCustomPositions) {
    // One K/V head for 3 query heads; queries and keys at scattered, unsorted positions (a custom
    // layout's shard against another's), with rows that see no key.
    Case c;
    c.name = "MQA, custom positions";
    c.sh = {1, 150, 170, 3, 1, 8};
    c.mask.causal = 1;
    for (int64_t i = 0; i < 150; i++)
        c.q_pos.push_back((i * 37) % 211);
    for (int64_t j = 0; j < 170; j++)
        c.k_pos.push_back(20 + (j * 53) % 190);
    c.sinks = true;
    ExpectSameAsPlain(c);
}

// Queries shorter than the keys (params.q_len): N queries at the last N positions of S keys,
// causal aligned bottom-right, forward only as the library runs it; N = 1, 4, 64 and S/4, with
// a window, documents the queries extend, MLA, soft-capping and sinks.
TEST(Reference, QueriesAtTheLastPositions) {
    const int64_t S = 300;
    for (int64_t n : {int64_t{1}, int64_t{4}, int64_t{64}, S / 4}) {
        Case c;
        c.name = "q_len " + std::to_string(n);
        c.sh = {2, n, S, 4, 2, 16};
        c.backward = false;
        c.mask.causal = 1;
        for (int64_t i = 0; i < n; i++)
            c.q_pos.push_back(S - n + i);
        ExpectSameAsPlain(c);
        c.name += ", window 70, documents, MLA 16/12, softcap, sinks";
        c.mask.window_left = 70;
        c.cu = {0, 100, 129, 290, 300};
        c.num_docs = 4;
        c.dv = 12;
        c.softcap = 1.5;
        c.sinks = true;
        ExpectSameAsPlain(c);
    }
}

TEST(Reference, SelectedRowsEqualTheWholeComputation) {
    for (bool backward : {true, false}) {
        Case c = Base("selection");
        c.mask.causal = 1;
        c.sinks = true;
        c.softcap = 2.0;
        c.backward = backward;
        Problem pr(c);
        Full whole = Fast(pr);
        const std::vector<int64_t> qr = {0, 1, 127, 128, 200, 299}, kr = {0, 5, 128, 299};
        cpt_ref_select sel = {qr.data(), int64_t(qr.size()), kr.data(), int64_t(kr.size())};
        Full part = Fast(pr, &sel);
        const cpt_oracle_shape &s = c.sh;
        const int64_t H = s.heads_q, Hk = s.heads_kv, D = s.head_dim, Dv = DimV(c);
        for (int64_t b = 0; b < s.batch; b++)
            for (size_t x = 0; x < qr.size(); x++)
                for (int64_t h = 0; h < H; h++) {
                    const int64_t i = qr[x];
                    const size_t w = size_t(b * s.seq_q + i) * H + h, g = size_t(b * qr.size() + x) * H + h;
                    const size_t wl = size_t(b * H + h) * s.seq_q + i, gl = size_t(b * H + h) * qr.size() + x;
                    EXPECT_NEAR(part.t[1][gl], whole.t[1][wl], 1e-13);
                    EXPECT_NEAR(part.mag[1][gl], whole.mag[1][wl], 1e-12 * whole.mag[1][wl]);
                    for (int64_t d = 0; d < Dv; d++) {
                        EXPECT_NEAR(part.t[0][g * Dv + d], whole.t[0][w * Dv + d], 1e-13);
                        EXPECT_NEAR(part.mag[0][g * Dv + d], whole.mag[0][w * Dv + d],
                                    1e-12 * whole.mag[0][w * Dv + d]);
                    }
                    for (int64_t d = 0; backward && d < D; d++) {
                        EXPECT_NEAR(part.t[2][g * D + d], whole.t[2][w * D + d], 1e-13);
                        EXPECT_NEAR(part.mag16[2][g * D + d], whole.mag16[2][w * D + d],
                                    1e-12 * whole.mag16[2][w * D + d]);
                    }
                }
        for (int64_t b = 0; backward && b < s.batch; b++)
            for (size_t x = 0; x < kr.size(); x++)
                for (int64_t h = 0; h < Hk; h++) {
                    const size_t w = size_t(b * s.seq_k + kr[x]) * Hk + h;
                    const size_t g = size_t(b * kr.size() + x) * Hk + h;
                    for (int64_t d = 0; d < D; d++) {
                        EXPECT_NEAR(part.t[3][g * D + d], whole.t[3][w * D + d], 1e-13);
                        EXPECT_NEAR(part.mag[3][g * D + d], whole.mag[3][w * D + d],
                                    1e-12 * whole.mag[3][w * D + d]);
                    }
                    for (int64_t d = 0; d < Dv; d++)
                        EXPECT_NEAR(part.t[4][g * Dv + d], whole.t[4][w * Dv + d], 1e-13);
                }
        for (int64_t h = 0; backward && h < s.heads_q; h++)
            EXPECT_EQ(part.ds[h], whole.ds[h]); // every row, whatever the selection
    }
}

TEST(Reference, SameBitsForAnyThreadCount) {
    Case c = Base("threads");
    c.mask.causal = 1;
    c.sinks = true;
    Problem pr(c);
    const int before = omp_get_max_threads();
    omp_set_num_threads(1);
    Full one = Fast(pr);
    omp_set_num_threads(3);
    Full three = Fast(pr);
    omp_set_num_threads(before);
    for (int i = 0; i < 5; i++) {
        EXPECT_EQ(0, std::memcmp(one.t[i].data(), three.t[i].data(), one.t[i].size() * 8)) << i;
        EXPECT_EQ(0, std::memcmp(one.mag[i].data(), three.mag[i].data(), one.mag[i].size() * 8));
    }
    EXPECT_EQ(0, std::memcmp(one.ds.data(), three.ds.data(), one.ds.size() * 8));
}

TEST(Reference, NonFiniteInputsStayWhereTheMaskLetsThem) {
    // A NaN in a key and an infinity in a value late in the sequence: causal rows before them must
    // not see either (the plain oracle never touches them), rows after them must be NaN, as the
    // oracle's are.
    Case c = Base("non-finite");
    c.sh.batch = 1;
    c.mask.causal = 1;
    Problem pr(c);
    pr.k[(200 * c.sh.heads_kv + 1) * c.sh.head_dim + 3] = NAN;
    pr.v[(250 * c.sh.heads_kv + 0) * c.sh.head_dim + 2] = INFINITY;
    pr.q[(40 * c.sh.heads_q + 2) * c.sh.head_dim] = NAN;
    Full fast = Fast(pr), plain = Plain(pr);
    for (int i = 0; i < 5; i++)
        ExpectClose(fast.t[i], plain.t[i], false, kNames[i]);
    size_t finite = 0, nan = 0;
    for (double x : fast.t[0])
        (std::isnan(x) ? nan : finite) += 1;
    EXPECT_GT(finite, 0u);
    EXPECT_GT(nan, 0u);
}

TEST(Reference, BadArgumentsFillNaNAndSayWhy) {
    cpt_oracle_shape sh = {1, 4, 4, 3, 2, 8}; // 3 query heads over 2 K/V heads
    Vec q(96, 0.1), k(64, 0.1), v(64, 0.1), out(96, 0.0), lse(12, 0.0);
    cpt_ref_out o = {};
    o.t[0] = out.data();
    o.t[1] = lse.data();
    EXPECT_EQ(cpt_reference(&sh, q.data(), k.data(), v.data(), nullptr, nullptr, nullptr,
                            nullptr, nullptr, 1.0, nullptr, nullptr, &o),
              CTXPAR_ERR_INVALID_ARG);
    EXPECT_NE(std::strstr(ctxpar_last_error(), "heads_q 3"), nullptr) << ctxpar_last_error();
    for (double x : out)
        EXPECT_TRUE(std::isnan(x));
    sh.heads_q = 2;
    const int64_t unsorted[] = {2, 1};
    cpt_ref_select sel = {unsorted, 2, nullptr, 0};
    EXPECT_EQ(cpt_reference(&sh, q.data(), k.data(), v.data(), nullptr, nullptr, nullptr,
                            nullptr, nullptr, 1.0, &sel, nullptr, &o),
              CTXPAR_ERR_INVALID_ARG);
    EXPECT_TRUE(std::isnan(out[0]));
}

// The product used where OpenBLAS is not built in (valgrind's run), in every build: each
// transpose, sizes on and off its blocks (4 x 8 corners, 64-wide panels) and strides wider than
// the rows, against the sum written out here; beta 0 must not read C (NaN there stays unseen).
TEST(Reference, PlainMatrixProductIsTheWrittenOutSum) {
    uint64_t x = 12345;
    auto rnd = [&x]() {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        return (double)(x >> 11) / 9007199254740992.0 - 0.5;
    };
    const int64_t sizes[][3] = {{1, 1, 1}, {4, 8, 3}, {5, 9, 64}, {67, 130, 65}, {64, 64, 129}};
    for (const auto &sz : sizes)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++)
                for (double beta : {0.0, 0.5}) {
                    const int64_t m = sz[0], n = sz[1], k = sz[2], pad = 3;
                    const int64_t lda = (ta ? m : k) + pad, ldb = (tb ? k : n) + pad, ldc = n + pad;
                    Vec A((size_t)((ta ? k : m) * lda)), B((size_t)((tb ? n : k) * ldb));
                    Vec C((size_t)(m * ldc));
                    for (double &a : A)
                        a = rnd();
                    for (double &b : B)
                        b = rnd();
                    for (double &c : C)
                        c = beta == 0.0 ? NAN : rnd();
                    const Vec C0 = C;
                    ref_dgemm_plain(ta, tb, m, n, k, 1.5, A.data(), lda, B.data(), ldb, beta,
                                    C.data(), ldc);
                    size_t wrong = 0;
                    for (int64_t i = 0; i < m; i++)
                        for (int64_t j = 0; j < n; j++) {
                            double s = 0.0, mag = 0.0;
                            for (int64_t l = 0; l < k; l++) {
                                const double t =
                                    (ta ? A[(size_t)(l * lda + i)] : A[(size_t)(i * lda + l)]) *
                                    (tb ? B[(size_t)(j * ldb + l)] : B[(size_t)(l * ldb + j)]);
                                s += t;
                                mag += std::fabs(t);
                            }
                            const double c0 = C0[(size_t)(i * ldc + j)];
                            const double want = 1.5 * s + (beta == 0.0 ? 0.0 : beta * c0);
                            const double tol =
                                1e-14 * (1.5 * mag + (beta == 0.0 ? 0.0 : std::fabs(beta * c0)));
                            wrong += !(std::fabs(C[(size_t)(i * ldc + j)] - want) <= tol);
                        }
                    // The padding between rows of C is left as it was.
                    for (int64_t i = 0; i < m; i++)
                        for (int64_t j = n; j < ldc; j++)
                            wrong += std::memcmp(&C[(size_t)(i * ldc + j)],
                                                 &C0[(size_t)(i * ldc + j)], sizeof(double)) != 0;
                    EXPECT_EQ(wrong, 0u)
                        << m << "x" << n << "x" << k << " trans " << ta << tb << " beta " << beta;
                }
}

} // namespace
