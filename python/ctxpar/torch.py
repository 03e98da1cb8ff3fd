"""PyTorch front: ctxpar attention as an autograd Function, and a drop-in for
torch.nn.functional.scaled_dot_product_attention (CPU tensors, F32/F16/BF16).

    out = ctxpar.torch.attention(q, k, v, ctx=ctx, mask="causal", layout="zigzag")  # BSHD
    out = ctxpar.torch.scaled_dot_product_attention(q, k, v, is_causal=True, ctx=ctx)  # BHSD

ctx: a ctxpar.Context holding this rank's comm; each rank passes its local shard. Without ctx,
one rank (the whole sequence) on a per-thread default context.
"""
import threading

import torch

from ._core import Context

_default = threading.local()


def _default_context():
    if getattr(_default, "ctx", None) is None:
        _default.ctx = Context("cpu")
    return _default.ctx


class Attention(torch.autograd.Function):
    """forward(q, k, v, ctx, options) -> out; backward through ctxpar_attn_bwd."""

    @staticmethod
    def forward(fctx, q, k, v, ctx, options):
        out, lse = ctx.attention(q, k, v, **options)
        fctx.save_for_backward(q, k, v, out, lse)
        fctx.ctx, fctx.options = ctx, options
        return out

    @staticmethod
    def backward(fctx, dout):
        q, k, v, out, lse = fctx.saved_tensors
        dq, dk, dv = fctx.ctx.attention_backward(q, k, v, out, lse, dout, **fctx.options)
        return dq, dk, dv, None, None


def attention(q, k, v, *, ctx=None, algo="ring", layout="zigzag", mask="causal", window=0,
              cu_seqlens=None, scale=None, seq_len_global=0, format="bshd"):
    """Context-parallel attention of this rank's shard, differentiable in q, k and v."""
    options = dict(algo=algo, layout=layout, mask=mask, window=window, cu_seqlens=cu_seqlens,
                   scale=scale, seq_len_global=seq_len_global, format=format)
    return Attention.apply(q, k, v, ctx if ctx is not None else _default_context(), options)


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                                 is_causal=False, scale=None, enable_gqa=False, *, ctx=None,
                                 algo="ring", layout="zigzag"):
    """F.scaled_dot_product_attention's signature over ctxpar: [B, H, S, D] tensors."""
    if attn_mask is not None:
        raise ValueError("attn_mask is not supported: ctxpar masks are is_causal, windows and "
                         "documents (ctxpar.torch.attention)")
    if dropout_p != 0.0:
        raise ValueError(f"dropout_p ({dropout_p}) is not supported: ctxpar has no dropout")
    if query.dim() != 4 or key.dim() != 4:
        raise ValueError("query, key and value must be 4-D [batch, heads, seq, head_dim]")
    if query.shape[1] != key.shape[1] and not enable_gqa:
        raise ValueError(f"query has {query.shape[1]} heads and key {key.shape[1]}: pass "
                         "enable_gqa=True for grouped-query attention")
    return attention(query, key, value, ctx=ctx, algo=algo, layout=layout,
                     mask="causal" if is_causal else "none", scale=scale, format="bhsd")
