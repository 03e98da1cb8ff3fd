#!/usr/bin/env bash
# Prepares the GPU run on the development machine (no GPU needed): builds every GPU test and
# bench binary with Bazel and puts them, with what the GPU machine lacks, into gpu_stage/ (ignored
# by git, carried with the working tree; under 64 MiB in all):
#
#   gpu_stage/bin/         cuda_ops_test device_conformance_test nccl_comm_test
#                          comm_conformance_nccl_test e2e_cuda_test cuda_bench ctxpar
#   gpu_stage/lib/         non-CUDA shared libraries the GPU machine may lack: the ctxpar tool's
#                          OpenMPI and its dependencies (the tool links MPI, which the in-process
#                          comm never initialises) and GCC's OpenMP runtime (the reference is
#                          built without OpenBLAS, so none is carried); lib.sh puts this
#                          directory last on the library path, so the machine's own come first
#   gpu_stage/googletest/  GoogleTest's sources (Debian's /usr/src/googletest), for run.sh's
#                          from-source fallback: the GPU machine has no GoogleTest
#   gpu_stage/COMMIT, gpu_stage/MANIFEST
#
# The binaries link cuDNN, NCCL and the CUDA runtime dynamically (libcudnn.so.9, libnccl.so.2,
# libcudart.so.13); run.sh finds them on the GPU machine (the nvidia-* wheels, the toolkit).
#
#   testing/gpu/stage.sh
set -euo pipefail
cd "$(dirname "$0")/../.."

STAGE=gpu_stage
LIMIT=$((60 * 1024 * 1024)) # what travels with the tree is capped at 64 MiB: keep room

targets=(//testing:cuda_ops_test //testing:device_conformance_test //testing/gpu:nccl_comm_test
         //testing/gpu:comm_conformance_nccl_test //testing/gpu:e2e_cuda_test
         //testing/gpu:cuda_bench //tools/ctxpar:ctxpar)
# The reference's plain loops, not OpenBLAS: the tool would carry libopenblas (36 MB) and
# libgfortran, over the size the tree may travel with.
bazel build --define=reference_blas=off "${targets[@]}"

rm -rf "$STAGE"
mkdir -p "$STAGE/bin" "$STAGE/lib"
for t in "${targets[@]}"; do
    src="bazel-bin/$(echo "${t#//}" | tr ':' '/')"
    dst="$STAGE/bin/$(basename "$src")"
    cp -f "$src" "$dst"
    chmod u+w "$dst"
    strip --strip-debug "$dst" # line tables only help a debugger; size travels
done

# Shared libraries of the ctxpar tool outside glibc, the C++ runtime and CUDA: OpenMPI and what
# it pulls in, and libgomp (every binary's; a machine with nvcc usually has it).
ldd "$STAGE/bin/ctxpar" | awk '$3 ~ /^\// {print $1, $3}' | while read -r name path; do
    case "$name" in
        libc.so.* | libm.so.* | libdl.so.* | librt.so.* | libpthread.so.* | libstdc++.so.* | \
            libgcc_s.so.* | libcud* | libnccl*) continue ;;
    esac
    cp -fL "$path" "$STAGE/lib/$name"
done

# GoogleTest's sources, without its own tests, docs and samples.
gt=/usr/src/googletest/googletest
if [ -d "$gt/src" ]; then
    mkdir -p "$STAGE/googletest"
    cp -r "$gt/include" "$gt/src" "$STAGE/googletest/"
else
    echo "stage.sh: $gt not found (Debian package googletest): no from-source fallback" >&2
fi

# The commit, marked when the binaries hold uncommitted changes (first_run.sh shows it).
commit=$(git rev-parse HEAD 2>/dev/null || echo unknown)
git diff --quiet HEAD 2>/dev/null || commit="$commit+uncommitted"
echo "$commit" > "$STAGE/COMMIT"
manifest=$(cd "$STAGE" && find . -type f -printf '%s %p\n' | sort -k2) # before it exists
echo "$manifest" > "$STAGE/MANIFEST"
total=$(du -sb "$STAGE" | cut -f1)
echo "stage.sh: $STAGE holds $((total / 1024 / 1024)) MiB ($total bytes)"
if [ "$total" -gt "$LIMIT" ]; then
    echo "stage.sh: $STAGE is over $((LIMIT / 1024 / 1024)) MiB: it cannot travel" >&2
    exit 1
fi
