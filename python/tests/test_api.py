"""Context / local_group use per rank, zero-copy views, the GIL released inside C calls, and
errors: bad arguments raise in Python before any C call, library failures raise CtxparError."""
import pathlib
import threading
import time

import numpy as np
import pytest

import ctxpar
from ctxpar import _lib, _tensor
from conftest import inputs, max_error, run_ranks


def test_context_per_rank_matches_oracle_and_writes_out_in_place():
    P = 2
    q, k, v, do = inputs(s=32, hq=4, hk=2, d=16)
    shards = [{n: ctxpar.shard(x, r, P, "zigzag") for n, x in
               (("q", q), ("k", k), ("v", v), ("do", do))} for r in range(P)]
    outs = [np.full_like(s["q"], np.nan) for s in shards]

    def fn(ctx):
        s = shards[ctx.rank]
        out, lse = ctx.attention(s["q"], s["k"], s["v"], out=outs[ctx.rank], algo="ring",
                                 layout="zigzag", mask="causal")
        assert out is outs[ctx.rank]  # written in place, not copied
        return out, lse, ctx.attention_backward(s["q"], s["k"], s["v"], out, lse, s["do"])

    res = run_ranks(P, fn)
    got = {n: np.empty_like(x) for n, x in (("out", q), ("dq", q), ("dk", k), ("dv", v))}
    for r, (out, lse, (dq, dk, dv)) in enumerate(res):
        for name, local in (("out", out), ("dq", dq), ("dk", dk), ("dv", dv)):
            ctxpar.unshard(local, r, P, got[name], "zigzag")
    ref = ctxpar.oracle(q, k, v, do)
    for name in got:
        assert max_error(got[name], ref[name]) < 4e-6, name


@pytest.mark.parametrize("fmt", ["bshd", "bhsd"])
def test_views_are_zero_copy(fmt):
    """The ctxpar_tensor the C call gets points at the array's own buffer, with its strides."""
    base = np.zeros((2, 8, 3, 16), dtype=np.float32)  # [B, S, H, D]
    x = base if fmt == "bshd" else base.transpose(0, 2, 1, 3)  # a BHSD view of BSHD memory
    assert _tensor.prepare(x, fmt) is x
    t = _tensor.view(x, fmt, "f32")
    assert t.data == base.ctypes.data
    assert list(t.shape) == [2, 8, 3, 16] and list(t.stride) == [384, 48, 16, 1]
    # A strided slice (every other token) is still passed in place.
    sl = base[:, ::2]
    assert _tensor.prepare(sl, "bshd") is sl
    assert _tensor.view(sl, "bshd", "f32").data == base.ctypes.data
    assert list(_tensor.view(sl, "bshd", "f32").stride) == [384, 96, 16, 1]
    # head_dim not contiguous: the input is copied, never passed with a wrong stride.
    nc = base[..., ::2]
    assert _tensor.prepare(nc, "bshd") is not nc


def test_c_call_sees_the_buffer(monkeypatch):
    """Intercepts ctxpar_attn_fwd: q, k, v and out arrive as the callers' own buffers."""
    q, k, v, _ = inputs(s=16, hq=2, hk=2, d=8)
    qb = np.ascontiguousarray(q.transpose(0, 2, 1, 3))  # BHSD memory
    kb, vb = (np.ascontiguousarray(x.transpose(0, 2, 1, 3)) for x in (k, v))
    out = np.empty_like(qb)
    seen = {}
    real = _lib.lib.ctxpar_attn_fwd

    def spy(ctx, params, tq, tk, tv, tout, lse, stream):
        for name, t in (("q", tq), ("k", tk), ("v", tv), ("out", tout)):
            seen[name] = t._obj.data
        return real(ctx, params, tq, tk, tv, tout, lse, stream)

    monkeypatch.setattr(_lib.lib, "ctxpar_attn_fwd", spy)
    with ctxpar.Context("cpu") as ctx:
        ctx.attention(qb, kb, vb, out=out, format="bhsd", mask="none")
    assert seen == {"q": qb.ctypes.data, "k": kb.ctypes.data, "v": vb.ctypes.data,
                    "out": out.ctypes.data}
    ref = ctxpar.oracle(qb, kb, vb, mask="none", format="bhsd")
    assert max_error(out, ref["out"]) < 2e-6


