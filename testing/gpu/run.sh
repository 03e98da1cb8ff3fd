#!/usr/bin/env bash
# The GPU checks, for the GPU machine as it is: the CUDA 13 toolkit, PyTorch, compute-sanitizer,
# cuDNN and NCCL only as Python wheels (nvidia-cudnn-cu13, nvidia-nccl-cu13), no GoogleTest, no
# Bazel, no network. Designed for under 8 minutes on an H200 with staged binaries.
#
#   testing/gpu/run.sh [RESULTS_DIR]      (default: $OUT, else out/gpu-results)
#
# 1. Libraries: cuDNN and NCCL from the wheels of the first python3 on PATH (or $PYTHON), found
#    through the packages' __path__ (nvidia.cudnn is a namespace package: no __file__), else the
#    toolkit's or the system's; LD_LIBRARY_PATH points at them.
# 2. Binaries: gpu_stage/bin from testing/gpu/stage.sh (carried with the tree) when each one
#    loads here, else (or with CTXPAR_GPU_FROM_SOURCE=1) built from the sources with nvcc and
#    gcc/g++: wheel headers, -l:libcudnn.so.9 -l:libnccl.so.2, GoogleTest from the sources
#    stage.sh carried.
# 3. Tests, each binary with its own timeout ($CTXPAR_GPU_TEST_TIMEOUT, 120 s); cuda_ops_test
#    and device_conformance_test (its CUDA factories' cases)
#    suite by suite (a sticky CUDA error fails its own suite, named, not every later one).
#    Without a GPU they report "skipped: no CUDA device" (counted as skipped, never passed).
# 4. compute-sanitizer memcheck and racecheck on a reduced set of small shapes.
# 5. Benchmarks: cuda_bench (block forward, native and cuDNN), `ctxpar bench --backend cuda`
#    (ring and all-gather, P = 1, 2, 4 ranks on one GPU through the in-process comm, BF16,
#    head_dim 128, seq 8k, causal and not, forward and forward + backward), and PyTorch's SDPA on
#    the same shapes in the same run (testing/bench/torch_sdpa.py, testing/gpu/torch_train_sdpa.py).
# Everything goes to RESULTS_DIR/results.txt (the summary) and RESULTS_DIR/*.log (full output).
# Exit status: 0 when nothing failed (skips are not failures), 1 otherwise.
set -uo pipefail

ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
RESULTS_DIR="${1:-${OUT:-$ROOT/out/gpu-results}}"
mkdir -p "$RESULTS_DIR"
RESULTS_DIR="$(cd "$RESULTS_DIR" && pwd)"
RESULTS="$RESULTS_DIR/results.txt"
: > "$RESULTS"
STAGE="$ROOT/gpu_stage"
PY="${PYTHON:-python3}"
TEST_TIMEOUT="${CTXPAR_GPU_TEST_TIMEOUT:-120}"
BUDGET="${CTXPAR_GPU_BUDGET:-450}" # seconds; benchmark steps past it are skipped, by name
START=$(date +%s)
FAILED=0

say() { echo "$*" | tee -a "$RESULTS"; }
section() { say ""; say "== $* (t=$(( $(date +%s) - START ))s)"; }
over_budget() { [ $(( $(date +%s) - START )) -ge "$BUDGET" ]; }
fail() { say "FAILED: $*"; FAILED=1; }

# ---------------------------------------------------------------- environment
NVCC="${NVCC:-$(command -v nvcc || true)}"
if [ -z "$NVCC" ] && [ -x /usr/local/cuda/bin/nvcc ]; then NVCC=/usr/local/cuda/bin/nvcc; fi
if [ -z "${CUDA_HOME:-}" ]; then
    CUDA_HOME=/usr/local/cuda
    [ -n "$NVCC" ] && CUDA_HOME="$(dirname "$(dirname "$(readlink -f "$NVCC")")")"
fi
HAVE_GPU=0
if nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then HAVE_GPU=1; fi

section "environment"
say "commit: $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || cat "$STAGE/COMMIT" 2>/dev/null)"
if [ $HAVE_GPU = 1 ]; then
    say "gpu: $(nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total \
        --format=csv,noheader 2>&1 | head -4)"
else
    say "gpu: none (skipped: no CUDA device): tests report skips, benchmarks and sanitizers skip"
