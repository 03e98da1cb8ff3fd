# Pieces shared by the GPU machine's scripts (run.sh: everything; first_run.sh: the first, timed
# run). Sourced, not run:  source testing/gpu/lib.sh; gpu_init RESULTS_DIR [BUDGET_S]
#
# gpu_init         results folder, summary (results.txt), the clock; BUDGET_S makes every step's
#                  timeout end by then (first_run.sh), else steps keep their own (run.sh)
# gpu_environment  the GPU, nvcc, Python, cuDNN and NCCL (wheels first); LD_LIBRARY_PATH
# gpu_binaries     BIN[name]: the staged binaries where they load, else a from-source build
# gpu_test NAME    one gtest binary, suite by suite, each under its own timeout; COUNT[...]
# gpu_sanitizers, gpu_cuda_bench, gpu_ctxpar_bench, gpu_torch_sdpa: the later steps
# Without a GPU every GPU step says "skipped: no CUDA device" (counted, never a pass).

GPU_LIB_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$GPU_LIB_DIR/../.." && pwd)"
STAGE="$ROOT/gpu_stage"
PY="${PYTHON:-python3}"
TEST_TIMEOUT="${CTXPAR_GPU_TEST_TIMEOUT:-120}"
# Built outside the results: what is under the results folder is sent back (~28 MB of objects).
BUILD_DIR="${CTXPAR_GPU_BUILD_DIR:-$ROOT/out/gpu-build}"
TESTS=(cuda_ops_test device_conformance_test nccl_comm_test comm_conformance_nccl_test e2e_cuda_test)
ALL_BINS=("${TESTS[@]}" cuda_bench ctxpar)
declare -A BIN
declare -A COUNT=([passed]=0 [failed]=0 [skipped]=0)
STEPS_SKIPPED=0 # steps that did not run (no GPU, no time), apart from the tests' own skips
FAILED=0

gpu_init() { # RESULTS_DIR [BUDGET_S]
    RESULTS_DIR="$1"
    mkdir -p "$RESULTS_DIR"
    RESULTS_DIR="$(cd "$RESULTS_DIR" && pwd)"
    RESULTS="$RESULTS_DIR/results.txt"
    : > "$RESULTS"
    START=$(date +%s)
    DEADLINE=""
    [ -n "${2:-}" ] && DEADLINE=$((START + $2))
}

say() { echo "$*" | tee -a "$RESULTS"; }
section() { say ""; say "== $* (t=$(($(date +%s) - START))s)"; }
fail() { say "FAILED: $*"; FAILED=1; }
skip() { say "skipped: $*"; STEPS_SKIPPED=$((STEPS_SKIPPED + 1)); }

# The seconds a step may take: CAP, or less where the budget ends sooner.
limit() {
    local cap=$1 left
    [ -z "$DEADLINE" ] && { echo "$cap"; return; }
    left=$((DEADLINE - $(date +%s)))
    [ "$left" -lt "$cap" ] && cap=$left
    echo $((cap > 0 ? cap : 0))
}
# True when at least N seconds of the budget are left (always without a budget).
time_for() { [ "$(limit "$1")" -ge "$1" ]; }

# ---------------------------------------------------------------- environment
gpu_environment() {
    NVCC="${NVCC:-$(command -v nvcc || true)}"
    if [ -z "$NVCC" ] && [ -x /usr/local/cuda/bin/nvcc ]; then NVCC=/usr/local/cuda/bin/nvcc; fi
    if [ -z "${CUDA_HOME:-}" ]; then
        CUDA_HOME=/usr/local/cuda
        [ -n "$NVCC" ] && CUDA_HOME="$(dirname "$(dirname "$(readlink -f "$NVCC")")")"
    fi
    HAVE_GPU=0
    if nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then HAVE_GPU=1; fi
    # The tests' skip-or-fail rule (gpu_rule.h) then fails what cannot run, whatever they probe.
    [ $HAVE_GPU = 1 ] && export CTXPAR_GPU_EXPECTED=1

    section "environment"
    say "commit: $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || cat "$STAGE/COMMIT" 2>/dev/null)"
    if [ $HAVE_GPU = 1 ]; then
        say "gpu: $(nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total \
            --format=csv,noheader 2>&1 | head -4)"
    else
        say "gpu: NONE FOUND (nvidia-smi lists no GPU): GPU steps are skipped and counted as skips"
    fi
    say "nvcc: $("$NVCC" --version 2>/dev/null | grep release || echo missing) (CUDA_HOME $CUDA_HOME)"
    say "python: $(command -v "$PY") $("$PY" -c 'import torch; print("torch", torch.__version__)' \
        2>&1 | tail -1)"
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
    # The stage's own libraries (the ctxpar tool's OpenMPI) last: the machine's come first. No
    # empty element (an empty one means the current directory), no repeats.
    local p="" d
    for d in "$CUDNN_LIB" "$NCCL_LIB" "$CUDA_HOME/lib64" ${LD_LIBRARY_PATH:+${LD_LIBRARY_PATH//:/ }} \
        "$STAGE/lib"; do
        [ -n "$d" ] && case ":$p:" in *":$d:"*) ;; *) p="${p:+$p:}$d" ;; esac
    done
    export LD_LIBRARY_PATH="$p"
    say "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
}

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

