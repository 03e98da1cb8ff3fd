// `ctxpar audit --against` as users run it: results made here the way another implementation
// would make them (correct, or with one planted bug of the kind context parallelism breeds) are
// judged by the tool, which must say consistent (exit 0) or not (exit 1) and name the rank that
// holds the bad rows. Inputs and every "third-party" result are computed here with the float64
// oracle (reference/oracle.c) on inputs made here; the zigzag positions are written out here too.
// Also: base-2 LSE, every tensor order and file kind read as declared, per-rank shards, and
// malformed files (exit 2, one line naming the file).
#include <jansson.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <sys/stat.h>

#include "reference/data.h"
#include "testing/naive_f32.h"
#include "reference/npy.h"
#include "reference/oracle.h"
#include "reference/safetensors.h"
#include "tools/ctxpar/tool_run.h"

namespace {

using cpt_tool::Lines;
using cpt_tool::Outcome;
using cpt_tool::TempDir;
using cpt_tool::Tool;

constexpr int64_t kB = 1, kS = 64, kH = 2, kD = 16;
constexpr int kP = 4;
constexpr int64_t kChunk = kS / (2 * kP); // zigzag: 2P chunks, rank r holds r and 2P-1-r

std::vector<int64_t> Zigzag(int r) {
    std::vector<int64_t> pos;
    for (int64_t c : {(int64_t)r, (int64_t)(2 * kP - 1 - r)})
        for (int64_t i = 0; i < kChunk; i++)
            pos.push_back(c * kChunk + i);
    return pos;
}

std::vector<int64_t> AllBut(const std::vector<int64_t> &drop) {
    std::vector<int64_t> keep;
    for (int64_t s = 0; s < kS; s++)
        if (std::find(drop.begin(), drop.end(), s) == drop.end())
            keep.push_back(s);
    return keep;
}

using Vec = std::vector<double>;

size_t Row(int64_t s) {
    return static_cast<size_t>(s * kH * kD);
} // [1, S, H, D], batch 1

// Values in [-1, 1) rounded to dtype.
Vec Input(ctxpar_dtype dtype, uint64_t id) {
    Vec v(static_cast<size_t>(kB * kS * kH * kD));
    for (size_t i = 0; i < v.size(); i++)
        v[i] = cpt_test_round(dtype, cpt_test_value(7, id, i));
    return v;
}

struct Problem {
    ctxpar_dtype dtype;
    Vec q, k, v, dout;
    Vec out, lse, dq, dk, dv; // the oracle: out/dq/dk/dv [B, S, H, D], lse [B, H, S]
};

double Scale() {
    return (double)(1.0f / std::sqrt((float)kD));
}

ctxpar_mask_desc Causal() {
    return ctxpar_mask_desc{1, 0, nullptr, 0, 0, 0};
}

// Two packed documents (THD) for the TransformerEngine-style tests: 16 and 48 tokens, each a
// multiple of 2P so that each splits into 2P chunks.
const int32_t kCu[3] = {0, 16, 64};

// Rank r's positions under TransformerEngine's THD zigzag: chunks r and 2P-1-r of every
// document.
std::vector<int64_t> ZigzagPerDoc(int r) {
    std::vector<int64_t> pos;
    for (int d = 0; d < 2; d++) {
        int64_t c = (kCu[d + 1] - kCu[d]) / (2 * kP);
        for (int64_t chunk : {(int64_t)r, (int64_t)(2 * kP - 1 - r)})
            for (int64_t i = 0; i < c; i++)
                pos.push_back(kCu[d] + chunk * c + i);
    }
    return pos;
}

Vec Gather(const Vec &t, const std::vector<int64_t> &pos) {
    Vec g;
    for (int64_t s : pos)
        g.insert(g.end(), t.begin() + Row(s), t.begin() + Row(s + 1));
    return g;
}

// Causal attention of the queries at qpos over the keys at kpos: out rows [qpos, H, D] and lse
// [H, qpos].
void Attend(const Problem &p, const std::vector<int64_t> &qpos, const std::vector<int64_t> &kpos,
            Vec *out, Vec *lse) {
    cpt_oracle_shape sh = {kB, (int64_t)qpos.size(), (int64_t)kpos.size(), kH, kH, kD};
    Vec q = Gather(p.q, qpos), k = Gather(p.k, kpos), v = Gather(p.v, kpos);
    out->assign(q.size(), 0);
    lse->assign(qpos.size() * kH, 0);
    ctxpar_mask_desc m = Causal();
    cpt_oracle_fwd(&sh, q.data(), k.data(), v.data(), qpos.data(), kpos.data(), &m, Scale(),
                      out->data(), lse->data());
}

Problem MakeProblem(ctxpar_dtype dtype, bool backward, bool docs = false) {
    Problem p{dtype, Input(dtype, 1), Input(dtype, 2), Input(dtype, 3), {}, {}, {}, {}, {}, {}};
    cpt_oracle_shape sh = {kB, kS, kS, kH, kH, kD};
    ctxpar_mask_desc m = Causal();
    if (docs)
        m.cu_seqlens = kCu, m.num_docs = 2;
    p.out.resize(p.q.size());
    p.lse.resize(static_cast<size_t>(kH * kS));
    cpt_oracle_fwd(&sh, p.q.data(), p.k.data(), p.v.data(), nullptr, nullptr, &m, Scale(),
                      p.out.data(), p.lse.data());
    if (backward) {
        p.dout = Input(dtype, 4);
        p.dq.resize(p.q.size());
        p.dk.resize(p.q.size());
        p.dv.resize(p.q.size());
        cpt_oracle_bwd(&sh, p.q.data(), p.k.data(), p.v.data(), nullptr, nullptr, &m, Scale(),
                          p.dout.data(), p.dq.data(), p.dk.data(), p.dv.data());
    }
    return p;
}

// ---------------------------------------------------------------- files

std::string Dir(const std::string &name) {
    std::string d = TempDir() + "/audit_" + name;
    mkdir(d.c_str(), 0777);
    return d;
}

// One named tensor: values, dims as stored, and the dtype to store them in.
struct Named {
    std::string name;
    Vec v;
    std::vector<int64_t> shape;
    ctxpar_dtype dtype;
};

// Stored bytes of doubles in dtype (rounded to nearest even).
std::vector<unsigned char> Bytes(const Vec &v, ctxpar_dtype dtype) {
    std::vector<unsigned char> raw(v.size() * ctxpar_dtype_size(dtype) + 1);
    ctxpar_tensor t = ctxpar_tensor_bshd(raw.data(), dtype, 1, (int64_t)v.size(), 1, 1);
    for (size_t i = 0; i < v.size(); i++)
        cpt_test_set(&t, 0, (int64_t)i, 0, 0, v[i]);
    return raw;
}

cpt_npy_dtype NpyType(ctxpar_dtype d) {
    return d == CTXPAR_DTYPE_BF16  ? CPT_NPY_BF16
           : d == CTXPAR_DTYPE_F16 ? CPT_NPY_F16
                                   : CPT_NPY_F32;
}

void WriteSafetensors(const std::string &path, const std::vector<Named> &ts) {
    std::vector<std::vector<unsigned char>> bytes;
    std::vector<cpt_st_tensor> st;
    for (const Named &t : ts)
        bytes.push_back(Bytes(t.v, t.dtype));
    for (size_t i = 0; i < ts.size(); i++) {
        cpt_npy_array a{};
        a.dtype = NpyType(ts[i].dtype);
        a.ndim = (int)ts[i].shape.size();
        for (int d = 0; d < a.ndim; d++)
            a.shape[d] = ts[i].shape[d];
        a.count = ts[i].v.size();
        a.data = bytes[i].data();
        st.push_back(cpt_st_tensor{const_cast<char *>(ts[i].name.c_str()), a});
    }
    ASSERT_EQ(cpt_st_write(path.c_str(), (int)st.size(), st.data()), CTXPAR_OK)
        << ctxpar_last_error();
}

void WriteNpy(const std::string &path, const Named &t) {
    std::vector<unsigned char> b = Bytes(t.v, t.dtype);
    ASSERT_EQ(cpt_npy_write(path.c_str(), NpyType(t.dtype), (int)t.shape.size(), t.shape.data(),
                               b.data()),
              CTXPAR_OK)
        << ctxpar_last_error();
}

const std::vector<int64_t> kBSHD = {kB, kS, kH, kD}, kBHS = {kB, kH, kS};

std::string WriteInputs(const std::string &dir, const Problem &p) {
    std::vector<Named> ts = {
        {"q", p.q, kBSHD, p.dtype}, {"k", p.k, kBSHD, p.dtype}, {"v", p.v, kBSHD, p.dtype}};
    if (!p.dout.empty())
        ts.push_back({"dout", p.dout, kBSHD, p.dtype});
    std::string path = dir + "/inputs.safetensors";
    WriteSafetensors(path, ts);
    return path;
}

// A third party's results: out and lse, and dq, dk, dv when given.
struct Results {
    Vec out, lse, dq, dk, dv;
};

Results Correct(const Problem &p) {
    return Results{p.out, p.lse, p.dq, p.dk, p.dv};
}

std::string WriteResults(const std::string &dir, const Problem &p, const Results &r) {
    std::vector<Named> ts = {{"out", r.out, kBSHD, p.dtype},
                             {"lse", r.lse, kBHS, CTXPAR_DTYPE_F32}};
    if (!r.dq.empty()) {
        ts.push_back({"dq", r.dq, kBSHD, p.dtype});
        ts.push_back({"dk", r.dk, kBSHD, p.dtype});
        ts.push_back({"dv", r.dv, kBSHD, p.dtype});
    }
    std::string path = dir + "/results.safetensors";
    WriteSafetensors(path, ts);
    return path;
}

// ---------------------------------------------------------------- the tool's verdict

struct Verdict {
    Outcome o;
    json_t *root = nullptr;
    ~Verdict() { json_decref(root); }
    bool Consistent() const { return json_is_true(json_object_get(root, "consistent")); }
    json_t *Tensor(const char *name) const {
        return json_object_get(json_object_get(root, "against"), name);
    }
    bool TensorOk(const char *name) const {
        return json_is_true(json_object_get(Tensor(name), "consistent"));
    }
    int WorstRank(const char *name) const {
        json_t *r = json_object_get(json_object_get(Tensor(name), "worst"), "rank");
        return json_is_integer(r) ? (int)json_integer_value(r) : -1;
    }
    // The rank with the largest error in error_by_rank.
    int WorstRankByError(const char *name) const {
        json_t *a = json_object_get(Tensor(name), "error_by_rank");
        int best = -1;
        double e = -1;
        for (size_t i = 0; i < json_array_size(a); i++)
            if (json_number_value(json_array_get(a, i)) > e)
                e = json_number_value(json_array_get(a, i)), best = (int)i;
        return best;
    }
};

// Runs the tool's command line cmd (which asks for --json) into v.
void JudgeCommand(const std::string &cmd, Verdict *v) {
    v->o = Tool(cmd);
    json_error_t err;
    v->root = json_loads(v->o.out.c_str(), 0, &err);
    ASSERT_NE(v->root, nullptr) << "stdout is not JSON: " << err.text << "\n"
                                << v->o.out << v->o.err;
}

void Judge(const std::string &args, Verdict *v) {
    JudgeCommand("audit --ranks 4 --layout zigzag --mask causal --json " + args, v);
}

// The tool's judgement of results r on problem p.
void JudgeResults(const std::string &name, const Problem &p, const Results &r, Verdict *v,
                  const std::string &extra = "") {
    std::string dir = Dir(name);
    std::string in = WriteInputs(dir, p), res = WriteResults(dir, p, r);
    Judge("--inputs '" + in + "' --against '" + res + "' " + extra, v);
}

// ---------------------------------------------------------------- correct results

TEST(AuditAgainst, CorrectResultsRoundedToTheDtypeAreConsistent) {
    for (ctxpar_dtype dtype : {CTXPAR_DTYPE_F32, CTXPAR_DTYPE_BF16}) {
        SCOPED_TRACE(ctxpar_dtype_name(dtype));
        Problem p = MakeProblem(dtype, true);
        Verdict v;
        JudgeResults(std::string("correct_") + ctxpar_dtype_name(dtype), p, Correct(p), &v);
        EXPECT_EQ(v.o.code, 0) << v.o.out << v.o.err;
        EXPECT_TRUE(v.Consistent()) << v.o.out;
        for (const char *t : {"out", "lse", "dq", "dk", "dv"}) {
            EXPECT_TRUE(v.TensorOk(t)) << t << ": " << v.o.out;
            json_t *e = json_object_get(v.Tensor(t), "error");
            EXPECT_TRUE(json_is_number(e)) << t;
        }
        EXPECT_STREQ(json_string_value(json_object_get(json_object_get(v.root, "config"), "dtype")),
                     ctxpar_dtype_name(dtype));
    }
}

// Plain float32 attention (full softmax, float32 products: testing/naive_f32) with dO = 1
// (loss = out.sum()): dq nearly cancels there, so a bound against max |dq| cannot judge it; the
// per-element bound accepts it, and --max-ratio 1 (ctxpar's own error as the bar) does not
// change that it is called consistent only through the bound.
TEST(AuditAgainst, PlainFloat32ResultsWithCancellingDqAreConsistent) {
    Problem p = MakeProblem(CTXPAR_DTYPE_F32, true);
    std::fill(p.dout.begin(), p.dout.end(), 1.0);
    cpt_oracle_shape sh = {kB, kS, kS, kH, kH, kD};
    ctxpar_mask_desc m = Causal();
    cpt_oracle_bwd(&sh, p.q.data(), p.k.data(), p.v.data(), nullptr, nullptr, &m, Scale(),
                      p.dout.data(), p.dq.data(), p.dk.data(), p.dv.data());
    std::vector<float> f[4], o(p.q.size()), l(p.lse.size()), dq(p.q.size()), dk(p.q.size()),
        dv(p.q.size());
    const Vec *in[4] = {&p.q, &p.k, &p.v, &p.dout};
    for (int i = 0; i < 4; i++)
        f[i].assign(in[i]->begin(), in[i]->end());
    std::vector<uint8_t> vis((size_t)(kS * kS));
    ASSERT_EQ(cpt_oracle_visibility(&sh, nullptr, nullptr, &m, vis.data()), CTXPAR_OK);
    const float scale = (float)Scale();
    cpt_naive_f32_fwd(&sh, f[0].data(), f[1].data(), f[2].data(), vis.data(), scale, o.data(),
                         l.data());
    cpt_naive_f32_bwd(&sh, f[0].data(), f[1].data(), f[2].data(), vis.data(), scale, o.data(),
                         f[3].data(), dq.data(), dk.data(), dv.data());
    Results r{Vec(o.begin(), o.end()), Vec(l.begin(), l.end()), Vec(dq.begin(), dq.end()),
              Vec(dk.begin(), dk.end()), Vec(dv.begin(), dv.end())};
    Verdict v;
    JudgeResults("naive_f32_dout1", p, r, &v);
    EXPECT_EQ(v.o.code, 0) << v.o.out << v.o.err;
    EXPECT_TRUE(v.Consistent()) << v.o.out;
    for (const char *t : {"out", "lse", "dq", "dk", "dv"}) {
        json_t *b = json_object_get(v.Tensor(t), "bound_ratio");
        ASSERT_TRUE(json_is_number(b)) << t << ": " << v.o.out;
        EXPECT_GT(json_number_value(b), 0.0) << t; // not bitwise the oracle: the bound judged it
        EXPECT_LE(json_number_value(b), 1.0) << t;
    }
}

// ---------------------------------------------------------------- planted bugs

// Results whose rank 2 never got the keys of ring step 1 (rank 1's block): out of rank 2's rows
// (and their lse, with_lse) attend to every key but those.
Results RingStepLostOnRank2(const Problem &p, bool with_lse) {
    Results r = Correct(p);
    std::vector<int64_t> mine = Zigzag(2);
    Vec o, l;
    Attend(p, mine, AllBut(Zigzag(1)), &o, &l);
    for (size_t i = 0; i < mine.size(); i++) {
        std::copy(o.begin() + Row((int64_t)i), o.begin() + Row((int64_t)i + 1),
                  r.out.begin() + Row(mine[i]));
        for (int64_t h = 0; with_lse && h < kH; h++)
            r.lse[h * kS + mine[i]] = l[h * mine.size() + i];
    }
    return r;
}

TEST(AuditAgainst, OneRingStepsKeysMissingOnOneRank) {
    Problem p = MakeProblem(CTXPAR_DTYPE_F32, false);
    Results r = RingStepLostOnRank2(p, true);
    Verdict v;
    JudgeResults("missing_step", p, r, &v);
    EXPECT_EQ(v.o.code, 1) << v.o.out << v.o.err;
    EXPECT_FALSE(v.Consistent());
    EXPECT_FALSE(v.TensorOk("out"));
    EXPECT_EQ(v.WorstRank("out"), 2) << v.o.out;
    EXPECT_EQ(v.WorstRankByError("out"), 2) << v.o.out;
    EXPECT_EQ(v.WorstRank("lse"), 2) << v.o.out;
}

// The same lost ring step, counted: every row of rank 2 fails, in the two runs of its zigzag
// chunks, and the text ends with the verdict on the results (ctxpar's run is the yardstick).
TEST(AuditAgainst, FailingRowsAreCountedAndTheirRunsNamed) {
    Problem p = MakeProblem(CTXPAR_DTYPE_F32, false);
    Results r = RingStepLostOnRank2(p, false);
    const std::vector<int64_t> mine = Zigzag(2);
    Verdict v;
    JudgeResults("missing_step_counted", p, r, &v);
    json_t *out = v.Tensor("out");
    EXPECT_EQ(json_integer_value(json_object_get(out, "failing_rows")), (json_int_t)mine.size());
    const json_int_t elements = json_integer_value(json_object_get(out, "failing_elements"));
    EXPECT_GT(elements, (json_int_t)mine.size());
    EXPECT_LE(elements, (json_int_t)mine.size() * kH * kD);
    EXPECT_EQ(json_integer_value(json_object_get(v.root, "failing_elements")), elements);
    // Zigzag rank 2 of 4 holds chunks 2 and 5 of 8: two runs, both its own.
    json_t *runs = json_object_get(out, "failing_ranges");
    ASSERT_EQ(json_array_size(runs), 2u) << v.o.out;
    const int64_t c = kS / 8;
    for (size_t i = 0; i < 2; i++) {
        json_t *run = json_array_get(runs, i);
        const int64_t chunk = i == 0 ? 2 : 5;
        EXPECT_EQ(json_integer_value(json_object_get(run, "first")), chunk * c);
        EXPECT_EQ(json_integer_value(json_object_get(run, "last")), (chunk + 1) * c - 1);
        EXPECT_EQ(json_integer_value(json_object_get(run, "rank_first")), 2);
        EXPECT_EQ(json_integer_value(json_object_get(run, "rank_last")), 2);
    }
    // Passing rows are not among the worst once rows fail.
    json_t *worst = json_object_get(out, "worst_rows");
    for (size_t i = 0; i < json_array_size(worst); i++)
        EXPECT_GT(json_number_value(json_object_get(json_array_get(worst, i), "bound_ratio")), 1.0);
    EXPECT_EQ(json_integer_value(json_object_get(v.Tensor("lse"), "failing_rows")), 0);
    // The table: ctxpar's run as the yardstick, never "result: OK"; the last line the verdict.
    const std::string dir = Dir("missing_step_counted");
    Outcome t = Tool("audit --ranks 4 --layout zigzag --mask causal --inputs '" + dir +
                     "/inputs.safetensors' --against '" + dir + "/results.safetensors'");
    EXPECT_EQ(t.code, 1) << t.out << t.err;
    EXPECT_EQ(t.out.find("result: OK"), std::string::npos) << t.out;
    EXPECT_NE(t.out.find("yardstick: ctxpar's own run is within its bound"), std::string::npos)
        << t.out;
    std::string last = t.out.substr(t.out.rfind('\n', t.out.size() - 2) + 1);
    EXPECT_EQ(last.rfind("verdict on ", 0), 0u) << last;
    EXPECT_NE(last.find(": NOT CONSISTENT: " + std::to_string(elements) + " elements in " +
                        std::to_string(mine.size()) + " rows out of their bound; worst: out at "
                        "position "),
              std::string::npos)
        << last;
    EXPECT_NE(last.find(", rank 2 (error/bound"), std::string::npos) << last;
    EXPECT_NE(t.out.find("failing rows: " + std::to_string(2 * c) + "-" +
                         std::to_string(3 * c - 1) + " (rank 2), " + std::to_string(5 * c) +
                         "-" + std::to_string(6 * c - 1) + " (rank 2)"),
              std::string::npos)
        << t.out;
}

// Merging partial results (o_a, lse_a), (o_b, lse_b): out = o_a e^(lse_a - lse) +
// o_b e^(lse_b - lse). Rank 1 flips the sign of the exponent of ring step 1's term (the keys of
// rank 0, which every row of rank 1 sees).
TEST(AuditAgainst, LseMergedWithTheWrongSignOnOneStep) {
    Problem p = MakeProblem(CTXPAR_DTYPE_F32, false);
    Results r = Correct(p);
    std::vector<int64_t> mine = Zigzag(1);
    Vec oa, la, ob, lb;
    Attend(p, mine, AllBut(Zigzag(0)), &oa, &la);
    Attend(p, mine, Zigzag(0), &ob, &lb);
    for (size_t i = 0; i < mine.size(); i++)
        for (int64_t h = 0; h < kH; h++) {
            double a = la[h * mine.size() + i], b = lb[h * mine.size() + i];
            ASSERT_TRUE(std::isfinite(a) && std::isfinite(b));
            double m = std::max(a, b), lse = m + std::log(std::exp(a - m) + std::exp(b - m));
            for (int64_t d = 0; d < kD; d++) {
                size_t j = Row((int64_t)i) + (size_t)(h * kD + d);
                r.out[Row(mine[i]) + (size_t)(h * kD + d)] =
                    oa[j] * std::exp(a - lse) + ob[j] * std::exp(lse - b); // the bug: lse - b
            }
        }
    Verdict v;
    JudgeResults("merge_sign", p, r, &v);
    EXPECT_EQ(v.o.code, 1) << v.o.out << v.o.err;
    EXPECT_FALSE(v.TensorOk("out"));
    EXPECT_TRUE(v.TensorOk("lse")) << v.o.out;
    EXPECT_EQ(v.WorstRank("out"), 1) << v.o.out;
    EXPECT_EQ(v.WorstRankByError("out"), 1) << v.o.out;
}

// Rank 3's two zigzag chunks (3 and 4) come back in each other's place.
TEST(AuditAgainst, TwoZigzagChunksSwapped) {
    Problem p = MakeProblem(CTXPAR_DTYPE_F32, false);
    Results r = Correct(p);
    for (int64_t i = 0; i < kChunk; i++) {
        int64_t a = 3 * kChunk + i, b = 4 * kChunk + i;
        std::swap_ranges(r.out.begin() + Row(a), r.out.begin() + Row(a + 1),
                         r.out.begin() + Row(b));
        for (int64_t h = 0; h < kH; h++)
            std::swap(r.lse[h * kS + a], r.lse[h * kS + b]);
    }
    Verdict v;
    JudgeResults("chunks_swapped", p, r, &v);
    EXPECT_EQ(v.o.code, 1) << v.o.out << v.o.err;
    EXPECT_EQ(v.WorstRank("out"), 3) << v.o.out;
    EXPECT_EQ(v.WorstRankByError("out"), 3) << v.o.out;
    EXPECT_EQ(v.WorstRank("lse"), 3) << v.o.out;
}

// Rank 2 rounds each ring step's partial output to BF16 before merging (in an F32 run).
TEST(AuditAgainst, PartialsRoundedToBf16BeforeMerging) {
    Problem p = MakeProblem(CTXPAR_DTYPE_F32, false);
    Results r = Correct(p);
    std::vector<int64_t> mine = Zigzag(2);
    Vec acc(mine.size() * (size_t)(kH * kD), 0.0), lse(mine.size() * (size_t)kH, -INFINITY);
    std::vector<Vec> parts_o, parts_l;
    for (int step = 0; step < kP; step++) {
        Vec o, l;
        Attend(p, mine, Zigzag((2 - step + kP) % kP), &o, &l);
        parts_o.push_back(o);
        parts_l.push_back(l);
        for (size_t i = 0; i < l.size(); i++)
            if (std::isfinite(l[i]))
                lse[i] = std::isfinite(lse[i]) ? std::max(lse[i], l[i]) +
                                                     std::log1p(std::exp(-std::fabs(lse[i] - l[i])))
                                               : l[i];
    }
    for (size_t s = 0; s < parts_o.size(); s++)
        for (size_t i = 0; i < mine.size(); i++)
            for (int64_t h = 0; h < kH; h++) {
                double l = parts_l[s][h * mine.size() + i];
                if (!std::isfinite(l))
                    continue; // no visible key in this step
                double w = std::exp(l - lse[h * mine.size() + i]);
                for (int64_t d = 0; d < kD; d++) {
                    size_t j = Row((int64_t)i) + (size_t)(h * kD + d);
                    acc[j] += cpt_test_round(CTXPAR_DTYPE_BF16, parts_o[s][j]) * w;
                }
            }
    for (size_t i = 0; i < mine.size(); i++)
        std::copy(acc.begin() + Row((int64_t)i), acc.begin() + Row((int64_t)i + 1),
                  r.out.begin() + Row(mine[i]));
    Verdict v;
    JudgeResults("bf16_partials", p, r, &v);
    EXPECT_EQ(v.o.code, 1) << v.o.out << v.o.err;
    EXPECT_FALSE(v.TensorOk("out"));
    EXPECT_EQ(v.WorstRank("out"), 2) << v.o.out;
    EXPECT_EQ(v.WorstRankByError("out"), 2) << v.o.out;
}

// The dK/dV of the keys rank 0 holds lack the contribution of rank 3's queries.
TEST(AuditAgainst, DkDvMissingOneRanksContribution) {
    Problem p = MakeProblem(CTXPAR_DTYPE_F32, true);
    Results r = Correct(p);
    // Zero dout on rank 3's rows: their queries then add nothing to dK and dV (dS = 0 there).
    Vec dout = p.dout;
    for (int64_t s : Zigzag(3))
        std::fill(dout.begin() + Row(s), dout.begin() + Row(s + 1), 0.0);
    cpt_oracle_shape sh = {kB, kS, kS, kH, kH, kD};
    ctxpar_mask_desc m = Causal();
    Vec dq(p.q.size()), dk(p.q.size()), dv(p.q.size());
    cpt_oracle_bwd(&sh, p.q.data(), p.k.data(), p.v.data(), nullptr, nullptr, &m, Scale(),
                      dout.data(), dq.data(), dk.data(), dv.data());
    for (int64_t s : Zigzag(0)) {
        std::copy(dk.begin() + Row(s), dk.begin() + Row(s + 1), r.dk.begin() + Row(s));
        std::copy(dv.begin() + Row(s), dv.begin() + Row(s + 1), r.dv.begin() + Row(s));
    }
    Verdict v;
    JudgeResults("dkdv_missing", p, r, &v);
    EXPECT_EQ(v.o.code, 1) << v.o.out << v.o.err;
    for (const char *t : {"out", "lse", "dq"})
        EXPECT_TRUE(v.TensorOk(t)) << t << ": " << v.o.out;
    for (const char *t : {"dk", "dv"}) {
        EXPECT_FALSE(v.TensorOk(t)) << t;
        EXPECT_EQ(v.WorstRank(t), 0) << t << ": " << v.o.out;
        EXPECT_EQ(v.WorstRankByError(t), 0) << t << ": " << v.o.out;
    }
}

// ---------------------------------------------------------------- LSE base 2

TEST(AuditAgainst, Base2LseConsistentOnlyWhenDeclared) {
    Problem p = MakeProblem(CTXPAR_DTYPE_F32, false);
    Results r = Correct(p);
    for (double &x : r.lse)
        x /= std::log(2.0);
    {
        Verdict v;
        JudgeResults("lse_base2", p, r, &v, "--lse-base 2");
        EXPECT_EQ(v.o.code, 0) << v.o.out << v.o.err;
        EXPECT_TRUE(v.TensorOk("lse"));
    }
    Verdict v;
    JudgeResults("lse_base2_undeclared", p, r, &v);
    EXPECT_EQ(v.o.code, 1) << v.o.out << v.o.err;
    EXPECT_FALSE(v.TensorOk("lse"));
    EXPECT_TRUE(v.TensorOk("out"));
}

// ---------------------------------------------------------------- orders and file kinds

// dims [B, S, H, D] as stored in `format`; values permuted here, independently of the tool.
Named Stored(const std::string &name, const Vec &bshd, const std::string &format,
             ctxpar_dtype dtype) {
    Named t{name, Vec(bshd.size()), {}, dtype};
    for (int64_t s = 0; s < kS; s++)
        for (int64_t h = 0; h < kH; h++)
            for (int64_t d = 0; d < kD; d++) {
                double x = bshd[Row(s) + (size_t)(h * kD + d)];
                size_t i = format == "bhsd" ? (size_t)((h * kS + s) * kD + d)
                                            : Row(s) + (size_t)(h * kD + d); // bshd, sbhd, thd
                t.v[i] = x;
            }
    t.shape = format == "bhsd"   ? std::vector<int64_t>{kB, kH, kS, kD}
              : format == "sbhd" ? std::vector<int64_t>{kS, kB, kH, kD}
              : format == "thd"  ? std::vector<int64_t>{kS, kH, kD}
                                 : kBSHD;
    return t;
}

Named StoredLse(const Vec &bhs, const std::string &layout) {
    Named t{"lse", Vec(bhs.size()), {}, CTXPAR_DTYPE_F32};
    for (int64_t h = 0; h < kH; h++)
        for (int64_t s = 0; s < kS; s++)
            t.v[layout == "bsh" ? (size_t)(s * kH + h) : (size_t)(h * kS + s)] = bhs[h * kS + s];
    t.shape = layout == "bsh"  ? std::vector<int64_t>{kB, kS, kH}
              : layout == "ht" ? std::vector<int64_t>{kH, kS}
                               : kBHS;
    return t;
}

TEST(AuditAgainst, EveryOrderAndFileKindIsReadAsDeclared) {
    Problem p = MakeProblem(CTXPAR_DTYPE_F32, true);
    const char *lse_for[4][2] = {{"bshd", "bhs"}, {"bhsd", "bsh"}, {"sbhd", "bhs"}, {"thd", "ht"}};
    for (auto &fl : lse_for) {
        std::string f = fl[0], l = fl[1];
        for (bool st : {true, false}) {
            SCOPED_TRACE(f + " " + l + (st ? " safetensors" : " npy"));
            std::string dir = Dir("order_" + f + (st ? "_st" : "_npy"));
            std::vector<Named> in = {Stored("q", p.q, f, p.dtype), Stored("k", p.k, f, p.dtype),
                                     Stored("v", p.v, f, p.dtype),
                                     Stored("dout", p.dout, f, p.dtype)};
            std::vector<Named> res = {Stored("out", p.out, f, p.dtype), StoredLse(p.lse, l),
                                      Stored("dq", p.dq, f, p.dtype),
                                      Stored("dk", p.dk, f, p.dtype),
                                      Stored("dv", p.dv, f, p.dtype)};
            std::string args = " --format " + f + " --lse-layout " + l;
            if (st) {
                WriteSafetensors(dir + "/in.safetensors", in);
                WriteSafetensors(dir + "/res.safetensors", res);
                args += " --inputs '" + dir + "/in.safetensors' --against '" + dir +
                        "/res.safetensors' --save '" + dir + "/saved'";
            } else {
                mkdir((dir + "/in").c_str(), 0777);
                mkdir((dir + "/res").c_str(), 0777);
                for (const Named &t : in)
                    WriteNpy(dir + "/in/" + t.name + ".npy", t);
                for (const Named &t : res)
                    WriteNpy(dir + "/res/" + t.name + ".npy", t);
                args += " --inputs '" + dir + "/in' --against '" + dir + "/res'";
            }
            Verdict v;
            Judge(args, &v);
            EXPECT_EQ(v.o.code, 0) << v.o.out << v.o.err;
            EXPECT_TRUE(v.Consistent()) << v.o.out;
            if (!st)
                continue;
            // --save stored ctxpar's results the same way: as results they are consistent too.
            Verdict again;
            Judge(" --format " + f + " --lse-layout " + l + " --inputs '" + dir +
                      "/in.safetensors' --against '" + dir + "/saved/cpt_results.safetensors'",
                  &again);
            EXPECT_EQ(again.o.code, 0) << again.o.out << again.o.err;
        }
    }
}

// ---------------------------------------------------------------- per-rank shards

TEST(AuditAgainst, PerRankShardsAssembledByTheLayout) {
    Problem p = MakeProblem(CTXPAR_DTYPE_F32, true);
    std::string dir = Dir("shards");
    std::vector<Named> globals = {{"q", p.q, kBSHD, p.dtype},     {"k", p.k, kBSHD, p.dtype},
                                  {"v", p.v, kBSHD, p.dtype},     {"dout", p.dout, kBSHD, p.dtype},
                                  {"out", p.out, kBSHD, p.dtype}, {"dq", p.dq, kBSHD, p.dtype},
                                  {"dk", p.dk, kBSHD, p.dtype},   {"dv", p.dv, kBSHD, p.dtype}};
    for (int r = 0; r < kP; r++) {
        std::vector<int64_t> mine = Zigzag(r);
        for (const Named &g : globals) {
            Named t{g.name, Gather(g.v, mine), {kB, (int64_t)mine.size(), kH, kD}, g.dtype};
            WriteNpy(dir + "/" + g.name + ".rank" + std::to_string(r) + ".npy", t);
        }
        Named l{"lse", {}, {kB, kH, (int64_t)mine.size()}, CTXPAR_DTYPE_F32};
        for (int64_t h = 0; h < kH; h++)
            for (int64_t s : mine)
                l.v.push_back(p.lse[h * kS + s]);
        WriteNpy(dir + "/lse.rank" + std::to_string(r) + ".npy", l);
    }
    std::string pattern = "'" + dir + "/{name}.rank{rank}.npy'";
    Verdict v;
    Judge("--shards " + pattern + " --save '" + dir + "/saved'", &v);
    EXPECT_EQ(v.o.code, 0) << v.o.out << v.o.err;
    EXPECT_TRUE(v.Consistent()) << v.o.out;
    // Saved as shards named like the inputs' (one per rank and tensor).
    cpt_npy_array a;
    ASSERT_EQ(cpt_npy_read((dir + "/saved/out.rank3.npy").c_str(), &a), CTXPAR_OK);
    EXPECT_EQ(a.shape[1], kS / kP);
    cpt_npy_free(&a);

    // Assembled under another layout, the same shards are wrong.
    Verdict wrong;
    Judge("--shards " + pattern + " --layout contiguous", &wrong);
    EXPECT_EQ(wrong.o.code, 1) << wrong.o.out << wrong.o.err;

    // A shard that does not fit: exit 2, one line naming the rank.
    Named bad{"out", Vec(static_cast<size_t>(3 * kH * kD), 0.0), {kB, 3, kH, kD}, CTXPAR_DTYPE_F32};
    WriteNpy(dir + "/out.rank2.npy", bad);
    Outcome o = Tool("audit --ranks 4 --layout zigzag --mask causal --shards " + pattern);
    EXPECT_EQ(o.code, 2) << o.out << o.err;
    EXPECT_EQ(Lines(o.err), 1) << o.err;
    EXPECT_NE(o.err.find("rank 2"), std::string::npos) << o.err;
    EXPECT_NE(o.err.find("out.rank2.npy"), std::string::npos) << o.err;
    // One missing: exit 2 naming it.
    std::remove((dir + "/out.rank2.npy").c_str());
    o = Tool("audit --ranks 4 --layout zigzag --mask causal --shards " + pattern);
    EXPECT_EQ(o.code, 2) << o.out << o.err;
    EXPECT_NE(o.err.find("rank 2's shard of out is missing"), std::string::npos) << o.err;
}

// TransformerEngine's THD context parallelism: per-rank dumps of packed tokens [T/P, H, D] and
// LSE [H, T/P], each document zigzagged on its own; cu_seqlens global.
TEST(AuditAgainst, ThdShardsZigzaggedPerDocument) {
    Problem p = MakeProblem(CTXPAR_DTYPE_F32, false, true);
    std::string dir = Dir("thd_shards");
    std::vector<int64_t> cu64(kCu, kCu + 3);
    ASSERT_EQ(cpt_npy_write((dir + "/cu_seqlens.npy").c_str(), CPT_NPY_I64, 1,
                               std::vector<int64_t>{3}.data(), cu64.data()),
              CTXPAR_OK);
    auto write_shards = [&](const Results &r) {
        for (int rank = 0; rank < kP; rank++) {
            std::vector<int64_t> mine = ZigzagPerDoc(rank);
            const int64_t n = (int64_t)mine.size();
            for (auto &[name, v] : std::map<std::string, const Vec *>{
                     {"q", &p.q}, {"k", &p.k}, {"v", &p.v}, {"out", &r.out}}) {
                Named t{name, Gather(*v, mine), {n, kH, kD}, CTXPAR_DTYPE_F32};
                WriteNpy(dir + "/" + name + "_" + std::to_string(rank) + ".npy", t);
            }
            Named l{"lse", {}, {kH, n}, CTXPAR_DTYPE_F32};
            for (int64_t h = 0; h < kH; h++)
                for (int64_t s : mine)
                    l.v.push_back(r.lse[h * kS + s]);
            WriteNpy(dir + "/lse_" + std::to_string(rank) + ".npy", l);
        }
    };
    const std::string args = "--format thd --lse-layout ht --cu-seqlens '" + dir +
                             "/cu_seqlens.npy' --shards '" + dir + "/{name}_{rank}.npy'";
    Results r = Correct(p);
    write_shards(r);
    Verdict v;
    Judge(args, &v);
    EXPECT_EQ(v.o.code, 0) << v.o.out << v.o.err;
    EXPECT_EQ(json_integer_value(json_object_get(json_object_get(v.root, "config"), "docs")), 2);
    // Rank 1 returns its second document's rows shifted by one token.
    std::vector<int64_t> mine = ZigzagPerDoc(1);
    for (size_t i = 4; i + 1 < mine.size(); i++)
        std::copy(p.out.begin() + Row(mine[i + 1]), p.out.begin() + Row(mine[i + 1] + 1),
                  r.out.begin() + Row(mine[i]));
    write_shards(r);
    Verdict bad;
    Judge(args, &bad);
    EXPECT_EQ(bad.o.code, 1) << bad.o.out << bad.o.err;
    EXPECT_EQ(bad.WorstRank("out"), 1) << bad.o.out;
    EXPECT_EQ(bad.WorstRankByError("out"), 1) << bad.o.out;
}

// ---------------------------------------------------------------- malformed files

std::string Le64(uint64_t n) {
    std::string b(8, '\0');
    for (int i = 0; i < 8; i++)
        b[i] = (char)(n >> (8 * i) & 0xff);
    return b;
}

std::string StFile(const std::string &header, const std::string &data) {
    return Le64(header.size()) + header + data;
}

TEST(AuditAgainst, MalformedSafetensorsExit2WithOneLine) {
    Problem p = MakeProblem(CTXPAR_DTYPE_F32, false);
    std::string dir = Dir("malformed");
    std::string in = WriteInputs(dir, p);
    const std::string d8(8, '\0');
    const std::string ok = R"({"out":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
    struct Case {
        const char *label;
        std::string bytes, why;
    } cases[] = {
        {"header_length", Le64(1000) + ok + d8, "header length 1000 runs past the end"},
        {"offsets_past_end",
         StFile(R"({"out":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", "abcd"),
         "past the end of the data"},
        {"overlap",
         StFile(R"({"out":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                R"("lse":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                d8),
         "overlap"},
        {"unknown_dtype", StFile(R"({"out":{"dtype":"C64","shape":[1],"data_offsets":[0,8]}})", d8),
         "dtype 'C64' not supported"},
        {"truncated", StFile(ok, "abcd").substr(0, 8 + ok.size() + 2), "past the end of the data"},
        {"not_json", StFile("{\"out\": [", d8), "not valid JSON"},
        {"size_mismatch", StFile(R"({"out":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", d8),
         "needs 12"},
    };
    for (const Case &c : cases) {
        SCOPED_TRACE(c.label);
        std::string path = dir + "/" + c.label + ".safetensors";
        FILE *f = std::fopen(path.c_str(), "wb");
        ASSERT_NE(f, nullptr);
        std::fwrite(c.bytes.data(), 1, c.bytes.size(), f);
        std::fclose(f);
        for (std::string flag : {"--against", "--inputs"}) {
            std::string args = flag == "--inputs"
                                   ? "--inputs '" + path + "'"
                                   : "--inputs '" + in + "' --against '" + path + "'";
            Outcome o = Tool("audit --ranks 4 " + args);
            EXPECT_EQ(o.code, 2) << flag << o.out << o.err;
            EXPECT_EQ(Lines(o.err), 1) << o.err;
            EXPECT_NE(o.err.find(path), std::string::npos) << o.err;
            EXPECT_NE(o.err.find(c.why), std::string::npos) << o.err;
        }
    }
}

// A tensor that is not there: the message lists what the source does hold, so that a misnamed
// tensor ("V", "value") is seen at once.
TEST(AuditAgainst, MissingTensorListsTheTensorsFound) {
    Problem p = MakeProblem(CTXPAR_DTYPE_F32, false);
    std::string dir = Dir("missing_tensor");
    WriteSafetensors(
        dir + "/missing_v.safetensors",
        {{"q", p.q, kBSHD, p.dtype}, {"k", p.k, kBSHD, p.dtype}, {"value", p.v, kBSHD, p.dtype}});
    Outcome o = Tool("audit --ranks 4 --inputs '" + dir + "/missing_v.safetensors'");
    EXPECT_EQ(o.code, 2) << o.out << o.err;
    EXPECT_EQ(Lines(o.err), 1) << o.err;
    EXPECT_NE(o.err.find("no v here (found: k, q, value; name it v, or give --v FILE)"),
              std::string::npos)
        << o.err;

    // A folder of NAME.npy files: its names, sorted.
    std::string folder = dir + "/npy";
    mkdir(folder.c_str(), 0755);
    WriteNpy(folder + "/q.npy", {"q", p.q, kBSHD, p.dtype});
    WriteNpy(folder + "/keys.npy", {"keys", p.k, kBSHD, p.dtype});
    WriteNpy(folder + "/v.npy", {"v", p.v, kBSHD, p.dtype});
    o = Tool("audit --ranks 4 --inputs '" + folder + "'");
    EXPECT_EQ(o.code, 2) << o.out << o.err;
    EXPECT_NE(o.err.find("no k here (found: keys, q, v;"), std::string::npos) << o.err;

    // Results holding none of the names judged: what they do hold.
    WriteSafetensors(dir + "/res.safetensors", {{"output", p.out, kBSHD, p.dtype}});
    o = Tool("audit --ranks 4 --inputs '" + WriteInputs(dir, p) + "' --against '" + dir +
             "/res.safetensors'");
    EXPECT_EQ(o.code, 2) << o.out << o.err;
    EXPECT_NE(o.err.find("holds none of out, lse, dq, dk, dv, dsinks (found: output)"),
              std::string::npos)
        << o.err;
}

TEST(AuditAgainst, ResultsOfTheWrongShapeOrWithoutDoutExit2) {
    Problem p = MakeProblem(CTXPAR_DTYPE_F32, false);
    std::string dir = Dir("wrong_shape");
    std::string in = WriteInputs(dir, p);
    WriteSafetensors(dir + "/short.safetensors", {{"out",
                                                   Vec(p.out.begin(), p.out.begin() + Row(kS / 2)),
                                                   {kB, kS / 2, kH, kD},
                                                   CTXPAR_DTYPE_F32}});
    Outcome o =
        Tool("audit --ranks 4 --inputs '" + in + "' --against '" + dir + "/short.safetensors'");
    EXPECT_EQ(o.code, 2) << o.out << o.err;
    EXPECT_EQ(Lines(o.err), 1) << o.err;
    EXPECT_NE(o.err.find("short.safetensors: out has dims"), std::string::npos) << o.err;
    WriteSafetensors(dir + "/dq.safetensors", {{"dq", p.out, kBSHD, CTXPAR_DTYPE_F32}});
    o = Tool("audit --ranks 4 --inputs '" + in + "' --against '" + dir + "/dq.safetensors'");
    EXPECT_EQ(o.code, 2) << o.out << o.err;
    EXPECT_NE(o.err.find("no dout"), std::string::npos) << o.err;
    // One .npy file cannot stand for several results.
    WriteNpy(dir + "/out.npy", {"out", p.out, kBSHD, CTXPAR_DTYPE_F32});
    o = Tool("audit --ranks 4 --inputs '" + in + "' --against '" + dir + "/out.npy'");
    EXPECT_EQ(o.code, 2) << o.out << o.err;
    EXPECT_NE(o.err.find("out.npy: give a folder of NAME.npy files or a .safetensors file"),
              std::string::npos)
        << o.err;
}

// ---------------------------------------------------------------- MLA, sinks, uneven shards

// MLA (v's head_dim 8 beside q/k's 16), GQA (2 query heads on 1 K/V head), sinks and 30 tokens
// on 4 ranks (uneven shards: 8, 8, 7, 7 under contiguous): every result of the third party made
// here by the float64 oracle with those features, dsinks included.
struct Mla {
    static constexpr int64_t HQ = 2, HK = 1, D = 16, DV = 8;
    int64_t S = 30;
    Vec q, k, v, dout, out, lse, dq, dk, dv;
    double sinks[HQ] = {0.5, -1.0};
    double dsinks[HQ] = {0, 0};
};

Mla MakeMla(int64_t seq = 30) {
    Mla m;
    m.S = seq;
    auto fill = [&](uint64_t id, int64_t h, int64_t d) {
        Vec x(static_cast<size_t>(m.S * h * d));
        for (size_t i = 0; i < x.size(); i++)
            x[i] = cpt_test_round(CTXPAR_DTYPE_F32, cpt_test_value(17, id, i));
        return x;
    };
    m.q = fill(1, Mla::HQ, Mla::D), m.k = fill(2, Mla::HK, Mla::D);
    m.v = fill(3, Mla::HK, Mla::DV), m.dout = fill(4, Mla::HQ, Mla::DV);
    cpt_oracle_shape sh = {1, m.S, m.S, Mla::HQ, Mla::HK, Mla::D};
    cpt_oracle_features f = {};
    f.head_dim_v = Mla::DV;
    f.sinks = m.sinks;
    ctxpar_mask_desc c = Causal();
    const double scale = (double)(1.0f / std::sqrt((float)Mla::D));
    m.out.resize((size_t)(m.S * Mla::HQ * Mla::DV));
    m.lse.resize((size_t)(m.S * Mla::HQ));
    m.dq.resize(m.q.size()), m.dk.resize(m.k.size()), m.dv.resize(m.v.size());
    cpt_oracle_fwd_ex(&sh, m.q.data(), m.k.data(), m.v.data(), nullptr, nullptr, &c, &f, scale,
                      m.out.data(), m.lse.data());
    cpt_oracle_bwd_ex(&sh, m.q.data(), m.k.data(), m.v.data(), nullptr, nullptr, &c, &f, scale,
                      m.dout.data(), m.dq.data(), m.dk.data(), m.dv.data(), m.dsinks);
    return m;
}

std::vector<Named> MlaInputs(const Mla &m) {
    const std::vector<int64_t> kMlaQ = {1, m.S, Mla::HQ, Mla::D}, kMlaK = {1, m.S, Mla::HK, Mla::D},
                               kMlaV = {1, m.S, Mla::HK, Mla::DV},
                               kMlaO = {1, m.S, Mla::HQ, Mla::DV};
    return {{"q", m.q, kMlaQ, CTXPAR_DTYPE_F32},
            {"k", m.k, kMlaK, CTXPAR_DTYPE_F32},
            {"v", m.v, kMlaV, CTXPAR_DTYPE_F32},
            {"dout", m.dout, kMlaO, CTXPAR_DTYPE_F32}};
}

std::vector<Named> MlaResults(const Mla &m) {
    const std::vector<int64_t> kMlaQ = {1, m.S, Mla::HQ, Mla::D}, kMlaK = {1, m.S, Mla::HK, Mla::D},
                               kMlaV = {1, m.S, Mla::HK, Mla::DV},
                               kMlaO = {1, m.S, Mla::HQ, Mla::DV}, kMlaL = {1, Mla::HQ, m.S};
    return {{"out", m.out, kMlaO, CTXPAR_DTYPE_F32},
            {"lse", m.lse, kMlaL, CTXPAR_DTYPE_F32},
            {"dq", m.dq, kMlaQ, CTXPAR_DTYPE_F32},
            {"dk", m.dk, kMlaK, CTXPAR_DTYPE_F32},
            {"dv", m.dv, kMlaV, CTXPAR_DTYPE_F32}};
}

std::string WriteSinks(const std::string &dir, const Mla &m) {
    WriteNpy(dir + "/sinks.npy",
             {"sinks", Vec(m.sinks, m.sinks + Mla::HQ), {Mla::HQ}, CTXPAR_DTYPE_F32});
    return dir + "/sinks.npy";
}

TEST(AuditFeatures, MlaWithSinksJudgesDsinksAndSavesIt) {
    const Mla m = MakeMla();
    const std::string dir = Dir("mla_sinks"), in = dir + "/in", res = dir + "/res";
    mkdir(in.c_str(), 0777);
    mkdir(res.c_str(), 0777);
    for (const Named &t : MlaInputs(m))
        WriteNpy(in + "/" + t.name + ".npy", t);
    for (const Named &t : MlaResults(m))
        WriteNpy(res + "/" + t.name + ".npy", t);
    const Vec ds(m.dsinks, m.dsinks + Mla::HQ);
    WriteNpy(res + "/dsinks.npy", {"dsinks", ds, {Mla::HQ}, CTXPAR_DTYPE_F32});
    const std::string sinks = WriteSinks(dir, m);
    const std::string args =
        "--inputs '" + in + "' --sinks '" + sinks + "' --against '" + res + "'";
    Verdict v;
    Judge(args + " --save '" + dir + "/saved'", &v);
    EXPECT_EQ(v.o.code, 0) << v.o.out << v.o.err;
    EXPECT_TRUE(v.Consistent()) << v.o.out;
    for (const char *t : {"out", "lse", "dq", "dk", "dv", "dsinks"})
        EXPECT_TRUE(v.TensorOk(t)) << t << ": " << v.o.out;
    EXPECT_LE(json_number_value(json_object_get(v.Tensor("dsinks"), "bound_ratio")), 1.0);
    // --save: ctxpar's dsinks (float32 [heads]) and out with v's head_dim, next to the oracle.
    cpt_npy_array a;
    ASSERT_EQ(cpt_npy_read((dir + "/saved/dsinks.npy").c_str(), &a), CTXPAR_OK);
    ASSERT_EQ(a.dtype, CPT_NPY_F32);
    ASSERT_EQ(a.count, (size_t)Mla::HQ);
    for (int h = 0; h < Mla::HQ; h++)
        EXPECT_NEAR(((const float *)a.data)[h], m.dsinks[h], 1e-5 * (1 + std::fabs(m.dsinks[h])));
    cpt_npy_free(&a);
    ASSERT_EQ(cpt_npy_read((dir + "/saved/out.npy").c_str(), &a), CTXPAR_OK);
    EXPECT_EQ(a.ndim, 4);
    EXPECT_EQ(a.shape[3], Mla::DV);
    cpt_npy_free(&a);

    // A dsinks off by a factor of 2 (the sink counted on two partials) is not consistent.
    const Vec twice = {2 * m.dsinks[0], 2 * m.dsinks[1]};
    WriteNpy(res + "/dsinks.npy", {"dsinks", twice, {Mla::HQ}, CTXPAR_DTYPE_F32});
    Verdict bad;
    Judge(args, &bad);
    EXPECT_EQ(bad.o.code, 1) << bad.o.out << bad.o.err;
    EXPECT_FALSE(bad.Consistent());
    EXPECT_FALSE(bad.TensorOk("dsinks"));
    EXPECT_TRUE(bad.TensorOk("out"));

    // Refusals: dsinks of the wrong length, sinks of the wrong length, dsinks without sinks.
    WriteNpy(res + "/dsinks.npy", {"dsinks", {1.0, 2.0, 3.0}, {3}, CTXPAR_DTYPE_F32});
    Outcome o = Tool("audit --ranks 4 " + args);
    EXPECT_EQ(o.code, 2) << o.out << o.err;
    EXPECT_NE(o.err.find("dsinks is float32 (3,); want float32 [2]"), std::string::npos) << o.err;
    WriteNpy(res + "/dsinks.npy", {"dsinks", ds, {Mla::HQ}, CTXPAR_DTYPE_F32});
    o = Tool("audit --ranks 4 --inputs '" + in + "' --against '" + res + "'");
    EXPECT_EQ(o.code, 2) << o.out << o.err;
    EXPECT_NE(o.err.find("holds dsinks, but the run has no --sinks"), std::string::npos) << o.err;
    WriteNpy(dir + "/sinks3.npy", {"sinks", {1.0, 2.0, 3.0}, {3}, CTXPAR_DTYPE_F32});
    o = Tool("audit --ranks 4 --inputs '" + in + "' --sinks '" + dir + "/sinks3.npy'");
    EXPECT_EQ(o.code, 2) << o.out << o.err;
    EXPECT_NE(o.err.find("want float32 [2]"), std::string::npos) << o.err;
    // dout must carry v's head_dim.
    WriteNpy(in + "/dout.npy", {"dout", m.q, {1, m.S, Mla::HQ, Mla::D}, CTXPAR_DTYPE_F32});
    o = Tool("audit --ranks 4 --inputs '" + in + "'");
    EXPECT_EQ(o.code, 2) << o.out << o.err;
    EXPECT_NE(o.err.find("with v's head_dim"), std::string::npos) << o.err;
}

// Writes every input and result of m as per-rank shards dir/{name}_{rank}.npy, rank r holding
// the positions s with owner[s] == r, in increasing order.
void WriteShards(const Mla &m, const std::string &dir, const std::vector<int> &owner, int ranks) {
    std::vector<Named> all = MlaInputs(m);
    for (const Named &t : MlaResults(m))
        all.push_back(t);
    for (const Named &t : all) {
        const bool lse = t.name == "lse";
        const int64_t width = lse ? 1 : t.shape[2] * t.shape[3];
        for (int r = 0; r < ranks; r++) {
            Vec part;
            std::vector<int64_t> shape = t.shape;
            int64_t rows = 0;
            for (int64_t h = 0; h < (lse ? Mla::HQ : 1); h++) // lse [1, H, S]: head by head
                for (int64_t s = 0; s < m.S; s++)
                    if (owner[(size_t)s] == r) {
                        const int64_t at = lse ? h * m.S + s : s * width;
                        part.insert(part.end(), t.v.begin() + at, t.v.begin() + at + width);
                        rows += h == 0;
                    }
            shape[lse ? 2 : 1] = rows;
            WriteNpy(dir + "/" + t.name + "_" + std::to_string(r) + ".npy",
                     {t.name, part, shape, CTXPAR_DTYPE_F32});
        }
    }
}

// Per-rank shards of 30 tokens over 4 ranks under contiguous: the first 30 % 4 = 2 ranks hold
// one token more (8, 8, 7, 7; api/ctxpar.h). Shards split otherwise are refused, naming the rank.
// Rank r holds rows[r] consecutive tokens.
void WriteContiguousShards(const Mla &m, const std::string &dir, const int64_t *rows) {
    std::vector<int> owner;
    for (int r = 0; r < 4; r++)
        owner.insert(owner.end(), (size_t)rows[r], r);
    WriteShards(m, dir, owner, 4);
}

TEST(AuditFeatures, UnevenShards) {
    const Mla m = MakeMla();
    const std::string dir = Dir("uneven_shards");
    const int64_t counts[4] = {8, 8, 7, 7};
    auto write = [&](const int64_t *rows) { WriteContiguousShards(m, dir, rows); };
    write(counts);
    const std::string args = "audit --ranks 4 --layout contiguous --mask causal --json --sinks '" +
                             WriteSinks(dir, m) + "' --shards '" + dir + "/{name}_{rank}.npy'";
    {
        Verdict v;
        JudgeCommand(args, &v);
        ASSERT_EQ(v.o.code, 0) << v.o.out << v.o.err;
        EXPECT_TRUE(v.Consistent()) << v.o.out;
        EXPECT_EQ(json_integer_value(json_object_get(json_object_get(v.root, "config"), "seq")),
                  30);
    }
    const int64_t wrong[4] = {7, 8, 7, 8};
    write(wrong);
    Outcome o = Tool(args);
    EXPECT_EQ(o.code, 2) << o.out << o.err;
    EXPECT_NE(o.err.find("rank 0's shard of q has 7 rows, but the contiguous layout gives rank 0 "
                         "8 of the 30 tokens"),
              std::string::npos)
        << o.err;
}

// Fewer tokens than ranks: 3 tokens on 4 ranks, the last rank's shards empty (0 rows).
TEST(AuditFeatures, ShardsOfFewerTokensThanRanks) {
    const Mla m = MakeMla(3);
    const std::string dir = Dir("empty_shard");
    const int64_t counts[4] = {1, 1, 1, 0};
    WriteContiguousShards(m, dir, counts);
    Verdict v;
    JudgeCommand("audit --ranks 4 --layout contiguous --mask causal --json --sinks '" +
                     WriteSinks(dir, m) + "' --shards '" + dir + "/{name}_{rank}.npy' --save '" +
                     dir + "/saved'",
                 &v);
    ASSERT_EQ(v.o.code, 0) << v.o.out << v.o.err;
    EXPECT_TRUE(v.Consistent()) << v.o.out;
    cpt_npy_array a;
    ASSERT_EQ(cpt_npy_read((dir + "/saved/out_3.npy").c_str(), &a), CTXPAR_OK);
    EXPECT_EQ(a.shape[1], 0);
    cpt_npy_free(&a);
}

// Shards of a custom layout (--layout custom --assign): rank r holds the tokens the assignment
// gives it, scattered over the sequence and uneven (3 ranks, 30 tokens). Assembled with the
// assignment they were written with, the audit agrees with itself; with another one of the same
// counts the results land at the wrong positions and fail the bound; an assignment of another
// length is refused.
TEST(AuditFeatures, CustomLayoutShards) {
    const Mla m = MakeMla();
    const std::string dir = Dir("custom_shards"), a = dir + "/assign.npy";
    std::vector<int> owner((size_t)m.S);
    std::vector<int32_t> assign((size_t)m.S);
    for (int64_t s = 0; s < m.S; s++)
        assign[(size_t)s] = owner[(size_t)s] = (int)((s * s + 2 * s) % 7 % 3);
    WriteShards(m, dir, owner, 3);
    auto write_assign = [&](const std::vector<int32_t> &v) {
        const int64_t n = (int64_t)v.size();
        ASSERT_EQ(cpt_npy_write(a.c_str(), CPT_NPY_I32, 1, &n, v.data()), CTXPAR_OK);
    };
    write_assign(assign);
    const std::string args = "audit --ranks 3 --layout custom --assign '" + a +
                             "' --mask causal --json --sinks '" + WriteSinks(dir, m) +
                             "' --shards '" + dir + "/{name}_{rank}.npy'";
    {
        Verdict v;
        JudgeCommand(args, &v);
        ASSERT_EQ(v.o.code, 0) << v.o.out << v.o.err;
        EXPECT_TRUE(v.Consistent()) << v.o.out;
    }
    // The same counts per rank, positions swapped between two tokens of different ranks.
    std::vector<int32_t> swapped = assign;
    size_t i = 0, j = 1;
    while (swapped[j] == swapped[i])
        j++;
    std::swap(swapped[i], swapped[j]);
    write_assign(swapped);
    Outcome o = Tool(args);
    EXPECT_EQ(o.code, 1) << o.out << o.err;
    write_assign(std::vector<int32_t>(assign.begin(), assign.end() - 1));
    o = Tool(args);
    EXPECT_EQ(o.code, 2) << o.out << o.err;
    EXPECT_NE(o.err.find("hold 30 tokens, but the assignment (--assign) gives ranks to 29"),
              std::string::npos)
        << o.err;
}

} // namespace