def test_gil_is_released_two_simulations_overlap(monkeypatch):
    """Each C attention call is timed from Python; calls of two simulations in two threads
    overlap in time, which they cannot if a call held the GIL. (simulate's own P > 1 ranks,
    which wait for each other inside C, already need this.)"""
    calls = []
    real = _lib.lib.ctxpar_attn_fwd

    def timed(*args):
        t0 = time.perf_counter()
        st = real(*args)
        calls.append((threading.current_thread().name, t0, time.perf_counter()))
        return st

    monkeypatch.setattr(_lib.lib, "ctxpar_attn_fwd", timed)
    q, k, v, _ = inputs(s=1024, hq=4, hk=4, d=64, dout=False)
    errors = []

    def sim():
        try:
            ctxpar.simulate(q, k, v, ranks=1, mask="none", num_threads=1)
        except Exception as e:
            errors.append(e)

    threads = [threading.Thread(target=sim) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    (_, a0, a1), (_, b0, b1) = calls
    assert a0 < b1 and b0 < a1, f"no overlap: {calls}"


def test_bad_inputs_raise_before_any_c_call(monkeypatch):
    def forbidden(*args):
        raise AssertionError("C was called")

    monkeypatch.setattr(_lib.lib, "ctxpar_attn_fwd", forbidden)
    q, k, v, _ = inputs(s=16, hq=4, hk=2, d=8)
    with ctxpar.Context("cpu") as ctx:
        with pytest.raises(ValueError, match="4-D"):
            ctx.attention(q[0], k, v)
        with pytest.raises(ValueError, match="head_dim|multiple"):
            ctx.attention(q, k[..., :4], v[..., :4])
        with pytest.raises(ValueError, match="multiple"):
            ctx.attention(q[:, :, :3], k, v)
        with pytest.raises(ValueError, match="expected f32"):
            ctx.attention(q, k.astype(np.float16), v)
        with pytest.raises(ValueError, match="float64 is not supported"):
            ctx.attention(q.astype(np.float64), k, v)
        with pytest.raises(ValueError, match="algo 'rings'"):
            ctx.attention(q, k, v, algo="rings")
        with pytest.raises(ValueError, match="mask"):
            ctx.attention(q, k, v, mask="sliding")
        with pytest.raises(ValueError, match="format"):
            ctx.attention(q, k, v, format="sbhd")
        with pytest.raises(ValueError, match="out shape"):
            ctx.attention(q, k, v, out=np.empty((1, 16, 2, 8), np.float32))
        with pytest.raises(TypeError):
            ctx.attention(q.tolist(), k, v)
    with pytest.raises(ValueError, match="ranks"):
        ctxpar.simulate(q, k, v, ranks=0)
    with pytest.raises(TypeError, match="device"):
        ctxpar.Context(0)


def test_devices_by_name():
    names = [name for name, _ in ctxpar.devices()]
    assert names[0] == "cpu"
    with ctxpar.Context("cpu", num_threads=1) as ctx:
        assert ctx.size == 1
    # A name the registry does not hold: the library's error lists the names there are.
    with pytest.raises(ctxpar.CtxparError) as e:
        ctxpar.Context("tpu")
    assert e.value.name == "CTXPAR_ERR_NOT_SUPPORTED"
    assert "'tpu'" in str(e.value) and "cpu" in str(e.value)


def test_algorithm_names_come_from_the_library():
    from ctxpar._core import ALGOS
    assert ALGOS["auto"] == 0
    assert {"ring", "allgather", "alltoall", "hybrid"} <= set(ALGOS)
    assert sorted(ALGOS.values()) == list(range(len(ALGOS))), "the table's values, no gap"


def test_comms_by_name():
    kinds = ctxpar.comms()
    assert kinds[0][0] == "local" and kinds[0][1]
    assert len({name for name, _ in kinds}) == len(kinds)


def test_library_errors_carry_status_and_message():
    q, k, v, _ = inputs(s=48, hq=4, hk=2, d=8)
    # All-to-all re-shards the query heads: 4 cannot be split over 3 ranks. Only C knows that.
    with pytest.raises(ctxpar.CtxparError) as e:
        ctxpar.simulate(q, k, v, ranks=3, algo="alltoall", layout="contiguous", num_threads=1)
    assert e.value.status == -1 and e.value.name == "CTXPAR_ERR_INVALID_ARG"
    assert "divide by the ranks (3)" in e.value.message and e.value.name in str(e.value)
    with pytest.raises(ctxpar.CtxparError) as e:
        ctxpar.simulate(q, k, v, ranks=2, cu_seqlens=[0, 5, 3, 48], num_threads=1)
    assert e.value.name == "CTXPAR_ERR_INVALID_ARG" and "cu_seqlens" in e.value.message
    with pytest.raises(ctxpar.CtxparError) as e:
        ctxpar.positions("zigzag", 0, 0, 4)
    assert e.value.name == "CTXPAR_ERR_INVALID_ARG"


def test_one_rank_of_several_alone_is_told_every_rank_must_call():
    # The README's Context snippet run as one program: rank 0 of a group of 2, with nobody for
    # rank 1. The timeout says what to do, and how many ranks came.
    q, k, v, _ = inputs(s=32, hq=2, hk=2, d=8)
    comm = ctxpar.local_group(2).comm(0)
    comm.set_timeout(0.3)
    with ctxpar.Context("cpu", comm) as ctx:
        with pytest.raises(ctxpar.CtxparError) as e:
            ctx.attention(ctxpar.shard(q, 0, 2, "zigzag"), ctxpar.shard(k, 0, 2, "zigzag"),
                          ctxpar.shard(v, 0, 2, "zigzag"), layout="zigzag", mask="causal")
    assert e.value.name == "CTXPAR_ERR_TIMEOUT"
    assert "1 of 2 ranks made this call" in e.value.message, e.value.message
    assert "every rank of the comm must make the same calls" in e.value.message


def test_uneven_lengths_shard_and_match_one_rank():
    # 15 tokens on 4 ranks (zigzag: 2P = 8 chunks): shards of 4, 4, 4, 3 tokens, none padded.
    assert [len(ctxpar.positions("zigzag", 15, r, 4)) for r in range(4)] == [4, 4, 4, 3]
    assert len(ctxpar.positions("contiguous", 3, 3, 4)) == 0
    q, k, v, _ = inputs(s=15, hq=4, hk=2, d=8)
    one = ctxpar.simulate(q, k, v, ranks=1, mask="causal", num_threads=1)
    four = ctxpar.simulate(q, k, v, ranks=4, mask="causal", layout="zigzag", num_threads=1)
    assert max_error(four["out"], one["out"]) < 1e-5


def test_version_matches_the_package_metadata():
    pyproject = pathlib.Path(__file__).resolve().parents[1] / "pyproject.toml"
    if not pyproject.exists():
        pytest.skip("skipped: python/pyproject.toml not next to the tests")
    assert f'version = "{ctxpar.version()}"' in pyproject.read_text()
