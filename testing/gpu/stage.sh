#!/usr/bin/env bash
# Builds the GPU test and bench binaries with Bazel on the development machine (no GPU needed)
# and copies them to out/gpu/bin, for testing/gpu/run.sh on a GPU machine without Bazel.
# The binaries link the project statically; they need the same CUDA 13 runtime, cuDNN 9 and
# NCCL 2 shared libraries there (run.sh points LD_LIBRARY_PATH at nvcc's lib64).
#
#   testing/gpu/stage.sh            then carry out/gpu to the GPU machine with the tree
set -euo pipefail
cd "$(dirname "$0")/../.."

targets=(//testing:cuda_ops_test //testing/gpu:nccl_comm_test //testing/gpu:e2e_cuda_test
         //testing/gpu:cuda_bench)
bazel build "${targets[@]}"
mkdir -p out/gpu/bin
for t in "${targets[@]}"; do
    path="bazel-bin/$(echo "${t#//}" | tr ':' '/')"
    cp -f "$path" out/gpu/bin/
done
# The ctxpar tool, when it exists: run.sh's end-to-end benchmark step uses it.
if bazel build //testing:ctxpar >/dev/null 2>&1; then
    cp -f bazel-bin/testing/ctxpar out/gpu/bin/
fi
git rev-parse HEAD > out/gpu/bin/COMMIT 2>/dev/null || true
ls -l out/gpu/bin
