"""simulate() (P ranks as threads through libctxpar.so) against the float64 oracle, over
algorithms x layouts x masks x dtypes x GQA; inputs are rounded to the dtype before the oracle
sees them, so the tolerances bound ctxpar's own error (F32 accumulation, outputs rounded to the
dtype: 2^-24, 2^-11, 2^-8 relative, with a margin for the sums)."""
import numpy as np
import pytest

import ctxpar
from ctxpar import _tensor
from conftest import inputs, max_error

# Largest errors measured over the matrix below: f32 out 3.6e-7, grads 6.2e-7; f16 4.2e-4 and
# 4.1e-4; bf16 3.0e-3 and 2.8e-3; lse 1.1e-7 in every dtype (it stays F32).
TOL = {"f32": {"out": 2e-6, "lse": 1e-6, "grad": 4e-6},
       "f16": {"out": 2e-3, "lse": 1e-6, "grad": 2e-3},
       "bf16": {"out": 1.6e-2, "lse": 1e-6, "grad": 1.6e-2}}


def rounded(x, dtype):
    """The float32 values ctxpar sees after rounding x to dtype."""
    if dtype == "f16":
        return x.astype(np.float16).astype(np.float32)
    if dtype == "bf16":
        return _tensor.from_bf16_bits(_tensor.to_bf16_bits(x))
    return x


def check(res, ref, dtype, grads=True):
    tol = TOL[dtype]
    assert max_error(res["out"], ref["out"]) <= tol["out"]
    assert max_error(res["lse"], ref["lse"]) <= tol["lse"]
    for name in ("dq", "dk", "dv") if grads else ():
        assert max_error(res[name], ref[name]) <= tol["grad"], name


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("hk", [4, 2])
@pytest.mark.parametrize("mask", ["causal", "none"])
@pytest.mark.parametrize("layout", ["contiguous", "zigzag", "striped"])
@pytest.mark.parametrize("algo", ["ring", "allgather", "alltoall"])
def test_simulate_matches_oracle(algo, layout, mask, hk, dtype):
    q, k, v, do = inputs(s=64, hq=4, hk=hk, d=16, seed=hk)
    res = ctxpar.simulate(q, k, v, do, ranks=2, algo=algo, layout=layout, mask=mask,
                          dtype=dtype, num_threads=1)
    ref = ctxpar.oracle(*(rounded(x, dtype) for x in (q, k, v, do)), mask=mask)
    assert res["out"].shape == q.shape and res["dk"].shape == k.shape
    check(res, ref, dtype)


@pytest.mark.parametrize("ranks", [1, 3, 4])
@pytest.mark.parametrize("window,cu", [(0, None), (9, None), (0, [0, 5, 40, 48]),
                                       (7, [0, 30, 48])])
def test_simulate_windows_documents_ranks(ranks, window, cu):
    q, k, v, do = inputs(s=48, hq=4, hk=2, d=16, seed=ranks)
    res = ctxpar.simulate(q, k, v, do, ranks=ranks, algo="ring", layout="zigzag", window=window,
                          cu_seqlens=cu, scale=0.2, num_threads=1)
    check(res, ctxpar.oracle(q, k, v, do, window=window, cu_seqlens=cu, scale=0.2), "f32")


@pytest.mark.parametrize("algo", ["ring", "allgather", "alltoall"])
@pytest.mark.parametrize("window,cu", [((9, 5), None), ((0, 3), [0, 20, 20, 48])])
def test_simulate_two_sided_windows(algo, window, cu):
    # Non-causal with a right limit too (window_size=(left, right) as FlashAttention has it).
    q, k, v, do = inputs(s=48, hq=4, hk=2, d=16, seed=11)
    res = ctxpar.simulate(q, k, v, do, ranks=4, algo=algo, layout="zigzag", mask="none",
                          window=window, cu_seqlens=cu, num_threads=1)
    check(res, ctxpar.oracle(q, k, v, do, mask="none", window=window, cu_seqlens=cu), "f32")
    # The band is what the oracle applied: query 0 sees keys 0 .. right only.
    from ctxpar._oracle import visible
    assert visible(48, "none", window)[0].nonzero()[0].max() == window[1]
    with pytest.raises(ValueError, match="window"):
        ctxpar.simulate(q, k, v, ranks=2, mask="none", window=(4, -1))


