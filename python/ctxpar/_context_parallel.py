"""PyTorch's context-parallel API (torch.distributed.tensor.experimental) over ctxpar, for CPU
tensors and a torch.distributed process group (gloo) or a 1-D DeviceMesh:

    with context_parallel(mesh, buffers=(q, k, v), buffer_seq_dims=(2, 2, 2)):
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)   # this rank's shard
    (out,) = context_parallel_unshard(mesh, [out], [2])                  # the whole sequence

The block shards each buffer in place along its sequence dim (the tensor object keeps its
identity; its data becomes this rank's tokens in `layout`'s order, zigzag by default like
PyTorch's head-tail load balancer), and F.scaled_dot_product_attention runs through ctxpar with
autograd. On exit the buffers get their whole data back, except no_restore_buffers and the
buffers that require grad: those keep their shard, so that a backward after the block gives
them this rank's shard of the gradient (unshard it like the output). (PyTorch's own
context_parallel refuses buffers that require grad; autograd cannot put a shard's gradient on
a tensor that has grown back.) On a torch without F.scaled_dot_product_attention (before 2.0)
the block provides it.
"""
import contextlib
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F

from . import _core
from . import _torch_comm

_contexts = {}  # id(process group) -> (group, Context): one ctxpar context per group


def _group_rank_size(mesh):
    group = _torch_comm.process_group(mesh)
    return group, dist.get_rank(group), dist.get_world_size(group)


def _positions(layout, seq, rank, nranks):
    if layout == "custom":
        raise ValueError("layout 'custom' needs an assignment: use ctxpar.shard / ctxpar.torch."
                         "attention for it")
    return torch.as_tensor(_core.positions(layout, seq, rank, nranks))


def context_parallel_shard(mesh, tensors, seq_dims, layout="zigzag"):
    """This rank's tokens of each whole tensor (along its seq dim, in `layout`'s order): a list
    of new tensors."""
    _, rank, nranks = _group_rank_size(mesh)
    return [t.index_select(d, _positions(layout, t.shape[d], rank, nranks))
            for t, d in zip(tensors, _dims(tensors, seq_dims))]


@torch.no_grad()
def context_parallel_unshard(mesh, tensors, seq_dims, layout="zigzag"):
    """Each rank's shard gathered into the whole tensor in global order (collective over the
    group; shards may be uneven): a list of new tensors, detached."""
    group, _, nranks = _group_rank_size(mesh)
    return [_unshard_one(group, nranks, t.detach(), d, layout)
            for t, d in zip(tensors, _dims(tensors, seq_dims))]


def _dims(tensors, seq_dims):
    tensors, seq_dims = list(tensors), list(seq_dims)
    if len(tensors) != len(seq_dims):
        raise ValueError(f"{len(tensors)} tensors and {len(seq_dims)} seq_dims: one dim each")
    return [d % t.dim() for t, d in zip(tensors, seq_dims)]


def _unshard_one(group, nranks, local, dim, layout):
    """All-gather of the shards as bytes (any dtype, any shard length), then each rank's rows
    put at their global positions."""
    rows = local.movedim(dim, 0).contiguous()
    counts = torch.tensor([rows.shape[0]], dtype=torch.int64)
    all_counts = [torch.zeros(1, dtype=torch.int64) for _ in range(nranks)]
    dist.all_gather(all_counts, counts, group=group)
    counts = [int(c) for c in all_counts]
    row_bytes = rows[0].numel() * rows.element_size() if rows.shape[0] else \
        int(torch.tensor(rows.shape[1:]).prod()) * rows.element_size()
    longest = max(counts)
    mine = torch.zeros(longest * row_bytes, dtype=torch.uint8)
    mine[:rows.numel() * rows.element_size()] = rows.reshape(-1).view(torch.uint8)
    parts = [torch.empty_like(mine) for _ in range(nranks)]
    dist.all_gather(parts, mine, group=group)
    seq = sum(counts)
    whole = torch.empty((seq,) + tuple(rows.shape[1:]), dtype=rows.dtype)
    for r, (part, n) in enumerate(zip(parts, counts)):
        shard = part[:n * row_bytes].view(rows.dtype).view((n,) + tuple(rows.shape[1:]))
        whole[_positions(layout, seq, r, nranks)] = shard
    return whole.movedim(0, dim)


