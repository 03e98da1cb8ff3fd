"""PyTorch front: ctxpar attention as an autograd Function, a drop-in for
torch.nn.functional.scaled_dot_product_attention, and PyTorch's context_parallel API (CPU
tensors, F32/F16/BF16; float64 computed in float32, see F64_NOTE).

    out = ctxpar.torch.attention(q, k, v, ctx=ctx, mask="causal", layout="zigzag")  # BSHD
    out = ctxpar.torch.scaled_dot_product_attention(q, k, v, is_causal=True, ctx=ctx)  # BHSD
    with ctxpar.torch.context_parallel(mesh_or_group, buffers=(q, k, v),
                                       buffer_seq_dims=(2, 2, 2)):
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # through ctxpar

ctx: a ctxpar.Context holding this rank's comm; each rank passes its local shard. Without ctx,
one rank (the whole sequence) on a per-thread default context.
"""
import threading
import warnings

import torch

from . import _tensor as T
from ._context_parallel import (context_parallel, context_parallel_shard,
                                context_parallel_unshard)
from ._core import Context

__all__ = ["Attention", "attention", "context_parallel", "context_parallel_shard",
           "context_parallel_unshard", "scaled_dot_product_attention", "F64_NOTE"]

_default = threading.local()


def _default_context(like):
    """This thread's one-rank context for like's device type ("cpu" or "cuda")."""
    kind = like.device.type
    contexts = _default.__dict__.setdefault("contexts", {})
    if kind not in contexts:
        contexts[kind] = Context(kind)
    return contexts[kind]


def _bshd(x, fmt):
    return x if fmt == "bshd" else x.transpose(1, 2)


def _local_dsinks(sinks, out, dout, lse, lse_lo, fmt):
    """This rank's share of the sinks' gradient, -sum over its rows of e^(sink - lse) rowsum(dO o
    O) (docs/numerics.md), in float64. The library's dsinks is the sum over every rank's rows, on
    every rank; autograd adds each use of a parameter, and trainers sum (or average) gradients
    over the context-parallel group as for every weight, so each rank returns its own rows'."""
    delta = (_bshd(dout, fmt).double() * _bshd(out, fmt).double()).sum(-1)  # [B, S, H]
    lse64 = (lse.double() + lse_lo.double()).transpose(1, 2)  # [B, S, H]
    p_sink = torch.exp(sinks.detach().double() - lse64)
    return -(p_sink * delta).sum((0, 1)).to(sinks.dtype)


class Attention(torch.autograd.Function):
    """forward(q, k, v, sinks, ctx, options) -> out; backward through ctxpar_attn_bwd. sinks may
    be None; its gradient is this rank's share (see _local_dsinks)."""

    @staticmethod
    def forward(fctx, q, k, v, sinks, ctx, options):
        T.check_format(options["format"])
        b, s, hq, _ = T.bshd_shape(q, options["format"])
        # The backward reads the LSE as lse + lse_lo.
        lse_lo = torch.empty((b, hq, s), dtype=torch.float32, device=q.device)
        out, lse = ctx.attention(q, k, v, sinks=sinks, lse_lo=lse_lo, **options)
        # The inputs are kept as detached aliases of their memory, not through
        # save_for_backward: context_parallel points its buffers at other memory (.data) when
        # its block ends, before the backward; the aliases keep the shards. The version check
        # that save_for_backward would make is made in backward.
        fctx.inputs = tuple(None if x is None else x.detach() for x in (q, k, v, sinks))
        fctx.versions = tuple(None if x is None else x._version for x in fctx.inputs)
        fctx.save_for_backward(out, lse, lse_lo)
        fctx.ctx, fctx.options = ctx, options
        return out

    @staticmethod
    def backward(fctx, dout):
        out, lse, lse_lo = fctx.saved_tensors
        q, k, v, sinks = fctx.inputs
        for x, version, name in zip(fctx.inputs, fctx.versions, ("q", "k", "v", "sinks")):
            if x is not None and x._version != version:
                raise RuntimeError(f"ctxpar attention: {name} was modified in place after the "
                                   "forward; its backward needs the values it was called with")
        grads = fctx.ctx.attention_backward(q, k, v, out, lse, dout, sinks=sinks, lse_lo=lse_lo,
                                            **fctx.options)
        dsinks = None
        if sinks is not None and fctx.needs_input_grad[3]:
            dsinks = _local_dsinks(sinks, out, dout, lse, lse_lo, fctx.options["format"])
        return grads[0], grads[1], grads[2], dsinks, None, None


def attention(q, k, v, *, ctx=None, algo="ring", layout="zigzag", mask="causal", window=0,
              cu_seqlens=None, scale=None, seq_len_global=0, assignment=None, ulysses=0,
              sinks=None, softcap=0.0, format="bshd", reproducible=False):
    """Context-parallel attention of this rank's shard, differentiable in q, k, v and sinks.

    The options are Context.attention's: window W or (left, right); layout "custom" with
    assignment (the rank of each global token); algo "hybrid" with ulysses; softcap C > 0;
    seq_len_global for uneven shards. sinks: a float32 tensor [Hq] (one logit per query head,
    added once to every row's softmax denominator); its gradient is the sum over this rank's
    rows only, so that summing gradients over the ranks (autograd across in-process ranks, or
    the trainer's all-reduce over the context-parallel group) gives the whole gradient once.
    reproducible=True: the output and q, k, v's gradients have the same bits for any number of
    ranks, layout and algorithm (the sinks' per-rank share is not covered); refused
    (CtxparError) with "hybrid" and for ring/allgather shards that are not whole chunks.
    """
    if sinks is not None and not isinstance(sinks, torch.Tensor):
        sinks = torch.as_tensor(sinks, dtype=torch.float32)
    if q.dtype == torch.float64:
        return _in_float32(attention, q, k, v, ctx=ctx, algo=algo, layout=layout, mask=mask,
                           window=window, cu_seqlens=cu_seqlens, scale=scale,
                           seq_len_global=seq_len_global, assignment=assignment,
                           ulysses=ulysses, sinks=sinks, softcap=softcap, format=format,
                           reproducible=reproducible)
    options = dict(algo=algo, layout=layout, mask=mask, window=window, cu_seqlens=cu_seqlens,
                   scale=scale, seq_len_global=seq_len_global, assignment=assignment,
                   ulysses=ulysses, softcap=softcap, format=format, reproducible=reproducible)
    return Attention.apply(q, k, v, sinks, ctx if ctx is not None else _default_context(q),
                           options)


F64_NOTE = T.F64_NOTE


def _in_float32(fn, q, k, v, **kw):
    """fn on float32 copies of float64 q, k, v, its result back in float64; autograd carries the
    casts (the gradients come back as float64 too). Warns (F64_NOTE), once per call site."""
    warnings.warn(F64_NOTE, stacklevel=3)
    return fn(q.float(), k.float(), v.float(), **kw).double()


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                                 is_causal=False, scale=None, enable_gqa=False, *, ctx=None,
                                 algo="ring", layout="zigzag", seq_len_global=0,
                                 reproducible=False):
    """F.scaled_dot_product_attention's signature over ctxpar: [B, H, S, D] tensors (non-causal
    unless is_causal, as PyTorch's). float64 is computed in float32 (F64_NOTE). reproducible:
    as in attention() (the same bits for any ranks, layout and algorithm; "hybrid" refused)."""
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
                     mask="causal" if is_causal else "none", scale=scale,
                     seq_len_global=seq_len_global, format="bhsd", reproducible=reproducible)
