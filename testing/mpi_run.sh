#!/bin/bash
# Runs a GoogleTest binary under mpirun, once per rank count: mpi_run.sh BINARY NP [NP ...]
# Every rank runs every test; mpirun's exit code is non-zero when any rank fails.
# Shared memory only (no network): btl self,vader; no core binding (ranks may outnumber cores).
set -u
if [ $# -lt 2 ]; then
    echo "usage: $0 BINARY NP [NP ...]" >&2
    exit 2
fi
bin=$1
shift
mpirun=$(command -v mpirun || true)
# Through the real path: invoked as /bin/mpirun, Open MPI would take "/" as its prefix.
[ -n "$mpirun" ] && mpirun=$(readlink -f "$mpirun")
if [ -z "$mpirun" ]; then
    echo "mpirun not found (install openmpi-bin)" >&2
    exit 1
fi
# Open MPI keeps its session directory under TMPDIR, and its shared-memory segments in
# /dev/shm under names made from mpirun's PID. Sandboxed tests run in PID namespaces, so two
# concurrent jobs can get the same names and corrupt each other: keep both in the test's
# private directory.
export TMPDIR=${TEST_TMPDIR:-${TMPDIR:-/tmp}}
# Under --config=asan: Open MPI leaks by design at MPI_Finalize. Keep its plugins loaded (so that
# their frames have names) and tell LeakSanitizer to ignore leaks allocated inside Open MPI;
# leaks from ctxpar and the tests are still reported.
if [ -n "${ASAN_OPTIONS:-}" ]; then
    supp="$TMPDIR/lsan_openmpi.supp"
    printf 'leak:%s\n' libmpi.so libopen-pal.so libopen-rte.so libpmix.so libhwloc.so \
        libevent mca_ >"$supp"
    export LSAN_OPTIONS="suppressions=$supp${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
    export OMPI_MCA_mca_base_component_disable_dlclose=1
    export PMIX_MCA_mca_base_component_disable_dlclose=1
    export ASAN_OPTIONS="$ASAN_OPTIONS:fast_unwind_on_malloc=0" # Open MPI has no frame pointers
fi
status=0
for np in "$@"; do
    echo "=== mpirun -np $np $bin"
    if ! "$mpirun" -np "$np" --oversubscribe --bind-to none --mca btl self,vader \
        --mca btl_vader_backing_directory "$TMPDIR" "$bin"; then
        echo "=== FAILED with -np $np" >&2
        status=1
    fi
done
exit $status
