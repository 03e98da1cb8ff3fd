#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (ASan + UBSan + coverage), outside Bazel since Bazel's
# toolchain is gcc, then runs each for SECONDS (default 60). The committed corpus
# (testing/fuzz/corpus/<target>/: seeds and every crash ever found, as regression inputs) is
# replayed first; new inputs go to the build folder, never into the repository. Exits 1 on any
# crash, sanitizer report, leak or broken property; the input is left in $build/artifacts.
#
#   testing/fuzz/run_fuzzers.sh [SECONDS]      needs: clang libclang-rt-14-dev libomp-14-dev
#                                              libjansson-dev
#
# Environment: CTXPAR_FUZZ_BUILD (build folder, default out/fuzz), CTXPAR_FUZZ_TARGETS (default
# "npy_fuzz safetensors_fuzz validate_fuzz"), CLANG (default clang).
set -euo pipefail
cd "$(dirname "$0")/../.."

seconds=${1:-60}
build=${CTXPAR_FUZZ_BUILD:-out/fuzz}
targets=${CTXPAR_FUZZ_TARGETS:-npy_fuzz safetensors_fuzz validate_fuzz}
cc=${CLANG:-clang}

if ! command -v "$cc" >/dev/null; then
    echo "run_fuzzers: $cc not found (apt-get install clang libclang-rt-14-dev libomp-14-dev)" >&2
    exit 1
fi

# Library sources as Bazel builds them (see each BUILD file); cpu_bench.c has its own main().
lib_srcs=(core/*.c dispatch/*.c algorithms/*.c comm/local/*.c)
for f in backends/cpu/*.c; do
    [ "$f" = backends/cpu/cpu_bench.c ] || lib_srcs+=("$f")
done
lib_srcs+=(reference/npy.c reference/safetensors.c reference/data.c reference/oracle.c reference/metrics.c reference/tolerance.c)
fuzz_srcs=(testing/fuzz/fuzz_problem.c testing/fuzz/cpu_supports_shim.c)

common=(-std=c11 -g -O1 -fno-omit-frame-pointer -fsanitize=address,undefined
    -fno-sanitize-recover=all -fopenmp -I. -Iapi -Icore -Idispatch -Ialgorithms -Itesting -Ireference)
# The fuzz files build without a warning; the library's are held to that by gcc in Bazel, and
# clang's extra notes about them (GCC-only pragmas, unvectorised loops) are not failures here.
strict=(-Wall -Wextra -Werror)
lenient=(-Wall -Wextra -Wno-unknown-pragmas -Wno-pass-failed)

# Per-file flags that stand in for what gcc gets from the sources themselves.
file_flags() {
    case "$1" in
    # `#pragma GCC target` is GCC-only: give clang the same instruction sets on the command line.
    backends/cpu/cpu_kernels_avx2.c) echo "-mavx2 -mfma -mf16c" ;;
    backends/cpu/cpu_kernels_avx512*.c) echo "-mavx512f -mavx2 -mfma -mf16c" ;;
    # clang 14's __builtin_cpu_supports lacks "f16c": see cpu_supports_shim.c.
    backends/cpu/cpu_device.c)
        echo "-include testing/fuzz/cpu_supports_shim.h"
        echo "-D__builtin_cpu_supports=cpt_fuzz_cpu_supports"
        ;;
    esac
}

mkdir -p "$build/obj" "$build/artifacts"
echo "==> building fuzz targets with $("$cc" --version | head -1) in $build"
# Compiles and fuzzing runs go side by side, one per core.
width=$(getconf _NPROCESSORS_ONLN) # not nproc: it obeys OMP_NUM_THREADS
running=0
failed_jobs=0
slot() { # waits for a free core
    if [ "$running" -ge "$width" ]; then
        wait -n || failed_jobs=$((failed_jobs + 1))
        running=$((running - 1))
    fi
    running=$((running + 1))
}
drain() {
    while [ "$running" -gt 0 ]; do
        wait -n || failed_jobs=$((failed_jobs + 1))
        running=$((running - 1))
    done
}
objs=()
compile() { # src, extra flags...
    local src=$1 obj
    shift
    obj="$build/obj/$(echo "${src%.c}" | tr / _).o"
    objs+=("$obj")
    slot
    # shellcheck disable=SC2046 # file_flags is a list of words
    "$cc" "${common[@]}" "$@" $(file_flags "$src") -fsanitize=fuzzer-no-link -c "$src" \
        -o "$obj" &
}
for f in "${lib_srcs[@]}"; do compile "$f" "${lenient[@]}"; done
for f in "${fuzz_srcs[@]}"; do compile "$f" "${strict[@]}"; done
drain
if [ "$failed_jobs" -gt 0 ]; then
    echo "run_fuzzers: $failed_jobs compiles failed" >&2
    exit 1
fi

for t in $targets; do
    "$cc" "${common[@]}" "${strict[@]}" -fsanitize=fuzzer "testing/fuzz/$t.c" "${objs[@]}" \
        -ljansson -lm -pthread -o "$build/$t"
done

export OMP_NUM_THREADS=1
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
fuzz() { # target: runs it for $seconds and reports; non-zero when it found a failure
    local t=$1 seeds=testing/fuzz/corpus/$1 work=$build/corpus/$1 log=$build/$1.log
    mkdir -p "$work"
    echo "==> $t for ${seconds}s (seeds: $(ls "$seeds" | wc -l) in $seeds)"
    if "$build/$t" -max_total_time="$seconds" -timeout=30 -rss_limit_mb=2048 \
        -print_final_stats=1 -artifact_prefix="$build/artifacts/$t-" "$work" "$seeds" \
        >"$log" 2>&1; then
        execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
        cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1)
        echo "$t: OK, $execs runs, $cov, corpus $(ls "$work" | wc -l) new inputs"
    else
        tail -n 60 "$log"
        echo "$t: FAILED (log $log; crashing input in $build/artifacts/)"
        return 1
    fi
}
failed_jobs=0
for t in $targets; do
    slot
    fuzz "$t" &
done
drain
exit "$([ "$failed_jobs" -eq 0 ] && echo 0 || echo 1)"