fi
say "nvcc: $("$NVCC" --version 2>/dev/null | grep release || echo missing) (CUDA_HOME $CUDA_HOME)"
say "python: $(command -v "$PY") $("$PY" -c 'import torch; print("torch", torch.__version__)' \
    2>&1 | tail -1)"

# The directory of an installed Python package, or nothing. nvidia.cudnn and nvidia.nccl are
# namespace packages in the wheels (no __init__.py, so no __file__): take __path__.
pkg_dir() {
    "$PY" -c 'import importlib, os, sys
m = importlib.import_module(sys.argv[1])
f = getattr(m, "__file__", None)
print(os.path.dirname(f) if f else list(m.__path__)[0])' "$1" 2>/dev/null
}

# find_lib VAR PACKAGE HEADER SONAME: sets VAR_INC and VAR_LIB to the directories holding
# HEADER and SONAME: the wheel's include/ and lib/, else the toolkit's, else the system's.
find_lib() {
    local var=$1 pkg=$2 header=$3 soname=$4 dir inc="" lib="" from=""
    dir=$(pkg_dir "$pkg")
    if [ -n "$dir" ] && [ -f "$dir/include/$header" ] && [ -e "$dir/lib/$soname" ]; then
        inc="$dir/include" lib="$dir/lib" from="wheel ($pkg)"
    else
        for d in "$CUDA_HOME" /usr; do
            for l in "$d/lib64" "$d/lib" "$d/lib/x86_64-linux-gnu"; do
                if [ -f "$d/include/$header" ] && [ -e "$l/$soname" ]; then
                    inc="$d/include" lib="$l" from="$d"
                    break 2
                fi
            done
        done
    fi
    printf -v "${var}_INC" '%s' "$inc"
    printf -v "${var}_LIB" '%s' "$lib"
    if [ -n "$inc" ]; then
        say "$var: $from: headers $inc/$header, library $lib/$soname"
    else
        say "$var: NOT FOUND ($pkg has no $header and $soname; nor the toolkit or the system)"
    fi
}
find_lib CUDNN nvidia.cudnn cudnn.h libcudnn.so.9
find_lib NCCL nvidia.nccl nccl.h libnccl.so.2
if [ -n "$CUDNN_INC" ]; then
    say "CUDNN: version $(awk '/#define CUDNN_(MAJOR|MINOR|PATCHLEVEL) /{printf "%s%s", sep, $3;
        sep="."}' "$CUDNN_INC/cudnn_version.h" 2>/dev/null) (headers)"
fi
if [ -n "$NCCL_INC" ]; then
    say "NCCL: version $(awk '/#define NCCL_(MAJOR|MINOR|PATCH) /{printf "%s%s", sep, $3;
        sep="."}' "$NCCL_INC/nccl.h" 2>/dev/null) (headers)"
fi
# The stage's own libraries (the ctxpar tool's OpenMPI) last: the machine's come first.
export LD_LIBRARY_PATH="${CUDNN_LIB:+$CUDNN_LIB:}${NCCL_LIB:+$NCCL_LIB:}$CUDA_HOME/lib64:${LD_LIBRARY_PATH:-}:$STAGE/lib"
say "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"

# ---------------------------------------------------------------- binaries
TESTS=(cuda_ops_test device_conformance_test nccl_comm_test comm_conformance_nccl_test e2e_cuda_test)
ALL_BINS=("${TESTS[@]}" cuda_bench ctxpar)
declare -A BIN

# A staged binary is used when every library it needs resolves here (ldd names a missing one,
# or a glibc too old, as "not found").
loads() { [ -x "$1" ] && ! ldd "$1" 2>&1 | grep -q "not found"; }

