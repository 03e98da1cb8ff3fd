#!/usr/bin/env bash
# Installs ctxpar for use outside Bazel:  bazel run //:install -- --prefix DIR
#
#   DIR/include/ctxpar/*.h                  the public headers (compile with -I DIR/include/ctxpar)
#   DIR/lib/libctxpar.so.V (+ .so.0, .so)   CPU device + local comm (threads); no MPI needed
#   DIR/lib/libctxpar.a                     the same, static (link with -fopenmp -lm -pthread)
#   DIR/lib/libctxpar_mpi.so.V (+ links)    the MPI comm (ctxpar_mpi.h), on top of libctxpar.so
#   DIR/lib/libctxpar_cuda.so.V, libctxpar_nccl.so.V (+ links, ctxpar_cuda.h, ctxpar_nccl.h)
#                                           the CUDA device and the NCCL comm, when the build
#                                           found the toolkit (not yet run on a GPU)
#   DIR/lib/pkgconfig/ctxpar.pc, ctxpar-mpi.pc (ctxpar-cuda.pc, ctxpar-nccl.pc)
#   DIR/lib/cmake/ctxpar/ctxparConfig.cmake (+ ctxparConfigVersion.cmake): ctxpar::ctxpar,
#                                           ctxpar::static, ctxpar::mpi (ctxpar::cuda, ::nccl)
#   DIR/bin/ctxpar                          the tool
#   DIR/lib/python3/site-packages/ctxpar    the Python package (finds DIR/lib/libctxpar.so)
set -euo pipefail

prefix=""
while [ $# -gt 0 ]; do
    case "$1" in
    --prefix) prefix=${2:?--prefix needs a directory}; shift 2 ;;
    --prefix=*) prefix=${1#--prefix=}; shift ;;
    -h | --help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "install: unknown argument '$1' (usage: --prefix DIR)" >&2; exit 2 ;;
    esac
done
[ -n "$prefix" ] || { echo "install: --prefix DIR is required" >&2; exit 2; }

# Files come from the runfiles tree (bazel run puts us there); a relative prefix is relative to
# where bazel run was called.
runfiles="${RUNFILES_DIR:-$0.runfiles}/ctxpar"
[ -d "$runfiles" ] || runfiles=$PWD
case "$prefix" in /*) ;; *) prefix="${BUILD_WORKING_DIRECTORY:-$PWD}/$prefix" ;; esac
cd "$runfiles"

# One version, the library's own (ctxpar_version() in dispatch/status.c).
version=$(sed -n 's/.*ctxpar_version(void) { return "\([0-9]*\.[0-9]*\.[0-9]*\)"; }.*/\1/p' \
    dispatch/status.c)
[ -n "$version" ] || { echo "install: cannot read the version from dispatch/status.c" >&2; exit 1; }
major=${version%%.*}

inc="$prefix/include/ctxpar"
lib="$prefix/lib"
mkdir -p "$inc" "$lib/pkgconfig" "$lib/cmake/ctxpar" "$prefix/bin" \
    "$lib/python3/site-packages/ctxpar"

install -m 644 api/ctxpar.h api/ctxpar_backend.h api/ctxpar_bins.h api/ctxpar_cpu.h \
    api/ctxpar_half.h api/ctxpar_local.h api/ctxpar_mpi.h "$inc/"

# A shared library PATH/NAME.so as NAME.so.VERSION with the soname link NAME.so.MAJOR and the
# link NAME.so.
install_shared() {
    local name
    name=$(basename "$1" .so)
    install -m 755 "$1" "$lib/$name.so.$version"
    ln -sfn "$name.so.$version" "$lib/$name.so.$major"
    ln -sfn "$name.so.$version" "$lib/$name.so"
}
install_shared libctxpar.so
install_shared libctxpar_mpi.so
install -m 644 libctxpar.a "$lib/libctxpar.a"
install -m 755 tools/ctxpar/ctxpar "$prefix/bin/ctxpar"
install -m 644 python/ctxpar/*.py "$lib/python3/site-packages/ctxpar/"

# Templates: @PREFIX@, @VERSION@ and @CUDA_ROOT@ filled in.
cuda_root=$(cat packaging/cuda/cuda_root.txt 2>/dev/null || true)
fill() {
    sed -e "s|@PREFIX@|$prefix|g" -e "s|@VERSION@|$version|g" -e "s|@CUDA_ROOT@|$cuda_root|g" \
        "packaging/$1.in" >"$lib/pkgconfig/$1"
}
fill ctxpar.pc
fill ctxpar-mpi.pc
# The CUDA device and the NCCL comm: present when the build found the toolkit.
if [ -e packaging/cuda/libctxpar_cuda.so ]; then
    install -m 644 api/ctxpar_cuda.h "$inc/"
    install_shared packaging/cuda/libctxpar_cuda.so
    fill ctxpar-cuda.pc
fi
if [ -e packaging/cuda/libctxpar_nccl.so ]; then
    install -m 644 api/ctxpar_nccl.h "$inc/"
    install_shared packaging/cuda/libctxpar_nccl.so
    fill ctxpar-nccl.pc
fi
for f in ctxparConfig.cmake ctxparConfigVersion.cmake; do
    fill "$f" && mv "$lib/pkgconfig/$f" "$lib/cmake/ctxpar/$f"
done

# Where each part went, and the variables that find it (the last lines a user sees).
cat <<EOF
installed ctxpar $version into $prefix
  headers         $inc
  libraries       $lib
  tool            $prefix/bin/ctxpar
  Python package  $lib/python3/site-packages/ctxpar
use it with:
  export PKG_CONFIG_PATH=$lib/pkgconfig
  export PYTHONPATH=$lib/python3/site-packages
  cmake ... -DCMAKE_PREFIX_PATH=$prefix
EOF
