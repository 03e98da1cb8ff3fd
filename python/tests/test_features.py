"""The attention of current models through the Python API (issue 17's features and the hybrid
algorithm): simulate() against ctxpar.oracle (NumPy float64, itself checked against a row loop
and finite differences in test_oracle.py), forward and backward, and the errors for bad values:
shapes and buffer lengths raise ValueError in Python before any C call; values only the library
judges (softcap, sink contents, assignment entries, ulysses) raise CtxparError naming the field."""
import numpy as np
import pytest

import ctxpar
from conftest import inputs, max_error, run_ranks

TOL = {"out": 2e-6, "lse": 1e-6, "grad": 4e-6, "dsinks": 4e-6}


def check(res, ref, grads=True):
    assert res["out"].shape == ref["out"].shape
    assert max_error(res["out"], ref["out"]) <= TOL["out"]
    assert max_error(res["lse"], ref["lse"]) <= TOL["lse"]
    for name in ("dq", "dk", "dv") if grads else ():
        assert res[name].shape == ref[name].shape, name
        assert max_error(res[name], ref[name]) <= TOL["grad"], name
    if "dsinks" in ref:
        assert max_error(res["dsinks"], ref["dsinks"]) <= TOL["dsinks"]


def mla_inputs(b=1, s=24, hq=4, hk=2, d=16, dv=8, seed=0):
    """q, k [.., d], v [.., dv] and dout [.., dv]: V with its own head_dim (MLA)."""
    rng = np.random.default_rng(seed)
    f = lambda *shape: rng.standard_normal(shape, dtype=np.float32)  # noqa: E731
    return f(b, s, hq, d), f(b, s, hk, d), f(b, s, hk, dv), f(b, s, hq, dv)


@pytest.mark.parametrize("layout", ["contiguous", "zigzag", "striped"])
@pytest.mark.parametrize("algo", ["ring", "allgather", "alltoall"])
@pytest.mark.parametrize("s,P", [(13, 4), (3, 4), (17, 2)])
def test_uneven_lengths(algo, layout, s, P):
    # S that does not divide by P (2P for zigzag), and S < P: a rank holds no token.
    q, k, v, do = inputs(s=s, hq=4, hk=2, d=8, seed=s)
    counts = [ctxpar.shard_count(layout, s, r, P) for r in range(P)]
    assert sum(counts) == s and max(counts) - min(counts) <= 1
    got = np.sort(np.concatenate([ctxpar.positions(layout, s, r, P) for r in range(P)]))
    np.testing.assert_array_equal(got, np.arange(s))
    res = ctxpar.simulate(q, k, v, do, ranks=P, algo=algo, layout=layout, num_threads=1)
    check(res, ctxpar.oracle(q, k, v, do))


@pytest.mark.parametrize("algo", ["ring", "allgather", "alltoall", "hybrid"])
def test_custom_assignment(algo):
    # Any token-to-rank map (here a random one over 4 ranks, uneven: 6, 6, 6, 5 tokens); the
    # hybrid as 2 all-to-all groups of 2.
    s, P = 23, 4
    assignment = np.random.default_rng(7).permutation(np.arange(s) % P)
    for r in range(P):
        pos = ctxpar.positions("custom", s, r, P, assignment)
        np.testing.assert_array_equal(pos, np.flatnonzero(assignment == r))
        assert ctxpar.shard_count("custom", s, r, P, assignment) == len(pos)
    q, k, v, do = inputs(s=s, hq=4, hk=2, d=8, seed=1)
    res = ctxpar.simulate(q, k, v, do, ranks=P, algo=algo, layout="custom",
                          assignment=assignment, num_threads=1,
                          **(dict(ulysses=2) if algo == "hybrid" else {}))
    check(res, ctxpar.oracle(q, k, v, do))


@pytest.mark.parametrize("algo", ["ring", "allgather", "alltoall"])
def test_documents_per_row_with_empty_ones(algo):
    cu = np.array([[0, 10, 10, 32], [0, 3, 20, 32]])  # row 0 has an empty document
    q, k, v, do = inputs(b=2, s=32, hq=4, hk=2, d=8, seed=2)
    res = ctxpar.simulate(q, k, v, do, ranks=2, algo=algo, cu_seqlens=cu, num_threads=1)
    check(res, ctxpar.oracle(q, k, v, do, cu_seqlens=cu))
    # Not the same as either row's documents for both rows: the rows really differ.
    assert max_error(res["out"], ctxpar.oracle(q, k, v, cu_seqlens=cu[0])["out"]) > 1e-3