def test_simulate_bhsd_and_forward_only():
    q, k, v, _ = inputs(s=32, hq=4, hk=1, d=8)
    t = lambda x: np.ascontiguousarray(x.transpose(0, 2, 1, 3))  # noqa: E731
    res = ctxpar.simulate(t(q), t(k), t(v), ranks=2, format="bhsd", algo="allgather")
    assert set(res) == {"out", "lse"}
    check(res, ctxpar.oracle(t(q), t(k), t(v), format="bhsd"), "f32", grads=False)


def test_simulate_window_one_sees_only_itself():
    # Causal with window 1: every query sees its own key only, so out equals v.
    q, k, v, do = inputs(s=16, hq=2, hk=2, d=8)
    res = ctxpar.simulate(q, k, v, do, ranks=2, mask="causal", window=1, num_threads=1)
    check(res, ctxpar.oracle(q, k, v, do, mask="causal", window=1), "f32")
    np.testing.assert_allclose(res["out"], v, atol=1e-6)


def test_simulate_float64_is_computed_in_float32_with_a_note():
    """NumPy's default dtype: float64 inputs are rounded to float32 (a warning says so) and
    the results, float32, match the float64 oracle on the float64 inputs within float32's
    bound plus that rounding."""
    q, k, v, do = (x.astype(np.float64) + 1e-9 for x in inputs(s=40, hq=4, hk=2, d=16, seed=8))
    with pytest.warns(UserWarning, match="float64 inputs in float32"):
        res = ctxpar.simulate(q, k, v, do, ranks=3, num_threads=1)
    ref = ctxpar.oracle(q, k, v, do)
    for name in ("out", "dq", "dk", "dv"):
        assert res[name].dtype == np.float32
        assert max_error(res[name], ref[name]) <= 4e-6, name


@pytest.mark.parametrize("algo", ["decode", "allgather"])
@pytest.mark.parametrize("layout", ["contiguous", "zigzag", "striped"])
@pytest.mark.parametrize("q_len", [1, 4, 12])
@pytest.mark.parametrize("window,cu", [(0, None), (9, [0, 20, 45, 50])])
def test_simulate_queries_at_the_last_positions(algo, layout, q_len, window, cu):
    # q_len queries over a cache of S keys sharded on 3 ranks: the full sequence's oracle, last
    # q_len rows (causal aligned bottom-right; the queries extend the last document).
    q, k, v, _ = inputs(s=50, hq=4, hk=2, d=16, seed=q_len)
    res = ctxpar.simulate(q[:, -q_len:], k, v, ranks=3, algo=algo, layout=layout, window=window,
                          cu_seqlens=cu, num_threads=1, q_len=q_len)
    ref = ctxpar.oracle(q, k, v, window=window, cu_seqlens=cu)
    assert res["out"].shape == (1, q_len, 4, 16) and res["lse"].shape == (1, 4, q_len)
    check(res, {"out": ref["out"][:, -q_len:], "lse": ref["lse"][:, :, -q_len:]}, "f32",
          grads=False)


def test_simulate_queries_at_the_last_positions_refused():
    q, k, v, do = inputs(s=32, hq=4, hk=4, d=8)
    with pytest.raises(ctxpar.CtxparError, match="q_len"):
        ctxpar.simulate(q[:, -2:], k, v, ranks=2, algo="ring", q_len=2)
    with pytest.raises(ctxpar.CtxparError, match="forward only"):
        ctxpar.simulate(q[:, -2:], k, v, do[:, -2:], ranks=2, algo="decode", q_len=2)
