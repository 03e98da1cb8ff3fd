#!/usr/bin/env bash
# The one script for a GPU machine lent for 15 minutes (one H100 or H200, 10 minutes a command):
# the staged binaries (testing/gpu/stage.sh, run here before the tree travels), nothing built,
# the issue-36 steps in order, each under its own timeout, all ending within CTXPAR_GPU_BUDGET
# (420 s) so that the command ends under 8 minutes. Results go under OUT as they come (a run cut
# off keeps what it had): OUT/results.txt, one log per step, cuDNN's own log per step.
#
#   testing/gpu/first_run.sh OUT
#
# Staged binaries that do not load: with a GPU, the from-source build of run.sh (lib.sh), under
# the budget, since a run without binaries says nothing; without a GPU, nothing is built.
# Without a GPU it ends in seconds, every GPU step counted as skipped.
# Exit status: 0 when nothing failed (skips are not failures), 1 otherwise.
set -uo pipefail
if [ $# -ne 1 ]; then
    echo "usage: testing/gpu/first_run.sh OUT" >&2
    exit 2
fi
source "$(dirname "$0")/lib.sh"
gpu_init "$1" "${CTXPAR_GPU_BUDGET:-420}"
TEST_TIMEOUT="${CTXPAR_GPU_TEST_TIMEOUT:-90}"
gpu_environment
# cuDNN's own log (errors and warnings; 3 adds every call), one file per step: a refused graph
# says why there.
export CUDNN_LOGLEVEL_DBG="${CUDNN_LOGLEVEL_DBG:-2}"
cudnn_log() { export CUDNN_LOGDEST_DBG="$RESULTS_DIR/cudnn_$1.log"; }
say "cuDNN log: level $CUDNN_LOGLEVEL_DBG, to $RESULTS_DIR/cudnn_<step>.log"

section "stage (gpu_stage/, from testing/gpu/stage.sh)"
if ! gpu_check_stage; then
    if [ $HAVE_GPU = 1 ]; then fail "the stage is not usable as it is (above)"; fi
fi
if [ $HAVE_GPU = 1 ]; then gpu_binaries build; else gpu_binaries staged; fi

section "1. cuda_ops_test"
cudnn_log cuda_ops_test
gpu_test cuda_ops_test

section "2. device_conformance_test, the CUDA factories' cases"
cudnn_log device_conformance_test
gpu_test device_conformance_test

section "3. e2e_cuda_test"
cudnn_log e2e_cuda_test
gpu_test e2e_cuda_test
gpu_test_totals

section "4. ctxpar check --backend cuda: P = 4, 4k tokens, 8 heads, dim 128, BF16, causal, ring, zigzag, backward, against fp64"
cudnn_log ctxpar_check
if [ $HAVE_GPU = 0 ]; then
    skip "ctxpar check --backend cuda: no CUDA device"
elif [ -z "${BIN[ctxpar]:-}" ]; then
    fail "ctxpar check: the tool is not available"
elif ! time_for 30; then
    skip "time budget used: ctxpar check"
else
    timeout -k 5 "$(limit 120)" "${BIN[ctxpar]}" check --backend cuda --comm local --ranks 4 \
        --seq 4096 --batch 1 --heads 8 --dim 128 --dtype bf16 --mask causal --algo ring \
        --layout zigzag --backward > "$RESULTS_DIR/ctxpar_check.log" 2>&1 ||
        fail "ctxpar check --backend cuda: exit $?"
    tee -a "$RESULTS" < "$RESULTS_DIR/ctxpar_check.log"
fi

section "5. native kernels (cuDNN off) and cuDNN (cuda_bench), PyTorch SDPA, BF16, same shapes"
cudnn_log cuda_bench
gpu_cuda_bench
cudnn_log torch
gpu_torch_sdpa

section "6. ctxpar bench --backend cuda --sweep --ranks 1,2,4: ring and all-gather, fwd and fwd + bwd"
cudnn_log ctxpar_bench
gpu_ctxpar_bench

section "7. if time is left: NCCL at P = 1, compute-sanitizer on small shapes outside cuDNN"
cudnn_log nccl
for t in nccl_comm_test comm_conformance_nccl_test; do
    if time_for 30; then gpu_test "$t"; else skip "time budget used: $t"; fi
done
cudnn_log sanitizer
gpu_sanitizers "*Cudnn*"
gpu_test_totals

for f in "$RESULTS_DIR"/cudnn_*.log; do
    [ -s "$f" ] && say "cuDNN log $(basename "$f"): $(wc -l < "$f") lines"
done
gpu_done
say "skips (tests and steps) are counted above, never as passes"
exit $FAILED