@pytest.mark.parametrize("hk", [4, 2, 1])
@pytest.mark.parametrize("algo", ["ring", "allgather", "alltoall"])
def test_mla_v_has_its_own_head_dim(algo, hk):
    q, k, v, do = mla_inputs(s=24, hq=4, hk=hk, d=24, dv=16, seed=hk)
    res = ctxpar.simulate(q, k, v, do, ranks=2, algo=algo, layout="zigzag", num_threads=1)
    assert res["out"].shape == (1, 24, 4, 16) and res["dv"].shape == (1, 24, hk, 16)
    assert res["dk"].shape == (1, 24, hk, 24)
    check(res, ctxpar.oracle(q, k, v, do))


@pytest.mark.parametrize("algo", ["ring", "allgather", "alltoall", "hybrid"])
def test_sinks_and_their_gradient(algo):
    q, k, v, do = inputs(b=2, s=24, hq=4, hk=2, d=8, seed=3)
    sinks = np.array([0.5, -1.0, 2.0, 0.0], dtype=np.float32)
    res = ctxpar.simulate(q, k, v, do, ranks=4, algo=algo, sinks=sinks, window=5,
                          num_threads=1, **(dict(ulysses=2) if algo == "hybrid" else {}))
    ref = ctxpar.oracle(q, k, v, do, sinks=sinks, window=5)
    check(res, ref)
    assert res["dsinks"].dtype == np.float32 and res["dsinks"].shape == (4,)
    # The sink entered the denominator once: without it the rows would differ.
    assert max_error(res["lse"], ctxpar.oracle(q, k, v, window=5)["lse"]) > 1e-2


def test_dsinks_are_the_same_bits_on_every_rank():
    P = 3
    q, k, v, do = inputs(s=18, hq=2, hk=2, d=8, seed=4)
    sinks = np.array([0.25, -0.5], dtype=np.float32)
    local = [{n: ctxpar.shard(x, r, P, "zigzag") for n, x in
              (("q", q), ("k", k), ("v", v), ("do", do))} for r in range(P)]

    def fn(ctx):
        s = local[ctx.rank]
        kw = dict(sinks=sinks, seq_len_global=18)
        out, lse = ctx.attention(s["q"], s["k"], s["v"], **kw)
        dsinks = np.full(2, np.nan, dtype=np.float32)
        grads = ctx.attention_backward(s["q"], s["k"], s["v"], out, lse, s["do"], dsinks=dsinks,
                                       **kw)
        assert grads[3] is dsinks  # written in place
        return dsinks

    got = run_ranks(P, fn)
    for r in range(1, P):
        np.testing.assert_array_equal(got[r], got[0])
    ref = ctxpar.oracle(q, k, v, do, sinks=sinks)
    assert max_error(got[0], ref["dsinks"]) <= TOL["dsinks"]


@pytest.mark.parametrize("algo", ["ring", "allgather", "alltoall"])
def test_softcap(algo):
    q, k, v, do = inputs(s=32, hq=4, hk=2, d=8, seed=5)
    res = ctxpar.simulate(q, k, v, do, ranks=2, algo=algo, softcap=1.5, scale=0.9,
                          num_threads=1)
    check(res, ctxpar.oracle(q, k, v, do, softcap=1.5, scale=0.9))
    assert max_error(res["out"], ctxpar.oracle(q, k, v, scale=0.9)["out"]) > 1e-2


def test_everything_at_once_on_three_ranks():
    # MLA, GQA, per-row documents, a two-sided window, soft-capping, sinks, uneven shards.
    q, k, v, do = mla_inputs(b=2, s=25, hq=6, hk=2, d=12, dv=8, seed=6)
    cu = np.array([[0, 0, 11, 25], [0, 7, 19, 25]])
    sinks = np.linspace(-1, 1, 6).astype(np.float32)
    kw = dict(mask="none", window=(6, 3), cu_seqlens=cu, softcap=2.0, sinks=sinks)
    res = ctxpar.simulate(q, k, v, do, ranks=3, algo="ring", layout="zigzag", num_threads=1,
                          **kw)
    check(res, ctxpar.oracle(q, k, v, do, **kw))


@pytest.mark.parametrize("u,r", [(2, 2), (2, 3), (4, 2)])
def test_hybrid(u, r):
    q, k, v, do = inputs(s=48, hq=4, hk=2, d=8, seed=u * r)
    for mask, window in (("causal", 0), ("none", (9, 4))):
        res = ctxpar.simulate(q, k, v, do, ranks=u * r, algo="hybrid", ulysses=u, mask=mask,
                              window=window, layout="zigzag", num_threads=1)
        check(res, ctxpar.oracle(q, k, v, do, mask=mask, window=window))


