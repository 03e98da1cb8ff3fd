#!/usr/bin/env bash
# The Python package's tests: installs ctxpar into a temporary prefix (bazel run //:install),
# runs the pytest suites against the installed package (PYTHONPATH=PREFIX/lib/python3/
# site-packages: it finds PREFIX/lib/libctxpar.so by itself), then checks that
# `pip install ./python` gives a working package too. PYTHON picks the interpreter (default
# Debian's /usr/bin/python3 with python3-numpy and python3-pytest; the torch suite runs when that
# interpreter has torch, and says "skipped" otherwise).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-/usr/bin/python3}
export PYTHONDONTWRITEBYTECODE=1
unset CTXPAR_LIBRARY
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
bazel run //:install -- --prefix "$tmp/prefix" >"$tmp/install.log" 2>&1 ||
    { cat "$tmp/install.log"; echo "FAIL: bazel run //:install"; exit 1; }

PYTHONPATH="$tmp/prefix/lib/python3/site-packages:$PWD/python/tests" \
    "$PYTHON" -m pytest -q -rs -p no:cacheprovider python/tests "$@"

if "$PYTHON" -m pip --version >/dev/null 2>&1; then
    cp -r python "$tmp/src" # pip builds in the source folder: keep the checkout clean
    "$PYTHON" -m pip install -q --root-user-action=ignore --no-build-isolation --no-deps --target "$tmp/pip" "$tmp/src"
    CTXPAR_LIBRARY="$tmp/prefix/lib/libctxpar.so" PYTHONPATH="$tmp/pip" "$PYTHON" -c '
import numpy as np, ctxpar
q = np.random.default_rng(0).standard_normal((1, 32, 2, 8), dtype=np.float32)
res, ref = ctxpar.simulate(q, q, q, ranks=2), ctxpar.oracle(q, q, q)
err = float(np.abs(res["out"] - ref["out"]).max())
assert err < 1e-5, err
print("pip install ./python: OK (simulate vs oracle, max error %.1e)" % err)'
else
    echo "skipped: pip install ./python ($PYTHON has no pip)"
fi