def _context(group):
    """This process's ctxpar Context on the group, made once (OpenMP threads: this machine's
    cores shared among torchrun's local processes)."""
    key = id(group)
    if key not in _contexts or _contexts[key][0] is not group:  # an id may be reused
        local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        threads = max(1, (os.cpu_count() or 1) // max(local, 1))
        comm = _core.Comm.torch(group)
        _contexts[key] = (group, _core.Context("cpu", comm, num_threads=threads))
    return _contexts[key][1]


@contextlib.contextmanager
def context_parallel(mesh, *, buffers=None, buffer_seq_dims=None, no_restore_buffers=None,
                     layout="zigzag", reproducible=False):
    """PyTorch's context_parallel with ctxpar's attention (see the module's docstring).

    mesh: a 1-D DeviceMesh, a ProcessGroup, or None (the default group). buffers: tensors
    sharded in place along buffer_seq_dims. no_restore_buffers: a subset of buffers that keep
    their shard after the block. layout: "zigzag", "contiguous" or "striped".
    reproducible=True: the block's attention output and gradients have the same bits for any
    number of ranks and layout; the attention call raises CtxparError where a rank's shard is
    not whole chunks of positions (e.g. zigzag needs S/(2P) a multiple of the chunk).
    """
    buffers = list(buffers or ())
    dims = _dims(buffers, buffer_seq_dims or ())
    keep = list(no_restore_buffers or ())
    if not all(any(b is k for b in buffers) for k in keep):
        raise ValueError("no_restore_buffers must be a subset of buffers")
    _core._choice("layout", _core.LAYOUTS, layout)
    reproducible = bool(_core._flag("reproducible", reproducible))
    group, rank, nranks = _group_rank_size(mesh)
    ctx = _context(group)
    seqs = {b.shape[d] for b, d in zip(buffers, dims)}
    # The whole data of each buffer stays where it is: sharding points the tensor at new
    # memory (set .data: allowed for tensors that require grad, unlike resize_), restoring
    # points it back.
    wholes = [b.data for b in buffers]
    for b, shard in zip(buffers, context_parallel_shard(group, wholes, dims, layout)):
        b.data = shard
    patched = _patch_sdpa(ctx, layout, rank, nranks, seqs, reproducible)
    try:
        yield
    finally:
        patched()
        for b, whole in zip(buffers, wholes):
            if not b.requires_grad and not any(b is k for k in keep):
                b.data = whole


def _patch_sdpa(ctx, layout, rank, nranks, seqs, reproducible=False):
    """Points F.scaled_dot_product_attention at ctxpar on ctx; returns the undo."""
    from . import torch as ctxpar_torch
    had = hasattr(F, "scaled_dot_product_attention")
    before = getattr(F, "scaled_dot_product_attention", None)

    def sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
             enable_gqa=False):
        local = query.shape[-2]
        # The whole sequence's length when the shards may be uneven: the buffers' whose shard
        # this is (0: the library's S/P * P).
        seq = next((s for s in sorted(seqs)
                    if _core.shard_count(layout, s, rank, nranks) == local), 0)
        return ctxpar_torch.scaled_dot_product_attention(
            query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
            scale=scale, enable_gqa=enable_gqa, ctx=ctx, layout=layout, seq_len_global=seq,
            reproducible=reproducible)

    F.scaled_dot_product_attention = sdpa

    def undo():
        if had:
            F.scaled_dot_product_attention = before
        else:
            del F.scaled_dot_product_attention

    return undo
