#!/usr/bin/env bash
# Installs ctxpar for use outside Bazel:  bazel run //:install -- --prefix DIR
#
#   DIR/include/ctxpar/*.h                  the public headers (compile with -I DIR/include/ctxpar)
#   DIR/lib/libctxpar.so.V (+ .so.0, .so)   CPU device + local comm (threads); no MPI needed
#   DIR/lib/libctxpar.a                     the same, static (link with -fopenmp -lm -pthread)
#   DIR/lib/libctxpar_mpi.so.V (+ links)    the MPI comm (ctxpar_mpi.h), on top of libctxpar.so
#   DIR/lib/pkgconfig/ctxpar.pc, ctxpar-mpi.pc
#   DIR/lib/cmake/ctxpar/ctxparConfig.cmake (+ ctxparConfigVersion.cmake): ctxpar::ctxpar,
#                                           ctxpar::mpi, ctxpar::static
#   DIR/bin/ctxpar                          the tool
#   DIR/lib/python3/site-packages/ctxpar    the Python package (finds DIR/lib/libctxpar.so)
set -euo pipefail

prefix=""
while [ $# -gt 0 ]; do
    case "$1" in
    --prefix) prefix=${2:?--prefix needs a directory}; shift 2 ;;
    --prefix=*) prefix=${1#--prefix=}; shift ;;
    -h | --help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
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

# One version, the library's own (ctxpar_version() in api/status.c).
version=$(sed -n 's/.*ctxpar_version(void) { return "\([0-9]*\.[0-9]*\.[0-9]*\)"; }.*/\1/p' \
    api/status.c)
[ -n "$version" ] || { echo "install: cannot read the version from api/status.c" >&2; exit 1; }
major=${version%%.*}

inc="$prefix/include/ctxpar"
lib="$prefix/lib"
mkdir -p "$inc" "$lib/pkgconfig" "$lib/cmake/ctxpar" "$prefix/bin" \
    "$lib/python3/site-packages/ctxpar"

install -m 644 api/ctxpar.h api/ctxpar_backend.h api/ctxpar_cpu.h api/ctxpar_half.h \
    api/ctxpar_local.h api/ctxpar_mpi.h "$inc/"

# A shared library as NAME.so.VERSION with the soname link NAME.so.MAJOR and the link NAME.so.
install_shared() {
    local name=$1
    install -m 755 "$name.so" "$lib/$name.so.$version"
    ln -sfn "$name.so.$version" "$lib/$name.so.$major"
    ln -sfn "$name.so.$version" "$lib/$name.so"
}
install_shared libctxpar
install_shared libctxpar_mpi
install -m 644 libctxpar.a "$lib/libctxpar.a"
install -m 755 testing/ctxpar "$prefix/bin/ctxpar"
install -m 644 python/ctxpar/*.py "$lib/python3/site-packages/ctxpar/"

# Templates: @PREFIX@ and @VERSION@ filled in.
fill() { sed -e "s|@PREFIX@|$prefix|g" -e "s|@VERSION@|$version|g" "packaging/$1.in" >"$2"; }
fill ctxpar.pc "$lib/pkgconfig/ctxpar.pc"
fill ctxpar-mpi.pc "$lib/pkgconfig/ctxpar-mpi.pc"
fill ctxparConfig.cmake "$lib/cmake/ctxpar/ctxparConfig.cmake"
fill ctxparConfigVersion.cmake "$lib/cmake/ctxpar/ctxparConfigVersion.cmake"

echo "installed ctxpar $version into $prefix"
