#!/usr/bin/env bash
# The GPU checks in full, for the GPU machine as it is: the CUDA 13 toolkit, PyTorch,
# compute-sanitizer, cuDNN and NCCL only as Python wheels (nvidia-cudnn-cu13, nvidia-nccl-cu13),
# no GoogleTest, no Bazel, no network. For the first, timed run on a lent machine use
# first_run.sh (a fixed order under one budget); this one runs everything.
#
#   testing/gpu/run.sh [RESULTS_DIR]      (default: $OUT, else out/gpu-results)
#
# 1. Libraries: cuDNN and NCCL from the wheels of the first python3 on PATH (or $PYTHON), else
#    the toolkit's or the system's; LD_LIBRARY_PATH points at them (lib.sh).
# 2. Binaries: gpu_stage/bin from testing/gpu/stage.sh (carried with the tree) when each one
#    loads here, else (or with CTXPAR_GPU_FROM_SOURCE=1) built from the sources with nvcc and
#    gcc/g++ into out/gpu-build (CTXPAR_GPU_BUILD_DIR).
# 3. Tests, each binary or suite with its own timeout ($CTXPAR_GPU_TEST_TIMEOUT, 120 s).
#    Without a GPU they report "skipped: no CUDA device" (counted as skipped, never passed).
# 4. compute-sanitizer memcheck and racecheck on a reduced set of small shapes.
# 5. Benchmarks: cuda_bench (block forward, native and cuDNN), `ctxpar bench --backend cuda`
#    (ring and all-gather, P = 1, 2, 4 on one GPU), PyTorch's SDPA on the same shapes.
# With CTXPAR_GPU_BUDGET=S every step's timeout ends S seconds after the start.
# Everything goes to RESULTS_DIR/results.txt (the summary) and RESULTS_DIR/*.log (full output).
# Exit status: 0 when nothing failed (skips are not failures), 1 otherwise.
set -uo pipefail
source "$(dirname "$0")/lib.sh"
gpu_init "${1:-${OUT:-$ROOT/out/gpu-results}}" "${CTXPAR_GPU_BUDGET:-}"
gpu_environment
gpu_binaries build

# The tool must run before its GPU steps are worth anything: a small CPU check, GPU or not.
if [ -n "${BIN[ctxpar]:-}" ]; then
    if out=$(timeout 60 "${BIN[ctxpar]}" check --ranks 2 --seq 256 2>&1); then
        say "ctxpar check --ranks 2 --seq 256 (CPU): $(echo "$out" | tail -1)"
    else
        fail "ctxpar check --ranks 2 --seq 256 (CPU): $(echo "$out" | tail -3)"
    fi
fi

section "tests (each binary or suite under ${TEST_TIMEOUT}s)"
for t in "${TESTS[@]}"; do gpu_test "$t"; done
gpu_test_totals

section "compute-sanitizer (memcheck, racecheck), small shapes"
gpu_sanitizers

section "bench: block forward on one GPU, native kernels and cuDNN (cuda_bench)"
gpu_cuda_bench

section "bench: ctxpar bench --backend cuda, P = 1, 2, 4 on one GPU (in-process comm)"
gpu_ctxpar_bench

section "bench: PyTorch scaled_dot_product_attention, same shapes, same run"
gpu_torch_sdpa

gpu_done
exit $FAILED