def test_hybrid_uneven_mla():
    # 2 x 2 grid, 29 tokens (shards of 8, 7, 7, 7), v's head_dim of its own.
    q, k, v, do = mla_inputs(s=29, hq=4, hk=2, d=12, dv=8, seed=9)
    res = ctxpar.simulate(q, k, v, do, ranks=4, algo="hybrid", ulysses=2, layout="zigzag",
                          num_threads=1)
    check(res, ctxpar.oracle(q, k, v, do))


def test_lse_lo_is_the_remainder_and_feeds_the_backward():
    # A sharp softmax (|lse| ~ 30): lse + lse_lo is closer to the float64 LSE than lse alone.
    q, k, v, do = inputs(s=64, hq=2, hk=2, d=16, seed=8)
    res = ctxpar.simulate(q, k, v, do, ranks=2, scale=2.5, lse_lo=True, num_threads=1)
    ref = ctxpar.oracle(q, k, v, do, scale=2.5)
    lse, lo = res["lse"].astype(np.float64), res["lse_lo"].astype(np.float64)
    half_ulp = 0.5 * (np.nextafter(np.abs(res["lse"]), np.float32(np.inf)) - np.abs(res["lse"]))
    assert (np.abs(lo) <= half_ulp).all() and (lo != 0).sum() > lo.size // 2
    assert np.abs(lse + lo - ref["lse"]).max() < np.abs(lse - ref["lse"]).max()
    for name in ("out", "dq", "dk", "dv"):
        assert max_error(res[name], ref[name]) <= 5e-5, name


def test_bad_values_get_clear_errors():
    q, k, v, do = inputs(s=16, hq=4, hk=2, d=8)
    P = 2

    def c_error(field, **kw):
        with pytest.raises(ctxpar.CtxparError) as e:
            ctxpar.simulate(q, k, v, do, ranks=P, num_threads=1, **kw)
        assert e.value.name == "CTXPAR_ERR_INVALID_ARG" and field in e.value.message, \
            e.value.message

    c_error("softcap", softcap=-1.0)
    c_error("softcap", softcap=float("nan"))
    c_error("sinks", sinks=np.array([0, np.nan, 0, 0], np.float32))
    c_error("assignment", layout="custom", assignment=np.array([0, 1, 2] + [0] * 13))
    c_error("ulysses", algo="hybrid", ulysses=3)
    with pytest.raises(ValueError, match="sinks"):
        ctxpar.simulate(q, k, v, ranks=P, sinks=np.zeros(3, np.float32))
    with pytest.raises(ValueError, match="assignment"):
        ctxpar.simulate(q, k, v, ranks=P, layout="custom", assignment=[0, 1])
    with pytest.raises(ValueError, match="assignment"):
        ctxpar.simulate(q, k, v, ranks=P, layout="custom")
    with pytest.raises(ValueError, match="assignment"):
        ctxpar.positions("zigzag", 16, 0, P, assignment=np.zeros(16, int))
    with pytest.raises(ValueError, match="assignment"):
        ctxpar.shard_count("custom", 16, 0, P, assignment=np.zeros(16, float))
    with pytest.raises(ValueError, match="cu_seqlens"):
        ctxpar.simulate(q, k, v, ranks=P, cu_seqlens=np.zeros((1, 1, 3), int))
    with pytest.raises(ValueError, match="ulysses"):
        ctxpar.simulate(q, k, v, ranks=P, algo="hybrid", ulysses=-1)
    with pytest.raises(ValueError, match="v shape"):
        ctxpar.simulate(q, k, v[:, :8], ranks=P)
    with ctxpar.Context("cpu") as ctx:
        out, lse = ctx.attention(q, k, v)
        with pytest.raises(ValueError, match="dsinks"):
            ctx.attention_backward(q, k, v, out, lse, do, dsinks=np.zeros(4, np.float32))
        with pytest.raises(ValueError, match="dsinks"):
            ctx.attention_backward(q, k, v, out, lse, do, sinks=np.zeros(4, np.float32),
                                   dsinks=np.zeros(3, np.float32))
        with pytest.raises(ValueError, match="lse_lo"):
            ctx.attention(q, k, v, lse_lo=np.zeros((1, 4, 15), np.float32))
        with pytest.raises(ValueError, match="dout shape"):
            ctx.attention_backward(q, k, v[..., :4], out[..., :4], lse, do)
