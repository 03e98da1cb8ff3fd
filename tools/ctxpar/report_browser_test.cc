// The four --report pages in a real browser: Debian's chromium, headless, with every host name
// made unresolvable, renders each into a 1400 x 1800 screenshot that must be a picture (many
// colours, not one flat one), and its DOM must hold the page's SVG pictures and nothing that
// fetches (no script, image, link or frame). Without chromium every case is skipped, so that
// testing/run_all.sh counts the target as skipped. The screenshots are kept in the test's
// undeclared outputs (bazel-testlogs/tools/ctxpar/report_browser_test/test.outputs/).
#include <unistd.h>

#include <cstdlib>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include "tools/ctxpar/report_run.h"

namespace {

using cpt_report::Count;
using cpt_tool::ReadAll;
using cpt_tool::Shell;

std::string Chromium() {
    for (const char *p : {"/usr/bin/chromium", "/usr/bin/chromium-browser"})
        if (access(p, X_OK) == 0)
            return p;
    return "";
}

// chromium on file `html` with `what` (--screenshot=..., --dump-dom), offline: every host name
// resolves to nothing, so a page that fetched anything would show it broken, not fetch it.
std::string Browse(const std::string &html, const std::string &what, const std::string &tag,
                   int *code) {
    const std::string tmp = cpt_tool::TempDir();
    return Shell("HOME='" + tmp + "' XDG_CONFIG_HOME='" + tmp + "' XDG_CACHE_HOME='" + tmp + "' '" +
                     Chromium() +
                     "' --headless --no-sandbox --disable-gpu "
                     "--user-data-dir='" +
                     tmp + "/profile-" + tag +
                     "' --host-resolver-rules='MAP * ~NOTFOUND' --window-size=1400,1800 " + what +
                     " 'file://" + html + "' 2>'" + tmp + "/chromium-" + tag + ".log'",
                 code);
}

std::string KeepDir() {
    const char *d = std::getenv("TEST_UNDECLARED_OUTPUTS_DIR");
    return d ? d : cpt_tool::TempDir();
}

// Renders one report and judges the picture and the DOM.
void Render(const cpt_report::Made &m, const std::string &tag) {
    SCOPED_TRACE(tag);
    ASSERT_FALSE(m.path.empty()) << m.o.err;
    ASSERT_NE(m.o.code, -1) << m.o.err;
    const std::string html = ReadAll(m.path);
    ASSERT_FALSE(html.empty());
    EXPECT_EQ(cpt_report::ExternalReference(html), "");
    const std::string png = KeepDir() + "/" + tag + ".png";
    int code = -1;
    Browse(m.path, "--screenshot='" + png + "'", tag, &code);
    ASSERT_EQ(code, 0) << ReadAll(cpt_tool::TempDir() + "/chromium-" + tag + ".log");
    const std::string bytes = ReadAll(png);
    ASSERT_GT(bytes.size(), 20000u) << png;
    const std::string script = std::string(std::getenv("TEST_SRCDIR")) + "/" +
                               std::getenv("TEST_WORKSPACE") + "/tools/ctxpar/png_stats.py";
    std::istringstream stats(Shell("/usr/bin/python3 '" + script + "' '" + png + "'", &code));
    ASSERT_EQ(code, 0) << "png_stats.py failed on " << png;
    int w = 0, h = 0, colours = 0;
    double dark = 0;
    stats >> w >> h >> colours >> dark;
    EXPECT_EQ(w, 1400);
    EXPECT_EQ(h, 1800);
    EXPECT_GE(colours, 100) << "a flat picture: the page did not render";
    EXPECT_LT(dark, 0.5) << "mostly dark: an error page?";
    // The DOM as rendered: the pictures are there, nothing that loads anything.
    const std::string dom = Browse(m.path, "--dump-dom", tag + "-dom", &code);
    ASSERT_EQ(code, 0);
    EXPECT_EQ(Count(dom, "<svg"), Count(html, "<svg"));
    EXPECT_GT(Count(dom, "<svg"), 0);
    EXPECT_EQ(Count(dom, "<rect class=\"bar"), Count(html, "<rect class=\"bar"));
    for (const char *bad : {"<script", "<img", "<link", "<iframe"})
        EXPECT_EQ(dom.find(bad), std::string::npos) << bad;
    EXPECT_EQ(ReadAll(cpt_tool::TempDir() + "/chromium-" + tag + ".log").find("ERR_NAME_NOT"),
              std::string::npos);
}

class Browser : public ::testing::Test {
  protected:
    void SetUp() override {
        if (Chromium().empty())
            GTEST_SKIP() << "chromium is not installed (apt-get install chromium)";
    }
};

TEST_F(Browser, RendersTheCheckReport) {
    Render(cpt_report::Check(cpt_report::Dir("b-check")), "check");
}

TEST_F(Browser, RendersTheAuditReportWithAPlantedFault) {
    Render(cpt_report::Audit(cpt_report::Dir("b-audit")), "audit");
}

TEST_F(Browser, RendersThePlanReport) {
    Render(cpt_report::Plan(cpt_report::Dir("b-plan")), "plan");
}

TEST_F(Browser, RendersTheBenchReport) {
    Render(cpt_report::Bench(cpt_report::Dir("b-bench")), "bench");
}

} // namespace