# ---------------------------------------------------------------- binaries
# A binary loads when every library it needs resolves here (ldd names a missing one, or a glibc
# too old, as "not found").
loads() { [ -x "$1" ] && ! ldd "$1" 2>&1 | grep -q "not found"; }

# The staged tree as it travelled: its size, and each binary's unresolved libraries. Returns 1
# when something is missing or does not load.
gpu_check_stage() {
    local total b head bad=0
    if [ ! -d "$STAGE/bin" ]; then
        say "stage: no gpu_stage/bin (testing/gpu/stage.sh was not run before the tree travelled)"
        return 1
    fi
    total=$(du -sb "$STAGE" | cut -f1)
    say "stage: $((total / 1024 / 1024)) MiB, commit $(cat "$STAGE/COMMIT" 2>/dev/null)"
    head=$(git -C "$ROOT" rev-parse HEAD 2>/dev/null)
    if [ -n "$head" ] && [ "$(cat "$STAGE/COMMIT" 2>/dev/null)" != "$head" ]; then
        say "stage: NOT built from this tree's commit $head: its binaries may be stale"
    fi
    if [ "$total" -gt $((60 * 1024 * 1024)) ]; then
        say "stage: over 60 MiB"
        bad=1
    fi
    for b in "${ALL_BINS[@]}"; do
        if [ ! -x "$STAGE/bin/$b" ]; then
            say "stage: $b missing"
            bad=1
        elif ! loads "$STAGE/bin/$b"; then
            say "stage: $b does not load: $(ldd "$STAGE/bin/$b" 2>&1 | grep 'not found' |
                tr -s ' \t' ' ' | tr '\n' ';')"
            bad=1
        fi
    done
    return $bad
}

build_from_source() {
    local B="$BUILD_DIR" jobs cc_arch tool_failed=0
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
            # The binned sums' bits are the SDK's only without contracted multiply-adds (as
            # backends/cuda/BUILD builds bins.cu).
            case "$f" in */bins.cu) printf ' --fmad=false' ;; esac
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
        # Every one takes the skip-or-fail rule; the conformance suites' cases are in files of
        # their own.
        local more="$ROOT/testing/gpu/gpu_rule.cc"
        [ "$t" = testing/device_conformance_test ] &&
            more="$more $ROOT/testing/device_conformance.cc $ROOT/testing/nonfinite_oracle.cc"
        [ "$t" = testing/gpu/comm_conformance_nccl_test ] &&
            more="$more $ROOT/testing/comm_conformance.cc"
        g++ -std=c++17 -O2 -fopenmp $inc $gt_flag "$ROOT/$t.cc" $more $LIBS -L"$gt_lib" \
            -lgtest_main -lgtest -o "$B/bin/$(basename $t)" || return 1
    done
    return $tool_failed
}

# gpu_binaries MODE: BIN[name] for each binary. MODE "build" builds from source what the stage
# lacks (or everything, with CTXPAR_GPU_FROM_SOURCE=1); "staged" takes only staged binaries.
gpu_binaries() {
    local mode=$1 b need_build=0
    section "binaries"
    for b in "${ALL_BINS[@]}"; do
        if [ "${CTXPAR_GPU_FROM_SOURCE:-0}" = 1 ] && [ "$mode" = build ]; then
            need_build=1 # asked for: the from-source path, staged binaries or not
        elif loads "$STAGE/bin/$b"; then
            BIN[$b]="$STAGE/bin/$b"
        else
            need_build=1
        fi
    done
    if [ $need_build = 0 ]; then
        say "using the staged binaries of gpu_stage/bin (commit $(cat "$STAGE/COMMIT" 2>/dev/null))"
    elif [ "$mode" = build ]; then
        say "staged binaries missing or not loadable here: building from source (build.log)"
        if timeout "$(limit 600)" bash -c "$(declare -f build_from_source); $(declare -p \
            ROOT STAGE BUILD_DIR NVCC CUDA_HOME CUDNN_INC CUDNN_LIB NCCL_INC NCCL_LIB); \
            build_from_source" > "$RESULTS_DIR/build.log" 2>&1; then
            grep -E "^(building|GoogleTest|ctxpar)" "$RESULTS_DIR/build.log" | tee -a "$RESULTS"
        else
            fail "the from-source build (see build.log):"
            tail -20 "$RESULTS_DIR/build.log" | tee -a "$RESULTS"
        fi
        for b in "${ALL_BINS[@]}"; do
            if [ -z "${BIN[$b]:-}" ] && loads "$BUILD_DIR/bin/$b"; then
                BIN[$b]="$BUILD_DIR/bin/$b"
            fi
        done
    fi
    for b in "${ALL_BINS[@]}"; do
        say "$b: ${BIN[$b]:-NOT AVAILABLE}"
    done
}

