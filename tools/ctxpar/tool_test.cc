// The `ctxpar` tool as users run it: the binary is started as a child process (also under mpirun
// when it is there) and judged by its exit code, its output and the files it writes.
//  - audit on .npy files written here with the npy writer: the saved out, lse, dq, dk, dv match
//    float64 attention computed here with the oracle, for ring and all-gather, causal and not,
//    contiguous and zigzag, float32 and float16, documents;
//  - malformed, truncated and mismatched inputs: exit 2 and one line naming the file;
//  - bench --json: every field, sane values, the FLOP count of the convention;
//  - --trace: valid JSON, one track per rank, exactly one compute slice per ring step that the
//    mask leaves alive (counted here from the layout's positions, not from the library);
//  - check and audit with two-sided windows (--window-right), --softcap and the hybrid
//    (--algo hybrid --ulysses) against the oracle; their bad values are usage errors;
//  - progress (shown from the start with CTXPAR_PROGRESS_AFTER=0) goes to stderr only: stdout
//    stays one JSON document;
//  - --help for every subcommand, --version.
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "reference/data.h"
#include "reference/metrics.h"
#include "reference/npy.h"
#include "reference/oracle.h"
#include "reference/tolerance.h"
#include "tools/ctxpar/tool_run.h"

namespace {

// ---------------------------------------------------------------- running the binary

using cpt_tool::Binary;
using cpt_tool::Lines;
using cpt_tool::Outcome;
using cpt_tool::ReadAll;
using cpt_tool::RunWith;
using cpt_tool::TempDir;
using cpt_tool::Tool;

std::string Mpirun() {
    for (const char *p : {"/usr/bin/mpirun", "/usr/local/bin/mpirun"}) {
        char real[4096];
        // Through the real path: invoked as /bin/mpirun, Open MPI would take "/" as its prefix.
        if (access(p, X_OK) == 0 && realpath(p, real))
            return real;
    }
    return "";
}

// mpirun with shared memory only, and its session files in the test's own directory. Under
// --config=asan, as testing/mpi_run.sh does: Open MPI leaks by design at MPI_Finalize, so leaks
// allocated inside Open MPI are suppressed (ctxpar's own are still reported).
std::string MpiPrefix(int np) {
    std::string env;
    if (const char *asan = std::getenv("ASAN_OPTIONS")) {
        std::string supp = TempDir() + "/lsan_openmpi.supp";
        std::ofstream f(supp);
        for (const char *lib : {"libmpi.so", "libopen-pal.so", "libopen-rte.so", "libpmix.so",
                                "libhwloc.so", "libevent", "mca_"})
            f << "leak:" << lib << "\n";
        env = "LSAN_OPTIONS='suppressions=" + supp + "'" +
              " OMPI_MCA_mca_base_component_disable_dlclose=1" +
              " PMIX_MCA_mca_base_component_disable_dlclose=1 ASAN_OPTIONS='" + asan +
              ":fast_unwind_on_malloc=0' ";
    }
    return env + "TMPDIR='" + TempDir() + "' '" + Mpirun() + "' -np " + std::to_string(np) +
           " --oversubscribe --bind-to none --mca btl self,vader" +
           " --mca btl_vader_backing_directory '" + TempDir() + "' ";
}

// ---------------------------------------------------------------- a small JSON reader

struct Json {
    enum Kind { Null, Bool, Number, String, Array, Object } kind = Null;
    bool b = false;
    double num = 0;
    std::string str;
    std::vector<Json> items;
    std::map<std::string, Json> members;
    bool Has(const std::string &k) const { return kind == Object && members.count(k); }
    const Json &operator[](const std::string &k) const {
        static const Json null;
        auto it = members.find(k);
        return it == members.end() ? null : it->second;
    }
};

// Strict enough for these files: RFC 8259 values, no trailing commas; ok false on any error.
class JsonParser {
  public:
    explicit JsonParser(const std::string &s) : s_(s) {}
    bool Parse(Json *out) {
        ok_ = true;
        *out = Value();
        Ws();
        return ok_ && i_ == s_.size();
    }

