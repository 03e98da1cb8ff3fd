#!/usr/bin/env bash
# The Python package's tests: installs ctxpar into a temporary prefix (bazel run //:install),
# runs the pytest suites against the installed package (PYTHONPATH=PREFIX/lib/python3/
# site-packages: it finds PREFIX/lib/libctxpar.so by itself), then checks that
# `pip install ./python` gives a working package too. PYTHON picks the interpreter (default
# Debian's /usr/bin/python3 with python3-numpy and python3-pytest; the torch suite runs when that
# interpreter has torch, and says "skipped" otherwise). The audit tests run the installed tool
# (PREFIX/bin/ctxpar, found beside the package): CTXPAR_TEST_REQUIRE_TOOL makes a missing one a
# failure here rather than a skip.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-/usr/bin/python3}
export PYTHONDONTWRITEBYTECODE=1
unset CTXPAR_LIBRARY CTXPAR_TOOL
export CTXPAR_TEST_REQUIRE_TOOL=1
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
rep = ctxpar.audit(q, q, q, out=ref["out"].astype(np.float32), ranks=2)  # tool found by the library
assert rep.consistent, rep
print("pip install ./python: OK (simulate vs oracle, max error %.1e; audit found %s)"
      % (err, ctxpar.tool_path()))'
else
    echo "skipped: pip install ./python ($PYTHON has no pip)"
fi
