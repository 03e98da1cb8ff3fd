"""ctxpar.oracle (NumPy float64) against references written here independently: a per-row loop
for the forward and central finite differences of sum(out * dout) for the gradients."""
import numpy as np
import pytest

import ctxpar
from conftest import inputs


def naive_forward(q, k, v, mask, window, cu_seqlens, scale):
    """One query row at a time, with the visibility rule spelled out per key."""
    B, S, Hq, D = q.shape
    group = Hq // k.shape[2]
    doc = np.zeros(S, dtype=int)
    if cu_seqlens is not None:
        for d_ in range(len(cu_seqlens) - 1):
            doc[cu_seqlens[d_]:cu_seqlens[d_ + 1]] = d_
    out = np.zeros((B, S, Hq, D))
    lse = np.full((B, Hq, S), -np.inf)
    for b in range(B):
        for h in range(Hq):
            for i in range(S):
                keys = [j for j in range(S) if (mask == "none" or j <= i)
                        and (window == 0 or i - j < window) and doc[i] == doc[j]]
                if not keys:
                    continue
                s = np.array([scale * np.dot(q[b, i, h], k[b, j, h // group]) for j in keys],
                             dtype=np.float64)
                w = np.exp(s - s.max())
                lse[b, h, i] = s.max() + np.log(w.sum())
                out[b, i, h] = sum(wj * v[b, j, h // group] for wj, j in zip(w, keys)) / w.sum()
    return out, lse


@pytest.mark.parametrize("mask,window,cu", [("causal", 0, None), ("none", 0, None),
                                            ("causal", 5, None), ("none", 0, [0, 7, 20, 24]),
                                            ("causal", 3, [0, 1, 24])])
@pytest.mark.parametrize("hk", [4, 2, 1])
def test_oracle_forward_matches_row_loop(mask, window, cu, hk):
    q, k, v, _ = (x.astype(np.float64) if x is not None else None
                  for x in inputs(b=2, s=24, hq=4, hk=hk, d=8, dout=False))
    got = ctxpar.oracle(q, k, v, mask=mask, window=window, cu_seqlens=cu, scale=0.3)
    out, lse = naive_forward(q, k, v, mask, window, cu, 0.3)
    np.testing.assert_allclose(got["out"], out, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(np.isneginf(got["lse"]), np.isneginf(lse))
    np.testing.assert_allclose(np.where(np.isinf(lse), 0, got["lse"]),
                               np.where(np.isinf(lse), 0, lse), rtol=0, atol=1e-12)


@pytest.mark.parametrize("mask,hk", [("causal", 2), ("none", 1), ("causal", 4)])
def test_oracle_gradients_match_finite_differences(mask, hk):
    q, k, v, do = (x.astype(np.float64) for x in inputs(b=1, s=6, hq=4, hk=hk, d=3))
    got = ctxpar.oracle(q, k, v, do, mask=mask, window=4)

    def loss(q_, k_, v_):
        return float((ctxpar.oracle(q_, k_, v_, mask=mask, window=4)["out"] * do).sum())

    eps = 1e-6
    for name, x in (("dq", q), ("dk", k), ("dv", v)):
        fd = np.zeros_like(x)
        for idx in np.ndindex(x.shape):
            plus, minus = x.copy(), x.copy()
            plus[idx] += eps
            minus[idx] -= eps
            args = {"dq": lambda t: (t, k, v), "dk": lambda t: (q, t, v),
                    "dv": lambda t: (q, k, t)}[name]
            fd[idx] = (loss(*args(plus)) - loss(*args(minus))) / (2 * eps)
        np.testing.assert_allclose(got[name], fd, rtol=0, atol=1e-7, err_msg=name)


def test_oracle_bhsd_is_the_transpose():
    q, k, v, do = inputs(s=16, hq=4, hk=2)
    bshd = ctxpar.oracle(q, k, v, do)
    t = lambda x: np.ascontiguousarray(x.transpose(0, 2, 1, 3))  # noqa: E731
    bhsd = ctxpar.oracle(t(q), t(k), t(v), t(do), format="bhsd")
    for name in ("out", "dq", "dk", "dv"):
        np.testing.assert_array_equal(t(bshd[name]), bhsd[name])
    np.testing.assert_array_equal(bshd["lse"], bhsd["lse"])
