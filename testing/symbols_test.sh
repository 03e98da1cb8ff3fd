#!/usr/bin/env bash
# The shared library exports the public API and nothing else: symbols_test.sh LIB HEADER...
#   - every dynamic symbol LIB defines starts with ctxpar_ and is declared for export by one of
#     the headers (an internal function, such as the dispatch layer's wrappers, a helper of a
#     backend or a copy of a static library would not be; a name a comment mentions is not
#     enough);
#   - every function the headers declare for export (CTXPAR_API, or a prototype in
#     ctxpar_backend.h, whose whole content is exported) is defined by LIB.
set -euo pipefail
lib=$1
shift
exported=$(nm -D --defined-only "$lib" | awk 'NF >= 3 {print $3}' | sort -u)
declared=$( (cat "$@" | tr '\n' ' ' | grep -oE 'CTXPAR_API [^;{(]*\bctxpar_[a-z0-9_]+\(' || true
    for h in "$@"; do
        case "$h" in *ctxpar_backend.h) grep -oE '^[a-z][a-z0-9_ ]*[ *]ctxpar_[a-z0-9_]+\(' "$h" | grep -v '^static' ;; esac
    done) | grep -oE 'ctxpar_[a-z0-9_]+\($' -o | tr -d '(' | sort -u)
status=0
echo "$(echo "$exported" | wc -l) exported symbols, $(echo "$declared" | wc -l) declared functions"
for s in $exported; do
    case "$s" in
    ctxpar_*)
        if ! grep -qx "$s" <<<"$declared"; then
            echo "FAIL: $s is exported but no public header declares it for export"
            status=1
        fi
        ;;
    __bss_start | _edata | _end) ;; # defined by the linker in every shared object
    *)
        echo "FAIL: $s is exported but is not a ctxpar_ symbol"
        status=1
        ;;
    esac
done
for s in $declared; do
    if ! grep -qx "$s" <<<"$exported"; then
        echo "FAIL: $s is declared for export but $lib does not export it"
        status=1
    fi
done
[ "$status" -eq 0 ] && echo "OK: exactly the public API is exported"
exit "$status"
