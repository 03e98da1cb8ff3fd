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


def naive_row(q, k, v, i, keys, scale, softcap, sink):
    """One query row spelled out: (out, lse) with soft-capping and a sink in the denominator."""
    s = []
    for j in keys:
        x = scale * float(np.dot(q[i], k[j]))
        s.append(softcap * np.tanh(x / softcap) if softcap else x)
    terms = [np.exp(x) for x in s] + ([np.exp(sink)] if sink is not None else [])
    if not terms:
        return np.zeros(v.shape[1]), -np.inf
    z = sum(terms)
    out = sum(np.exp(x) / z * v[j] for x, j in zip(s, keys)) if keys else np.zeros(v.shape[1])
    return out, np.log(z)


@pytest.mark.parametrize("softcap", [0.0, 1.5])
@pytest.mark.parametrize("with_sinks", [False, True])
def test_oracle_features_match_row_loop(softcap, with_sinks):
    # MLA (v's head_dim 5 != 8), documents per batch row (row 1 has an empty one), a two-sided
    # window leaving query 0 of row 1's second document with no key, soft-capping, sinks.
    rng = np.random.default_rng(3)
    B, S, Hq, Hk, D, Dv = 2, 12, 4, 2, 8, 5
    q, k = rng.standard_normal((B, S, Hq, D)), rng.standard_normal((B, S, Hk, D))
    v = rng.standard_normal((B, S, Hk, Dv))
    cu = np.array([[0, 5, 12, 12], [0, 3, 3, 12]])
    sinks = rng.standard_normal(Hq) if with_sinks else None
    got = ctxpar.oracle(q, k, v, mask="none", window=(2, 1), cu_seqlens=cu, scale=0.7,
                        softcap=softcap, sinks=sinks)
    assert got["out"].shape == (B, S, Hq, Dv)
    for b in range(B):
        doc = np.searchsorted(cu[b][1:-1], np.arange(S), side="right")
        for h in range(Hq):
            for i in range(S):
                keys = [j for j in range(S) if i - j < 2 and j - i <= 1 and doc[i] == doc[j]]
                out, lse = naive_row(q[b, :, h], k[b, :, h // 2], v[b, :, h // 2], i, keys, 0.7,
                                     softcap, None if sinks is None else sinks[h])
                np.testing.assert_allclose(got["out"][b, i, h], out, rtol=0, atol=1e-12)
                assert got["lse"][b, h, i] == pytest.approx(lse, abs=1e-12)


@pytest.mark.parametrize("softcap,hk", [(0.0, 2), (1.3, 1), (2.0, 4)])
def test_oracle_feature_gradients_match_finite_differences(softcap, hk):
    # Soft-capping, sinks (dsinks) and MLA (Dv = 2 != D = 3), per-row documents.
    rng = np.random.default_rng(5)
    q, k = rng.standard_normal((2, 6, 4, 3)), rng.standard_normal((2, 6, hk, 3))
    v = rng.standard_normal((2, 6, hk, 2))
    do = rng.standard_normal((2, 6, 4, 2))
    sinks = rng.standard_normal(4)
    cu = [[0, 4, 6], [0, 0, 6]]
    kw = dict(mask="causal", cu_seqlens=cu, softcap=softcap, scale=0.9)
    got = ctxpar.oracle(q, k, v, do, sinks=sinks, **kw)

    def loss(q_, k_, v_, s_):
        return float((ctxpar.oracle(q_, k_, v_, sinks=s_, **kw)["out"] * do).sum())

    eps = 1e-6
    args = (q, k, v, sinks)
    for pos, name in enumerate(("dq", "dk", "dv", "dsinks")):
        x = args[pos]
        fd = np.zeros_like(x)
        for idx in np.ndindex(x.shape):
            plus, minus = list(args), list(args)
            plus[pos], minus[pos] = x.copy(), x.copy()
            plus[pos][idx] += eps
            minus[pos][idx] -= eps
            fd[idx] = (loss(*plus) - loss(*minus)) / (2 * eps)
        np.testing.assert_allclose(got[name], fd, rtol=0, atol=1e-7, err_msg=name)
