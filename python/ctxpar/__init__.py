"""ctxpar: context-parallel attention from Python (ctypes over libctxpar.so).

    simulate(q, k, v, dout=None, *, ranks, ...)  P ranks as threads; results in global order
    oracle(q, k, v, dout=None, ...)              full attention in float64 (NumPy)
    Context(device="cpu", comm=...)              one rank of a real distributed program:
        comm = local_group(P).comm(rank), or an mpi4py communicator
        ctx.attention(q, k, v, ...), ctx.attention_backward(...)
    ctxpar.torch                                 autograd Function and an SDPA drop-in

libctxpar.so is found through $CTXPAR_LIBRARY, else relative to this package in an installed
prefix (PREFIX/lib), else through the dynamic loader's search path.
"""
from ._core import Comm, Context, LocalGroup, local_group, positions, shard, simulate, unshard
from ._lib import CtxparError, library_path, version
from ._oracle import oracle

__all__ = ["Comm", "Context", "CtxparError", "LocalGroup", "library_path", "local_group",
           "oracle", "positions", "shard", "simulate", "unshard", "version"]
