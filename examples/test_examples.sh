#!/usr/bin/env bash
# Installs ctxpar into a temporary prefix (bazel run //:install), builds examples/attention.c
# against it with pkg-config and with CMake's find_package(ctxpar) (shared and static), runs each
# build (it checks itself against float64 attention and exits non-zero outside tolerance), and
# checks that the shared build needs no MPI, and that a program using the MPI comm builds with
# ctxpar-mpi.pc and runs, and so do the CUDA and NCCL libraries when they were installed.
# Usage: bash examples/test_examples.sh
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
prefix="$tmp/prefix"
bazel run //:install -- --prefix "$prefix" >"$tmp/install.log" 2>&1 ||
    { cat "$tmp/install.log"; echo "FAIL: bazel run //:install"; exit 1; }
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
# The install says where the Python package went, and exports what finds it.
for line in "Python package  $prefix/lib/python3/site-packages/ctxpar" \
    "export PYTHONPATH=$prefix/lib/python3/site-packages" "export PKG_CONFIG_PATH=$PKG_CONFIG_PATH"; do
    grep -qF "$line" "$tmp/install.log" || { cat "$tmp/install.log"; echo "FAIL: install log lacks '$line'"; exit 1; }
done
version=$(pkg-config --modversion ctxpar)
status=0

# run NAME BINARY: runs the example; it must pass and report the library's version (its
# ctxpar_version()) as the one the .pc file names.
run() {
    local out
    if out=$("$2") && [[ "$out" == "ctxpar $version:"* ]]; then
        echo "PASS $1: ${out##*$'\n'}"
    else
        echo "FAIL $1 (ctxpar $version expected): $out"
        status=1
    fi
}

# shellcheck disable=SC2046  # pkg-config's output is meant to be split into words
cc -std=c11 -Wall -Wextra -Werror examples/attention.c $(pkg-config --cflags --libs ctxpar) \
    -pthread -lm -o "$tmp/attention_pkgconfig"
run "pkg-config build" "$tmp/attention_pkgconfig"
if ldd "$tmp/attention_pkgconfig" | grep -q libmpi; then
    echo "FAIL: a CPU + threads program links MPI"
    status=1
fi

# ctxpar-mpi.pc: a program using the MPI comm compiles, links and runs (one process).
cat >"$tmp/mpi.c" <<'C'
#include <stdio.h>
#include "ctxpar_mpi.h"
int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    ctxpar_comm *comm = NULL, *by_name = NULL;
    ctxpar_comm_world *world = NULL;
    ctxpar_status st = ctxpar_comm_create_mpi(MPI_COMM_WORLD, &comm);
    if (st == CTXPAR_OK) // the same comm by name: the library registered "mpi" when loaded
        st = ctxpar_comm_world_create("mpi", 0, &world);
    if (st == CTXPAR_OK)
        st = ctxpar_comm_world_comm(world, 0, NULL, &by_name);
    printf("%s size %d\n", ctxpar_status_string(st),
           st ? -1 : ctxpar_comm_size(comm) * ctxpar_comm_size(by_name));
    ctxpar_comm_destroy(by_name);
    ctxpar_comm_world_destroy(world);
    ctxpar_comm_destroy(comm);
    MPI_Finalize();
    return st != CTXPAR_OK;
}
C
# shellcheck disable=SC2046
cc -std=c11 -Wall -Werror "$tmp/mpi.c" $(pkg-config --cflags --libs ctxpar-mpi) -o "$tmp/mpi"
if out=$(OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "$tmp/mpi") &&
    [ "$out" = "CTXPAR_OK size 1" ]; then
    echo "PASS ctxpar-mpi build: $out"
else
    echo "FAIL ctxpar-mpi build: $out"
    status=1
fi

# ctxpar-cuda.pc / ctxpar-nccl.pc (installed when the build found the toolkit): a program that
# makes a CUDA device and an NCCL comm builds and runs. Without a GPU the device fails cleanly
# with CTXPAR_ERR_DEVICE; the NCCL comm rejects a NULL communicator with INVALID_ARG.
if pkg-config --exists ctxpar-nccl; then
    cat >"$tmp/cuda.c" <<'C'
#include <stdio.h>
#include "ctxpar_cuda.h"
#include "ctxpar_nccl.h"
int main(void) {
    ctxpar_device *dev = NULL;
    ctxpar_comm *comm = NULL;
    ctxpar_status d = ctxpar_device_create_cuda(NULL, &dev);
    printf("cuda device: %s %s; ", ctxpar_status_string(d), ctxpar_last_error());
    ctxpar_status n = ctxpar_comm_create_nccl(NULL, dev, NULL, &comm);
    printf("nccl comm on NULL: %s\n", ctxpar_status_string(n));
    ctxpar_device_destroy(dev);
    return !((d == CTXPAR_OK || d == CTXPAR_ERR_DEVICE) && n == CTXPAR_ERR_INVALID_ARG);
}
C
    # shellcheck disable=SC2046
    if cc -std=c11 -Wall -Werror "$tmp/cuda.c" $(pkg-config --cflags --libs ctxpar-nccl) -o "$tmp/cuda" &&
        out=$("$tmp/cuda"); then
        echo "PASS ctxpar-cuda/ctxpar-nccl build: $out"
    else
        echo "FAIL ctxpar-cuda/ctxpar-nccl build: ${out:-}"
        status=1
    fi
else
    echo "skipped: ctxpar-cuda/ctxpar-nccl (built without the CUDA toolkit or NCCL)"
fi

cmake -S examples -B "$tmp/build" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release \
    >"$tmp/cmake.log" 2>&1 && cmake --build "$tmp/build" >>"$tmp/cmake.log" 2>&1 ||
    { cat "$tmp/cmake.log"; echo "FAIL: CMake build"; exit 1; }
run "CMake ctxpar::ctxpar build" "$tmp/build/attention"
run "CMake ctxpar::static build" "$tmp/build/attention_static"

# The static library registers its CPU device and local comm for a program that names only
# strings (its objects are prelinked into one: packaging/merge_archives.sh).
cat >"$tmp/by_name.c" <<'C'
#include <stdio.h>
#include "ctxpar.h"
int main(void) {
    ctxpar_device *dev = NULL;
    ctxpar_comm_world *world = NULL;
    ctxpar_status st = ctxpar_device_create_by_name("cpu", 1, &dev);
    if (st == CTXPAR_OK)
        st = ctxpar_comm_world_create("local", 2, &world);
    printf("%s %s\n", ctxpar_status_string(st), st ? ctxpar_last_error() : "cpu, local");
    ctxpar_comm_world_destroy(world);
    ctxpar_device_destroy(dev);
    return st != CTXPAR_OK;
}
C
# shellcheck disable=SC2046
cc -std=c11 -Wall -Werror "$tmp/by_name.c" $(pkg-config --cflags ctxpar) "$prefix/lib/libctxpar.a" \
    -fopenmp -pthread -lm -o "$tmp/by_name"
if out=$("$tmp/by_name") && [ "$out" = "CTXPAR_OK cpu, local" ]; then
    echo "PASS static build, devices and comms by name: $out"
else
    echo "FAIL static build, devices and comms by name: $out"
    status=1
fi
exit "$status"
