// --report FILE.html as users run it: the four pages (check, audit with a planted fault, plan,
// bench) are self-contained, hold their pictures (an SVG heat map per tensor, a bar per rank,
// lines with whiskers), list the planted fault's run of rows with its counts, escape what they
// quote, leave --json unchanged, and a page that cannot be written is an error, not a crash.
#include <jansson.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include <gtest/gtest.h>

#include "tools/ctxpar/report_run.h"

namespace {

using cpt_report::Count;
using cpt_report::Dir;
using cpt_report::ExternalReference;
using cpt_report::kRanks;
using cpt_tool::ReadAll;
using cpt_tool::Tool;

TEST(Report, CheckDrawsEachTensorAndABarPerRank) {
    cpt_report::Made m = cpt_report::Check(Dir("check"));
    ASSERT_EQ(m.o.code, 0) << m.o.out << m.o.err;
    const std::string html = ReadAll(m.path);
    ASSERT_FALSE(html.empty()) << m.path;
    EXPECT_EQ(ExternalReference(html), "");
    EXPECT_EQ(html.rfind("<!DOCTYPE html>", 0), 0u);
    EXPECT_NE(html.find("CONSISTENT"), std::string::npos);
    EXPECT_EQ(Count(html, "<svg"), 1 + 2 * 2) << "the legend, then out and lse: map and bars";
    EXPECT_EQ(Count(html, "class=\"heat\" data-tensor=\"out\""), 1);
    EXPECT_EQ(Count(html, "class=\"heat\" data-tensor=\"lse\""), 1);
    EXPECT_EQ(Count(html, "<rect class=\"bar"), 2 * kRanks) << "a bar per rank, per tensor";
    EXPECT_GT(Count(html, "class=\"rankrun\""), kRanks) << "zigzag: 2 runs a rank but the last";
    EXPECT_EQ(Count(html, "<rect class=\"bar fail\""), 0);
    EXPECT_NE(html.find("No row out of its bound"), std::string::npos);
}

TEST(Report, AuditListsThePlantedRunOfRows) {
    const std::string dir = Dir("audit");
    cpt_report::Made m = cpt_report::Audit(dir);
    ASSERT_FALSE(m.path.empty()) << m.o.err;
    ASSERT_EQ(m.o.code, 1) << m.o.out << m.o.err; // not consistent
    const std::string html = ReadAll(m.path);
    EXPECT_EQ(ExternalReference(html), "");
    EXPECT_NE(html.find("NOT CONSISTENT"), std::string::npos);
    // The same verdict by --json: its counts are the page's.
    cpt_tool::Outcome j =
        Tool("audit --ranks 4 --q '" + dir + "/q.npy' --k '" + dir + "/k.npy' --v '" + dir +
             "/v.npy' --against '" + dir + "/results' --json");
    json_error_t e;
    json_t *root = json_loads(j.out.c_str(), 0, &e);
    ASSERT_TRUE(root) << j.out << j.err;
    json_t *out = json_object_get(json_object_get(root, "against"), "out");
    const long long elements = json_integer_value(json_object_get(out, "failing_elements"));
    const long long rows = json_integer_value(json_object_get(out, "failing_rows"));
    EXPECT_EQ(rows, cpt_report::kBadLast - cpt_report::kBadFirst + 1);
    EXPECT_GT(elements, rows);
    json_decref(root);
    // One run, rows 100-131, all rank 3's (zigzag chunks 3 and 4 of 8), with its counts.
    EXPECT_EQ(Count(html, "<tr class=\"range\">"), 1) << html;
    const std::string run =
        "<tr class=\"range\"><td>0</td><td>" + std::to_string(cpt_report::kBadFirst) + "-" +
        std::to_string(cpt_report::kBadLast) + "</td><td>" + std::to_string(rows) +
        "</td><td>3</td><td>" + std::to_string(elements) + "</td></tr>";
    EXPECT_NE(html.find(run), std::string::npos) << run;
    EXPECT_NE(
        html.find(std::to_string(elements) + " elements in " + std::to_string(rows) + " rows"),
        std::string::npos);
    // Per-rank bars: rank 3 fails in out, nobody in lse.
    EXPECT_EQ(Count(html, "<rect class=\"bar"), 2 * kRanks);
    EXPECT_EQ(Count(html, "<rect class=\"bar fail\" data-rank=\"3\""), 1);
    EXPECT_EQ(Count(html, "<rect class=\"bar fail\""), 1);
    EXPECT_EQ(Count(html, "class=\"heat\" data-tensor=\"out\""), 1);
}

// A long sequence is drawn in at most 1000 columns, each the worst of its bucket: one bad row
// of 4096 still colours its column.
TEST(Report, OneBadRowOfALongSequenceStaysVisible) {
    cpt_report::Made m = cpt_report::Audit(Dir("long"), 4096, 3001, 3001);
    ASSERT_FALSE(m.path.empty()) << m.o.err;
    ASSERT_EQ(m.o.code, 1) << m.o.out << m.o.err;
    const std::string html = ReadAll(m.path);
    EXPECT_NE(html.find("820 columns of 5 positions each"), std::string::npos);
    EXPECT_NE(html.find("<td>3001-3001</td><td>1</td><td>2</td>"), std::string::npos)
        << "zigzag: 3001 is in chunk 5 of 8, rank 2's";
    const std::string cell = "<title>head 1, positions 3000-3004: error/bound ";
    const size_t at = html.find(cell);
    ASSERT_NE(at, std::string::npos);
    EXPECT_GT(std::stod(html.substr(at + cell.size(), 12)), 1.0);
}

TEST(Report, AuditEscapesThePathsItQuotes) {
    const std::string dir = Dir("a<b>&c");
    cpt_report::Made m = cpt_report::Audit(dir);
    ASSERT_FALSE(m.path.empty()) << m.o.err;
    ASSERT_EQ(m.o.code, 1) << m.o.out << m.o.err;
    const std::string html = ReadAll(m.path);
    EXPECT_NE(html.find("a&lt;b&gt;&amp;c"), std::string::npos);
    EXPECT_EQ(html.find("a<b>"), std::string::npos);
}

TEST(Report, PlanBarsFlopsBytesAndTimePerRank) {
    cpt_report::Made m = cpt_report::Plan(Dir("plan"));
    ASSERT_EQ(m.o.code, 0) << m.o.out << m.o.err;
    const std::string html = ReadAll(m.path);
    EXPECT_EQ(ExternalReference(html), "");
    EXPECT_EQ(Count(html, "<svg"), 4) << "FLOPs, sent, received, time";
    EXPECT_EQ(Count(html, "<rect class=\"bar"), 4 * kRanks);
    EXPECT_EQ(Count(html, "<rect class=\"bar\" data-rank=\"3\""), 4);
    EXPECT_NE(html.find("FLOPs imbalance"), std::string::npos);
    EXPECT_NE(html.find("contiguous layout"), std::string::npos);
}

// Past 600 ranks a bar is a bucket of neighbouring ranks drawn at its largest value: 1300 ranks
// give 434 bars of 3 (the last of one), and with a causal contiguous layout the last rank does
// the most work, so the last bar is the tallest and reads the plan's largest FLOPs.
TEST(Report, PlanOfManyRanksBarsBucketsAtTheirLargest) {
    const std::string path = Dir("plan_many") + "/plan.html";
    const cpt_tool::Outcome o = cpt_tool::Tool(
        "plan --ranks 1300 --seq 2600 --heads 4 --dim 16 --layout contiguous --algo ring "
        "--no-coverage --report '" + path + "' --json");
    ASSERT_EQ(o.code, 0) << o.out << o.err;
    const std::string html = ReadAll(path);
    EXPECT_EQ(Count(html, "<rect class=\"bar"), 4 * 434);
    EXPECT_EQ(Count(html, "data-rank=\""), 0);
    EXPECT_EQ(Count(html, "data-ranks=\"0-2\""), 4);
    EXPECT_EQ(Count(html, "data-ranks=\"1299-1299\""), 4);
    EXPECT_NE(html.find("the largest of 3 ranks"), std::string::npos);
    // The last bar of the FLOPs chart: the largest FLOPs of the plan (JSON: flops_max).
    const size_t at = o.out.find("\"flops_max\":");
    ASSERT_NE(at, std::string::npos) << o.out;
    const double flops_max = std::strtod(o.out.c_str() + at + 12, nullptr);
    const std::string want = "ranks 1299-1299, the largest: ";
    const size_t bar = html.find(want);
    ASSERT_NE(bar, std::string::npos);
    char *end = nullptr;
    double drawn = std::strtod(html.c_str() + bar + want.size(), &end);
    ASSERT_EQ(std::string(end, 6), " MFLOP") << "1.3 million FLOPs, 3 digits with a prefix";
    EXPECT_NEAR(drawn * 1e6, flops_max, flops_max * 0.005);
}

TEST(Report, BenchDrawsTimeAndSpeedupWithTheirSpread) {
    cpt_report::Made m = cpt_report::Bench(Dir("bench"));
    ASSERT_EQ(m.o.code, 0) << m.o.out << m.o.err;
    const std::string html = ReadAll(m.path);
    EXPECT_EQ(ExternalReference(html), "");
    EXPECT_EQ(Count(html, "<svg"), 2) << "time and speedup";
    EXPECT_EQ(Count(html, "class=\"series\""), 2) << "one line per seq, in each chart";
    EXPECT_EQ(Count(html, "class=\"point\""), 4) << "ranks 1 and 2, in each chart";
    EXPECT_EQ(Count(html, "class=\"whisker\""), 4);
    EXPECT_NE(html.find("<th>min ms</th><th>median ms</th><th>max ms</th>"), std::string::npos);
}

// The tool's stdout is the same with or without --report (the page is extra).
TEST(Report, JsonIsUnchanged) {
    const std::string args = "check --ranks 2 --seq 64 --heads 2 --dim 16 --json";
    cpt_tool::Outcome a = Tool(args), b = Tool(args + " --report '" + Dir("json") + "/c.html'");
    ASSERT_EQ(a.code, 0) << a.err;
    ASSERT_EQ(b.code, 0) << b.err;
    json_error_t e;
    json_t *ja = json_loads(a.out.c_str(), 0, &e), *jb = json_loads(b.out.c_str(), 0, &e);
    ASSERT_TRUE(ja && jb) << a.out << b.out;
    EXPECT_EQ(json_object_size(ja), json_object_size(jb));
    const char *key;
    json_t *value;
    json_object_foreach(ja, key, value) EXPECT_TRUE(json_object_get(jb, key)) << key;
    // The verdict and configuration alike (timings and memory differ from run to run).
    for (const char *k : {"ok", "status", "config", "errors", "error_ratio", "tolerance",
                          "bitwise_equal_single_rank"}) {
        ASSERT_TRUE(json_object_get(ja, k)) << k;
        EXPECT_TRUE(json_equal(json_object_get(ja, k), json_object_get(jb, k))) << k;
    }
    json_decref(ja);
    json_decref(jb);
}

TEST(Report, AnUnwritablePathIsAnErrorNotACrash) {
    for (const char *cmd : {"check --ranks 2 --seq 64 --heads 2 --dim 16", "plan --ranks 2",
                            "bench --ranks 2 --seq 64 --heads 2 --dim 16 --repeat 1 --warmup 0"}) {
        cpt_tool::Outcome o = Tool(std::string(cmd) + " --report /nonexistent-dir/r.html");
        EXPECT_EQ(o.code, 2) << cmd << ": " << o.out << o.err;
        EXPECT_NE(o.err.find("--report: /nonexistent-dir/r.html: cannot write the report: No "
                             "such file or directory"),
                  std::string::npos)
            << cmd << ": " << o.err;
    }
}

} // namespace
