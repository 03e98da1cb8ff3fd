// The progress line (progress.h) driven by a fake clock, into a temporary file: silent for the
// first 2 s and when the work ends sooner; on a terminal one line rewritten in place, at most a
// few times a second, and cleared; in a log one line per 10 s with stage, percent, elapsed time
// and the time left of the stage.
#include <cstdio>
#include <cstdlib>
#include <string>

#include <gtest/gtest.h>

#include "tools/ctxpar/progress.h"

namespace {

double fake_now = 0;
double FakeNow() {
    return fake_now;
}

// A progress of `cmd` at fake time 0 into a temporary file, as a terminal or as a log.
struct Progress {
    cpt_progress p;
    FILE *f;
    Progress(const char *cmd, bool tty) {
        unsetenv("CTXPAR_PROGRESS_AFTER");
        fake_now = 0;
        f = std::tmpfile();
        cpt_progress_init(&p, cmd, f, FakeNow);
        p.tty = tty; // a file is never a terminal: pretend
    }
    ~Progress() { std::fclose(f); }
    // At fake time t, `done` of `total` of `stage`.
    void At(double t, const char *stage, int done, int total) {
        fake_now = t;
        cpt_progress_update(&p, stage, done, total);
    }
    std::string Text() {
        std::fflush(f);
        std::string s;
        std::rewind(f);
        for (int c; (c = std::fgetc(f)) != EOF;)
            s += static_cast<char>(c);
        return s;
    }
};

int Count(const std::string &s, const std::string &what) {
    int n = 0;
    for (size_t i = s.find(what); i != std::string::npos; i = s.find(what, i + 1))
        n++;
    return n;
}

TEST(Progress, SilentForTheFirstTwoSeconds) {
    for (bool tty : {false, true}) {
        Progress pr("check", tty);
        for (int i = 0; i < 199; i++) // 0 .. 1.98 s
            pr.At(i / 100.0, "4 ranks", i, 1000);
        EXPECT_EQ(pr.Text(), "") << tty;
        pr.At(2.0, "4 ranks", 200, 1000);
        EXPECT_NE(pr.Text().find("ctxpar check: 4 ranks 20 %"), std::string::npos) << tty;
    }
}

TEST(Progress, NothingWhenTheWorkEndsWithinTwoSeconds) {
    for (bool tty : {false, true}) {
        Progress pr("check", tty);
        for (int i = 0; i <= 100; i++)
            pr.At(i / 100.0, "4 ranks", i, 100);
        for (int i = 0; i <= 90; i++)
            pr.At(1.0 + i / 100.0, "fp64 reference", i, 90);
        cpt_progress_clear(&pr.p);
        EXPECT_EQ(pr.Text(), "") << tty;
    }
}

// One line rewritten in place (no newline), a few times a second at most, erased by clear.
TEST(Progress, TerminalRewritesOneLineAndClearsIt) {
    Progress pr("check", true);
    for (int i = 0; i <= 500; i++) // 5 s, an update every 10 ms
        pr.At(i / 100.0, "fp64 reference", i, 500);
    std::string s = pr.Text();
    EXPECT_EQ(s.find('\n'), std::string::npos) << s;
    EXPECT_EQ(s.rfind("\r\033[K", 0), 0u) << s; // every line begins by erasing the last
    const int lines = Count(s, "ctxpar check:");
    EXPECT_EQ(Count(s, "\r\033[K"), lines);
    EXPECT_GE(lines, 10); // 3 s shown, a line per 0.25 s
    EXPECT_LE(lines, 13);
    // The last line: 5 s in, 100 % done.
    EXPECT_EQ(s.substr(s.rfind("\r\033[K")),
              "\r\033[Kctxpar check: fp64 reference 100 % (elapsed 5.0 s, about 0.0 s left)")
        << s;
    EXPECT_EQ(pr.p.shown, 1);
    cpt_progress_clear(&pr.p);
    s = pr.Text();
    EXPECT_EQ(s.substr(s.size() - 4), "\r\033[K"); // erased, and nothing after
    EXPECT_EQ(pr.p.shown, 0);
    cpt_progress_clear(&pr.p); // twice: nothing more
    EXPECT_EQ(pr.Text(), s);
}

// A line wider than the terminal is cut, so that it does not wrap onto a second row.
TEST(Progress, TerminalLineIsCutToTheWidth) {
    Progress pr("bench", true);
    pr.p.width = 40;
    cpt_progress_prefix(&pr.p, "ranks 2, seq 8192 (1 of 4): ");
    pr.At(3.0, "fp64 reference", 10, 100);
    EXPECT_EQ(pr.Text(), "\r\033[Kctxpar bench: ranks 2, seq 8192 (1 of 4)"); // 40 columns
}

// In a log: whole lines, the first at 2 s, then one per 10 s; what each says.
TEST(Progress, LogPrintsALinePerTenSeconds) {
    Progress pr("check", false);
    for (int i = 0; i <= 1200; i++) // 60 s, an update every 50 ms; 10 items a second of 600
        pr.At(i / 20.0, "fp64 reference", i / 2, 600);
    const std::string s = pr.Text();
    EXPECT_EQ(Count(s, "\n"), 6) << s; // at 2, 12, 22, 32, 42, 52 s
    EXPECT_EQ(Count(s, "ctxpar check:"), 6) << s;
    EXPECT_EQ(s.find('\r'), std::string::npos) << s;
    EXPECT_EQ(s.find('\033'), std::string::npos) << s;
    EXPECT_EQ(s.rfind("ctxpar check: fp64 reference 3 % (elapsed 2.0 s, about 58.0 s left)\n", 0),
              0u)
        << s;
    EXPECT_NE(s.find("ctxpar check: fp64 reference 20 % (elapsed 12.0 s, about 48.0 s left)\n"),
              std::string::npos)
        << s;
    cpt_progress_clear(&pr.p); // nothing to erase in a log
    EXPECT_EQ(pr.Text(), s);
}

// The time left is the current stage's, at its own pace; elapsed is the whole work's.
TEST(Progress, TimeLeftIsTheStagesAndUnknownWithoutATotal) {
    Progress pr("check", false);
    for (int i = 0; i <= 30; i++)
        pr.At(i / 10.0, "4 ranks", i / 10, 3); // 3 s, at 2 s a first line
    pr.At(3.0, "fp64 oracle", 0, 0);
    pr.At(12.5, "fp64 oracle", 0, 0);
    pr.At(13.0, "fp64 reference", 0, 100);  // a new stage at 13 s
    pr.At(23.0, "fp64 reference", 25, 100); // a quarter in 10 s: 30 s to go
    const std::string s = pr.Text();
    EXPECT_EQ(s, "ctxpar check: 4 ranks 66 % (elapsed 2.0 s, about 1.0 s left)\n"
                 "ctxpar check: fp64 oracle (elapsed 12.5 s, time left unknown)\n"
                 "ctxpar check: fp64 reference 25 % (elapsed 23.0 s, about 30.0 s left)\n");
}

// The command's prefix names the configuration; a new prefix is a new stage, even when the
// runner's name for it is the same; done going back starts the stage again too.
TEST(Progress, PrefixAndRestartedStages) {
    Progress pr("bench", false);
    cpt_progress_prefix(&pr.p, "ranks 2, seq 8192: ");
    pr.At(4.0, "2 ranks", 1, 2);
    cpt_progress_prefix(&pr.p, "ranks 4, seq 8192 (2 of 2): ");
    pr.At(5.0, "2 ranks", 0, 4);
    pr.At(14.0, "2 ranks", 1, 4); // a line: 1 of 4 in 9 s
    pr.At(15.0, "2 ranks", 0, 4); // the same stage again, from the start
    pr.At(24.0, "2 ranks", 2, 4); // 2 of 4 in 9 s
    EXPECT_EQ(pr.Text(),
              "ctxpar bench: ranks 2, seq 8192: 2 ranks 50 % (elapsed 4.0 s, time left unknown)\n"
              "ctxpar bench: ranks 4, seq 8192 (2 of 2): 2 ranks 25 % (elapsed 14.0 s, about "
              "27.0 s left)\n"
              "ctxpar bench: ranks 4, seq 8192 (2 of 2): 2 ranks 50 % (elapsed 24.0 s, about "
              "9.0 s left)\n");
}

TEST(Progress, LongTimesInMinutesAndHours) {
    Progress pr("plan", false);
    pr.At(0, "dry run of 4096 ranks", 0, 4096);
    pr.At(125.0, "dry run of 4096 ranks", 1, 4096);
    EXPECT_EQ(pr.Text(),
              "ctxpar plan: dry run of 4096 ranks 0 % (elapsed 2 min 05 s, about 142 h 11 min "
              "left)\n");
}

TEST(Progress, SilentWithoutAStreamAndTheEnvironmentsDelay) {
    fake_now = 0;
    cpt_progress p;
    cpt_progress_init(&p, "check", nullptr, FakeNow);
    fake_now = 100;
    cpt_progress_update(&p, "4 ranks", 1, 2);
    cpt_progress_clear(&p); // nothing to write to: no crash

    setenv("CTXPAR_PROGRESS_AFTER", "0", 1);
    fake_now = 0;
    FILE *f = std::tmpfile();
    cpt_progress_init(&p, "check", f, FakeNow);
    unsetenv("CTXPAR_PROGRESS_AFTER");
    EXPECT_EQ(p.after_s, 0.0);
    cpt_progress_update(&p, "4 ranks", 0, 1);
    EXPECT_GT(std::ftell(f), 0L);
    std::fclose(f);
}

} // namespace
