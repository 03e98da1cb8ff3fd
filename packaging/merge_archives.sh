#!/usr/bin/env bash
# merge_archives.sh OUT.a FILE...: one static archive of the objects of every static library among
# FILE... (Bazel names them .a, or .lo when alwayslink). Where a library comes both as PIC
# (.pic.a / .pic.lo) and not, the PIC one is taken, so that OUT.a links into a PIE executable.
# The objects are prelinked into one (ld -r): a program that uses any of the library gets all of
# it, the constructors that register the CPU device and the local comm by name included (from
# separate members, a linker takes only those a program references).
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
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
objs=()
for i in "${!archives[@]}"; do
    # A folder per archive: two libraries may both hold an object of the same name.
    mkdir "$tmp/$i"
    abs=$(cd "$(dirname "${archives[$i]}")" && pwd)/$(basename "${archives[$i]}")
    # `ar x` keeps one of two members of the same name: refuse rather than lose an object.
    dup=$(ar t "$abs" | sort | uniq -d)
    if [ -n "$dup" ]; then
        echo "merge_archives.sh: $abs holds two members named $dup" >&2
        exit 1
    fi
    (cd "$tmp/$i" && ar x "$abs")
    for o in "$tmp/$i"/*.o; do objs+=("$o"); done
done
ld -r -o "$tmp/libctxpar.o" "${objs[@]}"
rm -f "$out"
ar rcs "$out" "$tmp/libctxpar.o"
