#!/usr/bin/env bash
# The whole test suite, as CI runs it:
#   1. every Bazel test (CPU backend, in-process ranks, MPI ranks under mpirun; CUDA tests build
#      and report "skipped: no CUDA device" without a GPU);
#   2. the same suite under ASan + UBSan (--config=asan), but for the CUDA targets;
#   3. the core suites under valgrind memcheck (testing/valgrind/run_valgrind.sh);
#   4. each libFuzzer target for a bounded time (testing/fuzz/run_fuzzers.sh).
# Ends with one line "N passed, M failed" over all of them.
set -uo pipefail
cd "$(dirname "$0")/.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
FUZZ_SECONDS="${FUZZ_SECONDS:-30}"

passed=0
failed=0
log="$(mktemp)"
trap 'rm -f "$log"' EXIT

# Runs a bazel test command and counts its test targets.
bazel_suite() {
    echo "==> bazel test $*"
    bazel test --test_output=errors "$@" 2>&1 | tee "$log"
    local p f
    p=$(grep -cE '^//[^ ]+ +(\(cached\) )?PASSED' "$log")
    f=$(grep -cE '^//[^ ]+ +(\(cached\) )?(FAILED|TIMEOUT|FLAKY|NO STATUS|INCOMPLETE)|FAILED TO BUILD' "$log")
    if ! grep -qE '^Executed [0-9]+ out of [0-9]+ tests?' "$log" && [ "$f" -eq 0 ]; then
        f=1 # the build itself failed before any test ran
    fi
    passed=$((passed + p))
    failed=$((failed + f))
}

# Runs a script that exits non-zero on failure and counts it as one suite.
script_suite() {
    echo "==> $*"
    if "$@"; then passed=$((passed + 1)); else failed=$((failed + 1)); fi
}

bazel_suite //...
# CUDA tests cannot run here: show that they said so, rather than passing silently.
grep -h "skipped: no CUDA device" bazel-testlogs/testing/*cuda*/test.log \
    bazel-testlogs/testing/gpu/*/test.log 2>/dev/null | sort | uniq -c | sed 's/^/    /'
# The CUDA targets are left out here: their device code cannot run on this machine, and nvcc
# would compile them all again for the sanitizer configuration.
bazel_suite --config=asan -- //... -//backends/cuda/... -//comm/nccl/... -//testing/gpu/... \
    -//testing:cuda_ops_test
script_suite bash testing/valgrind/run_valgrind.sh
script_suite bash testing/fuzz/run_fuzzers.sh "$FUZZ_SECONDS"

echo "ctxpar test suites: $passed passed, $failed failed"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