# ---------------------------------------------------------------- tests
# Runs one gtest binary (with a filter) under its own timeout; adds its counts to the totals.
run_gtest() { # NAME LOG [FILTER]
    local name=$1 log=$2 filter=${3:-*} out rc p f s t
    t=$(limit "$TEST_TIMEOUT")
    if [ "$t" -lt 5 ]; then
        skip "time budget used: $name $filter"
        return
    fi
    out=$(mktemp)
    timeout -k 5 "$t" "${BIN[$name]}" --gtest_filter="$filter" > "$out" 2>&1
    rc=$?
    cat "$out" >> "$log"
    p=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' "$out" | tail -1)
    f=$(sed -n 's/^\[  FAILED  \] \([0-9]*\) test.*/\1/p' "$out" | tail -1)
    s=$(sed -n 's/^\[  SKIPPED \] \([0-9]*\) test.*/\1/p' "$out" | tail -1)
    p=${p:-0} f=${f:-0} s=${s:-0} # gtest's PASSED count leaves the skipped ones out
    COUNT[passed]=$((COUNT[passed] + p)) COUNT[failed]=$((COUNT[failed] + f))
    COUNT[skipped]=$((COUNT[skipped] + s))
    local what="$p passed, $f failed, $s skipped"
    if [ $rc = 124 ] || [ $rc = 137 ]; then what="$what; TIMED OUT after ${t}s"; fi
    if [ $rc != 0 ] && [ $f = 0 ] && [ $rc != 124 ] && [ $rc != 137 ]; then what="$what; exit $rc"; fi
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

# gpu_test NAME [SUITE_FILTER]: one binary; the two big ones suite by suite (a sticky CUDA error
# fails its own suite, named, not every later one).
gpu_test() {
    local t=$1 log="$RESULTS_DIR/$1.log" suites suite
    : > "$log"
    if [ -z "${BIN[$t]:-}" ]; then
        if [ $HAVE_GPU = 1 ]; then fail "$t: not available"; else skip "$t: not available, no GPU"; fi
        return
    fi
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
}

gpu_test_totals() {
    say "tests: ${COUNT[passed]} passed, ${COUNT[failed]} failed, ${COUNT[skipped]} skipped" \
        "(skipped tests are not passes); steps skipped: $STEPS_SKIPPED"
}

# ---------------------------------------------------------------- compute-sanitizer
# Small shapes only: every kernel (SIMT and tensor-core forward, backward, merge, cuDNN) once.
# "binary|filter": the block ops' cases are in the conformance suite (its CUDA factory).
SAN_RUNS=("device_conformance_test|Devices/HeadDim.*/cuda_*_d64:Devices/HeadDim.*/cuda_f32_d40:\
Devices/DeviceTest.Merge*/cuda:Devices/DeviceTest.FwdEmptyKeyBlock/cuda:\
Devices/DeviceTest.FwdFullyMaskedRows/cuda"
          "cuda_ops_test|Gpu.MergeOfTwoEmptyRowsZeroesLikeTheCpu:Shapes/Cudnn.*")

# gpu_sanitizers [EXCLUDE]: memcheck and racecheck on SAN_RUNS, each under its own timeout;
# EXCLUDE is a gtest negative filter appended to each (first_run.sh keeps cuDNN out).
gpu_sanitizers() {
    local san tool run bin log rc t filter
    san="$(command -v compute-sanitizer || echo "$CUDA_HOME/bin/compute-sanitizer")"
    if [ $HAVE_GPU = 0 ]; then
        skip "compute-sanitizer: no CUDA device"
        return
    elif [ ! -x "$san" ]; then
        fail "compute-sanitizer not found (PATH, $CUDA_HOME/bin)"
        return
    elif [ -z "${BIN[cuda_ops_test]:-}" ] || [ -z "${BIN[device_conformance_test]:-}" ]; then
        fail "compute-sanitizer: cuda_ops_test or device_conformance_test not available"
        return
    fi
    for tool in memcheck racecheck; do
        for run in "${SAN_RUNS[@]}"; do
            bin=${run%%|*} filter=${run#*|}
            [ -n "${1:-}" ] && filter="$filter-$1"
            t=$(limit 150)
            if [ "$t" -lt 20 ]; then skip "time budget used: $tool $bin"; continue; fi
            log="$RESULTS_DIR/sanitizer_${tool}_$bin.log"
            timeout -k 5 "$t" "$san" --tool "$tool" --error-exitcode 99 "${BIN[$bin]}" \
                --gtest_filter="$filter" > "$log" 2>&1
            rc=$?
            say "$tool $bin: exit $rc $(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$log" |
                tail -1) $(grep -E '^\[  (PASSED|FAILED) ' "$log" | tr '\n' ' ')"
            [ $rc = 0 ] || fail "compute-sanitizer $tool $bin ($(basename "$log"))"
        done
    done
}

# ---------------------------------------------------------------- benchmarks
# cuda_bench: the block forward, native kernels and cuDNN. With a GPU, a path that cannot create
# its device is a failure (cuda_bench itself says "unavailable" and goes on).
gpu_cuda_bench() {
    local t
    if [ $HAVE_GPU = 0 ]; then skip "cuda_bench: no CUDA device"; return; fi
    if [ -z "${BIN[cuda_bench]:-}" ]; then fail "cuda_bench not available"; return; fi
    t=$(limit "$TEST_TIMEOUT")
    if [ "$t" -lt 10 ]; then skip "time budget used: cuda_bench"; return; fi
    timeout -k 5 "$t" "${BIN[cuda_bench]}" "$@" > "$RESULTS_DIR/cuda_bench.log" 2>&1 ||
        fail "cuda_bench: exit $?"
    grep -v '^{' "$RESULTS_DIR/cuda_bench.log" | tee -a "$RESULTS"
    if grep -q "unavailable\|failed" "$RESULTS_DIR/cuda_bench.log"; then
        fail "cuda_bench: a path could not run (above)"
    fi
}

# `ctxpar bench --backend cuda`, ring and all-gather, P = 1, 2, 4 on one GPU (in-process comm).
gpu_ctxpar_bench() {
    local algo mask t log
    if [ $HAVE_GPU = 0 ]; then skip "ctxpar bench: no CUDA device"; return; fi
    if [ -z "${BIN[ctxpar]:-}" ]; then fail "ctxpar bench: the tool is not available"; return; fi
    for algo in ring allgather; do for mask in none causal; do
        t=$(limit "$TEST_TIMEOUT")
        if [ "$t" -lt 20 ]; then skip "time budget used: ctxpar bench $algo $mask"; continue; fi
        say "-- $algo, mask $mask (forward and forward + backward)"
        log="$RESULTS_DIR/ctxpar_bench_${algo}_$mask.log"
        timeout -k 5 "$t" "${BIN[ctxpar]}" bench --backend cuda --comm local --sweep \
            --ranks 1,2,4 --seq 8192 --batch 2 --heads 16 --dim 128 --dtype bf16 \
            --mask "$mask" --algo "$algo" --layout zigzag --backward --warmup 2 --repeat 5 \
            > "$log" 2>&1 || fail "ctxpar bench $algo $mask: exit $?"
        tee -a "$RESULTS" < "$log"
    done; done
}

# PyTorch's scaled_dot_product_attention on the same shapes, in the same run.
gpu_torch_sdpa() {
    local s t
    if [ $HAVE_GPU = 0 ]; then skip "PyTorch SDPA: no CUDA device"; return; fi
    if ! "$PY" -c 'import torch' 2>/dev/null; then
        skip "PyTorch SDPA: PyTorch is not importable by $PY"
        return
    fi
    for s in testing/gpu/torch_train_sdpa.py testing/bench/torch_sdpa.py; do
        t=$(limit "$TEST_TIMEOUT")
        if [ "$t" -lt 10 ]; then skip "time budget used: $s"; continue; fi
        timeout -k 5 "$t" "$PY" "$ROOT/$s" > "$RESULTS_DIR/$(basename "$s" .py).log" 2>&1 ||
            say "$(basename "$s"): exit $?"
        grep -v '^{' "$RESULTS_DIR/$(basename "$s" .py).log" | tee -a "$RESULTS"
    done
}

gpu_done() {
    section "done"
    [ $HAVE_GPU = 1 ] || say "NO GPU FOUND: nothing ran on a GPU; GPU steps and tests were skipped"
    say "results: $RESULTS ($([ $FAILED = 0 ] && echo "nothing failed" || echo "FAILURES above"))"
}
