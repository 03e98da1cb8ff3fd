// The four --report pages made by small real runs of the binary, for the suites that check them
// (report_test: their structure; report_browser_test: chromium renders them). The audit's
// results carry a planted fault: rows kBadFirst..kBadLast of out lose head 1 (zeroed), the way a
// lost ring step or a bad merge would spoil one run of rows.
#ifndef CPT_TOOL_REPORT_RUN_H
#define CPT_TOOL_REPORT_RUN_H

#include <sys/stat.h>

#include <cstdint>
#include <string>
#include <vector>

#include "reference/data.h"
#include "reference/npy.h"
#include "tools/ctxpar/tool_run.h"

namespace cpt_report {

constexpr int kRanks = 4;
constexpr int64_t kSeq = 256, kHeads = 2, kDim = 16;
constexpr int64_t kBadFirst = 100, kBadLast = 131;

// A report made: its path and how the tool exited.
struct Made {
    std::string path;
    cpt_tool::Outcome o;
};

inline std::string Dir(const std::string &name) {
    std::string d = cpt_tool::TempDir() + "/" + name;
    mkdir(d.c_str(), 0755);
    return d;
}

inline Made Check(const std::string &dir) {
    Made m{dir + "/check.html", {}};
    m.o = cpt_tool::Tool("check --ranks 4 --seq 256 --heads 2 --dim 16 --report '" + m.path + "'");
    return m;
}

inline Made Plan(const std::string &dir) {
    Made m{dir + "/plan.html", {}};
    m.o = cpt_tool::Tool("plan --ranks 4 --seq 4096 --layout contiguous --report '" + m.path + "'");
    return m;
}

inline Made Bench(const std::string &dir) {
    Made m{dir + "/bench.html", {}};
    m.o = cpt_tool::Tool("bench --ranks 1,2 --seq 128 --sweep --heads 2 --dim 16 --warmup 0 "
                         "--repeat 3 --threads 1 --report '" +
                         m.path + "'");
    return m;
}

// q, k, v of [1, seq, kHeads, kDim] float32 in dir; "" on success, else what failed.
inline std::string WriteInputs(const std::string &dir, int64_t seq) {
    const int64_t shape[4] = {1, seq, kHeads, kDim};
    std::vector<float> t(static_cast<size_t>(seq * kHeads * kDim));
    for (int id = 0; id < 3; id++) {
        for (size_t i = 0; i < t.size(); i++)
            t[i] = static_cast<float>(cpt_test_value(5, static_cast<uint64_t>(id), i));
        const std::string path = dir + "/" + "qkv"[id] + ".npy";
        if (cpt_npy_write(path.c_str(), CPT_NPY_F32, 4, shape, t.data()) != CTXPAR_OK)
            return path;
    }
    return "";
}

// ctxpar's own results saved (--save), out spoilt in rows first..last, head 1; "" on success.
inline std::string PlantFault(const std::string &dir, const std::string &inputs, int64_t first,
                              int64_t last) {
    cpt_tool::Outcome s = cpt_tool::Tool(inputs + " --save '" + dir + "/results'");
    if (s.code != 0)
        return "audit --save: " + s.out + s.err;
    const std::string out = dir + "/results/out.npy";
    cpt_npy_array a;
    if (cpt_npy_read(out.c_str(), &a) != CTXPAR_OK)
        return "cannot read " + out;
    float *v = static_cast<float *>(a.data);
    for (int64_t s2 = first; s2 <= last; s2++)
        for (int64_t d = 0; d < kDim; d++)
            v[(s2 * kHeads + 1) * kDim + d] = 0.0f;
    const ctxpar_status st = cpt_npy_write(out.c_str(), CPT_NPY_F32, a.ndim, a.shape, a.data);
    cpt_npy_free(&a);
    return st == CTXPAR_OK ? "" : "cannot write " + out;
}

// The audit of results spoilt in rows first..last (--against); m.path "" when the setup failed
// (m.o.err says why).
inline Made Audit(const std::string &dir, int64_t seq = kSeq, int64_t first = kBadFirst,
                  int64_t last = kBadLast) {
    const std::string inputs =
        "audit --ranks 4 --q '" + dir + "/q.npy' --k '" + dir + "/k.npy' --v '" + dir + "/v.npy'";
    Made m{dir + "/audit.html", {}};
    std::string why = WriteInputs(dir, seq);
    if (why.empty())
        why = PlantFault(dir, inputs, first, last);
    if (!why.empty()) {
        m.path.clear();
        m.o.err = why;
        return m;
    }
    m.o = cpt_tool::Tool(inputs + " --against '" + dir + "/results' --report '" + m.path + "'");
    return m;
}

// Occurrences of `what` in s.
inline int Count(const std::string &s, const std::string &what) {
    int n = 0;
    for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + what.size()))
        n++;
    return n;
}

// What would make a page fetch something or depend on anything outside it; "" when none.
inline std::string ExternalReference(const std::string &html) {
    for (const char *bad : {"http://", "https://", "//cdn", "<script", "src=", "<link", "@import",
                            "url(", "<iframe", "<img"})
        if (html.find(bad) != std::string::npos)
            return bad;
    return "";
}

} // namespace cpt_report

#endif // CPT_TOOL_REPORT_RUN_H