  private:
    void Ws() {
        while (i_ < s_.size() && std::strchr(" \t\r\n", s_[i_]))
            i_++;
    }
    bool Eat(char c) {
        Ws();
        if (i_ < s_.size() && s_[i_] == c) {
            i_++;
            return true;
        }
        return false;
    }
    bool Word(const char *w) {
        size_t n = std::strlen(w);
        if (s_.compare(i_, n, w) != 0)
            return false;
        i_ += n;
        return true;
    }
    std::string Str() {
        std::string r;
        if (!Eat('"'))
            return ok_ = false, r;
        while (i_ < s_.size() && s_[i_] != '"') {
            char c = s_[i_++];
            if (static_cast<unsigned char>(c) < 0x20)
                return ok_ = false, r;
            if (c == '\\') {
                if (i_ >= s_.size())
                    return ok_ = false, r;
                char e = s_[i_++];
                if (e == 'u') {
                    if (i_ + 4 > s_.size())
                        return ok_ = false, r;
                    r += static_cast<char>(std::stoi(s_.substr(i_, 4), nullptr, 16));
                    i_ += 4;
                } else if (std::strchr("\"\\/bfnrt", e)) {
                    r += e;
                } else {
                    return ok_ = false, r;
                }
            } else {
                r += c;
            }
        }
        if (i_ >= s_.size())
            return ok_ = false, r;
        i_++;
        return r;
    }
    Json Value() {
        Json v;
        Ws();
        if (!ok_ || i_ >= s_.size())
            return ok_ = false, v;
        char c = s_[i_];
        if (c == '{') {
            v.kind = Json::Object;
            i_++;
            if (Eat('}'))
                return v;
            do {
                std::string k = Str();
                if (!Eat(':'))
                    return ok_ = false, v;
                v.members[k] = Value();
            } while (ok_ && Eat(','));
            if (!Eat('}'))
                ok_ = false;
        } else if (c == '[') {
            v.kind = Json::Array;
            i_++;
            if (Eat(']'))
                return v;
            do
                v.items.push_back(Value());
            while (ok_ && Eat(','));
            if (!Eat(']'))
                ok_ = false;
        } else if (c == '"') {
            v.kind = Json::String;
            v.str = Str();
        } else if (Word("true") || Word("false")) {
            v.kind = Json::Bool;
            v.b = s_[i_ - 1] == 'e' && s_[i_ - 2] == 'u';
        } else if (Word("null")) {
            v.kind = Json::Null;
        } else {
            size_t start = i_;
            if (i_ < s_.size() && s_[i_] == '-')
                i_++;
            while (i_ < s_.size() && std::strchr("0123456789.eE+-", s_[i_]))
                i_++;
            char *end = nullptr;
            std::string num = s_.substr(start, i_ - start);
            v.kind = Json::Number;
            v.num = std::strtod(num.c_str(), &end);
            if (num.empty() || *end)
                ok_ = false;
        }
        return v;
    }
    const std::string &s_;
    size_t i_ = 0;
    bool ok_ = true;
};

bool ParseJson(const std::string &s, Json *out) { return JsonParser(s).Parse(out); }

// ---------------------------------------------------------------- .npy inputs and the oracle

struct Shape {
    int64_t b, s, h, hkv, d;
};

// A global tensor as doubles (exact values of the stored dtype) and its file.
struct Tensor {
    std::vector<double> v;
    int64_t shape[4];
};

// Uniform [-1, 1) values, rounded to `dtype`, written to `path` as that dtype.
Tensor WriteInput(const std::string &path, ctxpar_dtype dtype, int64_t b, int64_t s, int64_t h,
                  int64_t d, unsigned seed) {
    Tensor t{std::vector<double>(static_cast<size_t>(b * s * h * d)), {b, s, h, d}};
    std::mt19937 rng(seed);
    std::uniform_real_distribution<double> u(-1.0, 1.0);
    std::vector<unsigned char> raw(t.v.size() * ctxpar_dtype_size(dtype));
    ctxpar_tensor view = ctxpar_tensor_bshd(raw.data(), dtype, b, s, h, d);
    for (int64_t i0 = 0; i0 < b; i0++)
        for (int64_t i1 = 0; i1 < s; i1++)
            for (int64_t i2 = 0; i2 < h; i2++)
                for (int64_t i3 = 0; i3 < d; i3++)
                    cpt_test_set(&view, i0, i1, i2, i3, u(rng));
    cpt_test_to_f64(&view, t.v.data());
    EXPECT_EQ(cpt_npy_write(path.c_str(),
                               dtype == CTXPAR_DTYPE_F16 ? CPT_NPY_F16 : CPT_NPY_F32, 4,
                               t.shape, raw.data()),
              CTXPAR_OK)
        << ctxpar_last_error();
    return t;
}

struct Expected {
    std::vector<double> out, lse, dq, dk, dv;
};

Expected Oracle(const Shape &sh, const Tensor &q, const Tensor &k, const Tensor &v,
                const Tensor *dout, bool causal, int64_t window, const std::vector<int32_t> *cu) {
    Expected e;
    size_t nq = q.v.size(), nk = k.v.size();
    e.out.resize(nq);
    e.lse.resize(static_cast<size_t>(sh.b * sh.h * sh.s));
    cpt_oracle_shape os = {sh.b, sh.s, sh.s, sh.h, sh.hkv, sh.d};
    ctxpar_mask_desc mask = {causal ? 1 : 0, window, cu ? cu->data() : nullptr,
                             cu ? static_cast<int64_t>(cu->size()) - 1 : 0, 0, 0};
    // The scale the library resolves: 1/sqrt(D) in float.
    double scale = static_cast<double>(1.0f / std::sqrt(static_cast<float>(sh.d)));
    cpt_oracle_fwd(&os, q.v.data(), k.v.data(), v.v.data(), nullptr, nullptr, &mask, scale,
                      e.out.data(), e.lse.data());
    if (dout) {
        e.dq.resize(nq);
        e.dk.resize(nk);
        e.dv.resize(nk);
        cpt_oracle_bwd(&os, q.v.data(), k.v.data(), v.v.data(), nullptr, nullptr, &mask, scale,
                          dout->v.data(), e.dq.data(), e.dk.data(), e.dv.data());
    }
    return e;
}

// Reads a saved result and returns its error against ref (max |got - ref| / max |ref|), after
// checking its dtype and shape.
double SavedError(const std::string &path, cpt_npy_dtype dtype, std::vector<int64_t> shape,
                  const std::vector<double> &ref) {
    cpt_npy_array a;
    if (cpt_npy_read(path.c_str(), &a) != CTXPAR_OK) {
        ADD_FAILURE() << ctxpar_last_error();
        return INFINITY;
    }
    std::unique_ptr<cpt_npy_array, void (*)(cpt_npy_array *)> hold(&a, cpt_npy_free);
    EXPECT_EQ(a.dtype, dtype) << path;
    EXPECT_EQ(a.ndim, static_cast<int>(shape.size())) << path;
    for (size_t i = 0; i < shape.size() && static_cast<int>(i) < a.ndim; i++)
        EXPECT_EQ(a.shape[i], shape[i]) << path << " dimension " << i;
    if (a.count != ref.size())
        return INFINITY;
    if (dtype == CPT_NPY_F32)
        return cpt_compare_f32(static_cast<const float *>(a.data), ref.data(), a.count).rel;
    ctxpar_tensor t =
        ctxpar_tensor_bshd(a.data, CTXPAR_DTYPE_F16, shape[0], shape[1], shape[2], shape[3]);
    return cpt_compare_tensor(&t, ref.data()).rel;
}

std::string Dir(const std::string &name) {
    std::string d = TempDir() + "/" + name;
    mkdir(d.c_str(), 0777);
    return d;
}

// ---------------------------------------------------------------- audit against the oracle

struct AuditCase {
    const char *algo, *layout, *mask;
    int ranks;
    ctxpar_dtype dtype;
    bool docs;
};

std::string AuditName(const testing::TestParamInfo<AuditCase> &info) {
    const AuditCase &c = info.param;
    return std::string(c.algo) + "_" + c.layout + "_" + c.mask + "_P" + std::to_string(c.ranks) +
           "_" + ctxpar_dtype_name(c.dtype) + (c.docs ? "_docs" : "");
}

// Writes q, k, v, dout (and cu_seqlens) for a case into dir; returns the oracle's results.
struct AuditFiles {
    Shape sh{2, 64, 4, 2, 16};
    Tensor q, k, v, dout;
    std::vector<int32_t> cu;
    std::string dir, args;
};

AuditFiles MakeAuditFiles(const std::string &name, ctxpar_dtype dtype, bool docs) {
    AuditFiles f;
    f.dir = Dir(name);
    const Shape &s = f.sh;
    f.q = WriteInput(f.dir + "/q.npy", dtype, s.b, s.s, s.h, s.d, 1);
    f.k = WriteInput(f.dir + "/k.npy", dtype, s.b, s.s, s.hkv, s.d, 2);
    f.v = WriteInput(f.dir + "/v.npy", dtype, s.b, s.s, s.hkv, s.d, 3);
    f.dout = WriteInput(f.dir + "/dout.npy", dtype, s.b, s.s, s.h, s.d, 4);
    f.args = "--q '" + f.dir + "/q.npy' --k '" + f.dir + "/k.npy' --v '" + f.dir +
             "/v.npy' --dout '" + f.dir + "/dout.npy' --save '" + f.dir + "/saved'";
    if (docs) {
        // int64 on purpose: the tool converts it to the API's int32 with a range check.
        f.cu = {0, 20, 21, 64};
        std::vector<int64_t> cu64(f.cu.begin(), f.cu.end());
        int64_t n = static_cast<int64_t>(cu64.size());
        EXPECT_EQ(cpt_npy_write((f.dir + "/cu.npy").c_str(), CPT_NPY_I64, 1, &n,
                                   cu64.data()),
                  CTXPAR_OK);
        f.args += " --cu-seqlens '" + f.dir + "/cu.npy'";
    }
    return f;
}

// The saved results of an audit of f against the oracle's e.
void ExpectSavedMatch(const AuditFiles &f, ctxpar_dtype dtype, const Expected &e) {
    const Shape &s = f.sh;
    cpt_npy_dtype t = dtype == CTXPAR_DTYPE_F16 ? CPT_NPY_F16 : CPT_NPY_F32;
    const std::string d = f.dir + "/saved/";
    EXPECT_LE(SavedError(d + "out.npy", t, {s.b, s.s, s.h, s.d}, e.out),
              cpt_tolerance(dtype, "out"));
    EXPECT_LE(SavedError(d + "lse.npy", CPT_NPY_F32, {s.b, s.h, s.s}, e.lse),
              cpt_tolerance(dtype, "lse"));
    EXPECT_LE(SavedError(d + "dq.npy", t, {s.b, s.s, s.h, s.d}, e.dq),
              cpt_tolerance(dtype, "dq"));
    EXPECT_LE(SavedError(d + "dk.npy", t, {s.b, s.s, s.hkv, s.d}, e.dk),
              cpt_tolerance(dtype, "dk"));
    EXPECT_LE(SavedError(d + "dv.npy", t, {s.b, s.s, s.hkv, s.d}, e.dv),
              cpt_tolerance(dtype, "dv"));
}

void ExpectSavedMatchOracle(const AuditFiles &f, ctxpar_dtype dtype, bool causal) {
    ExpectSavedMatch(f, dtype,
                     Oracle(f.sh, f.q, f.k, f.v, &f.dout, causal, 0, f.cu.empty() ? nullptr : &f.cu));
}

class Audit : public testing::TestWithParam<AuditCase> {};

TEST_P(Audit, SavedResultsMatchFloat64Attention) {
    const AuditCase &c = GetParam();
    AuditFiles f = MakeAuditFiles("audit_" + AuditName(testing::TestParamInfo<AuditCase>(c, 0)),
                                  c.dtype, c.docs);
    Outcome o = Tool("audit " + f.args + " --ranks " + std::to_string(c.ranks) + " --algo " +
                    c.algo + " --layout " + c.layout + " --mask " + c.mask + " --json");
    ASSERT_EQ(o.code, 0) << o.err << o.out;
    Json j;
    ASSERT_TRUE(ParseJson(o.out, &j)) << o.out;
    EXPECT_TRUE(j["ok"].b);
    EXPECT_EQ(j["config"]["seq"].num, f.sh.s);
    EXPECT_EQ(j["config"]["heads"].num, f.sh.h);
    EXPECT_EQ(j["config"]["kv_heads"].num, f.sh.hkv);
    EXPECT_EQ(j["config"]["ranks"].num, c.ranks);
    EXPECT_EQ(j["config"]["docs"].num, c.docs ? 3 : 0);
    EXPECT_EQ(j["config"]["dtype"].str, ctxpar_dtype_name(c.dtype));
    EXPECT_EQ(j["saved_to"].str, f.dir + "/saved");
    ExpectSavedMatchOracle(f, c.dtype, std::strcmp(c.mask, "causal") == 0);
}

std::vector<AuditCase> AuditCases() {
    std::vector<AuditCase> v;
    for (const char *algo : {"ring", "allgather"})
        for (const char *layout : {"contiguous", "zigzag"})
            for (const char *mask : {"none", "causal"})
                v.push_back({algo, layout, mask, 4, CTXPAR_DTYPE_F32, false});
    v.push_back({"ring", "zigzag", "causal", 2, CTXPAR_DTYPE_F16, false});
    v.push_back({"ring", "contiguous", "causal", 2, CTXPAR_DTYPE_F32, true});
    return v;
}

INSTANTIATE_TEST_SUITE_P(Tool, Audit, testing::ValuesIn(AuditCases()), AuditName);

// Any length and any sharding: uneven built-in shards and a custom assignment (--assign) in
// check; in audit a custom layout with documents per batch row (--cu-seqlens [B, docs + 1]),
// the saved results against the fp64 oracle run row by row with each row's documents.
TEST(AnySharding, CheckRunsUnevenAndCustomShards) {
    Outcome o = Tool("check --seq 37 --ranks 4 --heads 2 --dim 16 --layout zigzag --mask causal "
                     "--backward --json");
    ASSERT_EQ(o.code, 0) << o.err << o.out;
    Json j;
    ASSERT_TRUE(ParseJson(o.out, &j)) << o.out;
    EXPECT_TRUE(j["ok"].b);
    std::string dir = Dir("any_sharding"), a = dir + "/assign.npy";
    std::vector<int32_t> assign(37);
    for (size_t t = 0; t < assign.size(); t++)
        assign[t] = static_cast<int32_t>((t * t + 3 * t) % 5 % 3); // rank 2 gets few tokens
    int64_t n = 37;
    ASSERT_EQ(cpt_npy_write(a.c_str(), CPT_NPY_I32, 1, &n, assign.data()), CTXPAR_OK);
    o = Tool("check --seq 37 --ranks 3 --heads 2 --dim 16 --layout custom --assign '" + a +
             "' --mask causal --algo allgather --backward --json");
    ASSERT_EQ(o.code, 0) << o.err << o.out;
    ASSERT_TRUE(ParseJson(o.out, &j)) << o.out;
    EXPECT_TRUE(j["ok"].b);
    EXPECT_EQ(j["config"]["layout"].str, "custom");
    // Usage errors: the pair goes together, and the assignment covers --seq.
    o = Tool("check --seq 37 --ranks 3 --layout custom");
    EXPECT_EQ(o.code, 2);
    EXPECT_NE(o.err.find("--layout custom and --assign"), std::string::npos) << o.err;
    o = Tool("check --seq 36 --ranks 3 --layout custom --assign '" + a + "'");
    EXPECT_EQ(o.code, 2);
    EXPECT_NE(o.err.find("holds 37 ranks but --seq is 36"), std::string::npos) << o.err;
    assign[11] = 3; // no rank 3 of 3
    ASSERT_EQ(cpt_npy_write(a.c_str(), CPT_NPY_I32, 1, &n, assign.data()), CTXPAR_OK);
    o = Tool("check --seq 37 --ranks 3 --layout custom --assign '" + a + "' --json");
    EXPECT_NE(o.code, 0);
    EXPECT_NE((o.out + o.err).find("assignment[11] (3) is not a rank in [0, 3)"),
              std::string::npos)
        << o.err << o.out;
}

TEST(AnySharding, AuditCustomLayoutWithDocumentsPerRow) {
    AuditFiles f = MakeAuditFiles("audit_any_sharding", CTXPAR_DTYPE_F32, false);
    const Shape &s = f.sh; // batch 2, seq 64
    const std::vector<int32_t> cu = {0, 10, 10, 40, 64, 0, 33, 50, 64, 64}; // [2, 5]
    const int64_t cu_shape[2] = {2, 5};
    ASSERT_EQ(cpt_npy_write((f.dir + "/cu2.npy").c_str(), CPT_NPY_I32, 2, cu_shape, cu.data()),
              CTXPAR_OK);
    std::vector<int64_t> assign(static_cast<size_t>(s.s)); // int64 on purpose
    for (int64_t t = 0; t < s.s; t++) // per-document head-tail of row 0's documents, 3 ranks
        assign[t] = t < 10 ? t * 6 / 10 : t < 40 ? (t - 10) * 6 / 30 : (t - 40) * 6 / 24;
    for (auto &r : assign)
        r = r < 3 ? r : 5 - r;
    const int64_t an = s.s;
    ASSERT_EQ(cpt_npy_write((f.dir + "/assign.npy").c_str(), CPT_NPY_I64, 1, &an, assign.data()),
              CTXPAR_OK);
    Outcome o = Tool("audit " + f.args + " --cu-seqlens '" + f.dir + "/cu2.npy' --ranks 3 " +
                     "--layout custom --assign '" + f.dir + "/assign.npy' --mask causal --json");
    ASSERT_EQ(o.code, 0) << o.err << o.out;
    Json j;
    ASSERT_TRUE(ParseJson(o.out, &j)) << o.out;
    EXPECT_TRUE(j["ok"].b);
    // The oracle of each batch row with its own documents, against the saved rows.
    const size_t qrow = static_cast<size_t>(s.s * s.h * s.d), krow = static_cast<size_t>(
                                                                      s.s * s.hkv * s.d);
    Expected all;
    for (int64_t b = 0; b < s.b; b++) {
        auto row = [&](const Tensor &t, size_t n) {
            Tensor r{std::vector<double>(t.v.begin() + b * n, t.v.begin() + (b + 1) * n),
                     {1, t.shape[1], t.shape[2], t.shape[3]}};
            return r;
        };
        Tensor q = row(f.q, qrow), k = row(f.k, krow), v = row(f.v, krow), dout = row(f.dout, qrow);
        std::vector<int32_t> cu_b(cu.begin() + b * 5, cu.begin() + (b + 1) * 5);
        Expected e = Oracle({1, s.s, s.h, s.hkv, s.d}, q, k, v, &dout, true, 0, &cu_b);
        for (auto p : {std::make_pair(&all.out, &e.out), std::make_pair(&all.lse, &e.lse),
                       std::make_pair(&all.dq, &e.dq), std::make_pair(&all.dk, &e.dk),
                       std::make_pair(&all.dv, &e.dv)})
            p.first->insert(p.first->end(), p.second->begin(), p.second->end());
    }
    ExpectSavedMatch(f, CTXPAR_DTYPE_F32, all);
    // A row count that is not the batch is refused, naming the file.
    const int64_t bad_shape[2] = {1, 5};
    ASSERT_EQ(cpt_npy_write((f.dir + "/cu1.npy").c_str(), CPT_NPY_I32, 2, bad_shape, cu.data()),
              CTXPAR_OK);
    o = Tool("audit " + f.args + " --cu-seqlens '" + f.dir + "/cu1.npy' --ranks 2");
    EXPECT_EQ(o.code, 2);
    EXPECT_NE(o.err.find("cu1.npy: cu_seqlens has 1 rows, but the batch"), std::string::npos)
        << o.err;
}

TEST(AuditTable, PrintsTheTableAndSaysWhatWasSaved) {
    AuditFiles f = MakeAuditFiles("audit_table", CTXPAR_DTYPE_F32, false);
    Outcome o = Tool("audit " + f.args + " --ranks 2");
    ASSERT_EQ(o.code, 0) << o.err;
    EXPECT_NE(o.out.find("ctxpar audit: ring"), std::string::npos) << o.out;
    EXPECT_NE(o.out.find("result: OK"), std::string::npos) << o.out;
    EXPECT_NE(o.out.find("saved out.npy, lse.npy, dq.npy, dk.npy, dv.npy"), std::string::npos);
    EXPECT_EQ(o.err, "");
}

TEST(AuditConvert, Float32FilesRunInBf16AndSaveFloat32) {
    AuditFiles f = MakeAuditFiles("audit_bf16", CTXPAR_DTYPE_F32, false);
    Outcome o = Tool("audit " + f.args + " --ranks 2 --dtype bf16 --json");
    ASSERT_EQ(o.code, 0) << o.err << o.out;
    Json j;
    ASSERT_TRUE(ParseJson(o.out, &j)) << o.out;
    EXPECT_EQ(j["config"]["dtype"].str, "bf16");
    // The oracle of the inputs rounded to bf16 (what the library computed on), the output saved
    // in the files' float32.
    AuditFiles r = f;
    for (Tensor *t : {&r.q, &r.k, &r.v, &r.dout})
        for (double &x : t->v)
            x = cpt_test_round(CTXPAR_DTYPE_BF16, x);
    Expected e = Oracle(r.sh, r.q, r.k, r.v, &r.dout, true, 0, nullptr);
    const Shape &s = r.sh;
    EXPECT_LE(SavedError(f.dir + "/saved/out.npy", CPT_NPY_F32, {s.b, s.s, s.h, s.d}, e.out),
              cpt_tolerance(CTXPAR_DTYPE_BF16, "out"));
}

// ---------------------------------------------------------------- bad inputs

std::string Bytes(const std::string &path) { return ReadAll(path); }

void WriteBytes(const std::string &path, const std::string &b) {
    std::ofstream f(path, std::ios::binary);
    f << b;
}

// The file's header with one substring replaced (same length keeps the data offset).
std::string Edit(std::string b, const std::string &from, const std::string &to) {
    size_t at = b.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    if (at != std::string::npos)
        b.replace(at, from.size(), to);
    return b;
}

struct BadInputs : testing::Test {
    void SetUp() override {
        dir = Dir("bad_inputs");
        good = MakeAuditFiles("bad_inputs_good", CTXPAR_DTYPE_F32, false);
        q = good.dir + "/q.npy";
        k = good.dir + "/k.npy";
        v = good.dir + "/v.npy";
    }
    // Runs audit with q, k, v replaced as given; expects exit 2 and one line mentioning `needle`.
    void ExpectRejected(const std::string &extra, const std::string &needle, const char *qq = 0,
                        const char *kk = 0, const char *vv = 0) {
        std::string args = "audit --ranks 2 --q '" + std::string(qq ? qq : q.c_str()) +
                           "' --k '" + (kk ? kk : k.c_str()) + "' --v '" +
                           (vv ? vv : v.c_str()) + "' " + extra;
        Outcome o = Tool(args);
        EXPECT_EQ(o.code, 2) << args << "\n" << o.err << o.out;
        EXPECT_EQ(Lines(o.err), 1) << args << "\n" << o.err;
        EXPECT_NE(o.err.find(needle), std::string::npos) << args << "\n" << o.err;
        EXPECT_EQ(o.err.find("Sanitizer"), std::string::npos) << o.err;
    }
    std::string File(const std::string &name, const std::string &bytes) {
        std::string p = dir + "/" + name;
        WriteBytes(p, bytes);
        return p;
    }
    std::string dir, q, k, v;
    AuditFiles good;
};

TEST_F(BadInputs, NotANpyFile) {
    std::string p = File("text.npy", "this is not numpy\n");
    ExpectRejected("", "text.npy: not a .npy file", p.c_str());
}

TEST_F(BadInputs, MissingFile) {
    ExpectRejected("", "nowhere.npy: cannot open", (dir + "/nowhere.npy").c_str());
}

TEST_F(BadInputs, TruncatedData) {
    std::string b = Bytes(q);
    std::string p = File("short.npy", b.substr(0, b.size() - 5));
    ExpectRejected("", "short.npy: truncated data", p.c_str());
}

TEST_F(BadInputs, TruncatedHeader) {
    std::string p = File("stub.npy", Bytes(q).substr(0, 30));
    ExpectRejected("", "stub.npy:", p.c_str());
}

TEST_F(BadInputs, BytesAfterTheData) {
    std::string p = File("long.npy", Bytes(k) + "xx");
    ExpectRejected("", "long.npy: 2 unexpected bytes", nullptr, p.c_str());
}

TEST_F(BadInputs, BigEndian) {
    std::string p = File("big.npy", Edit(Bytes(v), "'<f4'", "'>f4'"));
    ExpectRejected("", "big.npy: big-endian dtype", nullptr, nullptr, p.c_str());
}

TEST_F(BadInputs, FortranOrder) {
    std::string p = File("fortran.npy", Edit(Bytes(q), "False", "True "));
    ExpectRejected("", "fortran.npy: fortran_order True", p.c_str());
}

TEST_F(BadInputs, Complex) { // float64 is read (rounded to float32); complex is not
    std::string p = File("c8.npy", Edit(Bytes(q), "'<f4'", "'<c8'"));
    ExpectRejected("", "c8.npy: dtype '<c8' not supported", p.c_str());
}

TEST_F(BadInputs, IntegerTensor) {
    std::vector<int32_t> data(2 * 64 * 4 * 16);
    int64_t shape[4] = {2, 64, 4, 16};
    std::string p = dir + "/int.npy";
    ASSERT_EQ(cpt_npy_write(p.c_str(), CPT_NPY_I32, 4, shape, data.data()), CTXPAR_OK);
    ExpectRejected("", "int.npy: q has dtype int32", p.c_str());
}

TEST_F(BadInputs, ThreeDimensions) {
    std::vector<float> data(64 * 4 * 16);
    int64_t shape[3] = {64, 4, 16};
    std::string p = dir + "/three.npy";
    ASSERT_EQ(cpt_npy_write(p.c_str(), CPT_NPY_F32, 3, shape, data.data()), CTXPAR_OK);
    ExpectRejected("", "three.npy: q has shape (64, 4, 16); want 4 dimensions", p.c_str());
}

TEST_F(BadInputs, EmptyDimension) {
    int64_t shape[4] = {2, 0, 4, 16};
    std::string p = dir + "/empty.npy";
    ASSERT_EQ(cpt_npy_write(p.c_str(), CPT_NPY_F32, 4, shape, nullptr), CTXPAR_OK);
    ExpectRejected("", "empty.npy: q has an empty dimension", p.c_str());
}

TEST_F(BadInputs, HeadDimDisagrees) {
    WriteInput(dir + "/k_d8.npy", CTXPAR_DTYPE_F32, 2, 64, 2, 8, 9);
    ExpectRejected("", "k_d8.npy: k has shape (2, 64, 2, 8), which does not match q's",
                   nullptr, (dir + "/k_d8.npy").c_str());
}

TEST_F(BadInputs, SeqDisagrees) {
    WriteInput(dir + "/v_s32.npy", CTXPAR_DTYPE_F32, 2, 32, 2, 16, 9);
    ExpectRejected("", "v_s32.npy: v has shape (2, 32, 2, 16), which does not match k's",
                   nullptr, nullptr, (dir + "/v_s32.npy").c_str());
}

TEST_F(BadInputs, KvHeadsDoNotDivide) {
    WriteInput(dir + "/k_h3.npy", CTXPAR_DTYPE_F32, 2, 64, 3, 16, 9);
    WriteInput(dir + "/v_h3.npy", CTXPAR_DTYPE_F32, 2, 64, 3, 16, 9);
    ExpectRejected("", "k_h3.npy: k has 3 heads, which does not divide q's 4 heads", nullptr,
                   (dir + "/k_h3.npy").c_str(), (dir + "/v_h3.npy").c_str());
}

TEST_F(BadInputs, MixedDtypes) {
    WriteInput(dir + "/k_f16.npy", CTXPAR_DTYPE_F16, 2, 64, 2, 16, 9);
    ExpectRejected("", "k_f16.npy: k is float16 but q is float32", nullptr,
                   (dir + "/k_f16.npy").c_str());
}

TEST_F(BadInputs, DoutShape) {
    WriteInput(dir + "/dout_h2.npy", CTXPAR_DTYPE_F32, 2, 64, 2, 16, 9);
    ExpectRejected("--dout '" + dir + "/dout_h2.npy'", "dout_h2.npy: dout has shape");
}

TEST_F(BadInputs, CuSeqlensEndsEarly) {
    std::vector<int32_t> cu = {0, 10, 60};
    int64_t n = 3;
    std::string p = dir + "/cu_short.npy";
    ASSERT_EQ(cpt_npy_write(p.c_str(), CPT_NPY_I32, 1, &n, cu.data()), CTXPAR_OK);
    ExpectRejected("--cu-seqlens '" + p + "'", "cu_short.npy: cu_seqlens ends at 60");
}

TEST_F(BadInputs, CuSeqlensOutOfInt32) {
    std::vector<int64_t> cu = {0, 5000000000LL, 64};
    int64_t n = 3;
    std::string p = dir + "/cu_big.npy";
    ASSERT_EQ(cpt_npy_write(p.c_str(), CPT_NPY_I64, 1, &n, cu.data()), CTXPAR_OK);
    ExpectRejected("--cu-seqlens '" + p + "'",
                   "cu_big.npy: cu_seqlens[1] = 5000000000 does not fit in int32");
}

TEST_F(BadInputs, CuSeqlensDecreasing) {
    // Equal boundaries are an empty document (allowed); a boundary going back is not.
    std::vector<int32_t> cu = {0, 30, 30, 20, 64};
    int64_t n = 5;
    std::string p = dir + "/cu_back.npy";
    ASSERT_EQ(cpt_npy_write(p.c_str(), CPT_NPY_I32, 1, &n, cu.data()), CTXPAR_OK);
    ExpectRejected("--cu-seqlens '" + p + "'", "cu_back.npy: cu_seqlens[3] = 20");
}

TEST_F(BadInputs, CuSeqlensFloat) {
    std::vector<float> cu = {0, 64};
    int64_t n = 2;
    std::string p = dir + "/cu_float.npy";
    ASSERT_EQ(cpt_npy_write(p.c_str(), CPT_NPY_F32, 1, &n, cu.data()), CTXPAR_OK);
    ExpectRejected("--cu-seqlens '" + p + "'", "cu_float.npy: cu_seqlens has dtype float32");
}

TEST_F(BadInputs, SeqThatDoesNotSplitEvenlyRuns) {
    // 64 tokens over 3 ranks (and 128 ranks: some hold none): uneven shards, nothing padded.
    for (const char *ranks : {"3", "128"}) {
        Outcome o = Tool("audit --ranks " + std::string(ranks) + " --layout zigzag --q '" + q +
                         "' --k '" + k + "' --v '" + v + "' --json");
        EXPECT_EQ(o.code, 0) << ranks << " ranks: " << o.err << o.out;
    }
}

TEST_F(BadInputs, LibraryRejection) {
    // All-to-all splits the 4 query heads over the ranks: not over 3. The library's own message
    // is printed and the exit code is 2.
    ExpectRejected("--ranks 3 --algo alltoall", "divide by the ranks (3)");
}

TEST_F(BadInputs, MissingQ) {
    Outcome o = Tool("audit --k '" + k + "' --v '" + v + "'");
    EXPECT_EQ(o.code, 2);
    EXPECT_EQ(Lines(o.err), 1) << o.err;
    EXPECT_NE(o.err.find("--q, --k and --v are required"), std::string::npos) << o.err;
}

TEST_F(BadInputs, ShapeFlagsDoNotApply) {
    Outcome o = Tool("audit --q '" + q + "' --k '" + k + "' --v '" + v + "' --seq 128");
    EXPECT_EQ(o.code, 2);
    EXPECT_NE(o.err.find("--seq does not apply to audit"), std::string::npos) << o.err;
}

TEST_F(BadInputs, SaveDirCannotBeMade) {
    ExpectRejected("--save '" + q + "/sub'", "cannot create the directory");
}

// ---------------------------------------------------------------- bench

const char *const kBenchFields[] = {"fwd_flops_per_s",     "tokens_per_s",
                                    "peak_bytes_per_rank", "bytes_sent_per_rank",
                                    "fwd_time_s",          "fwd_bwd_flops_per_s",
                                    "fwd_bwd_time_s",      "hidden_transfer_fraction",
                                    "compute_s",           "transfer_s",
                                    "wait_s",              "allocations_per_call"};

TEST(Bench, JsonHasEveryFieldWithSaneValues) {
    Outcome o = Tool("bench --seq 256 --ranks 2 --heads 2 --dim 32 --mask causal --backward "
                    "--warmup 1 --repeat 2 --json");
    ASSERT_EQ(o.code, 0) << o.err << o.out;
    Json j;
    ASSERT_TRUE(ParseJson(o.out, &j)) << o.out;
    for (const Json *side : {static_cast<const Json *>(&j), &j["baseline"]}) {
        for (const char *f : kBenchFields)
            EXPECT_TRUE(side->Has(f)) << f;
        EXPECT_GT((*side)["fwd_flops_per_s"].num, 0);
        EXPECT_GT((*side)["fwd_bwd_flops_per_s"].num, 0);
        EXPECT_GT((*side)["tokens_per_s"].num, 0);
        EXPECT_GT((*side)["peak_bytes_per_rank"].num, 0);
        // The context's workspace: after the warm-up, calls allocate nothing.
        EXPECT_EQ((*side)["allocations_per_call"].num, 0);
        EXPECT_GT((*side)["compute_s"].num, 0);
        // FLOPs by the convention: 4 * B * H * D * S^2 / 2 (causal), computed here.
        EXPECT_DOUBLE_EQ((*side)["fwd_flops"].num, 4.0 * 1 * 2 * 32 * 256.0 * 256.0 / 2);
        // Throughput and time tell the same story.
        EXPECT_NEAR((*side)["tokens_per_s"].num * (*side)["fwd_time_s"].num, 256, 1e-2);
    }
    EXPECT_EQ(j["ranks"].num, 2);
    EXPECT_EQ(j["baseline"]["ranks"].num, 1);
    // Two ranks of a ring send K/V blocks; one rank sends nothing and hides nothing.
    EXPECT_GT(j["bytes_sent_per_rank"].num, 0);
    EXPECT_EQ(j["baseline"]["bytes_sent_per_rank"].num, 0);
    ASSERT_EQ(j["hidden_transfer_fraction"].kind, Json::Number);
    EXPECT_GE(j["hidden_transfer_fraction"].num, 0.0);
    EXPECT_LE(j["hidden_transfer_fraction"].num, 1.0);
    EXPECT_EQ(j["baseline"]["hidden_transfer_fraction"].kind, Json::Null);
    EXPECT_GT(j["speedup"].num, 0);
    EXPECT_EQ(j["config"]["comm"].str, "local");
    // What the device computed with: the CPU's kernels and the threads each rank had (one of
    // the 2 cores each: 2 ranks).
    EXPECT_EQ(j["device"].str.rfind("cpu: ", 0), 0u) << j["device"].str;
    EXPECT_NE(j["device"].str.find(" kernels ("), std::string::npos) << j["device"].str;
    EXPECT_NE(j["device"].str.find(", " + std::to_string(static_cast<int>(j["threads_per_rank"].num)) +
                                   " thread"),
              std::string::npos)
        << j["device"].str;
}

// --cudnn picks the CUDA device's path: any other backend is a usage error naming why, and a
// value other than auto, on, off is refused.
TEST(Bench, CudnnNeedsTheCudaBackend) {
    Outcome o = Tool("bench --seq 64 --ranks 2 --cudnn off");
    EXPECT_EQ(o.code, 2);
    EXPECT_NE(o.err.find("--cudnn chooses the CUDA device's path: it needs --backend cuda"),
              std::string::npos)
        << o.err;
    o = Tool("check --seq 64 --ranks 2 --cudnn maybe");
    EXPECT_EQ(o.code, 2);
    EXPECT_NE(o.err.find("bad value 'maybe' for --cudnn"), std::string::npos) << o.err;
}

// The percentages of peak, from numbers of the same JSON: FLOP/s over one core's measured peak
// times the cores in use (ranks x threads, at most the machine's cores); the backward alone is
// the fwd+bwd time minus the forward time, 2.5x the forward FLOPs.
TEST(Bench, PercentOfPeakFollowsFromTheMeasuredPeak) {
    Outcome o = Tool("bench --seq 256 --ranks 2 --threads 1 --heads 2 --dim 32 --backward "
                    "--warmup 0 --repeat 1 --json");
    ASSERT_EQ(o.code, 0) << o.err << o.out;
    Json j;
    ASSERT_TRUE(ParseJson(o.out, &j)) << o.out;
    const double per_core = j["peak_flops_per_core"].num;
    const double cores = j["cores"].num;
    ASSERT_GT(per_core, 0);
    ASSERT_GE(cores, 1);
    EXPECT_EQ(j["peak_vector_lanes"].num, j["peak_kernels"].str == "avx512" ? 16
                                          : j["peak_kernels"].str == "avx2" ? 8
                                                                            : 4);
    for (const Json *side : {static_cast<const Json *>(&j), &j["baseline"]}) {
        const Json &n = *side;
        const double used = std::min(n["ranks"].num * n["threads_per_rank"].num, cores);
        EXPECT_NEAR(n["peak_flops"].num / (per_core * used), 1.0, 1e-9); // JSON: 12 digits
        EXPECT_NEAR(n["fwd_fraction_of_peak"].num,
                    n["fwd_flops_per_s"].num / (per_core * used), 1e-9);
        EXPECT_NEAR(n["fwd_bwd_fraction_of_peak"].num,
                    n["fwd_bwd_flops_per_s"].num / (per_core * used), 1e-9);
        const double bwd_s = n["fwd_bwd_time_s"].num - n["fwd_time_s"].num;
        EXPECT_NEAR(n["bwd_time_s"].num, bwd_s, 1e-9);
        EXPECT_NEAR(n["bwd_flops_per_s"].num / (2.5 * n["fwd_flops"].num / bwd_s), 1.0, 1e-9);
        EXPECT_NEAR(n["bwd_fraction_of_peak"].num * per_core * used, n["bwd_flops_per_s"].num,
                    1e-6 * n["bwd_flops_per_s"].num);
    }
    EXPECT_EQ(j["threads_per_rank"].num, 1);
    EXPECT_EQ(j["baseline"]["threads_per_rank"].num, 2);
}

TEST(Bench, PeakAloneMeasuresTheCores) {
    Outcome o = Tool("bench --peak --json");
    ASSERT_EQ(o.code, 0) << o.err << o.out;
    Json j;
    ASSERT_TRUE(ParseJson(o.out, &j)) << o.out;
    EXPECT_GT(j["peak_flops_per_core"].num, 0);
    EXPECT_GT(j["all_cores_flops"].num, 0);
    EXPECT_GT(j["all_cores_flops_per_core"].num, 0);
    EXPECT_GE(j["cores"].num, 1);
    EXPECT_FALSE(j.Has("fwd_flops_per_s")); // no attention was run
    o = Tool("bench --peak");
    ASSERT_EQ(o.code, 0) << o.err;
    EXPECT_NE(o.out.find("GFLOP/s"), std::string::npos) << o.out;
    o = Tool("bench --peak --backend cuda");
    EXPECT_EQ(o.code, 2);
    // Where CUDA is not compiled in (sanitizer builds), the backend itself is the usage error.
    EXPECT_TRUE(o.err.find("--peak") != std::string::npos ||
                o.err.find("unknown backend 'cuda'") != std::string::npos)
        << o.err;
}

TEST(Bench, WindowCountsTheVisiblePairs) {
    Outcome o = Tool("bench --seq 128 --ranks 2 --heads 1 --dim 16 --mask none --window 10 "
                    "--layout contiguous --repeat 1 --warmup 0 --json");
    ASSERT_EQ(o.code, 0) << o.err << o.out;
    Json j;
    ASSERT_TRUE(ParseJson(o.out, &j)) << o.out;
    // Query i sees every key k > i and the min(i + 1, 10) keys k <= i within the window.
    double pairs = 0;
    for (int i = 0; i < 128; i++)
        pairs += std::min(i + 1, 10) + (127 - i);
    EXPECT_DOUBLE_EQ(j["fwd_flops"].num, 4.0 * 16 * pairs);
}

TEST(Bench, TwoSidedWindowCountsTheBand) {
    Outcome o = Tool("bench --seq 128 --ranks 2 --heads 1 --dim 16 --mask none --window 10 "
                    "--window-right 6 --layout contiguous --repeat 1 --warmup 0 --json");
    ASSERT_EQ(o.code, 0) << o.err << o.out;
    Json j;
    ASSERT_TRUE(ParseJson(o.out, &j)) << o.out;
    EXPECT_EQ(j["config"]["window_right"].num, 6);
    double pairs = 0; // i - 10 < k <= i + 6, brute force
    for (int i = 0; i < 128; i++)
        for (int k = 0; k < 128; k++)
            pairs += i - k < 10 && k - i <= 6;
    EXPECT_DOUBLE_EQ(j["fwd_flops"].num, 4.0 * 16 * pairs);
}

TEST(Bench, CheckComparesWithTheOracle) {
    Outcome o = Tool("bench --seq 128 --ranks 2 --heads 2 --dim 16 --repeat 1 --check --json");
    ASSERT_EQ(o.code, 0) << o.err << o.out;
    Json j;
    ASSERT_TRUE(ParseJson(o.out, &j)) << o.out;
    ASSERT_TRUE(j.Has("errors"));
    EXPECT_LE(j["errors"]["out"].num, cpt_tolerance(CTXPAR_DTYPE_F32, "out"));
    EXPECT_TRUE(j["ok"].b);
}

// The median comes with its spread: the fastest and slowest of the repeats (min <= median <=
// max, on each side and in the speedup's range), in the JSON and in the tables. More ranks x
// threads than this machine's cores is said on stderr, flagged in the JSON and marked in a
// sweep's row.
TEST(Bench, SpreadOverRepeatsAndAWarningWhenRanksShareCores) {
    Outcome o = Tool("bench --seq 256 --ranks 2 --threads 1 --heads 2 --dim 16 --backward "
                     "--warmup 0 --repeat 3 --json");
    ASSERT_EQ(o.code, 0) << o.err << o.out;
    Json j;
    ASSERT_TRUE(ParseJson(o.out, &j)) << o.out;
    for (const Json *side : {static_cast<const Json *>(&j), &j["baseline"]})
        for (const char *t : {"fwd_time", "fwd_bwd_time"}) {
            const std::string k = t;
            const double lo = (*side)[k + "_min_s"].num, mid = (*side)[k + "_s"].num,
                         hi = (*side)[k + "_max_s"].num;
            EXPECT_GT(lo, 0) << k;
            EXPECT_LE(lo, mid) << k;
            EXPECT_LE(mid, hi) << k;
        }
    EXPECT_LE(j["speedup_min"].num, j["speedup"].num);
    EXPECT_GE(j["speedup_max"].num, j["speedup"].num);
    const double want = j["baseline"]["fwd_bwd_time_min_s"].num / j["fwd_bwd_time_max_s"].num;
    EXPECT_NEAR(j["speedup_min"].num, want, 1e-9 * want); // JSON keeps 12 digits
    Outcome t = Tool("bench --seq 256 --ranks 2 --threads 1 --heads 2 --dim 16 --warmup 0 "
                     "--repeat 3");
    ASSERT_EQ(t.code, 0) << t.err;
    EXPECT_NE(t.out.find("min - max"), std::string::npos) << t.out;

    // Twice as many ranks as cores, one thread each: oversubscribed, whatever the machine.
    const long cores = sysconf(_SC_NPROCESSORS_ONLN);
    const std::string over = std::to_string(2 * cores);
    o = Tool("bench --seq 256 --ranks " + over +
             " --threads 1 --heads 2 --dim 16 --warmup 0 "
             "--repeat 1 --json");
    ASSERT_EQ(o.code, 0) << o.err << o.out;
    ASSERT_TRUE(ParseJson(o.out, &j)) << o.out;
    EXPECT_TRUE(j["oversubscribed"].b);
    // The baseline has as many threads in all as the ranks: the same cores, shared alike.
    EXPECT_TRUE(j["baseline"]["oversubscribed"].b) << o.out;
    EXPECT_EQ(j["baseline"]["threads_per_rank"].num, 2 * cores);
    EXPECT_NE(o.err.find("warning: " + over + " ranks x 1 threads on " + std::to_string(cores) +
                         " cores"),
              std::string::npos)
        << o.err;
    o = Tool("bench --seq 256 --ranks " + over +
             " --threads 1 --heads 2 --dim 16 --warmup 0 "
             "--repeat 1");
    EXPECT_NE(o.out.find("warning: " + over + " ranks x 1 threads"), std::string::npos) << o.out;
    o = Tool("bench --sweep --seq 256 --ranks 1," + over +
             " --threads 1 --heads 2 --dim 16 "
             "--warmup 0 --repeat 1");
    ASSERT_EQ(o.code, 0) << o.err;
    EXPECT_NE(o.out.find("| 256 | " + over + " | 1 (over the cores) |"), std::string::npos)
        << o.out;
    EXPECT_NE(o.out.find("| 256 | 1 | 1 |"), std::string::npos) << o.out;
}

TEST(Bench, SweepPrintsOneRowPerPair) {
    Outcome o = Tool("bench --sweep --seq 128,256 --ranks 1,2 --heads 2 --dim 16 --repeat 1 "
                    "--warmup 0");
    ASSERT_EQ(o.code, 0) << o.err << o.out;
    int rows = 0;
    std::istringstream in(o.out);
    for (std::string line; std::getline(in, line);)
        rows += line.rfind("| 128 |", 0) == 0 || line.rfind("| 256 |", 0) == 0;
    EXPECT_EQ(rows, 4) << o.out;
    EXPECT_NE(o.out.find("|---:|"), std::string::npos) << o.out;

    o = Tool("bench --sweep --seq 128,256 --ranks 1,2 --heads 2 --dim 16 --repeat 1 --json");
    ASSERT_EQ(o.code, 0) << o.err << o.out;
    Json j;
    ASSERT_TRUE(ParseJson(o.out, &j)) << o.out;
    ASSERT_EQ(j["sweep"].items.size(), 4u);
    for (const Json &e : j["sweep"].items)
        EXPECT_GT(e["tokens_per_s"].num, 0);
    EXPECT_EQ(j["sweep"].items[3]["config"]["seq"].num, 256);
    EXPECT_EQ(j["sweep"].items[3]["ranks"].num, 2);
}

// --reproducible: the default mode measured on the same ranks in the same run, beside it, with
// the ratios reproducible/default of the forward and forward + backward times, memory and bytes.
TEST(Bench, ReproducibleBesideTheDefault) {
    const std::string args = "bench --reproducible --seq 512 --ranks 2 --threads 1 --heads 2 "
                             "--dim 16 --layout contiguous --backward --warmup 0 --repeat 1";
    Outcome o = Tool(args);
    ASSERT_EQ(o.code, 0) << o.err << o.out;
    EXPECT_NE(o.out.find("reproducible against the default mode (2 ranks each, same run)"),
              std::string::npos)
        << o.out;
    for (const char *row : {"forward (median)", "forward + backward", "peak memory per rank, MiB",
                            "sent per rank, MiB"}) {
        const size_t at = o.out.find(std::string("  ") + row, o.out.find("reproducible/default"));
        ASSERT_NE(at, std::string::npos) << row << "\n" << o.out;
        const std::string line = o.out.substr(at, o.out.find('\n', at) - at);
        EXPECT_EQ(line.back(), 'x') << line; // the ratio closes the row
    }
    o = Tool(args + " --json");
    ASSERT_EQ(o.code, 0) << o.err << o.out;
    Json j;
    ASSERT_TRUE(ParseJson(o.out, &j)) << o.out;
    for (const char *f : kBenchFields)
        EXPECT_TRUE(j["default_mode"].Has(f)) << f;
    const Json &q = j["reproducible_over_default"];
    EXPECT_NEAR(q["fwd_time"].num, j["fwd_time_s"].num / j["default_mode"]["fwd_time_s"].num,
                1e-6 * q["fwd_time"].num);
    EXPECT_NEAR(q["fwd_bwd_time"].num,
                j["fwd_bwd_time_s"].num / j["default_mode"]["fwd_bwd_time_s"].num,
                1e-6 * q["fwd_bwd_time"].num);
    // The bins accumulators and the dK/dV sent as bins: more memory and more bytes.
    EXPECT_GT(q["peak_bytes_per_rank"].num, 1);
    EXPECT_GT(q["bytes_sent_per_rank"].num, 1);
    EXPECT_GT(j["bytes_sent_per_rank"].num, j["default_mode"]["bytes_sent_per_rank"].num);
    // Without --reproducible there is no second run.
    o = Tool("bench --seq 256 --ranks 2 --heads 2 --dim 16 --warmup 0 --repeat 1 --json");
    ASSERT_EQ(o.code, 0) << o.err << o.out;
    Json plain;
    ASSERT_TRUE(ParseJson(o.out, &plain)) << o.out;
    EXPECT_FALSE(plain.Has("default_mode"));
}

TEST(Bench, ListsNeedSweep) {
    Outcome o = Tool("bench --seq 128,256");
    EXPECT_EQ(o.code, 2);
    EXPECT_NE(o.err.find("needs --sweep"), std::string::npos) << o.err;
}

// --algo all: every algorithm that accepts the problem on the same inputs, and whether their
// results agree bit for bit. Reproducible mode promises they do (ring, allgather, alltoall and
// the hybrid: the shards of 256 tokens are whole chunks, 2 k/v heads over 2 ranks); decode
// (queries shorter than the keys only) is not among them. The fp64 reference is computed once.
TEST(Check, AllAlgorithmsAgreeBitForBitWhenReproducible) {
    const std::string args = "check --algo all --reproducible --seq 512 --ranks 2 --heads 2 "
                             "--dim 16 --layout contiguous --backward";
    Outcome o = Tool(args);
    ASSERT_EQ(o.code, 0) << o.err << o.out;
    EXPECT_NE(
        o.out.find("all algorithms agree bit for bit: yes (ring, allgather, alltoall, hybrid)"),
        std::string::npos)
        << o.out;
    EXPECT_NE(o.out.find("fp64 reference computed once"), std::string::npos) << o.out;
    o = Tool(args + " --json");
    ASSERT_EQ(o.code, 0) << o.err << o.out;
    Json j;
    ASSERT_TRUE(ParseJson(o.out, &j)) << o.out;
    EXPECT_TRUE(j["ok"].b);
    EXPECT_TRUE(j["reproducible"].b);
    ASSERT_EQ(j["bitwise_agree"].kind, Json::Bool);
    EXPECT_TRUE(j["bitwise_agree"].b);
    EXPECT_EQ(j["first_difference"].kind, Json::Null);
    ASSERT_EQ(j["compared"].items.size(), 4u);
    EXPECT_EQ(j["compared"].items[3].str, "hybrid");
    ASSERT_EQ(j["algorithms"].items.size(), 4u);
    for (const Json &a : j["algorithms"].items) {
        SCOPED_TRACE(a["algo"].str);
        EXPECT_FALSE(a["refused"].b);
        EXPECT_TRUE(a["ok"].b);
        EXPECT_EQ(a["config"]["algo"].str, a["algo"].str);
    }
}

// Without reproducible mode the ring's merges and the all-gather's differ in the last bits at
// P = 4: the agreement says no and names the first pair and tensor; all-to-all refuses 2 heads
// over 4 ranks. Not a failure: every algorithm is within its bound.
TEST(Check, AllAlgorithmsDifferWithoutReproducible) {
    Outcome o = Tool("check --algo all --seq 512 --ranks 4 --heads 2 --dim 16 --backward");
    ASSERT_EQ(o.code, 0) << o.err << o.out;
    EXPECT_NE(o.out.find("all algorithms agree bit for bit: no (ring and allgather differ first "
                         "in "),
              std::string::npos)
        << o.out;
    EXPECT_NE(o.out.find("alltoall   refused: "), std::string::npos) << o.out;
    EXPECT_NE(o.out.find("  hybrid     OK"), std::string::npos) << o.out;
    o = Tool("check --algo all --seq 512 --ranks 4 --heads 2 --dim 16 --backward --json");
    ASSERT_EQ(o.code, 0) << o.err << o.out;
    Json j;
    ASSERT_TRUE(ParseJson(o.out, &j)) << o.out;
    EXPECT_FALSE(j["bitwise_agree"].b);
    EXPECT_EQ(j["first_difference"]["a"].str, "ring");
    EXPECT_EQ(j["first_difference"]["b"].str, "allgather");
    EXPECT_GT(j["first_difference"]["elements_differing"].num, 0);
    // Nothing accepts the problem: a usage error; --report takes one algorithm.
    o = Tool("check --algo all --reproducible --seq 512 --ranks 4 --heads 2 --dim 16");
    EXPECT_EQ(o.code, 2) << o.out;
    EXPECT_NE(o.out.find("no algorithm accepted the problem"), std::string::npos) << o.out;
    o = Tool("check --algo all --seq 512 --ranks 2 --report '" + TempDir() + "/all.html'");
    EXPECT_EQ(o.code, 2) << o.out;
    EXPECT_NE(o.err.find("--algo all takes no --report"), std::string::npos) << o.err;
}

TEST(Check, GeneratedDocuments) {
    Outcome o = Tool("check --seq 256 --ranks 4 --heads 2 --dim 16 --docs 3 --layout striped "
                     "--backward --json");
    ASSERT_EQ(o.code, 0) << o.err << o.out;
    Json j;
    ASSERT_TRUE(ParseJson(o.out, &j)) << o.out;
    EXPECT_TRUE(j["ok"].b);
    EXPECT_EQ(j["config"]["docs"].num, 3);
    o = Tool("check --seq 16 --ranks 2 --docs 17");
    EXPECT_EQ(o.code, 2);
    EXPECT_NE(o.err.find("docs (17) must be in [1, seq (16)]"), std::string::npos) << o.err;
}

// --algo hybrid --ulysses U: groups of U ranks, a ring across them; the oracle judges it. A
// group size that does not divide the ranks is the library's INVALID_ARG, named.
TEST(Check, HybridWithUlysses) {
    Outcome o = Tool("check --seq 192 --ranks 6 --heads 6 --kv-heads 3 --dim 16 --mask causal "
                     "--algo hybrid --ulysses 3 --backward --json");
    ASSERT_EQ(o.code, 0) << o.err << o.out;
    Json j;
    ASSERT_TRUE(ParseJson(o.out, &j)) << o.out;
    EXPECT_TRUE(j["ok"].b);
    EXPECT_EQ(j["config"]["algo_resolved"].str, "hybrid");
    EXPECT_EQ(j["config"]["ulysses"].num, 3);
    o = Tool("check --seq 192 --ranks 6 --heads 6 --dim 16 --algo hybrid --ulysses 4");
    EXPECT_EQ(o.code, 2) << o.err << o.out;
    EXPECT_NE((o.err + o.out).find("ulysses"), std::string::npos) << o.err << o.out;
}

// Queries at the last N positions over a sharded cache: check runs decode and AUTO and judges
// them against the fp64 reference; the commands that do not take --q-len yet say so.
TEST(Check, QueriesShorterThanTheKeys) {
    Outcome o = Tool("check --seq 200 --q-len 4 --ranks 3 --layout striped --heads 4 "
                     "--kv-heads 2 --dim 16 --algo decode --json");
    ASSERT_EQ(o.code, 0) << o.err << o.out;
    Json j;
    ASSERT_TRUE(ParseJson(o.out, &j)) << o.out;
    EXPECT_TRUE(j["ok"].b);
    EXPECT_EQ(j["config"]["algo_resolved"].str, "decode");
    EXPECT_EQ(j["config"]["q_len"].num, 4);
    o = Tool("check --seq 200 --q-len 1 --ranks 2 --dim 16 --algo auto --json");
    ASSERT_EQ(o.code, 0) << o.err << o.out;
    ASSERT_TRUE(ParseJson(o.out, &j)) << o.out;
    EXPECT_EQ(j["config"]["algo_resolved"].str, "decode");
    o = Tool("check --seq 200 --q-len 4 --ranks 2 --dim 16 --algo ring");
    EXPECT_NE(o.code, 0);
    EXPECT_NE((o.err + o.out).find("q_len"), std::string::npos) << o.err << o.out;
    for (const char *cmd : {"bench", "plan"}) {
        o = Tool(std::string(cmd) + " --seq 200 --q-len 4 --ranks 2 --dim 16 --algo decode");
        EXPECT_NE(o.code, 0) << cmd;
        EXPECT_NE((o.err + o.out).find("q-len"), std::string::npos) << cmd << o.err << o.out;
    }
}

// MLA, sinks and soft-capping from the command line: judged like every tensor, dsinks included
// (the same bits on every rank, within its bound); bad values are named.
TEST(Check, MlaSinksAndSoftcap) {
    const std::string sinks = TempDir() + "/sinks.npy";
    const float logits[4] = {0.5f, -1.0f, 3.0f, 7.0f};
    const int64_t n = 4;
    ASSERT_EQ(cpt_npy_write(sinks.c_str(), CPT_NPY_F32, 1, &n, logits), CTXPAR_OK);
    Outcome o = Tool("check --seq 128 --ranks 4 --heads 4 --kv-heads 2 --dim 48 --v-dim 32 "
                     "--softcap 2.5 --scale 0.3 --sinks " +
                     sinks + " --layout zigzag --backward --json");
    ASSERT_EQ(o.code, 0) << o.err << o.out;
    Json j;
    ASSERT_TRUE(ParseJson(o.out, &j)) << o.out;
    EXPECT_TRUE(j["ok"].b);
    EXPECT_EQ(j["config"]["v_dim"].num, 32);
    EXPECT_EQ(j["config"]["softcap"].num, 2.5);
    ASSERT_TRUE(j.Has("dsinks")) << o.out;
    EXPECT_LE(j["dsinks"]["bound_ratio"].num, 1.0);
    EXPECT_GT(j["dsinks"]["error"].num, 0.0);
    o = Tool("check --seq 64 --ranks 2 --heads 4 --v-dim 8 --sinks " + sinks + " --backward");
    ASSERT_EQ(o.code, 0) << o.err << o.out;
    EXPECT_NE(o.out.find("dsinks"), std::string::npos) << o.out;
    for (const char *bad : {"--softcap 0", "--softcap -2", "--softcap nan"}) {
        o = Tool(std::string("check --seq 64 --ranks 2 ") + bad);
        EXPECT_EQ(o.code, 2) << bad;
        EXPECT_NE(o.err.find("--softcap"), std::string::npos) << o.err;
    }
    o = Tool("check --seq 64 --ranks 2 --heads 3 --sinks " + sinks);
    EXPECT_EQ(o.code, 2);
    EXPECT_NE(o.err.find("want float32 [3]"), std::string::npos) << o.err;
}

// ---------------------------------------------------------------- windows, soft-capping, hybrid

// --window-right with --mask none in check, alone and with --window, on the ring and the
// all-to-all: the run passes against the oracle (every tensor within its per-element bound),
// and the config says what ran.
TEST(Check, TwoSidedWindow) {
    struct Run {
        const char *args;
        int64_t left, right;
    };
    for (const Run &run :
         {Run{"--ranks 4 --heads 4 --kv-heads 2 --layout zigzag --algo ring --window 20 "
              "--window-right 9",
              20, 9},
          Run{"--ranks 4 --heads 4 --kv-heads 2 --layout striped --algo alltoall --window 20 "
              "--window-right 9",
              20, 9},
          Run{"--ranks 3 --heads 2 --layout contiguous --algo ring --window-right 5", 0, 5}}) {
        SCOPED_TRACE(run.args);
        Outcome o =
            Tool(std::string("check --seq 96 --dim 16 --mask none --backward --json ") + run.args);
        ASSERT_EQ(o.code, 0) << o.err << o.out;
        Json j;
        ASSERT_TRUE(ParseJson(o.out, &j)) << o.out;
        EXPECT_TRUE(j["ok"].b) << o.out;
        EXPECT_EQ(j["config"]["mask"].str, "none");
        EXPECT_EQ(j["config"]["window"].num, run.left);
        EXPECT_EQ(j["config"]["window_right"].num, run.right);
        for (const char *t : {"out", "lse", "dq", "dk", "dv"}) {
            ASSERT_TRUE(j["bound_ratio"].Has(t)) << t << ": " << o.out;
            EXPECT_LE(j["bound_ratio"][t].num, 1.0) << t;
        }
    }
}

// Oracle with a two-sided window and soft-capping: mask none (or causal), window_left,
// window_right, softcap (0: none) and the scale the library resolves from --scale.
Expected OracleBand(const Shape &sh, const AuditFiles &f, bool causal, int64_t left, int64_t right,
                    double softcap, float scale) {
    Expected e;
    e.out.resize(f.q.v.size());
    e.lse.resize(static_cast<size_t>(sh.b * sh.h * sh.s));
    e.dq.resize(f.q.v.size());
    e.dk.resize(f.k.v.size());
    e.dv.resize(f.k.v.size());
    cpt_oracle_shape os = {sh.b, sh.s, sh.s, sh.h, sh.hkv, sh.d};
    ctxpar_mask_desc mask = {causal ? 1 : 0, left, nullptr, 0, right, 0};
    cpt_oracle_features feat = {};
    feat.softcap = softcap;
    cpt_oracle_fwd_ex(&os, f.q.v.data(), f.k.v.data(), f.v.v.data(), nullptr, nullptr, &mask, &feat,
                      static_cast<double>(scale), e.out.data(), e.lse.data());
    cpt_oracle_bwd_ex(&os, f.q.v.data(), f.k.v.data(), f.v.v.data(), nullptr, nullptr, &mask, &feat,
                      static_cast<double>(scale), f.dout.v.data(), e.dq.data(), e.dk.data(),
                      e.dv.data(), nullptr);
    return e;
}

// audit with --window-right (and --window), --softcap and --algo hybrid --ulysses: exit 0, the
// verdict OK, and the saved out, lse, dq, dk, dv match float64 attention computed here with
// that band and cap. The saved out is also far from attention without the feature, so the
// option was not dropped on the way.
TEST(AuditFeatures, TwoSidedWindowSoftcapAndHybridMatchFloat64Attention) {
    struct Run {
        const char *name, *args;
        bool causal;
        int64_t left, right;
        double softcap;
        float scale; // 0: 1/sqrt(D) in float
        const char *algo;
        int64_t ulysses;
    };
    const Run runs[] = {
        {"audit_window_right",
         "--ranks 4 --algo ring --layout zigzag --mask none --window 20 "
         "--window-right 9",
         false, 20, 9, 0.0, 0.0f, "ring", 0},
        {"audit_softcap",
         "--ranks 3 --algo allgather --layout contiguous --mask causal "
         "--softcap 1.5 --scale 1",
         true, 0, 0, 1.5, 1.0f, "allgather", 0},
        {"audit_hybrid",
         "--ranks 4 --algo hybrid --ulysses 2 --layout zigzag --mask none "
         "--window 12 --window-right 7 --softcap 2 --scale 1",
         false, 12, 7, 2.0, 1.0f, "hybrid", 2},
    };
    for (const Run &run : runs) {
        SCOPED_TRACE(run.args);
        AuditFiles f = MakeAuditFiles(run.name, CTXPAR_DTYPE_F32, false);
        Outcome o = Tool("audit " + f.args + " " + run.args + " --json");
        ASSERT_EQ(o.code, 0) << o.err << o.out;
        Json j;
        ASSERT_TRUE(ParseJson(o.out, &j)) << o.out;
        EXPECT_TRUE(j["ok"].b) << o.out;
        EXPECT_EQ(j["config"]["algo_resolved"].str, run.algo);
        EXPECT_EQ(j["config"]["ulysses"].num, run.ulysses);
        EXPECT_EQ(j["config"]["window"].num, run.left);
        EXPECT_EQ(j["config"]["window_right"].num, run.right);
        EXPECT_EQ(j["config"]["softcap"].num, run.softcap);
        const float scale =
            run.scale != 0.0f ? run.scale : 1.0f / std::sqrt(static_cast<float>(f.sh.d));
        ExpectSavedMatch(f, CTXPAR_DTYPE_F32,
                         OracleBand(f.sh, f, run.causal, run.left, run.right, run.softcap, scale));
        // Without the band's right side, or without the cap, the saved out would be wrong.
        const Expected plain =
            OracleBand(f.sh, f, run.causal, run.left, 0, run.right ? run.softcap : 0.0, scale);
        EXPECT_GT(SavedError(f.dir + "/saved/out.npy", CPT_NPY_F32,
                             {f.sh.b, f.sh.s, f.sh.h, f.sh.d}, plain.out),
                  10 * cpt_tolerance(CTXPAR_DTYPE_F32, "out"));
    }
}

// Bad values of --window-right and --softcap in check and audit: exit 2 (a usage error, before
// any run) and one line naming the option and the value.
TEST(AuditFeatures, BadWindowRightAndSoftcapAreUsageErrors) {
    AuditFiles f = MakeAuditFiles("audit_bad_values", CTXPAR_DTYPE_F32, false);
    for (const std::string &cmd : {std::string("check --seq 64 --ranks 2 --mask none"),
                                   "audit " + f.args + " --ranks 2 --mask none"}) {
        for (const char *bad : {"--window-right -1", "--window-right -7", "--window-right x",
                                "--softcap 0", "--softcap nan", "--softcap -1", "--softcap inf"}) {
            SCOPED_TRACE(cmd + " " + bad);
            Outcome o = Tool(cmd + " " + bad);
            EXPECT_EQ(o.code, 2) << o.err << o.out;
            const std::string opt = std::string(bad).substr(0, std::string(bad).find(' '));
            const std::string val = std::string(bad).substr(opt.size() + 1);
            EXPECT_NE(o.err.find("bad value '" + val + "' for " + opt), std::string::npos) << o.err;
            EXPECT_EQ(Lines(o.err), 1) << o.err;
            EXPECT_EQ(o.out, "");
        }
    }
}

// --cu-seqlens for check and bench, [docs + 1] (every row) or [batch, docs + 1] (each row its
// own, empty documents too): check judges every tensor against the oracle with those documents,
// and bench counts exactly the pairs they leave visible (brute force here), at 2 (D + Dv) FLOPs
// a pair (MLA). Files that do not fit the run are refused, naming the file.
TEST(CuSeqlens, CheckAndBenchTakeDocumentsPerRow) {
    const std::string flat = TempDir() + "/cu_flat.npy", rows = TempDir() + "/cu_rows.npy";
    const int32_t cu_flat[4] = {0, 50, 50, 128};
    const int64_t cu_rows[2][4] = {{0, 30, 128, 128}, {0, 0, 100, 128}};
    const int64_t n4 = 4, shape2[2] = {2, 4};
    ASSERT_EQ(cpt_npy_write(flat.c_str(), CPT_NPY_I32, 1, &n4, cu_flat), CTXPAR_OK);
    ASSERT_EQ(cpt_npy_write(rows.c_str(), CPT_NPY_I64, 2, shape2, cu_rows), CTXPAR_OK);
    // The same documents as text (numbers; a row a line): every command takes both forms.
    const std::string flat_txt = TempDir() + "/cu_flat.txt", rows_txt = TempDir() + "/cu_rows.txt";
    std::ofstream(flat_txt) << "0 50\n50\n128\n";
    std::ofstream(rows_txt) << "0 30 128 128\n0 0 100 128\n";
    for (const std::string &cu : {flat, rows, flat_txt, rows_txt}) {
        SCOPED_TRACE(cu);
        const bool per_row = cu == rows || cu == rows_txt;
        Outcome o = Tool("check --seq 128 --batch 2 --ranks 3 --heads 2 --dim 16 --v-dim 8 "
                         "--mask causal --layout zigzag --backward --cu-seqlens " +
                         cu + " --json");
        ASSERT_EQ(o.code, 0) << o.err << o.out;
        Json j;
        ASSERT_TRUE(ParseJson(o.out, &j)) << o.out;
        EXPECT_TRUE(j["ok"].b) << o.out;
        o = Tool("bench --seq 128 --batch 2 --ranks 2 --heads 2 --dim 16 --v-dim 8 --mask causal "
                 "--window 40 --repeat 1 --warmup 0 --cu-seqlens " +
                 cu + " --json");
        ASSERT_EQ(o.code, 0) << o.err << o.out;
        ASSERT_TRUE(ParseJson(o.out, &j)) << o.out;
        double pairs = 0; // causal, i - k < 40, same document, each batch row its own
        for (int b = 0; b < 2; b++)
            for (int i = 0; i < 128; i++)
                for (int k = 0; k <= i; k++) {
                    auto doc = [&](int t) {
                        int d = 0;
                        for (int e = 1; e < 4; e++)
                            d += per_row ? t >= cu_rows[b][e] : t >= cu_flat[e];
                        return d;
                    };
                    pairs += i - k < 40 && doc(i) == doc(k);
                }
        EXPECT_DOUBLE_EQ(j["fwd_flops"].num, 2.0 * (16 + 8) * 2 * pairs);
        // plan reads the same file the same way: its pairs are the ones counted here, x heads.
        o = Tool("plan --seq 128 --batch 2 --ranks 2 --heads 2 --dim 16 --v-dim 8 --mask causal "
                 "--window 40 --cu-seqlens " +
                 cu + " --json");
        ASSERT_EQ(o.code, 0) << o.err << o.out;
        ASSERT_TRUE(ParseJson(o.out, &j)) << o.out;
        double planned = 0;
        for (const Json &x : j["pairs_per_rank"].items)
            planned += x.num;
        EXPECT_EQ(planned, 2 * pairs);
    }
    Outcome o = Tool("check --seq 100 --ranks 2 --cu-seqlens " + flat);
    EXPECT_EQ(o.code, 2);
    EXPECT_NE(o.err.find("ends at 128, but --seq is 100"), std::string::npos) << o.err;
    o = Tool("check --seq 128 --batch 3 --ranks 2 --cu-seqlens " + rows);
    EXPECT_EQ(o.code, 2);
    EXPECT_NE(o.err.find("2 rows of documents, but --batch is 3"), std::string::npos) << o.err;
    o = Tool("bench --seq 128 --ranks 2 --docs 3 --cu-seqlens " + flat);
    EXPECT_EQ(o.code, 2);
    EXPECT_NE(o.err.find("does not combine with --docs"), std::string::npos) << o.err;
}

// audit takes --cu-seqlens as text too: the same documents give the same bits as the .npy.
TEST(CuSeqlens, AuditTakesTextLikeNpy) {
    AuditFiles f = MakeAuditFiles("audit_cu_text", CTXPAR_DTYPE_F32, true);
    const std::string txt = f.dir + "/cu.txt";
    std::ofstream out(txt);
    for (int32_t c : f.cu)
        out << c << "\n";
    out.close();
    const std::string base = "audit --ranks 2 --mask causal --json --q '" + f.dir +
                             "/q.npy' --k '" + f.dir + "/k.npy' --v '" + f.dir +
                             "/v.npy' --cu-seqlens ";
    Outcome npy = Tool(base + "'" + f.dir + "/cu.npy'"), text = Tool(base + "'" + txt + "'");
    ASSERT_EQ(npy.code, 0) << npy.err << npy.out;
    ASSERT_EQ(text.code, 0) << text.err << text.out;
    Json jn, jt;
    ASSERT_TRUE(ParseJson(npy.out, &jn)) << npy.out;
    ASSERT_TRUE(ParseJson(text.out, &jt)) << text.out;
    for (const char *t : {"out", "lse"})
        EXPECT_EQ(jt["errors"][t].num, jn["errors"][t].num) << t;
    std::ofstream(txt) << "0 20 x 64\n";
    Outcome bad = Tool(base + "'" + txt + "'");
    EXPECT_EQ(bad.code, 2);
    EXPECT_NE(bad.err.find("cu.txt:1: 'x' is not an integer"), std::string::npos) << bad.err;
}

// plan --sinks takes the file every command takes (it needs only the count: one per query head);
// with --backward the sinks' gradient all-gather adds bytes. A switch without the file, or a file
// of the wrong count, is a usage error.
TEST(Plan, SinksFromAFileLikeEveryCommand) {
    const std::string dir = Dir("plan_sinks"), sinks = dir + "/sinks.npy", three = dir + "/s3.npy";
    const float s4[4] = {0.5f, -1, 2, 0}, s3[3] = {0, 0, 0};
    const int64_t n4 = 4, n3 = 3;
    ASSERT_EQ(cpt_npy_write(sinks.c_str(), CPT_NPY_F32, 1, &n4, s4), CTXPAR_OK);
    ASSERT_EQ(cpt_npy_write(three.c_str(), CPT_NPY_F32, 1, &n3, s3), CTXPAR_OK);
    const std::string args = "plan --ranks 4 --seq 512 --heads 4 --dim 16 --backward --json";
    Outcome with = Tool(args + " --sinks '" + sinks + "'"), without = Tool(args);
    ASSERT_EQ(with.code, 0) << with.err;
    Json jw, jo;
    ASSERT_TRUE(ParseJson(with.out, &jw)) << with.out;
    ASSERT_TRUE(ParseJson(without.out, &jo)) << without.out;
    EXPECT_GT(jw["bytes_max"].num, jo["bytes_max"].num) << "the dsinks all-gather";
    EXPECT_TRUE(jw["config"]["sinks"].b);
    // A usage error (exit 2) whose message holds `why`.
    auto refused = [](const std::string &args, const std::string &why) {
        Outcome o = Tool(args);
        EXPECT_EQ(o.code, 2) << args;
        EXPECT_NE(o.err.find(why), std::string::npos) << args << ": " << o.err;
    };
    refused("plan --ranks 4 --seq 512 --heads 4 --sinks", "--sinks needs a value");
    refused("plan --ranks 4 --seq 512 --heads 4 --sinks '" + three + "'", "want float32 [4]");
    refused("check --ranks 2 --seq 64 --heads 4 --dim 16 --sinks '" + three + "'",
            "want float32 [4]");
}

// MLA: bench counts 2 (D + Dv) FLOPs per visible pair, like the library's work statistics.
TEST(Bench, MlaCountsTwoDPlusDvPerPair) {
    Outcome o = Tool("bench --seq 96 --ranks 2 --heads 2 --dim 48 --v-dim 16 --mask causal "
                     "--repeat 1 --warmup 0 --json");
    ASSERT_EQ(o.code, 0) << o.err << o.out;
    Json j;
    ASSERT_TRUE(ParseJson(o.out, &j)) << o.out;
    EXPECT_DOUBLE_EQ(j["fwd_flops"].num, 2.0 * (48 + 16) * 2 * 96.0 * 96.0 / 2);
}

// The per-row error (max over rows of |err| / max |ref row|) is reported beside the per-tensor
// one in the JSON and the table; it is never below it (the row holding the largest error has
// at most the tensor's largest reference value), and a causal dk's small late-key rows keep it
// above the per-tensor one.
TEST(Check, ReportsThePerRowErrorBesideThePerTensorOne) {
    Outcome o = Tool("check --seq 256 --ranks 4 --heads 2 --dim 16 --mask causal "
                     "--layout contiguous --backward --json");
    ASSERT_EQ(o.code, 0) << o.err << o.out;
    Json j;
    ASSERT_TRUE(ParseJson(o.out, &j)) << o.out;
    ASSERT_TRUE(j.Has("row_errors")) << o.out;
    for (const char *t : {"out", "dq", "dk", "dv"}) {
        SCOPED_TRACE(t);
        const double tensor = j["errors"][t].num, row = j["row_errors"][t].num;
        EXPECT_GT(tensor, 0.0);
        EXPECT_GE(row, tensor);
        EXPECT_LT(row, 1e-3) << "F32 accuracy, row by row";
    }
    EXPECT_GT(j["row_errors"]["dk"].num, j["errors"]["dk"].num);
    o = Tool("check --seq 64 --ranks 2 --heads 1 --dim 16");
    ASSERT_EQ(o.code, 0) << o.err << o.out;
    EXPECT_NE(o.out.find("worst row"), std::string::npos) << o.out;
}

// The verdict is the per-element bound: per tensor the largest error/bound (within 1 for a
// correct run) and where it is: position, head, and the rank that held the row under zigzag.
TEST(Check, ReportsTheLargestErrorToBoundAndWhere) {
    Outcome o = Tool("check --seq 256 --ranks 4 --heads 2 --dim 16 --layout zigzag --backward "
                     "--json");
    ASSERT_EQ(o.code, 0) << o.err << o.out;
    Json j;
    ASSERT_TRUE(ParseJson(o.out, &j)) << o.out;
    EXPECT_TRUE(j["ok"].b);
    for (const char *t : {"out", "lse", "dq", "dk", "dv"}) {
        SCOPED_TRACE(t);
        ASSERT_TRUE(j["bound_ratio"].Has(t)) << o.out;
        EXPECT_GT(j["bound_ratio"][t].num, 0.0);
        EXPECT_LE(j["bound_ratio"][t].num, 1.0);
        const Json &w = j["bound_worst"][t];
        int64_t pos = (int64_t)w["position"].num, chunk = pos / 32; // 2 x 4 chunks of 32
        ASSERT_TRUE(pos >= 0 && pos < 256) << o.out;
        EXPECT_EQ((int64_t)w["rank"].num, chunk < 4 ? chunk : 7 - chunk) << o.out;
        EXPECT_TRUE(w["head"].num >= 0 && w["head"].num < 2) << o.out;
        EXPECT_LE(std::fabs(w["got"].num - w["expected"].num), w["bound"].num) << o.out;
    }
    o = Tool("check --seq 256 --ranks 4 --heads 2 --dim 16 --layout zigzag --backward");
    ASSERT_EQ(o.code, 0) << o.err << o.out;
    EXPECT_NE(o.out.find("error/bound"), std::string::npos) << o.out;
    EXPECT_NE(o.out.find("worst at (pos, head, rank)"), std::string::npos) << o.out;
}

// --rows judges a sample (every rank's and zigzag chunk's ends among it), says so in the table
// and the JSON, and beside the library's times reports the reference's; --no-single skips the
// one-rank run.
TEST(Check, RowsJudgesASampleAndNoSingleSkipsTheOneRankRun) {
    const std::string base = "check --seq 512 --ranks 4 --heads 2 --dim 16 --layout zigzag "
                             "--backward --rows 40 --seed 5";
    Outcome o = Tool(base + " --json");
    ASSERT_EQ(o.code, 0) << o.err << o.out;
    Json j;
    ASSERT_TRUE(ParseJson(o.out, &j)) << o.out;
    EXPECT_TRUE(j["ok"].b);
    EXPECT_EQ(j["rows_judged"].num, 40);
    EXPECT_EQ(j["rows_total"].num, 512);
    EXPECT_EQ(j["rows_boundaries"].num, 14); // 8 zigzag chunks, rank 3's two adjacent: 7 runs
    EXPECT_GT(j["reference_time_s"].num, 0.0);
    EXPECT_GT(j["single_rank_time_s"].num, 0.0);
    o = Tool(base);
    ASSERT_EQ(o.code, 0) << o.err << o.out;
    EXPECT_NE(o.out.find("judged 40 of 512 rows (query rows, and key rows for dk, dv): 14 first "
                         "or last of a rank's shard or layout chunk, 26 random (--seed 5)"),
              std::string::npos)
        << o.out;
    o = Tool(base + " --no-single --json");
    ASSERT_EQ(o.code, 0) << o.err << o.out;
    ASSERT_TRUE(ParseJson(o.out, &j)) << o.out;
    EXPECT_EQ(j["single_rank_time_s"].num, 0.0);
    EXPECT_TRUE(j["ok"].b);
    EXPECT_EQ(Tool(base + " --rows -1").code, 2);
}

TEST(Check, CudaBackendRunsOrSaysWhyNot) {
    // With a GPU: a result. Without one (or without CUDA in the build): one line, no crash.
    Outcome o = Tool("check --backend cuda --seq 256 --ranks 2 --heads 2 --dim 64");
    ASSERT_NE(o.code, -1) << o.err;
    if (o.code != 0) {
        EXPECT_EQ(Lines(o.err), 1) << o.err;
        EXPECT_TRUE(o.err.find("unknown backend 'cuda'") != std::string::npos ||
                    o.err.find("CUDA") != std::string::npos)
            << o.err;
    }
}

// ---------------------------------------------------------------- traces

// Global positions of `rank`'s tokens, written out here from the layouts' definitions.
std::vector<int64_t> Positions(const std::string &layout, int64_t S, int rank, int P) {
    std::vector<int64_t> pos;
    if (layout == "contiguous") {
        for (int64_t i = 0; i < S / P; i++)
            pos.push_back(rank * (S / P) + i);
    } else { // zigzag: 2P chunks, rank r holds chunks r and 2P-1-r
        int64_t c = S / (2 * P);
        for (int chunk : {rank, 2 * P - 1 - rank})
            for (int64_t i = 0; i < c; i++)
                pos.push_back(chunk * c + i);
    }
    return pos;
}

// Whether any query of rank r sees any key of rank j under the causal mask (k <= q).
bool CausalLive(const std::string &layout, int64_t S, int P, int r, int j) {
    std::vector<int64_t> q = Positions(layout, S, r, P), k = Positions(layout, S, j, P);
    return *std::min_element(k.begin(), k.end()) <= *std::max_element(q.begin(), q.end());
}

struct TraceCounts {
    std::set<int> rank_tracks;   // pids named "rank N"
    std::set<int> slice_pids;    // pids with slices
    std::map<int, std::vector<std::pair<int, int>>> compute; // rank -> (step, peer) per slice
    std::map<int, int> transfers;
};

TraceCounts ReadTrace(const std::string &path, const std::string &op) {
    TraceCounts t;
    Json j;
    std::string text = ReadAll(path);
    EXPECT_TRUE(ParseJson(text, &j)) << "not valid JSON: " << path;
    for (const Json &e : j["traceEvents"].items) {
        int pid = static_cast<int>(e["pid"].num);
        if (e["ph"].str == "M" && e["name"].str == "process_name") {
            EXPECT_EQ(e["args"]["name"].str, "rank " + std::to_string(pid));
            t.rank_tracks.insert(pid);
        }
        if (e["ph"].str != "X")
            continue;
        t.slice_pids.insert(pid);
        EXPECT_GE(e["dur"].num, 0);
        if (e["cat"].str == "compute" && e["args"]["op"].str == op) {
            int step = static_cast<int>(e["args"]["step"].num),
                peer = static_cast<int>(e["args"]["peer"].num);
            t.compute[pid].push_back({step, peer});
            EXPECT_EQ(e["name"].str, op + " step " + std::to_string(step) + ", block of rank " +
                                         std::to_string(peer));
        }
        if (e["cat"].str == "transfer")
            t.transfers[pid]++;
    }
    return t;
}

// One compute slice per live ring step, on each rank, with the block ring attention computes
// at that step: (r - s) mod P.
void ExpectOneSlicePerLiveStep(const TraceCounts &t, const std::string &layout, int64_t S, int P) {
    EXPECT_EQ(t.rank_tracks.size(), static_cast<size_t>(P));
    EXPECT_EQ(t.slice_pids.size(), static_cast<size_t>(P));
    for (int r = 0; r < P; r++) {
        std::vector<std::pair<int, int>> want;
        for (int s = 0; s < P; s++) {
            int j = (r - s + P) % P;
            if (CausalLive(layout, S, P, r, j))
                want.push_back({s, j});
        }
        std::vector<std::pair<int, int>> got;
        if (t.compute.count(r))
            got = t.compute.at(r);
        std::sort(got.begin(), got.end());
        EXPECT_EQ(got, want) << layout << " rank " << r;
        if (layout == "zigzag") { // every step of a zigzag causal ring computes something
            EXPECT_EQ(got.size(), static_cast<size_t>(P));
        }
    }
}

TEST(Trace, CausalRingHasOneComputeSlicePerLiveStep) {
    for (const char *layout : {"zigzag", "contiguous"}) {
        std::string path = TempDir() + "/trace_" + layout + ".json";
        Outcome o = Tool(std::string("check --seq 256 --ranks 4 --heads 2 --dim 16 --mask causal "
                                    "--algo ring --backward --layout ") +
                        layout + " --trace '" + path + "'");
        ASSERT_EQ(o.code, 0) << o.err << o.out;
        for (const char *op : {"fwd", "bwd"}) {
            SCOPED_TRACE(std::string(layout) + " " + op);
            TraceCounts t = ReadTrace(path, op);
            ExpectOneSlicePerLiveStep(t, layout, 256, 4);
            // Transfers show on their own tracks (how many is the algorithm's business: dead
            // steps move nothing).
            int transfers = 0;
            for (int r = 0; r < 4; r++)
                transfers += t.transfers[r];
            EXPECT_GT(transfers, 0);
        }
    }
}

TEST(Trace, BenchAndAuditWriteTraces) {
    std::string path = TempDir() + "/trace_bench.json";
    Outcome o = Tool("bench --seq 256 --ranks 2 --heads 2 --dim 16 --repeat 1 --warmup 1 --json "
                    "--trace '" + path + "'");
    ASSERT_EQ(o.code, 0) << o.err;
    TraceCounts t = ReadTrace(path, "fwd");
    EXPECT_EQ(t.rank_tracks.size(), 2u);
    // One timed call (the warm-up is not traced): 2 zigzag causal steps per rank.
    EXPECT_EQ(t.compute[0].size(), 2u);
    EXPECT_EQ(t.compute[1].size(), 2u);

    AuditFiles f = MakeAuditFiles("audit_trace", CTXPAR_DTYPE_F32, false);
    path = TempDir() + "/trace_audit.json";
    o = Tool("audit " + f.args + " --ranks 4 --trace '" + path + "'");
    ASSERT_EQ(o.code, 0) << o.err;
    ExpectOneSlicePerLiveStep(ReadTrace(path, "fwd"), "zigzag", 64, 4);
}

// ---------------------------------------------------------------- plan

// `ctxpar plan --json`: the fields the issue names, per-rank arrays of P entries whose FLOPs add
// up to the mask's visible pairs x 4·D x heads (counted independently here: causal, no
// documents: S(S+1)/2 pairs), a coverage proof that holds, and AUTO's reasons with --explain.
TEST(Plan, JsonFieldsAndCounts) {
    Outcome o = Tool("plan --ranks 6 --seq 1536 --heads 6 --kv-heads 3 --dim 32 --mask causal "
                     "--layout zigzag --algo hybrid --ulysses 3 --model cpu --explain --json");
    ASSERT_EQ(o.code, 0) << o.err << o.out;
    Json j;
    ASSERT_TRUE(ParseJson(o.out, &j)) << o.out;
    EXPECT_EQ(j["algo"].str, "hybrid");
    EXPECT_EQ(j["ulysses"].num, 3);
    EXPECT_TRUE(j["coverage_ok"].b);
    for (const char *k : {"flops_per_rank", "bytes_per_rank", "bytes_group_per_rank",
                          "bytes_across_per_rank", "time_per_rank_s"})
        EXPECT_EQ(j[k].items.size(), 6u) << k;
    double flops = 0, bytes = 0;
    for (size_t r = 0; r < 6; r++) {
        flops += j["flops_per_rank"].items[r].num;
        bytes += j["bytes_per_rank"].items[r].num;
        EXPECT_EQ(j["bytes_per_rank"].items[r].num, j["bytes_group_per_rank"].items[r].num +
                                                        j["bytes_across_per_rank"].items[r].num);
    }
    EXPECT_EQ(flops, 4.0 * 32 * 6 * (1536.0 * 1537.0 / 2));
    EXPECT_GT(bytes, 0);
    EXPECT_GT(j["bytes_across_per_rank"].items[0].num, 0) << "the ring crosses groups";
    EXPECT_GE(j["imbalance"].num, 0);
    EXPECT_GT(j["predicted_time_s"].num, 0);
    EXPECT_EQ(j["model"].str, "cpu");
    ASSERT_TRUE(j.Has("explain"));
    EXPECT_EQ(j["explain"]["candidates"].items.size(), 5u); // every entry, decode refusing
}

// The text table is for people (bytes in KiB/MiB/GiB, times in s/ms/us), the JSON exact and
// echoing what was planned: dtype, shape, mask, layout, the model and its group size.
TEST(Plan, HumanUnitsInTheTableExactNumbersAndTheConfigurationInJson) {
    const std::string args =
        "plan --ranks 4 --seq 65536 --heads 8 --dim 128 --backward --model h200";
    Outcome text = Tool(args), json = Tool(args + " --json");
    ASSERT_EQ(text.code, 0) << text.err;
    ASSERT_EQ(json.code, 0) << json.err;
    Json j;
    ASSERT_TRUE(ParseJson(json.out, &j)) << json.out;
    const double ws = j["workspace_bytes"].num, t = j["predicted_time_s"].num;
    ASSERT_GT(ws, 1 << 20);
    char want[64];
    std::snprintf(want, sizeof want, "workspace per rank max %.3g MiB", ws / (1 << 20));
    EXPECT_NE(text.out.find(want), std::string::npos) << want << "\n" << text.out;
    ASSERT_GT(t, 1e-3);
    ASSERT_LT(t, 1.0);
    std::snprintf(want, sizeof want, "predicted time     %.3g ms", t * 1e3);
    EXPECT_NE(text.out.find(want), std::string::npos) << want << "\n" << text.out;
    std::snprintf(want, sizeof want, "%.0f", ws);
    EXPECT_EQ(text.out.find(want), std::string::npos) << "raw bytes in the table: " << text.out;
    EXPECT_NE(text.out.find("bf16"), std::string::npos) << text.out;
    const Json &c = j["config"];
    EXPECT_EQ(c["dtype"].str, "bf16");
    EXPECT_EQ(c["model"].str, "h200");
    EXPECT_EQ(c["heads"].num, 8);
    EXPECT_EQ(c["dim"].num, 128);
    EXPECT_EQ(c["mask"].str, "causal");
    EXPECT_EQ(c["layout"].str, "zigzag");
    EXPECT_EQ(c["algo"].str, "auto");
    EXPECT_EQ(c["algo_resolved"].str, j["algo"].str);
    EXPECT_TRUE(c["backward"].b);
    EXPECT_GT(c["group_size"].num, 0);
    // --dtype changes the bytes the plan moves, and the JSON says which it was.
    Outcome f32 = Tool(args + " --json --dtype f32");
    Json j32;
    ASSERT_TRUE(ParseJson(f32.out, &j32)) << f32.out;
    EXPECT_EQ(j32["config"]["dtype"].str, "f32");
    EXPECT_GT(j32["bytes_max"].num, j["bytes_max"].num);
}

// A model file overrides the built-in model; a bad one is a usage error naming the field; a
// problem the library refuses is refused with its message.
TEST(Plan, ModelFileAndRefusals) {
    const std::string path = TempDir() + "/model.json";
    {
        std::ofstream f(path);
        f << "{\"name\": \"slow\", \"flops_per_s\": 1e6, \"links\": {\"across\": "
             "{\"bandwidth_Bps\": 1e3, \"latency_s\": 0.001}}}";
    }
    Outcome o = Tool("plan --ranks 4 --seq 1024 --heads 4 --dim 16 --json --model '" + path + "'");
    ASSERT_EQ(o.code, 0) << o.err;
    Json j;
    ASSERT_TRUE(ParseJson(o.out, &j)) << o.out;
    EXPECT_EQ(j["model"].str, "slow");
    Outcome fast = Tool("plan --ranks 4 --seq 1024 --heads 4 --dim 16 --json --model h200");
    Json jf;
    ASSERT_TRUE(ParseJson(fast.out, &jf)) << fast.out;
    EXPECT_GT(j["predicted_time_s"].num, 1000 * jf["predicted_time_s"].num);
    {
        std::ofstream f(path);
        f << "{\"flops_per_s\": -3}";
    }
    o = Tool("plan --ranks 4 --seq 1024 --model '" + path + "'");
    EXPECT_EQ(o.code, 2);
    EXPECT_NE(o.err.find("flops_per_s"), std::string::npos) << o.err;
    o = Tool("plan --ranks 4 --seq 1024 --heads 6 --algo alltoall");
    EXPECT_EQ(o.code, 2);
    EXPECT_NE(o.err.find("heads"), std::string::npos) << o.err;
    o = Tool("plan --ranks 4 --seq 1002"); // any length: shards of 251 and 250 tokens
    EXPECT_EQ(o.code, 0) << o.err;
    o = Tool("plan --ranks 4 --seq 0");
    EXPECT_EQ(o.code, 2) << o.err;
}

// --docs with a distribution, and --cu-seqlens from a file: the coverage proof holds and the
// FLOPs add up to the documents' causal pairs.
TEST(Plan, Documents) {
    const std::string path = TempDir() + "/cu.txt";
    {
        std::ofstream f(path);
        f << "0 100 100 612\n1024\n";
    }
    Outcome o = Tool("plan --ranks 8 --seq 1024 --heads 2 --dim 16 --layout striped --json "
                     "--cu-seqlens '" + path + "'");
    ASSERT_EQ(o.code, 0) << o.err;
    Json j;
    ASSERT_TRUE(ParseJson(o.out, &j)) << o.out;
    EXPECT_TRUE(j["coverage_ok"].b);
    double flops = 0;
    for (const Json &f : j["flops_per_rank"].items)
        flops += f.num;
    const double pairs = 100.0 * 101 / 2 + 512.0 * 513 / 2 + 412.0 * 413 / 2;
    EXPECT_EQ(flops, 4.0 * 16 * 2 * pairs);
    o = Tool("plan --ranks 8 --seq 4096 --docs 20 --doc-dist lognormal --doc-sigma 1.5 --json");
    ASSERT_EQ(o.code, 0) << o.err;
    ASSERT_TRUE(ParseJson(o.out, &j)) << o.out;
    EXPECT_TRUE(j["coverage_ok"].b);
}

// --layout custom --assign FILE.npy: an assignment that puts token t on rank t mod P gives the
// striped plan, number for number (the same positions on every rank); a random one's FLOPs add
// up to the documents' causal pairs with the coverage proof holding; the usage errors of check.
TEST(Plan, CustomAssignment) {
    const std::string dir = Dir("plan_custom"), a = dir + "/assign.npy", cu = dir + "/cu.txt";
    {
        std::ofstream f(cu);
        f << "0 100 100 612\n1024\n";
    }
    const std::string args = "plan --ranks 8 --seq 1024 --heads 2 --dim 16 --backward --json "
                             "--cu-seqlens '" + cu + "' ";
    std::vector<int32_t> assign(1024);
    for (size_t t = 0; t < assign.size(); t++)
        assign[t] = static_cast<int32_t>(t % 8);
    int64_t n = 1024;
    ASSERT_EQ(cpt_npy_write(a.c_str(), CPT_NPY_I32, 1, &n, assign.data()), CTXPAR_OK);
    Outcome striped = Tool(args + "--layout striped");
    Outcome custom = Tool(args + "--layout custom --assign '" + a + "'");
    ASSERT_EQ(custom.code, 0) << custom.err;
    Json js, jc;
    ASSERT_TRUE(ParseJson(striped.out, &js)) << striped.out;
    ASSERT_TRUE(ParseJson(custom.out, &jc)) << custom.out;
    for (const char *k : {"pairs_per_rank", "flops_per_rank", "bytes_per_rank",
                          "bytes_received_per_rank", "workspace_per_rank"}) {
        ASSERT_EQ(jc[k].items.size(), 8u) << k;
        for (size_t r = 0; r < 8; r++)
            EXPECT_EQ(jc[k].items[r].num, js[k].items[r].num) << k << " rank " << r;
    }
    std::mt19937 rng(5);
    for (int32_t &x : assign)
        x = static_cast<int32_t>(rng() % 8);
    ASSERT_EQ(cpt_npy_write(a.c_str(), CPT_NPY_I32, 1, &n, assign.data()), CTXPAR_OK);
    custom = Tool(args + "--layout custom --assign '" + a + "'");
    ASSERT_EQ(custom.code, 0) << custom.err;
    ASSERT_TRUE(ParseJson(custom.out, &jc)) << custom.out;
    EXPECT_TRUE(jc["coverage_ok"].b);
    double pairs = 0;
    for (const Json &x : jc["pairs_per_rank"].items)
        pairs += x.num;
    EXPECT_EQ(pairs, 2 * (100.0 * 101 / 2 + 512.0 * 513 / 2 + 412.0 * 413 / 2)); // x 2 heads
    Outcome o = Tool("plan --ranks 8 --seq 1024 --layout custom");
    EXPECT_EQ(o.code, 2);
    EXPECT_NE(o.err.find("--layout custom and --assign"), std::string::npos) << o.err;
    o = Tool("plan --ranks 8 --seq 1000 --layout custom --assign '" + a + "'");
    EXPECT_EQ(o.code, 2);
    EXPECT_NE(o.err.find("holds 1024 ranks but --seq is 1000"), std::string::npos) << o.err;
}

// ---------------------------------------------------------------- progress

// Progress is shown at once with CTXPAR_PROGRESS_AFTER=0 and, stderr being a file, as whole log
// lines; stdout is the JSON document alone, whatever stderr got.
TEST(Progress, OnStderrOnlyWithJsonOnStdout) {
    const struct {
        const char *args, *line;
    } runs[] = {
        {"check --ranks 2 --seq 512 --heads 2 --dim 32 --backward --json",
         "ctxpar check: 2 ranks 0 % (elapsed "},
        {"bench --ranks 2 --seq 256 --heads 2 --dim 32 --warmup 0 --repeat 2 --json",
         "ctxpar bench: seq 256, baseline: 1 rank 0 % (elapsed "},
        {"plan --ranks 8 --seq 4096 --json", "ctxpar plan: dry run of 8 ranks 0 % (elapsed "},
    };
    for (const auto &run : runs) {
        Outcome o = RunWith("CTXPAR_PROGRESS_AFTER=0 ", run.args);
        ASSERT_EQ(o.code, 0) << run.args << "\n" << o.err << o.out;
        Json j;
        EXPECT_TRUE(ParseJson(o.out, &j)) << o.out;
        EXPECT_EQ(o.out.find("ctxpar"), std::string::npos) << o.out;
        EXPECT_EQ(o.out.find("elapsed"), std::string::npos) << o.out;
        EXPECT_EQ(o.out.find_first_of("\r\033"), std::string::npos) << o.out;
        // The first line comes with the first update; the next not before 10 s.
        EXPECT_EQ(o.err.rfind(run.line, 0), 0u) << run.args << "\n" << o.err;
        EXPECT_NE(o.err.find(", time left unknown)\n"), std::string::npos) << o.err;
        EXPECT_EQ(o.err.find_first_of("\r\033"), std::string::npos) << o.err;
    }
}

// ---------------------------------------------------------------- help and version

TEST(Usage, HelpForEverySubcommand) {
    for (const char *cmd : {"check", "audit", "bench", "plan"}) {
        Outcome o = Tool(std::string(cmd) + " --help");
        EXPECT_EQ(o.code, 0) << cmd;
        EXPECT_EQ(o.out.rfind(std::string("usage: ctxpar ") + cmd, 0), 0u) << o.out;
        EXPECT_NE(o.out.find(cmd == std::string("plan") ? "--explain" : "--trace"),
                  std::string::npos)
            << cmd;
    }
    Outcome o = Tool("bench --help");
    EXPECT_NE(o.out.find("backward 2.5 x forward"), std::string::npos) << o.out;
    o = Tool("--help");
    EXPECT_EQ(o.code, 0);
    for (const char *cmd : {"check", "audit", "bench"})
        EXPECT_NE(o.out.find(std::string("  ") + cmd), std::string::npos) << cmd;
}

// Every command's --help, option by option: "  --name FORM  help [default]".
std::map<std::string, std::string> HelpForms(const std::string &cmd) {
    std::map<std::string, std::string> forms;
    std::istringstream in(Tool(cmd + " --help").out);
    for (std::string line; std::getline(in, line);) {
        if (line.rfind("  --", 0) != 0)
            continue;
        std::istringstream words(line);
        std::string name, form;
        words >> name >> form;
        // A flag's second word is its help; a value's form is capitals, lists or a file name.
        const bool value = !form.empty() && (std::isupper((unsigned char)form[0]) ||
                                             form.find('|') != std::string::npos);
        forms[name] = value ? form : "";
    }
    return forms;
}

// One table makes every command's options: an option two commands take has the same form in
// both; the enums' forms are the library's names (a new algorithm needs no help text); defaults
// are printed once, from the table, and name no option the command lacks.
TEST(Usage, EveryCommandsOptionsAgree) {
    const char *cmds[] = {"check", "audit", "bench", "plan"};
    std::map<std::string, std::map<std::string, std::string>> help;
    for (const char *c : cmds)
        help[c] = HelpForms(c);
    for (const char *a : cmds)
        for (const char *b : cmds)
            for (const auto &opt : help[a])
                if (help[b].count(opt.first)) {
                    EXPECT_EQ(opt.second, help[b][opt.first])
                        << opt.first << ": " << a << " vs " << b;
                }
    for (const char *c : {"check", "audit", "plan"})
        for (const char *o :
             {"--cu-seqlens", "--sinks", "--layout", "--assign", "--algo", "--dtype"})
            EXPECT_TRUE(help[c].count(o)) << c << " " << o;
    std::string algos;
    for (int i = 0; std::string(ctxpar_algo_name((ctxpar_algo)i)) != "?"; i++)
        algos += (i ? "|" : "") + std::string(ctxpar_algo_name((ctxpar_algo)i));
    EXPECT_EQ(help["plan"]["--algo"], algos);
    EXPECT_NE(help["plan"]["--layout"].find("custom"), std::string::npos);

    const std::string audit = Tool("audit --help").out, plan = Tool("plan --help").out;
    EXPECT_EQ(audit.find("(default:"), std::string::npos) << "defaults come from the table only";
    EXPECT_NE(audit.find("[causal]"), std::string::npos);
    std::istringstream lines(audit);
    for (std::string line; std::getline(lines, line);)
        if (line.rfind("  --", 0) == 0) {
            EXPECT_EQ(line.find("--seq"), std::string::npos) << "audit has no --seq: " << line;
        }
    EXPECT_NE(plan.find("--dtype f32|f16|bf16"), std::string::npos);
    EXPECT_NE(plan.find("[bf16]"), std::string::npos);
    EXPECT_NE(plan.find("--model h200|cpu|FILE"), std::string::npos);
    // The command list says what audit reads.
    const std::string top = Tool("--help").out;
    for (const char *w : {"plan", ".safetensors", "shards", "--against"})
        EXPECT_NE(top.find(w), std::string::npos) << w;
}

TEST(Usage, VersionAndUnknowns) {
    Outcome o = Tool("--version");
    EXPECT_EQ(o.code, 0);
    EXPECT_EQ(o.out, std::string("ctxpar ") + ctxpar_version() + "\n");
    o = Tool("frobnicate");
    EXPECT_EQ(o.code, 2);
    EXPECT_EQ(Lines(o.err), 1);
    o = Tool("check --no-such-flag");
    EXPECT_EQ(o.code, 2);
    EXPECT_EQ(Lines(o.err), 1);
    o = Tool("check --seq 12x");
    EXPECT_EQ(o.code, 2);
    EXPECT_NE(o.err.find("bad value '12x' for --seq"), std::string::npos) << o.err;
}

// ---------------------------------------------------------------- the backend registry

// `ctxpar --list-backends`: one "NAME available|unavailable  ..." line per backend compiled in,
// the CPU first and available; every listed name is what --backend accepts.
std::vector<std::pair<std::string, bool>> ListBackends() {
    Outcome o = Tool("--list-backends");
    EXPECT_EQ(o.code, 0) << o.err;
    EXPECT_EQ(o.err, "");
    std::vector<std::pair<std::string, bool>> out;
    std::istringstream lines(o.out);
    std::string line;
    while (std::getline(lines, line)) {
        std::istringstream words(line);
        std::string name, state;
        words >> name >> state;
        EXPECT_TRUE(state == "available" || state == "unavailable") << line;
        out.push_back({name, state == "available"});
    }
    return out;
}

TEST(Backends, ListedOnePerLineCpuFirst) {
    const auto all = ListBackends();
    ASSERT_GE(all.size(), 1u);
    EXPECT_EQ(all[0].first, "cpu");
    EXPECT_TRUE(all[0].second) << "the CPU device can always be created";
    for (size_t i = 0; i < all.size(); i++)
        for (size_t j = i + 1; j < all.size(); j++)
            EXPECT_NE(all[i].first, all[j].first);
    for (const auto &b : all)
        EXPECT_TRUE(b.first == "cpu" || b.first == "cuda") << b.first;
    Outcome o = Tool("--help");
    EXPECT_NE(o.out.find("--list-backends"), std::string::npos) << o.out;
}

TEST(Backends, EveryListedNameIsAcceptedAndAnUnavailableOneSaysWhy) {
    for (const auto &b : ListBackends()) {
        Outcome o = Tool("check --seq 32 --ranks 2 --heads 2 --dim 16 --backend " + b.first);
        if (b.second) {
            EXPECT_EQ(o.code, 0) << b.first << ": " << o.err;
        } else {
            // Parsed, then the device cannot be made here: a run failure, one line.
            EXPECT_NE(o.code, 0) << b.first;
            EXPECT_NE(o.code, 2) << b.first << " was not accepted: " << o.err;
            EXPECT_EQ(Lines(o.err), 1) << o.err;
        }
    }
}

TEST(Backends, AnUnknownBackendIsAUsageErrorListingTheChoices) {
    Outcome o = Tool("check --backend nosuch");
    EXPECT_EQ(o.code, 2);
    EXPECT_EQ(Lines(o.err), 1) << o.err;
    EXPECT_NE(o.err.find("unknown backend 'nosuch'"), std::string::npos) << o.err;
    for (const auto &b : ListBackends())
        EXPECT_NE(o.err.find(b.first), std::string::npos) << b.first << " not in: " << o.err;
}

// ---------------------------------------------------------------- under mpirun

class UnderMpi : public testing::Test {
    void SetUp() override {
        if (Mpirun().empty())
            GTEST_SKIP() << "skipped: mpirun not found (install openmpi-bin)";
    }
};

TEST_F(UnderMpi, AuditMatchesTheOracle) {
    AuditFiles f = MakeAuditFiles("audit_mpi", CTXPAR_DTYPE_F32, false);
    std::string path = TempDir() + "/trace_mpi.json";
    Outcome o = RunWith(MpiPrefix(2), "audit " + f.args + " --comm mpi --algo ring --layout "
                                      "zigzag --mask causal --json --trace '" + path + "'");
    ASSERT_EQ(o.code, 0) << o.err << o.out;
    Json j;
    ASSERT_TRUE(ParseJson(o.out, &j)) << o.out; // one object: rank 0 alone prints
    EXPECT_EQ(j["config"]["ranks"].num, 2);
    ExpectSavedMatchOracle(f, CTXPAR_DTYPE_F32, true);
    ExpectOneSlicePerLiveStep(ReadTrace(path, "fwd"), "zigzag", 64, 2);
}

TEST_F(UnderMpi, BenchJson) {
    Outcome o = RunWith(MpiPrefix(2), "bench --comm mpi --seq 256 --heads 2 --dim 16 --backward "
                                      "--repeat 2 --warmup 1 --json");
    ASSERT_EQ(o.code, 0) << o.err << o.out;
    Json j;
    ASSERT_TRUE(ParseJson(o.out, &j)) << o.out;
    EXPECT_EQ(j["config"]["comm"].str, "mpi");
    EXPECT_EQ(j["ranks"].num, 2);
    for (const char *f : kBenchFields)
        EXPECT_TRUE(j.Has(f) && j["baseline"].Has(f)) << f;
    EXPECT_GT(j["bytes_sent_per_rank"].num, 0);
    EXPECT_GE(j["hidden_transfer_fraction"].num, 0.0);
    EXPECT_LE(j["hidden_transfer_fraction"].num, 1.0);
}

TEST_F(UnderMpi, BadFileExitsTwoOnEveryRank) {
    std::string p = Dir("mpi_bad") + "/junk.npy";
    WriteBytes(p, "junk");
    Outcome o = RunWith(MpiPrefix(2), "audit --comm mpi --q '" + p + "' --k '" + p + "' --v '" +
                                          p + "'");
    EXPECT_EQ(o.code, 2) << o.err;
    EXPECT_NE(o.err.find("junk.npy: "), std::string::npos) << o.err;
}

} // namespace
