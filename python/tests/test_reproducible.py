"""reproducible=True (ctxpar_attn_params.reproducible) through simulate(): out, lse, lse_lo, dq,
dk, dv and dsinks have the same bits for 1, 2 and 4 ranks and the ring, allgather, alltoall and
hybrid algorithms, in the zigzag and contiguous layouts; each is checked for accuracy against a float64
attention written here (not ctxpar's oracle); without the flag the bits differ with the rank
count (so the bitwise checks can fail); decode and shards that are not whole chunks are
refused."""
import numpy as np
import pytest

import ctxpar

S, H, D = 1024, 4, 32
NAMES = ("out", "lse", "lse_lo", "dq", "dk", "dv", "dsinks")


def problem(s=S, seed=0):
    rng = np.random.default_rng(seed)
    q, k, v, do = (rng.standard_normal((1, s, H, D), dtype=np.float32) for _ in range(4))
    sinks = rng.standard_normal(H).astype(np.float32)
    return q, k, v, do, sinks


def reference(q, k, v, do, sinks):
    """Causal attention with sinks in float64, forward and backward, [B, S, H, D] (lse [B, H,
    S], natural log with the sink in the denominator; dsinks [H] summed over batch and rows)."""
    q, k, v, do = (x.astype(np.float64).transpose(0, 2, 1, 3) for x in (q, k, v, do))  # BHSD
    sink = sinks.astype(np.float64)[None, :, None]  # [1, H, 1]
    scale = 1.0 / np.sqrt(q.shape[-1])
    s = q.shape[2]
    scores = scale * q @ k.transpose(0, 1, 3, 2)
    scores = np.where(np.tril(np.ones((s, s), dtype=bool)), scores, -np.inf)
    m = np.maximum(scores.max(-1), sink)
    lse = m + np.log(np.exp(scores - m[..., None]).sum(-1) + np.exp(sink - m))
    p = np.exp(scores - lse[..., None])
    out = p @ v
    delta = (do * out).sum(-1)  # [B, H, S]
    ds = p * (do @ v.transpose(0, 1, 3, 2) - delta[..., None])
    dq = scale * ds @ k
    dk = scale * ds.transpose(0, 1, 3, 2) @ q
    dv = p.transpose(0, 1, 3, 2) @ do
    dsinks = -(np.exp(sink - lse) * delta).sum((0, 2))
    back = lambda x: x.transpose(0, 2, 1, 3)  # noqa: E731
    return {"out": back(out), "lse": lse, "dq": back(dq), "dk": back(dk), "dv": back(dv),
            "dsinks": dsinks}


def run(problem_, ranks, algo, layout, reproducible=True):
    q, k, v, do, sinks = problem_
    return ctxpar.simulate(q, k, v, do, ranks=ranks, algo=algo, layout=layout, mask="causal",
                           sinks=sinks, lse_lo=True, num_threads=1, reproducible=reproducible)


def differing(a, b):
    """The names whose bits differ between two results (float32 compared as uint32)."""
    assert set(a) == set(b) == set(NAMES)
    for n in NAMES:
        assert a[n].dtype == np.float32 and a[n].shape == b[n].shape, n
    return [n for n in NAMES if not np.array_equal(a[n].view(np.uint32), b[n].view(np.uint32))]


def rel_error(got, ref):
    return float(np.abs(got.astype(np.float64) - ref).max() / np.abs(ref).max())


_cache = {}


def baseline(s=S):
    """(problem, ranks=1 ring reproducible result, float64 reference) for sequence length s."""
    if s not in _cache:
        prob = problem(s)
        _cache[s] = (prob, run(prob, 1, "ring", "zigzag"), reference(*prob))
    return _cache[s]


def check_accuracy(res, ref):
    assert rel_error(res["out"], ref["out"]) < 1e-5
    for n in ("dq", "dk", "dv", "dsinks"):
        assert rel_error(res[n], ref[n]) < 1e-5, n
    assert rel_error(res["lse"].astype(np.float64) + res["lse_lo"], ref["lse"]) < 1e-6


def test_baseline_matches_float64_reference():
    _, base, ref = baseline()
    check_accuracy(base, ref)


# Ring and allgather need each rank's shard to be whole chunks of 256 positions: zigzag at 4
# ranks holds 2 x S/8 = 2 x 128 positions at S = 1024, so that case runs at S = 2048 (below) and
# is refused at 1024 (test_refusals).
@pytest.mark.parametrize("layout", ["zigzag", "contiguous"])
@pytest.mark.parametrize("algo", ["ring", "allgather", "alltoall", "hybrid"])
@pytest.mark.parametrize("ranks", [1, 2, 4])
def test_bitwise_equal_to_one_rank(ranks, algo, layout):
    s = 2 * S if (layout, ranks) == ("zigzag", 4) and algo != "alltoall" else S
    prob, base, ref = baseline(s)
    res = run(prob, ranks, algo, layout)
    assert differing(res, base) == [], f"{algo} {layout} at {ranks} ranks vs 1-rank ring"
    check_accuracy(res, ref)


def test_without_the_flag_the_bits_depend_on_the_ranks():
    """The bitwise test above is not vacuous: the default (fast) schedules at 4 ranks give other
    bits than at 1, yet stay accurate."""
    prob, _, ref = baseline()
    one, four = (run(prob, p, "ring", "zigzag", reproducible=False) for p in (1, 4))
    assert differing(one, four) != []
    check_accuracy(four, ref)


def test_refusals():
    q, k, v, do, sinks = problem()
    kw = dict(ranks=2, sinks=sinks, num_threads=1, reproducible=True)
    with pytest.raises(ctxpar.CtxparError, match="reproducible"):
        ctxpar.simulate(q, k, v, do, algo="decode", layout="zigzag", **kw)
    for algo in ("ring", "allgather"):
        with pytest.raises(ctxpar.CtxparError, match="whole chunks"):
            ctxpar.simulate(q, k, v, do, algo=algo, layout="striped", **kw)
        with pytest.raises(ctxpar.CtxparError, match="whole chunks"):
            ctxpar.simulate(q, k, v, do, algo=algo, layout="zigzag", **dict(kw, ranks=4))
    with pytest.raises(ValueError, match="reproducible"):
        ctxpar.simulate(q, k, v, do, algo="ring", layout="zigzag", **dict(kw, reproducible=2))


def test_context_methods_take_the_flag():
    """Context.attention / attention_backward directly (2 local ranks, contiguous): the same
    bits as simulate's 1-rank result."""
    from conftest import run_ranks
    prob, base, _ = baseline()
    q, k, v, do, sinks = prob
    kw = dict(algo="allgather", layout="contiguous", sinks=sinks, reproducible=True)

    def rank(ctx):
        local = [ctxpar.shard(x, ctx.rank, 2, "contiguous") for x in (q, k, v, do)]
        n = local[0].shape[1]
        lo = np.empty((1, H, n), np.float32)
        out, lse = ctx.attention(*local[:3], lse_lo=lo, **kw)
        grads = ctx.attention_backward(*local[:3], out, lse, local[3], lse_lo=lo, **kw)
        return out, grads

    results = run_ranks(2, rank)
    for r, (out, (dq, dk, dv, dsinks)) in enumerate(results):
        for name, got in (("out", out), ("dq", dq), ("dk", dk), ("dv", dv)):
            want = ctxpar.shard(base[name], r, 2, "contiguous")
            assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), (r, name)
        assert np.array_equal(dsinks.view(np.uint32), base["dsinks"].view(np.uint32)), r
