#!/usr/bin/env bash
# The whole test suite, as CI runs it:
#   1. every Bazel test (CPU backend, in-process ranks, MPI ranks under mpirun; CUDA tests build
#      and report "skipped: no CUDA device" without a GPU);
#   2. the same suite under ASan + UBSan (--config=asan), but for the CUDA targets;
#   3. the core suites under valgrind memcheck (testing/valgrind/run_valgrind.sh);
#   4. the local comm and the threaded end-to-end suites under ThreadSanitizer (--config=tsan);
#   5. each libFuzzer target for a bounded time (testing/fuzz/run_fuzzers.sh).
# A test target whose every test case skipped (GPU-only targets without a GPU: tag "gpu") counts
# as skipped, never as passed: GoogleTest's XML in bazel-testlogs says which cases ran.
# Ends with "ctxpar test suites: N passed, S skipped, F failed" over all of them, then the same
# counts as "N passed, F failed, S skipped".
set -uo pipefail
cd "$(dirname "$0")/.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
FUZZ_SECONDS="${FUZZ_SECONDS:-30}"

passed=0
failed=0
skipped=0
log="$(mktemp)"
trap 'rm -f "$log"' EXIT

# Whether every test case GoogleTest ran for target //pkg:name skipped (its test.xml files, one
# per shard, in bazel-testlogs, which points at the configuration just run). A target without
# GoogleTest XML (Bazel writes a one-case file for sh_test) is not skipped.
all_skipped() {
    local dir="bazel-testlogs/${1#//}"
    dir="${dir/://}"
    local cases skips
    cases=$(find "$dir" -name test.xml -exec grep -ho '<testcase ' {} + 2>/dev/null | wc -l)
    skips=$(find "$dir" -name test.xml -exec grep -ho '<testcase [^>]*result="skipped"' {} + \
        2>/dev/null | wc -l)
    [ "$cases" -gt 0 ] && [ "$skips" -eq "$cases" ]
}

# Runs a bazel test command and counts its test targets: passed, skipped (every case skipped)
# or failed.
# Each stage says when it ends and how long it took (CI logs show where the time goes).
stage_start=$SECONDS
stage_end() { echo "    ($((SECONDS - stage_start)) s; $((SECONDS / 60)) min in all)"; stage_start=$SECONDS; }

bazel_suite() {
    echo "==> bazel test $*"
    bazel test --test_output=errors "$@" 2>&1 | tee "$log"
    local f target
    while read -r target; do
        if all_skipped "$target"; then
            echo "    skipped: $target (every test case skipped)"
            skipped=$((skipped + 1))
        else
            passed=$((passed + 1))
        fi
    done < <(sed -nE 's#^(//[^ ]+) +(\(cached\) )?PASSED.*#\1#p' "$log")
    f=$(grep -cE '^//[^ ]+ +(\(cached\) )?(FAILED|TIMEOUT|FLAKY|NO STATUS|INCOMPLETE)|FAILED TO BUILD' "$log")
    if ! grep -qE '^Executed [0-9]+ out of [0-9]+ tests?' "$log" && [ "$f" -eq 0 ]; then
        f=1 # the build itself failed before any test ran
    fi
    failed=$((failed + f))
    stage_end
}

# Runs a script that exits non-zero on failure and counts it as one suite.
script_suite() {
    echo "==> $*"
    if "$@"; then passed=$((passed + 1)); else failed=$((failed + 1)); fi
    stage_end
}

bazel_suite //...
# CUDA tests cannot run here: show that they said so, rather than passing silently.
grep -h "skipped: no CUDA device" bazel-testlogs/testing/*cuda*/test.log \
    bazel-testlogs/testing/gpu/*/test.log 2>/dev/null | sort | uniq -c | sed 's/^/    /'
# The CUDA targets are left out here: their device code cannot run on this machine, and nvcc
# would compile them all again for the sanitizer configuration. Only what the tests need is
# built (the optimised run above built everything).
# The browser test is left out too: under ASan it would check chromium's rendering again, while
# the tool's report writing runs under ASan in report_test.
bazel_suite --config=asan --build_tests_only --test_tag_filters=-gpu -- //... -//backends/cuda/... \
    -//comm/nccl/... -//testing/gpu/... -//testing:cuda_ops_test -//testing:cuda_registry_test \
    -//packaging/cuda/... -//tools/ctxpar:report_browser_test
# Threads under ThreadSanitizer: the local comm (ranks as threads), and the end-to-end cases
# whose ranks are threads on one OpenMP thread each (TSan cannot see libgomp's barriers, so the
# thread-count and seq-4096 cases stay out): every algorithm, mask and the P = 3 and P = 4
# layouts, about 3 minutes on 2 cores.
tsan_e2e='All/EndToEnd.*_P4_zigzag_*f32*:All/EndToEnd.*_P3_striped_*bf16*:EndToEndWindow.*'
tsan_e2e+=':EndToEndAllToAll.*:EndToEndWork.*'
bazel_suite --config=tsan -- //testing:comm_local_test //testing:context_reuse_test
bazel_suite --config=tsan --test_arg=--gtest_filter="$tsan_e2e" -- //testing:e2e_test
script_suite bash testing/valgrind/run_valgrind.sh
script_suite bash testing/fuzz/run_fuzzers.sh "$FUZZ_SECONDS"
script_suite bash examples/test_examples.sh
script_suite bash python/run_tests.sh

echo "ctxpar test suites: $passed passed, $skipped skipped, $failed failed"
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
