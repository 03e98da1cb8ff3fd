"""ctxpar.torch against torch.nn.functional.scaled_dot_product_attention in float64, forward and
gradients; run when torch is importable, reported as skipped otherwise."""
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="skipped: torch is not installed")

import ctxpar  # noqa: E402
import ctxpar.torch  # noqa: E402
from ctxpar import _tensor  # noqa: E402
from conftest import max_error, require_tool, run_ranks  # noqa: E402

TOL = {torch.float32: 4e-6, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def bhsd_inputs(b, h, hk, s, d, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    mk = lambda heads: torch.randn(b, heads, s, d, generator=g).to(dtype)  # noqa: E731
    return mk(h), mk(hk), mk(hk), mk(h)


def sdpa64(q, k, v, dout, causal):
    """SDPA's result in float64 on the same (rounded) [B, H, S, D] inputs, out and gradients:
    attention64 written out in torch ops (torch 1.13, Debian's, has no
    F.scaled_dot_product_attention)."""
    q, k, v = (x.detach().double().requires_grad_() for x in (q, k, v))
    t = lambda x: x.transpose(1, 2)  # noqa: E731
    out = t(attention64(t(q), t(k), t(v), causal=causal))
    out.backward(dout.double())
    return out.detach(), q.grad, k.grad, v.grad


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("causal,hk", [(True, 4), (False, 2), (True, 1)])
def test_sdpa_drop_in_one_rank(dtype, causal, hk):
    q, k, v, do = bhsd_inputs(2, 4, hk, 48, 16, dtype)
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    out = ctxpar.torch.scaled_dot_product_attention(*leaves, is_causal=causal, enable_gqa=True)
    assert out.dtype == dtype and out.shape == q.shape
    out.backward(do)
    ref = sdpa64(q, k, v, do, causal)
    for got, want, name in zip([out] + [x.grad for x in leaves], ref, "o q k v".split()):
        assert max_error(got.detach().double().numpy(), want.numpy()) <= TOL[dtype], name


def sharded_autograd(q, k, v, do, P, causal, fmt="bshd"):
    """ctxpar.torch.attention on P threads (zigzag shards): global out, dq, dk, dv."""
    got = {n: torch.empty_like(x) for n, x in (("out", q), ("dq", q), ("dk", k), ("dv", v))}

    def rank(ctx):
        r = ctx.rank
        local = [ctxpar.shard(x, r, P, "zigzag", fmt).detach().requires_grad_()
                 for x in (q, k, v)]
        out = ctxpar.torch.attention(*local, ctx=ctx, algo="ring", layout="zigzag",
                                     mask="causal" if causal else "none", format=fmt)
        out.backward(ctxpar.shard(do, r, P, "zigzag", fmt))
        for name, t in zip(("out", "dq", "dk", "dv"), [out] + [x.grad for x in local]):
            ctxpar.unshard(t.detach(), r, P, got[name], "zigzag", fmt)

    run_ranks(P, rank)
    return got


def test_autograd_two_ranks_bshd_gqa():
    q, k, v, do = (x.transpose(1, 2).contiguous()
                   for x in bhsd_inputs(1, 4, 2, 64, 16, torch.float32, seed=3))
    got = sharded_autograd(q, k, v, do, 2, causal=True)
    t = lambda x: x.transpose(1, 2)  # noqa: E731
    ref = sdpa64(t(q), t(k), t(v), t(do), True)
    for name, want in zip(("out", "dq", "dk", "dv"), ref):
        assert max_error(got[name].numpy(), t(want).numpy()) <= 4e-6, name


def test_seed_example_bf16_seq4096_two_ranks():
    """The seed's example: batch 1, 4 heads, seq 4096, head_dim 64, BF16, causal, forward and
    backward, 2 ranks; against float64 SDPA on the same BF16 inputs."""
    q, k, v, do = bhsd_inputs(1, 4, 4, 4096, 64, torch.bfloat16, seed=7)
    got = sharded_autograd(q, k, v, do, 2, causal=True, fmt="bhsd")
    ref = sdpa64(q, k, v, do, True)
    errors = {n: max_error(got[n].double().numpy(), want.numpy())
              for n, want in zip(("out", "dq", "dk", "dv"), ref)}
    print("seed example: max error relative to max |fp64|:",
          {n: f"{e:.2e}" for n, e in errors.items()})
    assert all(e <= TOL[torch.bfloat16] for e in errors.values()), errors


def test_torch_views_are_zero_copy():
    x = torch.randn(2, 8, 3, 16)  # BSHD memory, seen as BHSD
    bhsd = x.transpose(1, 2)
    t = _tensor.view(_tensor.prepare(bhsd, "bhsd"), "bhsd", "f32")
    assert t.data == x.data_ptr() and list(t.stride) == list(x.stride())


def test_sdpa_rejects_what_it_cannot_do():
    q, k, v, _ = bhsd_inputs(1, 4, 2, 16, 8, torch.float32)
    with pytest.raises(ValueError, match="enable_gqa"):
        ctxpar.torch.scaled_dot_product_attention(q, k, v)
    with pytest.raises(ValueError, match="attn_mask"):
        ctxpar.torch.scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(16, 16))
    with pytest.raises(ValueError, match="dropout"):
        ctxpar.torch.scaled_dot_product_attention(q, k, v, dropout_p=0.1, enable_gqa=True)


def test_float64_computed_in_float32_with_a_note():
    """float64 tensors (non-causal SDPA, GQA) come back as float64, gradients too, with
    float32 accuracy against float64 SDPA, and a warning that says so."""
    q, k, v, do = (x.double() for x in bhsd_inputs(1, 4, 2, 40, 8, torch.float32, seed=4))
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    with pytest.warns(UserWarning, match="float64 inputs in float32"):
        out = ctxpar.torch.scaled_dot_product_attention(*leaves, enable_gqa=True)
    out.backward(do)
    assert out.dtype == torch.float64 and all(x.grad.dtype == torch.float64 for x in leaves)
    ref = sdpa64(q, k, v, do, False)
    for got, want, name in zip([out] + [x.grad for x in leaves], ref, "o q k v".split()):
        assert max_error(got.detach().numpy(), want.numpy()) <= 4e-6, name


def test_simulate_takes_torch_tensors():
    q, k, v, do = (x.transpose(1, 2).contiguous()
                   for x in bhsd_inputs(1, 4, 4, 32, 8, torch.float32, seed=1))
    res = ctxpar.simulate(q, k, v, do, ranks=2, num_threads=1)
    assert all(isinstance(x, torch.Tensor) for x in res.values())
    ref = ctxpar.oracle(q, k, v, do)
    for name in ("out", "lse", "dq", "dk", "dv"):
        assert max_error(res[name].numpy(), ref[name]) <= 4e-6, name
    assert np.isfinite(res["lse"].numpy()).all()


def test_audit_takes_torch_tensors_bf16_bhsd():
    """ctxpar.audit on torch BF16 [B, H, S, D] tensors: float64 SDPA rounded to BF16 is
    consistent; dV with rank 1's rows halved (zigzag, 2 ranks) is not, and names rank 1."""
    require_tool()
    q, k, v, do = bhsd_inputs(1, 4, 2, 64, 16, torch.bfloat16, seed=9)
    out, dq, dk, dv = (x.to(torch.bfloat16) for x in sdpa64(q, k, v, do, True))
    rep = ctxpar.audit(q, k, v, do, out=out, dq=dq, dk=dk, dv=dv, ranks=2, format="bhsd")
    assert rep.consistent, str(rep)
    pos = torch.as_tensor(ctxpar.positions("zigzag", 64, 1, 2))
    bad = dv.clone()
    bad[:, :, pos] *= 0.5
    rep = ctxpar.audit(q, k, v, do, out=out, dq=dq, dk=dk, dv=bad, ranks=2, format="bhsd")
    assert not rep.consistent and rep.tensors["out"].consistent
    assert rep.tensors["dv"].worst.rank == 1
    assert rep.tensors["dv"].error_by_rank[0] <= 2 * rep.tensors["dv"].reference_error


def attention64(q, k, v, *, causal, window=(0, 0), sinks=None, softcap=0.0):
    """Attention written out in float64 torch ops (BSHD, GQA by repeating K/V heads), with the
    features ctxpar.torch.attention takes; autograd gives the reference gradients."""
    scale = 1.0 / np.sqrt(np.float32(q.shape[-1]))
    group = q.shape[2] // k.shape[2]
    kk, vv = (x.repeat_interleave(group, dim=2) for x in (k, v))
    s = torch.einsum("bqhd,bkhd->bhqk", q, kk) * float(np.float32(scale))
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    i = torch.arange(q.shape[1])[:, None]
    j = torch.arange(k.shape[1])[None, :]
    visible = torch.ones(q.shape[1], k.shape[1], dtype=torch.bool)
    if causal:
        visible &= j <= i
    if window[0]:
        visible &= i - j < window[0]
    if window[1]:
        visible &= j - i <= window[1]
    s = s.masked_fill(~visible, float("-inf"))
    if sinks is not None:
        s = torch.cat([s, sinks.view(1, -1, 1, 1).expand(*s.shape[:3], 1)], dim=-1)
    p = torch.softmax(s, dim=-1)[..., :k.shape[1]]
    return torch.einsum("bhqk,bkhd->bqhd", p, vv)


@pytest.mark.parametrize("layout,P,causal,window,softcap", [
    ("custom", 3, True, (0, 0), 0.0),
    ("zigzag", 3, False, (9, 5), 0.0),
    ("contiguous", 4, True, (0, 0), 30.0),
])
def test_autograd_features_sinks_local_gradient(layout, P, causal, window, softcap):
    """Uneven shards (S = 41), MLA (v's head_dim 8 beside 16), GQA, sinks with their gradient,
    soft-capping, a two-sided window and a custom assignment (in which rank 2 holds no token: its
    tensors are empty, and torch gives them the address 0) through ctxpar.torch.attention on P
    in-process ranks, against attention64. Each rank's sinks.grad is its own rows' share: their
    sum is the whole gradient."""
    S, HQ, HK, D, DV = 41, 4, 2, 16, 8
    g = torch.Generator().manual_seed(11)
    q, k = torch.randn(1, S, HQ, D, generator=g), torch.randn(1, S, HK, D, generator=g)
    v, do = torch.randn(1, S, HK, DV, generator=g), torch.randn(1, S, HQ, DV, generator=g)
    sinks = torch.tensor([0.5, -1.0, 2.0, 0.0])
    assignment = [(t * t + 3 * t) % 5 % P for t in range(S)] if layout == "custom" else None
    got = {n: torch.zeros_like(x) for n, x in (("out", do), ("dq", q), ("dk", k), ("dv", v))}
    shares = [None] * P

    def rank(ctx):
        r = ctx.rank
        local = [ctxpar.shard(x, r, P, layout, assignment=assignment).requires_grad_()
                 for x in (q, k, v)]
        sk = sinks.clone().requires_grad_()
        out = ctxpar.torch.attention(*local, ctx=ctx, algo="ring", layout=layout,
                                     mask="causal" if causal else "none", window=window,
                                     seq_len_global=S, assignment=assignment, sinks=sk,
                                     softcap=softcap)
        out.backward(ctxpar.shard(do, r, P, layout, assignment=assignment))
        for name, t in zip(("out", "dq", "dk", "dv"), [out] + [x.grad for x in local]):
            ctxpar.unshard(t.detach(), r, P, got[name], layout, assignment=assignment)
        shares[r] = sk.grad

    run_ranks(P, rank)
    leaves = [x.double().requires_grad_() for x in (q, k, v, sinks)]
    out64 = attention64(*leaves[:3], causal=causal, window=window, sinks=leaves[3],
                        softcap=softcap)
    out64.backward(do.double())
    ref = {"out": out64.detach(), "dq": leaves[0].grad, "dk": leaves[1].grad,
           "dv": leaves[2].grad, "dsinks": leaves[3].grad}
    got["dsinks"] = sum(shares)
    for name, want in ref.items():
        assert max_error(got[name].numpy(), want.numpy()) <= 4e-6, name
    # A share is not the whole: the ranks' rows split the gradient.
    assert all(float((s - ref["dsinks"]).abs().max()) > 1e-3 for s in shares)


def test_autograd_sinks_one_rank_and_no_grad():
    """One rank: sinks.grad is the whole gradient; sinks that need no gradient get none (and
    a list of floats is accepted)."""
    q, k, v, do = (x.transpose(1, 2).contiguous()
                   for x in bhsd_inputs(2, 2, 2, 24, 8, torch.float32, seed=5))
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    sk = torch.tensor([1.0, -0.5], requires_grad=True)
    ctxpar.torch.attention(*leaves, sinks=sk).backward(do)
    ref = [x.double().requires_grad_() for x in (q, k, v, sk.detach())]
    attention64(*ref[:3], causal=True, sinks=ref[3]).backward(do.double())
    assert max_error(sk.grad.numpy(), ref[3].grad.numpy()) <= 4e-6
    for x, r in zip(leaves, ref):
        assert max_error(x.grad.numpy(), r.grad.numpy()) <= 4e-6
    out = ctxpar.torch.attention(q, k, v, sinks=[1.0, -0.5])
    ref_out = attention64(q.double(), k.double(), v.double(), causal=True,
                          sinks=torch.tensor([1.0, -0.5], dtype=torch.float64))
    assert max_error(out.numpy(), ref_out.numpy()) <= 4e-6


def test_cuda_tensors_through_the_cuda_device():
    """Context("cuda") on torch CUDA tensors (torch's current stream): the SDPA drop-in
    forward and backward, GQA, BF16 and F32, against float64 attention on the same inputs.
    Needs a GPU and a ctxpar built with CUDA."""
    if not torch.cuda.is_available():
        pytest.skip("skipped: no CUDA device (torch.cuda.is_available() is False)")
    try:
        ctx = ctxpar.Context("cuda")
    except (ValueError, ctxpar.CtxparError) as e:
        pytest.skip(f"skipped: ctxpar's CUDA device is not usable here ({e})")
    for dtype in (torch.float32, torch.bfloat16):
        q, k, v, do = bhsd_inputs(1, 4, 2, 128, 64, dtype, seed=6)
        leaves = [x.cuda().requires_grad_() for x in (q, k, v)]
        out = ctxpar.torch.scaled_dot_product_attention(*leaves, is_causal=True,
                                                        enable_gqa=True, ctx=ctx)
        out.backward(do.cuda())
        assert out.device.type == "cuda"
        ref = sdpa64(q, k, v, do, True)
        for got, want, name in zip([out] + [x.grad for x in leaves], ref, "o q k v".split()):
            assert max_error(got.detach().double().cpu().numpy(), want.numpy()) <= \
                TOL[dtype], (dtype, name)


def test_cuda_device_without_a_gpu_is_a_clear_error():
    """Where there is no GPU, Context("cuda") raises a ctxpar error naming why (no
    libctxpar_cuda.so, or the CUDA error), and CPU tensors given to a CPU context on a CUDA
    tensor's path are refused in Python."""
    if torch.cuda.is_available():
        pytest.skip("skipped: this machine has a GPU (the test above runs instead)")
    with pytest.raises((ValueError, ctxpar.CtxparError), match="cuda|CUDA"):
        ctxpar.Context("cuda")
    with pytest.raises(TypeError, match="torch CUDA tensors"):
        _tensor.prepare(np.zeros((1, 2, 2, 4), np.float32), "bshd", "cuda")
