#!/usr/bin/env bash
# The core suites under valgrind memcheck: any invalid access, use of an uninitialised value or
# definite/indirect leak fails the run. "Possibly lost" blocks (libgomp's thread pool, threads
# still parked at exit) are not errors; testing/valgrind/ctxpar.supp holds the third-party noise
# that would be, each entry with a comment saying why it is not ours.
#
#   testing/valgrind/run_valgrind.sh            needs: valgrind (Debian package)
#
# The binaries are the normal (opt, -g1) Bazel build: already built after `bazel test //...`.
# One OpenMP thread per device and filtered suites keep the whole run near 2 minutes on 2 cores
# (valgrind runs one thread at a time, 20-50x slower than native). Logs in out/valgrind/.
set -uo pipefail
cd "$(dirname "$0")/../.."

if ! command -v valgrind >/dev/null; then
    echo "run_valgrind: valgrind not found (apt-get install valgrind)" >&2
    exit 1
fi

suites=(api_test npy_test fault_test comm_local_test comm_conformance_test cpu_ops_test
        device_conformance_test e2e_test nonfinite_test reference_test)
# The fast reference with plain loops for its matrix products: under valgrind OpenBLAS's
# kernels run about 100 times slower than plain code (reference/reference_gemm.c).
bopts=(--define=reference_blas=off)
bazel build "${bopts[@]}" "${suites[@]/#///testing:}" || exit 1
bin=$(bazel info "${bopts[@]}" bazel-bin)/testing
logs=out/valgrind
mkdir -p "$logs"

# Fast, representative subsets: every test of the small suites; for the parameterised ones a
# few cases per algorithm, layout, mask, dtype and rank count.
declare -A filter=([api_test]='*' [npy_test]='*' [fault_test]='*')
filter[comm_local_test]='LocalCommUsage.*:LocalCommDevice.*:*/P1:*/P2:*/P4'
f='Bwd.*:Cast.*:Errors.*:Memory.*:Cpu/KernelTables.*generic'
filter[cpu_ops_test]=$f
filter[comm_conformance_test]='*/local_1:*/local_2:*/local_4:*/fault_passthrough_3'
g='Devices/*/cpu_generic'
f="$g:Devices/HeadDim.*/cpu_generic_f32_d*:${g}_causal_zigzag_f32_gqa2:"
f+="${g}_docs_causal_overlap_bf16_gqa1:${g}_window_striped_f32_gqa4:"
f+="${g}_causal_window_zigzag_f16_gqa2:${g}_docs_striped_f16_gqa4:"
f+="Devices/NonFinite*/cpu_generic_nan_v_other_document_causal_*:" # one masked NaN each way
f+="Devices/HeadDim.*/cpu_avx2*_f32_d*" # the AVX2 kernels, forward and both backward schedules
filter[device_conformance_test]=$f
# e2e_test in two halves of about 25 s each, run side by side (below), on the generic kernels
# (kernels= below); together: every case of
# *ring_P2_zigzag_causal_f32*, *ring_P3_zigzag_causal_window_bf16*, *ring_P4_striped_docs_causal_f16*,
# *allgather_P2_zigzag_docs_causal_bf16*, *allgather_P3_contiguous_causal_window_f16*,
# *alltoall_P2_striped_none_f32*, *alltoall_P4_zigzag_causal_window_bf16*, EndToEndWindow.* and
# EndToEndAllToAll.*.
f2=EndToEndWindow.TwoSidedWindowComputesNeighboursOnly
filter[e2e_test]="$f2:*ring_P2_zigzag_causal_f32*:*ring_P4_striped_docs_causal_f16*"
filter[e2e_test_2]='EndToEndWindow.*:EndToEndAllToAll.*:*ring_P3_zigzag_causal_window_bf16*:'
filter[e2e_test_2]+='*allgather_P2_zigzag_docs_causal_bf16*:*allgather_P3_contiguous_causal_window_f16*:'
filter[e2e_test_2]+="*alltoall_P2_striped_none_f32*:*alltoall_P4_zigzag_causal_window_bf16*-$f2"
filter[nonfinite_test]='*_ring_P2:*_allgather_P4'
filter[reference_test]='Reference.Causal:Reference.NonFinite*:Reference.Bad*'

export OMP_NUM_THREADS=1
vg=(valgrind -q --error-exitcode=1 --leak-check=full --errors-for-leak-kinds=definite,indirect
    --show-leak-kinds=definite,indirect --num-callers=30
    --suppressions=testing/valgrind/ctxpar.supp)
# Valgrind runs a program's threads one at a time: the suites run side by side, one per core,
# the longest first.
jobs=(device_conformance_test e2e_test e2e_test_2 reference_test fault_test cpu_ops_test
      nonfinite_test comm_local_test comm_conformance_test api_test npy_test)
width=${CTXPAR_VALGRIND_JOBS:-$(getconf _NPROCESSORS_ONLN)} # not nproc: it obeys OMP_NUM_THREADS
# The end-to-end suites check the algorithms and the comm: they run on the generic kernels, since
# valgrind emulates each lane of an FMA instruction with a helper call (a ring case: 24 s on the
# AVX2 kernels, 4.4 s on the generic ones); device_conformance_test checks the AVX2 kernels.
declare -A kernels=([e2e_test]=generic [e2e_test_2]=generic)
run_one() { # label: the suite, or SUITE_2 for its second part
    local s=${1%_2} t0=$SECONDS
    if CTXPAR_CPU_KERNELS="${kernels[$1]:-}" "${vg[@]}" "$bin/$s" --gtest_filter="${filter[$1]}" \
        >"$logs/$1.log" 2>&1; then
        n=$(grep -o '^\[  PASSED  \] [0-9]* test' "$logs/$1.log" | grep -o '[0-9]*')
        echo "valgrind $1: OK, ${n:-0} tests, $((SECONDS - t0)) s"
    else
        tail -n 80 "$logs/$1.log"
        echo "valgrind $1: FAILED ($((SECONDS - t0)) s, log $logs/$1.log)"
        return 1
    fi
}
status=0
start=$SECONDS
running=0
for j in "${jobs[@]}"; do
    if [ "$running" -ge "$width" ]; then
        wait -n || status=1
        running=$((running - 1))
    fi
    run_one "$j" &
    running=$((running + 1))
done
while [ "$running" -gt 0 ]; do
    wait -n || status=1
    running=$((running - 1))
done
echo "valgrind: $([ $status -eq 0 ] && echo all clean || echo FAILED) in $((SECONDS - start)) s"
exit "$status"
