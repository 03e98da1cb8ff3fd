"""Shared inputs for the ctxpar Python tests (run by python/run_tests.sh against an installed
prefix, or with PYTHONPATH=python CTXPAR_LIBRARY=bazel-bin/libctxpar.so)."""
import os
import threading

import numpy as np
import pytest

import ctxpar


def inputs(b=1, s=64, hq=4, hk=4, d=16, seed=0, dout=True):
    """Deterministic global q, k, v (and dout) in [B, S, H, D], float32."""
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((b, s, hq, d), dtype=np.float32)
    k = rng.standard_normal((b, s, hk, d), dtype=np.float32)
    v = rng.standard_normal((b, s, hk, d), dtype=np.float32)
    do = rng.standard_normal((b, s, hq, d), dtype=np.float32) if dout else None
    return q, k, v, do


def max_error(got, ref):
    """Largest |got - ref| relative to max(largest |ref|, 1): the inputs are O(1), so a tensor
    that is ~0 (dq where every query sees only itself) is compared absolutely."""
    got = np.asarray(got, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    both_inf = np.isneginf(got) & np.isneginf(ref)
    diff = np.where(both_inf, 0.0, np.abs(got - ref))
    return float(diff.max() / max(np.abs(np.where(np.isfinite(ref), ref, 0)).max(), 1.0))


def run_ranks(P, fn):
    """fn(ctx) on P threads with a local group; returns the results by rank (re-raises)."""
    group = ctxpar.local_group(P)
    results, errors = [None] * P, []

    def main(r):
        try:
            with ctxpar.Context("cpu", group.comm(r), num_threads=1) as ctx:
                results[r] = fn(ctx)
        except Exception as e:
            errors.append(e)

    threads = [threading.Thread(target=main, args=(r,)) for r in range(P)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


def require_tool():
    """The ctxpar tool for ctxpar.audit: skipped (with the reason) when there is none, a failure
    when CTXPAR_TEST_REQUIRE_TOOL is set (python/run_tests.sh installs it beside the package)."""
    path = ctxpar.tool_path()
    if path is None:
        if os.environ.get("CTXPAR_TEST_REQUIRE_TOOL"):
            pytest.fail("the ctxpar tool was not found beside the package "
                        "(CTXPAR_TEST_REQUIRE_TOOL is set)")
        pytest.skip("skipped: the ctxpar tool was not found (set CTXPAR_TOOL, or install ctxpar "
                    "with bazel run //:install)")
    return path
