"""ctxpar: context-parallel attention from Python (ctypes over libctxpar.so).

    simulate(q, k, v, dout=None, *, ranks, ...)  P ranks as threads; results in global order
    oracle(q, k, v, dout=None, ...)              full attention in float64 (NumPy)
    audit(q, k, v, dout, out=..., lse=..., ranks=P, ...)
                                                 judges another implementation's results
                                                 (through the ctxpar tool's audit --against)
    devices()                                    the device names this process can create
    comms()                                      the comm kinds the library knows by name
    Context(device="cpu", comm=...)              one rank of a real distributed program:
        comm = local_group(P).comm(rank), an mpi4py communicator, or a torch.distributed
        ProcessGroup / DeviceMesh; device "cuda": torch CUDA tensors
        ctx.attention(q, k, v, ...), ctx.attention_backward(...)
    positions/shard_count/shard/unshard(...)     a layout's tokens per rank (uneven, custom)
    ctxpar.torch                                 autograd Function, an SDPA drop-in, and
                                                 PyTorch's context_parallel API

libctxpar.so is found through $CTXPAR_LIBRARY, else relative to this package in an installed
prefix (PREFIX/lib), else through the dynamic loader's search path.
"""
from ._audit import (AuditError, AuditReport, AuditRow, FailingRange, TensorVerdict, audit,
                     tool_path)
from ._core import (Comm, Context, LocalGroup, comms, devices, local_group, positions, shard,
                    shard_count, simulate, unshard)
from ._lib import CtxparError, library_path, version
from ._oracle import oracle

__all__ = ["AuditError", "AuditReport", "AuditRow", "Comm", "Context", "CtxparError", "FailingRange",
           "LocalGroup", "comms", "devices", "TensorVerdict", "audit", "library_path", "local_group", "oracle",
           "positions", "shard", "shard_count", "simulate", "tool_path", "unshard", "version"]
