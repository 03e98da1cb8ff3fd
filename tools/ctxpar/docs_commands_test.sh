#!/usr/bin/env bash
# Every `ctxpar ...` command line that README.md and docs/*.md show in code blocks (and every
# command named in `ctxpar ...` spans of the text) against the tool, so that they cannot drift:
#  - its command is one the tool has (`ctxpar --help` lists them; README names each of them), in
#    code blocks and in `ctxpar ...` spans of the text alike;
#  - the line with --help appended is accepted: every flag and value it shows parses (the
#    parser reads every option before it acts on --help);
#  - the defaults in docs/auditing.md's options table are the ones `audit --help` prints;
#  - check, bench and plan lines run for real, at small sizes (--seq 512, at most 4 ranks, 64 for
#    a plan, one timed call), and exit 0. audit lines name files only their readers have: --help.
# Usage: docs_commands_test.sh CTXPAR_BINARY README.md docs/*.md
set -uo pipefail
bin=$1
shift
docs=("$@") # the loops below reuse the positional parameters
tmp=${TEST_TMPDIR:-$(mktemp -d)}
fail=0
say_fail() { echo "FAIL $*"; fail=1; }

commands=$("$bin" --help | awk '/^commands:/ {on = 1; next} on && /^  [a-z]/ {print $1} on && /^$/ {on = 0}')
[ -n "$commands" ] || { echo "FAIL: ctxpar --help lists no commands"; exit 1; }
for c in $commands; do
    grep -q "ctxpar $c" "${docs[0]}" || say_fail "README.md shows no 'ctxpar $c' (the tool has it)"
done

# FILE:LINE<TAB>code|span<TAB>the words after "ctxpar" (shell variables of the block expanded).
extract() {
    awk '
    # kind "code": a command line to run; "span": prose naming a command (placeholders allowed).
    function emit(kind, text, line,    rest, v) {
        for (v in vars) gsub("\\$\\{?" v "\\}?", vars[v], text)
        if (!match(text, /(^[ \t]*|\/)ctxpar [a-z<]|\/\/tools\/ctxpar -- [a-z]|\$B [a-z]/)) return
        rest = substr(text, RSTART + RLENGTH - 1)
        sub(/[ \t]+#.*$/, "", rest)          # a comment
        sub(/[ \t]+[0-9]?>.*$/, "", rest)    # a redirection and what follows
        printf "%s:%d\t%s\t%s\n", FILENAME, line, kind, rest
    }
    FNR == 1 { fence = 0; split("", vars) }
    /^[ \t]*```/ { fence = !fence; next }
    {
        code = fence || /^    [^ -]/
        if (!code) {                          # `ctxpar ...` spans in the text
            s = $0
            while (match(s, /`ctxpar [a-z][^`]*`/)) {
                span = substr(s, RSTART + 1, RLENGTH - 2)
                s = substr(s, RSTART + RLENGTH)
                if (span ~ /^ctxpar [a-z]+( -.*)?$/)   # not "ctxpar test suites: ..."
                    emit("span", span, FNR)
            }
            next
        }
        line = FNR; text = $0
        while (text ~ /\\$/ && (getline more) > 0) {
            sub(/\\$/, "", text); sub(/^[ \t]+/, " ", more); text = text more
        }
        if (match(text, /^[ \t]*[A-Z_]+="[^"]*"[ \t]*$/)) {   # NAME="..." used as $NAME below
            name = text; sub(/^[ \t]*/, "", name); sub(/=.*/, "", name)
            val = text; sub(/^[^"]*"/, "", val); sub(/"[ \t]*$/, "", val)
            vars[name] = val
            next
        }
        emit("code", text, line)
    }' "$@"
}

# A comma list with every value above hi made small: the i-th becomes to x i (kept distinct).
cap() {
    awk -F, -v hi="$2" -v to="$3" '{
        for (i = 1; i <= NF; i++) {
            v = $i + 0
            if (v > hi) v = to * i
            printf "%s%d", (i > 1 ? "," : ""), v
        }
    }' <<<"$1"
}

# The words of a documented line at small sizes (for a real run).
shrink() {
    local sub=$1 out=() prev=""
    shift
    for w in "$@"; do
        case "$prev" in
        --seq) w=$(cap "$w" 512 256) ;;
        --ranks) w=$(if [ "$sub" = plan ]; then cap "$w" 64 64; else cap "$w" 4 4; fi) ;;
        --docs) w=$(cap "$w" 4 4) ;;
        --repeat) w=1 ;;
        --warmup) w=0 ;;
        --trace) w="$tmp/trace.json" ;;
        esac
        out+=("$w")
        prev=$w
    done
    printf '%s\n' "${out[@]}"
}

n=0
while IFS=$'\t' read -r where kind line; do
    line=${line//<command>/EVERY_COMMAND}
    eval "set -- $line" 2>/dev/null || { say_fail "$where: cannot split: $line"; continue; }
    sub=$1
    shift
    subs=$sub
    [ "$sub" = EVERY_COMMAND ] && subs=$commands
    for s in $subs; do
        n=$((n + 1))
        if ! grep -qx "$s" <<<"$commands"; then
            say_fail "$where: 'ctxpar $s' is not a command of the tool ($(echo $commands))"
            continue
        fi
        [ "$kind" = span ] && continue # prose: "ctxpar audit --rows N" names, does not run
        out=$("$bin" "$s" "$@" --help 2>&1)
        if [ $? -ne 0 ] || [[ "$out" != "usage: ctxpar $s"* ]]; then
            say_fail "$where: ctxpar $s $* --help: $out"
            continue
        fi
        case "$s" in
        check | bench | plan)
            [[ " $* " == *" --comm mpi "* ]] && continue # needs mpirun: the flags were checked
            mapfile -t small < <(shrink "$s" "$@")
            out=$(CTXPAR_PROGRESS_AFTER=inf "$bin" "$s" "${small[@]}" 2>&1 >/dev/null)
            rc=$?
            [ $rc -eq 0 ] || say_fail "$where: ctxpar $s ${small[*]} exited $rc: $out"
            ;;
        esac
    done
done < <(extract "${docs[@]}")
[ $n -ge 10 ] || say_fail "only $n command lines found in the docs"

# The options table of auditing.md: "| `--mask`, ... | `causal` (default), ..." is what
# `audit --help` prints as the option's [default].
for f in "${docs[@]}"; do
    [ "$(basename "$f")" = auditing.md ] || continue
    help=$("$bin" audit --help)
    checked=0
    while IFS=$'\t' read -r flag def; do
        checked=$((checked + 1))
        grep -E -q "^  $flag .*\[$def\]\$" <<<"$help" ||
            say_fail "$f: $flag's default is '$def' there, but audit --help says: $(grep -E "^  $flag " <<<"$help")"
    done < <(sed -n 's/^| `\(--[a-z-]*\)`[^|]*|[^|]*`\([^`]*\)` (default).*/\1\t\2/p' "$f")
    [ $checked -ge 4 ] || say_fail "$f: only $checked defaults found in its options table"
done
[ $fail -eq 0 ] && echo "PASS: $n documented command lines"
exit $fail
