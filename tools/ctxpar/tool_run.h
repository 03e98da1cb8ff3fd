// Running the `ctxpar` binary from a test as a child process: its exit code, stdout and stderr.
// Shared by the suites that judge the tool as users run it (tool_test, audit_test).
#ifndef CPT_TOOL_TOOL_RUN_H
#define CPT_TOOL_TOOL_RUN_H

#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

namespace cpt_tool {

inline std::string TempDir() {
    const char *d = std::getenv("TEST_TMPDIR");
    return d ? d : "/tmp";
}

inline std::string Binary() {
    const char *srcdir = std::getenv("TEST_SRCDIR");
    const char *ws = std::getenv("TEST_WORKSPACE");
    return std::string(srcdir ? srcdir : ".") + "/" + (ws ? ws : "ctxpar") + "/tools/ctxpar/ctxpar";
}

struct Outcome {
    int code = -1; // exit status; -1 when the process did not exit normally (a crash)
    std::string out, err;
};

inline std::string ReadAll(const std::string &path) {
    std::ifstream f(path, std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

// Runs a shell command: its stdout, and its exit status in *code (-1: it did not exit normally).
inline std::string Shell(const std::string &cmd, int *code) {
    std::string out;
    *code = -1;
    FILE *p = popen(cmd.c_str(), "r");
    if (!p)
        return out;
    char buf[4096];
    size_t got;
    while ((got = fread(buf, 1, sizeof buf, p)) > 0)
        out.append(buf, got);
    int status = pclose(p);
    *code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    return out;
}

// Runs `prefix BINARY args` through the shell; stdout and stderr captured separately.
inline Outcome RunWith(const std::string &prefix, const std::string &args) {
    static int n = 0;
    std::string err_path = TempDir() + "/stderr_" + std::to_string(n++) + ".txt";
    Outcome o;
    o.out = Shell(prefix + "'" + Binary() + "' " + args + " 2>'" + err_path + "'", &o.code);
    o.err = ReadAll(err_path);
    return o;
}

inline Outcome Tool(const std::string &args) {
    return RunWith("", args);
}

inline int Lines(const std::string &s) {
    int n = 0;
    for (char c : s)
        n += c == '\n';
    return n;
}

} // namespace cpt_tool

#endif // CPT_TOOL_TOOL_RUN_H