build_from_source() {
    local B="$RESULTS_DIR/build" jobs cc_arch tool_failed=0
    jobs=$(nproc)
    cc_arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null |
        head -1 | tr -d '. ')
    cc_arch=${cc_arch:-90}
    mkdir -p "$B/obj" "$B/bin" "$B/gtest"
    if [ -z "$NVCC" ] || [ -z "$CUDNN_INC" ] || [ -z "$NCCL_INC" ]; then
        echo "cannot build: nvcc, cuDNN or NCCL missing"
        return 1
    fi
    local inc="-I$ROOT -I$ROOT/api -I$ROOT/core -I$ROOT/dispatch -I$ROOT/algorithms -I$ROOT/reference"
    inc="$inc -I$ROOT/comm/mpi -I$CUDA_HOME/include"
    inc="$inc -I$CUDNN_INC -I$NCCL_INC"
    local cflags="-std=c11 -O3 -fPIC -fopenmp -Wall $inc" blas="-lopenblas"
    # The reference's matrix products: OpenBLAS where the machine has it, else plain loops.
    if [ ! -f /usr/include/x86_64-linux-gnu/cblas.h ] && [ ! -f /usr/include/cblas.h ]; then
        cflags="$cflags -DCPT_REF_NO_BLAS" blas=""
    fi
    local srcs=() f
    for f in "$ROOT"/core/*.c "$ROOT"/dispatch/*.c "$ROOT"/algorithms/*.c "$ROOT"/backends/cpu/*.c \
             "$ROOT"/comm/local/*.c "$ROOT"/backends/cuda/*.c "$ROOT"/comm/nccl/*.c \
             "$ROOT"/reference/*.c; do
        # MPI's and Jansson's headers may be missing here: the tool's build below adds these.
        case "$f" in *_bench.c|*/cudnn_absent.c|*/runner_mpi.c|*/safetensors.c) continue ;; esac
        srcs+=("$f")
    done
    echo "building from source: ${#srcs[@]} C files, $(ls "$ROOT"/backends/cuda/*.cu | wc -l)" \
        "CUDA files (sm_$cc_arch), $jobs jobs"
    obj() { echo "$B/obj/$(echo "${1#"$ROOT"/}" | tr / _).o"; }
    {
        for f in "${srcs[@]}"; do
            printf 'gcc %s -c %q -o %q\n' "$cflags" "$f" "$(obj "$f")"
        done
        for f in "$ROOT"/backends/cuda/*.cu; do
            printf '%q -c -O3 -std=c++17 -gencode arch=compute_%s,code=sm_%s' \
                "$NVCC" "$cc_arch" "$cc_arch"
            printf ' -Xcompiler -fPIC %s %q -o %q\n' "$inc" "$f" "$(obj "$f")"
        done
    } | xargs -P "$jobs" -d '\n' -I{} bash -c '{}' || return 1
    # The library whole (devices and comms register by name from constructors that nothing
    # else references); the reference beside it, taken as needed.
    rm -f "$B/libctxpar_gpu.a" "$B/libcpt_reference.a"
    ar rcs "$B/libcpt_reference.a" "$B"/obj/reference_*.o || return 1
    ar rcs "$B/libctxpar_gpu.a" $(ls "$B"/obj/*.o | grep -v '/reference_') || return 1
    LIBS="$B/libcpt_reference.a -Wl,--whole-archive $B/libctxpar_gpu.a -Wl,--no-whole-archive"
    # The wheels ship only versioned libraries: link them by file name.
    LIBS="$LIBS -L$CUDNN_LIB -L$NCCL_LIB -L$CUDA_HOME/lib64"
    LIBS="$LIBS -Wl,-rpath,$CUDNN_LIB:$NCCL_LIB:$CUDA_HOME/lib64"
    LIBS="$LIBS -l:libcudnn.so.9 -l:libnccl.so.2 -lcudart -lstdc++ $blas -fopenmp -lm -lpthread -ldl"
    gcc $cflags "$ROOT/testing/gpu/cuda_bench.c" $LIBS -o "$B/bin/cuda_bench" || return 1

    # The ctxpar tool links MPI (its in-process comm never initialises it): only with headers.
    local mpi_c mpi_l
    mpi_c=$(mpicc -showme:compile 2>/dev/null) && mpi_l=$(mpicc -showme:link 2>/dev/null)
    # Its JSON output needs Jansson's headers and library.
    if [ -z "${mpi_c:-}" ]; then
        echo "ctxpar: not built from source (no mpicc for MPI headers); bench steps will skip"
    elif [ ! -f /usr/include/jansson.h ]; then
        echo "ctxpar: not built from source (no jansson.h); bench steps will skip"
    else
        gcc $cflags $mpi_c "$ROOT"/tools/ctxpar/*.c "$ROOT"/comm/mpi/*.c \
            "$ROOT"/reference/runner_mpi.c "$ROOT"/reference/safetensors.c $LIBS -ljansson $mpi_l \
            -o "$B/bin/ctxpar" ||
            { echo "ctxpar: the from-source build failed (see above)"; tool_failed=1; }
    fi

    # GoogleTest: given (GTEST_ROOT), else compiled from the sources stage.sh carried, else the
    # system's (installed, or its sources): gtest-all.cc and gtest_main.cc, no CMake needed.
    local gt_inc="" gt_lib="" gt_src=""
    if [ -n "${GTEST_ROOT:-}" ]; then
        gt_inc="$GTEST_ROOT/include" gt_lib="$GTEST_ROOT/lib"
    elif [ -f "$STAGE/googletest/src/gtest-all.cc" ]; then
        gt_src="$STAGE/googletest"
    elif [ -f /usr/include/gtest/gtest.h ] && [ -f /usr/lib/x86_64-linux-gnu/libgtest.a ]; then
        gt_inc=/usr/include gt_lib=/usr/lib/x86_64-linux-gnu
    elif [ -f /usr/src/googletest/googletest/src/gtest-all.cc ]; then
        gt_src=/usr/src/googletest/googletest
    fi
    if [ -n "$gt_src" ]; then
        echo "GoogleTest: compiling $gt_src"
        g++ -std=c++17 -O2 -isystem "$gt_src/include" -I"$gt_src" -c "$gt_src/src/gtest-all.cc" \
            -o "$B/gtest/gtest-all.o" &&
            g++ -std=c++17 -O2 -isystem "$gt_src/include" -I"$gt_src" \
                -c "$gt_src/src/gtest_main.cc" -o "$B/gtest/gtest_main.o" &&
            ar rcs "$B/gtest/libgtest.a" "$B/gtest/gtest-all.o" &&
            ar rcs "$B/gtest/libgtest_main.a" "$B/gtest/gtest_main.o" || return 1
        gt_inc="$gt_src/include" gt_lib="$B/gtest"
    fi
    if [ -z "$gt_lib" ]; then
        echo "GoogleTest not found (run stage.sh, or set GTEST_ROOT): no tests built"
        return 1
    fi
    local gt_flag="-isystem $gt_inc"
    [ "$gt_inc" = /usr/include ] && gt_flag="" # already searched; -isystem would reorder it
    for t in testing/cuda_ops_test testing/device_conformance_test testing/gpu/nccl_comm_test \
        testing/gpu/comm_conformance_nccl_test testing/gpu/e2e_cuda_test; do
        local more="" # the conformance suites' cases are in files of their own
        [ "$t" = testing/device_conformance_test ] &&
            more="$ROOT/testing/device_conformance.cc $ROOT/testing/nonfinite_oracle.cc"
        [ "$t" = testing/gpu/comm_conformance_nccl_test ] && more="$ROOT/testing/comm_conformance.cc"
        g++ -std=c++17 -O2 -fopenmp $inc $gt_flag "$ROOT/$t.cc" $more $LIBS -L"$gt_lib" \
            -lgtest_main -lgtest -o "$B/bin/$(basename $t)" || return 1
    done
    return $tool_failed
}

section "binaries"
need_build=0
for b in "${ALL_BINS[@]}"; do
    if [ "${CTXPAR_GPU_FROM_SOURCE:-0}" = 1 ]; then
        need_build=1 # asked for: the from-source path, staged binaries or not
    elif loads "$STAGE/bin/$b"; then
        BIN[$b]="$STAGE/bin/$b"
    else
        need_build=1
    fi
done
if [ $need_build = 0 ]; then
    say "using the staged binaries of gpu_stage/bin (commit $(cat "$STAGE/COMMIT" 2>/dev/null))"
else
    say "staged binaries missing or not loadable here: building from source (build.log)"
    if build_from_source > "$RESULTS_DIR/build.log" 2>&1; then
        grep -E "^(building|GoogleTest|ctxpar)" "$RESULTS_DIR/build.log" | tee -a "$RESULTS"
    else
        fail "the from-source build (see build.log):"
        tail -20 "$RESULTS_DIR/build.log" | tee -a "$RESULTS"
    fi
    for b in "${ALL_BINS[@]}"; do
        if [ -z "${BIN[$b]:-}" ] && loads "$RESULTS_DIR/build/bin/$b"; then
            BIN[$b]="$RESULTS_DIR/build/bin/$b"
        fi
    done
fi
for b in "${ALL_BINS[@]}"; do
    say "$b: ${BIN[$b]:-NOT AVAILABLE}"
done

# The tool must run before its GPU steps are worth anything: a small CPU check, GPU or not.
if [ -n "${BIN[ctxpar]:-}" ]; then
    if out=$(timeout 60 "${BIN[ctxpar]}" check --ranks 2 --seq 256 2>&1); then
        say "ctxpar check --ranks 2 --seq 256 (CPU): $(echo "$out" | tail -1)"
    else
        fail "ctxpar check --ranks 2 --seq 256 (CPU): $(echo "$out" | tail -3)"
    fi
fi

# ---------------------------------------------------------------- tests
# Runs one gtest binary (with a filter) under its own timeout; adds its counts to the totals.
declare -A COUNT=([passed]=0 [failed]=0 [skipped]=0)
run_gtest() { # NAME LOG [FILTER]
    local name=$1 log=$2 filter=${3:-*} out rc p f s
    out=$(mktemp)
    timeout "$TEST_TIMEOUT" "${BIN[$name]}" --gtest_filter="$filter" > "$out" 2>&1
    rc=$?
    cat "$out" >> "$log"
    p=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' "$out" | tail -1)
    f=$(sed -n 's/^\[  FAILED  \] \([0-9]*\) test.*/\1/p' "$out" | tail -1)
    s=$(sed -n 's/^\[  SKIPPED \] \([0-9]*\) test.*/\1/p' "$out" | tail -1)
    p=${p:-0} f=${f:-0} s=${s:-0} # gtest's PASSED count leaves the skipped ones out
    COUNT[passed]=$((COUNT[passed] + p)) COUNT[failed]=$((COUNT[failed] + f))
    COUNT[skipped]=$((COUNT[skipped] + s))
    local what="$p passed, $f failed, $s skipped"
    if [ $rc = 124 ]; then what="$what; TIMED OUT after ${TEST_TIMEOUT}s"; fi
    if [ $rc != 0 ] && [ $f = 0 ] && [ $rc != 124 ]; then what="$what; exit $rc"; fi
    say "  $filter: $what"
    grep -E "^\[  FAILED  \] [A-Za-z]" "$out" | sort -u | head -20 | sed 's/^/    /' |
        tee -a "$RESULTS"
    if [ $s -gt 0 ]; then
        grep -h -o "skipped: [^)]*)\?" "$out" | sort -u | head -3 | sed 's/^/    /' |
            tee -a "$RESULTS"
    fi
    rm -f "$out"
    [ $rc = 0 ] || FAILED=1
}

section "tests (each binary or suite under ${TEST_TIMEOUT}s)"
for t in "${TESTS[@]}"; do
    log="$RESULTS_DIR/$t.log"
    : > "$log"
    if [ -z "${BIN[$t]:-}" ]; then fail "$t: not built"; continue; fi
    say "$t:"
    if [ "$t" = device_conformance_test ]; then
        # The CUDA factories' cases only (the CPU tables run in CI), suite by suite: "FwdOracle",
        # "NonFiniteBwd", ... from the test list, so that a new suite is never left out.
        suites=$("${BIN[$t]}" --gtest_list_tests 2>>"$log" | sed -n 's#^Devices/\(.*\)\.$#\1#p')
        [ -n "$suites" ] || fail "$t: lists no test suite (see $t.log)"
        for suite in $suites; do
            run_gtest "$t" "$log" "Devices/$suite.*/cuda*"
        done
    elif [ "$t" = cuda_ops_test ]; then
        # Suite by suite: "Construct.", "All/FwdOracle.", ... from the test list.
        suites=$("${BIN[$t]}" --gtest_list_tests 2>>"$log" | grep -v '^ ' | grep '\.$')
        [ -n "$suites" ] || fail "$t: lists no test suite (see $t.log)"
        for suite in $suites; do
            run_gtest "$t" "$log" "${suite}*"
        done
    else
        run_gtest "$t" "$log"
    fi
done
say "tests: ${COUNT[passed]} passed, ${COUNT[failed]} failed, ${COUNT[skipped]} skipped" \
    "(skipped tests are not passes)"

# ---------------------------------------------------------------- compute-sanitizer
# Small shapes only: every kernel (SIMT and tensor-core forward, backward, merge, cuDNN) once.
# "binary|filter": the block ops' cases are in the conformance suite (its CUDA factory).
SAN_RUNS=("device_conformance_test|Devices/HeadDim.*/cuda_*_d64:Devices/HeadDim.*/cuda_f32_d40:\
Devices/DeviceTest.Merge*/cuda:Devices/DeviceTest.FwdEmptyKeyBlock/cuda:\
Devices/DeviceTest.FwdFullyMaskedRows/cuda"
          "cuda_ops_test|Gpu.MergeOfTwoEmptyRowsZeroesLikeTheCpu:Shapes/Cudnn.*")
section "compute-sanitizer (memcheck, racecheck), small shapes"
SAN="$(command -v compute-sanitizer || echo "$CUDA_HOME/bin/compute-sanitizer")"
if [ $HAVE_GPU = 0 ]; then
    say "skipped: no CUDA device"
elif [ ! -x "$SAN" ] || [ -z "${BIN[cuda_ops_test]:-}" ] ||
    [ -z "${BIN[device_conformance_test]:-}" ]; then
    fail "compute-sanitizer, cuda_ops_test or device_conformance_test missing"
else
    for tool in memcheck racecheck; do
        for run in "${SAN_RUNS[@]}"; do
            bin=${run%%|*}
            log="$RESULTS_DIR/sanitizer_${tool}_$bin.log"
            timeout 150 "$SAN" --tool "$tool" --error-exitcode 99 "${BIN[$bin]}" \
                --gtest_filter="${run#*|}" > "$log" 2>&1
            rc=$?
            say "$tool $bin: exit $rc $(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$log" |
                tail -1) $(grep -E '^\[  (PASSED|FAILED) ' "$log" | tr '\n' ' ')"
            [ $rc = 0 ] || fail "compute-sanitizer $tool $bin ($(basename "$log"))"
        done
    done
fi

# ---------------------------------------------------------------- benchmarks
section "bench: block forward on one GPU, native kernels and cuDNN (cuda_bench)"
if [ $HAVE_GPU = 0 ]; then
    say "skipped: no CUDA device"
elif [ -z "${BIN[cuda_bench]:-}" ]; then
    fail "cuda_bench not built"
else
    timeout "$TEST_TIMEOUT" "${BIN[cuda_bench]}" > "$RESULTS_DIR/cuda_bench.log" 2>&1 ||
        say "cuda_bench: exit $?"
    grep -v '^{' "$RESULTS_DIR/cuda_bench.log" | tee -a "$RESULTS"
fi

section "bench: ctxpar bench --backend cuda, P = 1, 2, 4 on one GPU (in-process comm)"
if [ $HAVE_GPU = 0 ]; then
    say "skipped: no CUDA device"
elif [ -z "${BIN[ctxpar]:-}" ]; then
    say "skipped: the ctxpar tool is not available here (see binaries)"
else
    for algo in ring allgather; do for mask in none causal; do
        if over_budget; then say "skipped: time budget (${BUDGET}s) used: $algo $mask"; continue; fi
        say "-- $algo, mask $mask (forward and forward + backward)"
        timeout "$TEST_TIMEOUT" "${BIN[ctxpar]}" bench --backend cuda --comm local --sweep \
            --ranks 1,2,4 --seq 8192 --batch 2 --heads 16 --dim 128 --dtype bf16 \
            --mask "$mask" --algo "$algo" --layout zigzag --backward --warmup 2 --repeat 5 \
            > "$RESULTS_DIR/ctxpar_bench_${algo}_$mask.log" 2>&1 || say "exit $?"
        tee -a "$RESULTS" < "$RESULTS_DIR/ctxpar_bench_${algo}_$mask.log"
    done; done
fi

section "bench: PyTorch scaled_dot_product_attention, same shapes, same run"
if [ $HAVE_GPU = 0 ]; then
    say "skipped: no CUDA device"
elif ! "$PY" -c 'import torch' 2>/dev/null; then
    say "skipped: PyTorch is not importable by $PY"
elif over_budget; then
    say "skipped: time budget (${BUDGET}s) used"
else
    timeout "$TEST_TIMEOUT" "$PY" "$ROOT/testing/gpu/torch_train_sdpa.py" \
        > "$RESULTS_DIR/torch_train_sdpa.log" 2>&1 || say "torch_train_sdpa: exit $?"
    grep -v '^{' "$RESULTS_DIR/torch_train_sdpa.log" | tee -a "$RESULTS"
    if ! over_budget; then
        timeout "$TEST_TIMEOUT" "$PY" "$ROOT/testing/bench/torch_sdpa.py" \
            > "$RESULTS_DIR/torch_sdpa.log" 2>&1 || say "torch_sdpa: exit $?"
        grep -v '^{' "$RESULTS_DIR/torch_sdpa.log" | tee -a "$RESULTS"
    fi
fi

section "done"
say "results: $RESULTS ($( [ $FAILED = 0 ] && echo "nothing failed" || echo "FAILURES above"))"
exit $FAILED
