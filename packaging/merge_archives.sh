#!/usr/bin/env bash
# merge_archives.sh OUT.a FILE...: one static archive holding the objects of every static library
# among FILE... (Bazel names them .a, or .lo when alwayslink). Where a library comes both as PIC
# (.pic.a / .pic.lo) and not, the PIC one is taken, so that OUT.a links into a PIE executable.
set -euo pipefail
out=$1
shift
archives=()
for f in "$@"; do
    case "$f" in
    *.pic.a | *.pic.lo) archives+=("$f") ;;
    *.a | *.lo)
        base=${f%.*}
        [[ " $* " == *" $base.pic.${f##*.} "* ]] || archives+=("$f")
        ;;
    esac
done
script="CREATE $out"$'\n'
for a in "${archives[@]}"; do script+="ADDLIB $a"$'\n'; done
script+=$'SAVE\nEND\n'
rm -f "$out"
ar -M <<<"$script"
