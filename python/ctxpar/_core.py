"""Contexts, local groups and simulate(): attention through libctxpar.so."""
import contextlib
import ctypes
import os
import threading
import warnings

import numpy as np

from . import _cuda
from . import _lib
from . import _tensor as T


def _algorithms():
    """{name: ctxpar_algo value}: "auto" and every entry of the library's table, by asking it
    (ctxpar_algo_name answers "?" past the last one)."""
    table, algo = {"auto": 0}, 1
    while (name := _lib.lib.ctxpar_algo_name(algo).decode()) != "?":
        table[name] = algo
        algo += 1
    return table


ALGOS = _algorithms()
LAYOUTS = {"contiguous": 0, "zigzag": 1, "striped": 2, "custom": 3}
MASKS = {"none": 0, "causal": 1}
_INT32 = np.iinfo(np.int32)


def _choice(kind, table, value):
    if value not in table:
        raise ValueError(f"{kind} '{value}' is not one of {sorted(table)}")
    return table[value]


def _host_array(x):
    """A NumPy view (or copy) of an array, list or CPU torch tensor."""
    if T.is_torch(x):
        return x.detach().to("cpu").numpy()
    return np.asarray(x)


def _int32_buffer(name, values):
    """values as a dense int32 array; ValueError for non-integers or values outside int32."""
    a = _host_array(values)
    if a.size and not np.issubdtype(a.dtype, np.integer):
        raise ValueError(f"{name} must hold integers, got {a.dtype}")
    if a.size and (a.min() < _INT32.min or a.max() > _INT32.max):
        raise ValueError(f"{name} has values outside int32")
    return np.ascontiguousarray(a, dtype=np.int32)


def _assignment(layout, assignment, seq_global):
    """The int32 buffer of a custom layout (None for the built-in layouts). The library reads
    seq_global entries, so the length is checked here."""
    if layout == "custom":
        if assignment is None:
            raise ValueError("layout 'custom' needs assignment (the rank of each global token)")
        a = _int32_buffer("assignment", assignment)
        if a.ndim != 1 or a.shape[0] != int(seq_global):
            raise ValueError(f"assignment shape {a.shape}: expected [{int(seq_global)}], one rank "
                             "per global token")
        return a
    if assignment is not None:
        raise ValueError(f"assignment is only for layout 'custom', not '{layout}'")
    return None


def _flag(name, value):
    """A 0/1 parameter from a bool (or 0/1); anything else is a ValueError here, not a bit
    pattern the library would read."""
    if isinstance(value, (bool, np.bool_)) or value in (0, 1):
        return int(bool(value))
    raise ValueError(f"{name} must be True or False, not {value!r}")


def _ptr(a, ctype):
    return None if a is None else a.ctypes.data_as(ctypes.POINTER(ctype))


def _params(algo, layout, mask, window, cu_seqlens, scale, seq_len_global, *, assignment=None,
            ulysses=0, sinks=None, softcap=0.0, heads=None, lse_lo=None, rows=None,
            like=None, q_len=0, reproducible=False):
    """ctxpar_attn_params, and the buffers it points to (keep both alive). Everything the
    library would read or write past a buffer's end is checked here: assignment's length
    (seq_len_global), the sinks' (heads) and lse_lo's shape (rows: the lse's [B, Hq, S/P]); the
    values themselves are the library's to judge."""
    p = _lib.AttnParams()
    p.struct_size = ctypes.sizeof(_lib.AttnParams)
    p.algo = _choice("algo", ALGOS, algo)
    p.layout = _choice("layout", LAYOUTS, layout)
    p.mask = _choice("mask", MASKS, mask)
    p.window_left, p.window_right = T.window_pair(window)
    keep = []
    if cu_seqlens is not None:
        cu = _int32_buffer("cu_seqlens", cu_seqlens)
        if cu.ndim not in (1, 2) or cu.shape[-1] < 2:
            raise ValueError(f"cu_seqlens shape {cu.shape}: expected [docs+1] or [batch, docs+1] "
                             "with at least 2 boundaries")
        keep.append(cu)
        p.cu_seqlens = _ptr(cu, ctypes.c_int32)
        p.num_docs = cu.shape[-1] - 1
        p.cu_seqlens_rows = cu.shape[0] if cu.ndim == 2 else 0
    p.softmax_scale = 0.0 if scale is None else float(scale)
    p.seq_len_global = int(seq_len_global or 0)
    if layout == "custom" and assignment is not None and not p.seq_len_global:
        p.seq_len_global = len(assignment)
    asg = _assignment(layout, assignment, p.seq_len_global)
    if asg is not None:
        keep.append(asg)
        p.assignment = _ptr(asg, ctypes.c_int32)
    if int(ulysses) < 0:
        raise ValueError(f"ulysses ({ulysses}) must be >= 0 (0: chosen by the library)")
    p.ulysses = int(ulysses)
    p.softcap = float(softcap or 0.0)
    p.q_len = int(q_len or 0)  # its range and shapes are the library's to judge
    p.reproducible = _flag("reproducible", reproducible)
    if sinks is not None:
        sk = np.ascontiguousarray(_host_array(sinks), dtype=np.float32)
        if sk.ndim != 1 or (heads is not None and sk.shape[0] != heads):
            raise ValueError(f"sinks shape {sk.shape}: expected [{heads}], one logit per query "
                             "head")
        if like is not None and T.is_torch(like) and like.device.type != "cpu":
            import torch  # the library reads the sinks in the device's memory
            sk = torch.from_numpy(sk).to(like.device)
        keep.append(sk)
        p.sinks = T.data_pointer(sk)
    if lse_lo is not None:
        T.check_lse(lse_lo, *rows, "lse_lo")
        p.lse_lo = T.data_pointer(lse_lo)
    return p, keep


class LocalGroup:
    """nranks in-process ranks (threads); comm(rank) gives the comm of one rank."""

    def __init__(self, nranks):
        if int(nranks) < 1:
            raise ValueError(f"nranks ({nranks}) must be >= 1")
        self.nranks = int(nranks)
        h = ctypes.c_void_p()
        _lib.check(_lib.lib.ctxpar_local_group_create(self.nranks, ctypes.byref(h)))
        self._handle = h

    def comm(self, rank):
        return Comm._local(self, rank)

    def __del__(self):
        # Every Comm holds a reference to its group, so they are gone by now.
        if getattr(self, "_handle", None):
            _lib.lib.ctxpar_local_group_destroy(self._handle)
            self._handle = None


def local_group(nranks):
    """A group of nranks ranks as threads of this process (the local comm)."""
    return LocalGroup(nranks)


class Comm:
    """A communicator between ranks: Comm._local(group, rank) or Comm.mpi(mpi4py_comm)."""

    def __init__(self, handle, owner):
        self._handle, self._owner = handle, owner  # owner: kept alive as long as the comm

    @classmethod
    def _local(cls, group, rank):
        if not 0 <= int(rank) < group.nranks:
            raise ValueError(f"rank {rank} is not in a group of {group.nranks}")
        h = ctypes.c_void_p()
        _lib.check(_lib.lib.ctxpar_comm_create_local(group._handle, int(rank), None,
                                                     ctypes.byref(h)))
        return cls(h, group)

    @classmethod
    def mpi(cls, mpi_comm):
        """From an mpi4py communicator (collective over it; ctxpar duplicates it)."""
        from mpi4py import MPI
        handle = MPI._handleof(mpi_comm)  # the C MPI_Comm (a pointer in Open MPI)
        h = ctypes.c_void_p()
        _lib.check(_lib.mpi_library().ctxpar_comm_create_mpi(handle, ctypes.byref(h)))
        return cls(h, mpi_comm)

    @classmethod
    def torch(cls, group=None):
        """Over a torch.distributed ProcessGroup (gloo for CPU tensors), a 1-D DeviceMesh, or
        None for the default group; this process is one rank, numbered as in the group."""
        from . import _torch_comm
        h, state = _torch_comm.create(group)
        return cls(h, state)

    @property
    def rank(self):
        return _lib.lib.ctxpar_comm_rank(self._handle)

    @property
    def size(self):
        return _lib.lib.ctxpar_comm_size(self._handle)

    def set_timeout(self, seconds):
        _lib.check(_lib.lib.ctxpar_comm_set_timeout(self._handle, float(seconds)))

    def close(self):
        if self._handle:
            _lib.lib.ctxpar_comm_destroy(self._handle)
            self._handle = None

    def __del__(self):
        self.close()


def _registered(listing):
    """[(name, description)] from one of the library's registries (ctxpar_*_names)."""
    n = listing(None, None, 0)
    names, about = (ctypes.c_char_p * n)(), (ctypes.c_char_p * n)()
    n = min(n, listing(names, about, n))
    return [(names[i].decode(), about[i].decode()) for i in range(n)]


def devices():
    """The devices this process can create by name, [(name, description)], "cpu" first (the
    library's registry: a backend's library adds its own when loaded)."""
    return _registered(_lib.lib.ctxpar_device_names)


def comms():
    """The comm kinds the library knows by name, [(name, description)], "local" first (ranks as
    threads; local_group()); a comm library adds its own when loaded (libctxpar_mpi.so: "mpi").
    mpi4py communicators are passed to Context directly."""
    return _registered(_lib.lib.ctxpar_comm_names)


class Context:
    """One rank's device + comm: attention() and attention_backward() on its local shard.

    comm: a Comm (local_group(P).comm(rank)), an mpi4py communicator, or a torch.distributed
    ProcessGroup or 1-D DeviceMesh (Comm.torch). device: a name from
    devices(), "cpu" (the CPU device of libctxpar.so) by default: NumPy arrays and CPU tensors;
    "cuda" (libctxpar_cuda.so, loaded when asked for): torch CUDA tensors, each call on torch's
    current stream (ctxpar._cuda). num_threads: OpenMP threads of the
    device (0: OpenMP's default).
    """

    def __init__(self, device="cpu", comm=None, *, num_threads=0, verify_transfers=False):
        self._device = self._ctx = None
        if not isinstance(device, str):
            raise TypeError(f"device must be a name such as 'cpu' (ctxpar.devices()), not {device!r}")
        if comm is None:
            comm = local_group(1).comm(0)
        elif not isinstance(comm, Comm):
            if T.is_torch(comm):
                comm = Comm.torch(comm)
            elif hasattr(comm, "Get_rank"):
                comm = Comm.mpi(comm)
            else:
                raise TypeError("comm must be a ctxpar Comm, an mpi4py communicator or a "
                                "torch.distributed ProcessGroup / DeviceMesh")
        self.comm = comm
        if device == "cuda":
            _cuda.library()  # registers "cuda"
        dev = ctypes.c_void_p()
        _lib.check(_lib.lib.ctxpar_device_create_by_name(device.encode(), int(num_threads),
                                                         ctypes.byref(dev)))
        self._device = dev
        # Where the tensors must live: "cpu" (host memory), else the name of torch's device type.
        self.memory = "cpu" if _lib.lib.ctxpar_device_host_memory(dev) else device
        if self.memory not in ("cpu", "cuda"):
            self.close()
            raise ValueError(f"device '{device}' keeps its memory off the host, and this package "
                             "passes host arrays or torch CUDA tensors only")
        copt = _lib.ContextOptions(ctypes.sizeof(_lib.ContextOptions), int(bool(verify_transfers)))
        ctx = ctypes.c_void_p()
        _lib.check(_lib.lib.ctxpar_context_create(dev, comm._handle, ctypes.byref(copt),
                                                  ctypes.byref(ctx)))
        self._ctx = ctx

    @property
    def rank(self):
        return self.comm.rank

    @property
    def size(self):
        return self.comm.size

    def close(self):
        if self._ctx:
            _lib.lib.ctxpar_context_destroy(self._ctx)
            self._ctx = None
        if self._device:
            _lib.lib.ctxpar_device_destroy(self._device)
            self._device = None

    def __enter__(self):
        return self

    def _stream(self, like):
        """The ctxpar_stream of a call: None (the device's own) on the host, torch's current
        stream on CUDA."""
        if self.memory == "cuda":
            return _cuda.current_stream(self._device, like)
        return contextlib.nullcontext(None)

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        self.close()

    @staticmethod
    def _views(tensors, fmt, dtype, q_len=0):
        """Checks q, k, v (and friends) in Python, before any C call; returns their views.
        q_len > 0: q holds its own rows (queries at the last q_len positions), not k's."""
        T.check_format(fmt)
        kinds = {T.is_torch(t) for t in tensors.values()}
        if len(kinds) != 1:
            raise TypeError("mix of numpy arrays and torch tensors")
        q = tensors["q"]
        if dtype is None:
            dtype = T.dtype_name(q)
        elif dtype not in T.DTYPES:
            raise ValueError(f"dtype '{dtype}' is not one of {sorted(T.DTYPES)}")
        for name, t in tensors.items():
            if dtype == "bf16" and not T.is_torch(t) and t.dtype == np.uint16:
                continue  # NumPy bfloat16 as its bits
            if T.dtype_name(t) != dtype:
                raise ValueError(f"{name} is {T.dtype_name(t)}, expected {dtype}")
        bq, sq, hq, dq = T.bshd_shape(q, fmt)
        bk, sk, hk, dk = T.bshd_shape(tensors["k"], fmt)
        bv, sv, hv, dv = T.bshd_shape(tensors["v"], fmt)
        if (bv, sv, hv) != (bk, sk, hk) or dv == 0:
            raise ValueError(f"v shape {tuple(tensors['v'].shape)} and k shape "
                             f"{tuple(tensors['k'].shape)} must share batch, seq and heads "
                             "(v may have its own head_dim)")
        if (bk, dk) != (bq, dq) or (not q_len and sk != sq) or hk == 0 or hq % hk:
            raise ValueError(f"q ({fmt} {tuple(q.shape)}) and k ({tuple(tensors['k'].shape)}) "
                             "must share batch, seq and head_dim, and q's heads must be a "
                             "multiple of k's")
        want = {"out": (bq, sq, hq, dv), "dout": (bq, sq, hq, dv), "dq": (bq, sq, hq, dq),
                "dk": (bk, sk, hk, dk), "dv": (bk, sk, hk, dv)}
        for name, shape in want.items():
            if name in tensors and T.bshd_shape(tensors[name], fmt) != shape:
                raise ValueError(f"{name} shape {tuple(tensors[name].shape)} does not fit: "
                                 f"expected [B, S, H, D] = {shape} in {fmt} order (out and "
                                 "dout: q's rows and heads with v's head_dim)")
        return dtype, (bq, sq, hq, dq), (bk, sk, hk, dk), dv

    def attention(self, q, k, v, *, algo="ring", layout="zigzag", mask="causal", window=0,
                  cu_seqlens=None, scale=None, seq_len_global=0, assignment=None, ulysses=0,
                  sinks=None, softcap=0.0, format="bshd", dtype=None, out=None, lse=None,
                  lse_lo=None, q_len=0, reproducible=False):
        """Forward attention on this rank's shard (collective over the comm): (out, lse).

        q [B, S/P, Hq, D], k [B, S/P, Hkv, D] and v [B, S/P, Hkv, Dv] in `format` (Dv: v's own
        head_dim, MLA), this rank's tokens in `layout`'s order (ctxpar.shard; S/P is this rank's
        ctxpar.shard_count). out [B, S/P, Hq, Dv] is written in place when given, else allocated
        like q; lse is float32 [B, Hq, S/P]. dtype: "bf16" for NumPy bfloat16 held as uint16
        bits; otherwise taken from q. seq_len_global: the global S (needed when the shards are
        uneven; default S/P * P). layout "custom" takes assignment (int [S]: the rank of each
        global token, the same on every rank). algo "hybrid" takes ulysses (ranks per
        all-to-all group; 0: the library chooses). sinks: float32 [Hq] logits added once to
        every row's denominator; softcap C > 0: scores C tanh(x / C). lse_lo: a float32 array
        like lse that receives the LSE's low part (lse + lse_lo), for attention_backward.
        q_len N > 0: q [B, N, Hq, D] holds the queries at the last N global positions, the same on
        every rank (k and v stay this rank's shard; set seq_len_global); out and lse are the
        whole [B, N, ...] result on every rank. Forward only; algo "decode" or "allgather".
        reproducible=True: out and lse (and lse_lo) have the same bits for every number of
        ranks, layout and algorithm (every rank must pass it); refused (CtxparError,
        NOT_SUPPORTED) with algo "hybrid" or "decode", with q_len, and for ring/allgather where
        a rank's shard is not whole chunks of positions.
        """
        q, k, v = (T.prepare(x, format, self.memory) for x in (q, k, v))
        tensors = {"q": q, "k": k, "v": v}
        if out is not None:
            tensors["out"] = out
        dtype, (b, s, hq, d), _, dv = self._views(tensors, format, dtype, q_len)
        if out is None:
            out = T.empty(q, (b, s, hq, dv), format)
        if lse is None:
            lse = T.empty_lse(q, b, hq, s)
        T.check_lse(lse, b, hq, s)
        params, keep = _params(algo, layout, mask, window, cu_seqlens, scale, seq_len_global,
                               assignment=assignment, ulysses=ulysses, sinks=sinks,
                               softcap=softcap, heads=hq, lse_lo=lse_lo, rows=(b, hq, s),
                               like=q, q_len=q_len, reproducible=reproducible)
        views = [T.view(x, format, dtype) for x in (q, k, v, out)]
        with self._stream(q) as stream:
            _lib.check(_lib.lib.ctxpar_attn_fwd(self._ctx, ctypes.byref(params),
                                                *(ctypes.byref(t) for t in views),
                                                T.data_pointer(lse), stream))
        del keep
        return out, lse

    def attention_backward(self, q, k, v, out, lse, dout, *, algo="ring", layout="zigzag",
                           mask="causal", window=0, cu_seqlens=None, scale=None,
                           seq_len_global=0, assignment=None, ulysses=0, sinks=None,
                           softcap=0.0, format="bshd", dtype=None, dq=None, dk=None, dv=None,
                           lse_lo=None, dsinks=None, q_len=0, reproducible=False):
        """Backward of attention() with the same arguments, out and lse (and lse_lo when the
        forward wrote one): (dq, dk, dv), or (dq, dk, dv, dsinks) with sinks (float32 [Hq], the
        sinks' gradient summed over batch and rows; written into dsinks when given). q_len > 0
        is forward only: the library refuses it. reproducible=True: dq, dk, dv and dsinks have
        the same bits for every number of ranks, layout and algorithm; refused as in
        attention()."""
        q, k, v, out, dout = (T.prepare(x, format, self.memory) for x in (q, k, v, out, dout))
        tensors = {"q": q, "k": k, "v": v, "out": out, "dout": dout}
        for name, t in (("dq", dq), ("dk", dk), ("dv", dv)):
            if t is not None:
                tensors[name] = t
        dtype, (b, s, hq, d), kshape, vdim = self._views(tensors, format, dtype, q_len)
        T.check_lse(lse, b, hq, s)
        dq = T.empty(q, (b, s, hq, d), format) if dq is None else dq
        dk = T.empty(k, kshape, format) if dk is None else dk
        dv = T.empty(v, kshape[:3] + (vdim,), format) if dv is None else dv
        params, keep = _params(algo, layout, mask, window, cu_seqlens, scale, seq_len_global,
                               assignment=assignment, ulysses=ulysses, sinks=sinks,
                               softcap=softcap, heads=hq, lse_lo=lse_lo, rows=(b, hq, s),
                               like=q, q_len=q_len, reproducible=reproducible)
        if sinks is not None:
            if dsinks is None:
                dsinks = T.empty_lse(q, 1, 1, hq).reshape(hq)
            T.check_f32(dsinks, (hq,), "dsinks")
            params.dsinks = T.data_pointer(dsinks)
        elif dsinks is not None:
            raise ValueError("dsinks is the gradient of sinks: pass sinks too")
        views = [T.view(x, format, dtype) for x in (q, k, v, out)]
        grads = [T.view(x, format, dtype) for x in (dout, dq, dk, dv)]
        with self._stream(q) as stream:
            _lib.check(_lib.lib.ctxpar_attn_bwd(self._ctx, ctypes.byref(params),
                                                *(ctypes.byref(t) for t in views),
                                                T.data_pointer(lse),
                                                *(ctypes.byref(t) for t in grads), stream))
        del keep
        return (dq, dk, dv) if sinks is None else (dq, dk, dv, dsinks)


def shard_count(layout, seq_global, rank, nranks, assignment=None):
    """How many tokens `rank` holds of seq_global in `layout` (its local seq): shards differ by
    at most one token when S does not divide (a rank may hold none); "custom" counts the
    assignment's entries equal to rank."""
    lay = _choice("layout", LAYOUTS, layout)
    asg = _assignment(layout, assignment, seq_global)
    n = ctypes.c_int64(0)
    _lib.check(_lib.lib.ctxpar_shard_count(lay, None if asg is None else asg.ctypes.data,
                                           int(seq_global), int(rank), int(nranks),
                                           ctypes.byref(n)))
    return n.value


def positions(layout, seq_global, rank, nranks, assignment=None):
    """Global positions (int64 array, increasing) of the tokens `rank` holds in `layout`; any
    seq_global >= 1 (uneven shards: the first ranks hold one token more, some may hold none).
    layout "custom": assignment (int [seq_global]) gives the rank of each token."""
    lay = _choice("layout", LAYOUTS, layout)
    asg = _assignment(layout, assignment, seq_global)
    n = shard_count(layout, seq_global, rank, nranks, asg)
    pos = np.empty(max(n, 1), dtype=np.int64)[:n]
    _lib.check(_lib.lib.ctxpar_positions_assigned(
        lay, None if asg is None else asg.ctypes.data, int(seq_global), int(rank), int(nranks),
        pos.ctypes.data_as(ctypes.POINTER(ctypes.c_int64))))
    return pos


def _index(x, pos):
    if T.is_torch(x):
        import torch
        return torch.as_tensor(pos)
    return pos


def shard(x, rank, nranks, layout="zigzag", format="bshd", assignment=None):
    """The tokens of a global tensor that `rank` holds (a copy), in the layout's order."""
    T.check_format(format)
    pos = positions(layout, T.bshd_shape(x, format)[1], rank, nranks, assignment)
    idx = _index(x, pos)
    return x[:, idx] if format == "bshd" else x[:, :, idx]


def unshard(local, rank, nranks, out, layout="zigzag", format="bshd", assignment=None):
    """Writes `rank`'s tokens back into their rows of the global tensor `out`."""
    T.check_format(format)
    pos = positions(layout, T.bshd_shape(out, format)[1], rank, nranks, assignment)
    idx = _index(out, pos)
    if format == "bshd":
        out[:, idx] = local
    else:
        out[:, :, idx] = local
    return out


def simulate(q, k, v, dout=None, *, ranks, algo="ring", layout="zigzag", mask="causal",
             window=0, cu_seqlens=None, scale=None, assignment=None, ulysses=0, sinks=None,
             softcap=0.0, lse_lo=False, dtype=None, format="bshd", num_threads=None,
             timeout=None, q_len=0, reproducible=False):
    """Context-parallel attention over `ranks` ranks as threads of this process.

    q [B, S, Hq, D], k [B, S, Hkv, D] and v [B, S, Hkv, Dv] (Dv: v's own head_dim, MLA; dout
    like out, [B, S, Hq, Dv]) are global tensors in `format`; each rank gets its shard in
    `layout` (any S: shards may be uneven), runs ctxpar, and the results come back in global
    order: {"out", "lse"} (+ "dq", "dk", "dv" when dout is given, + "dsinks" with sinks, +
    "lse_lo" with lse_lo=True). dtype ("f32", "f16", "bf16"): the dtype ctxpar computes in
    (inputs are rounded to it); None: q's dtype. NumPy results come back as float32 when dtype
    is bf16 (NumPy has no bfloat16), else in dtype. num_threads: OpenMP threads per rank
    (default: the cores shared out among the ranks).
    window: W (query i sees keys k with i - k < W) or (W, R) for a two-sided band that also
    needs k - i <= R (FlashAttention's window_size; 0 = no limit on that side).
    cu_seqlens: [docs+1] document boundaries, or [B, docs+1] for each batch row its own.
    layout "custom": assignment (int [S], the rank of each token). algo "hybrid": ulysses.
    sinks (float32 [Hq]) and softcap: see Context.attention. lse_lo: also compute the LSE's low
    part and hand it to the backward. float64 inputs (NumPy's default) with dtype None are
    computed in float32, with a warning (F64_NOTE), and come back as float32.
    q_len N > 0: q [B, N, Hq, D] holds the queries at the last N positions of k's S, every rank
    gets all of it (k and v are sharded), and out and lse are [B, N, ...]; forward only, with
    algo "decode" or "allgather" (docs/algorithms.md). Every rank must return the same bits.
    reproducible=True: every result has the same bits for any ranks, layout and algorithm
    (docs/numerics.md); refused (CtxparError) with "hybrid", "decode" and q_len, and for ring
    and allgather where a rank's shard is not whole chunks of positions.
    """
    P = int(ranks)
    if P < 1:
        raise ValueError(f"ranks ({ranks}) must be >= 1")
    T.check_format(format)
    torch_in = T.is_torch(q)
    inputs = {"q": q, "k": k, "v": v}
    if dout is not None:
        inputs["dout"] = dout
    if dtype is None and T.is_float64(q):  # NumPy's default
        warnings.warn(T.F64_NOTE + "; simulate returns float32", stacklevel=2)
        dtype = "f32"
    if dtype is None:
        dtype = T.dtype_name(q)
    if dtype not in T.DTYPES:
        raise ValueError(f"dtype '{dtype}' is not one of {sorted(T.DTYPES)}")
    inputs = {n: _cast(x, dtype) for n, x in inputs.items()}
    b, sq, hq, d = T.bshd_shape(inputs["q"], format)
    s, hk = T.bshd_shape(inputs["k"], format)[1:3]
    dv = T.bshd_shape(inputs["v"], format)[3]
    _choice("layout", LAYOUTS, layout)
    # Argument errors surface here, on the caller's thread, before any rank starts.
    Context._views(inputs, format, dtype, q_len)
    _, keep = _params(algo, layout, mask, window, cu_seqlens, scale, s, assignment=assignment,
                      ulysses=ulysses, sinks=sinks, softcap=softcap, heads=hq,
                      reproducible=reproducible)
    asg = _assignment(layout, assignment, s)
    if num_threads is None:
        num_threads = max(1, (os.cpu_count() or 1) // P)

    group = local_group(P)
    results, errors = [None] * P, [None] * P
    kw = dict(algo=algo, layout=layout, mask=mask, window=window, cu_seqlens=cu_seqlens,
              scale=scale, seq_len_global=s, assignment=asg, ulysses=ulysses, sinks=sinks,
              softcap=softcap, format=format, dtype=dtype, q_len=q_len,
              reproducible=reproducible)
    whole = ("q", "dout") if q_len else ()  # every rank holds all the queries

    def rank_main(r):
        try:
            local = {n: x if n in whole else shard(x, r, P, layout, format, asg)
                     for n, x in inputs.items()}
            n = sq if q_len else shard_count(layout, s, r, P, asg)
            with Context("cpu", group.comm(r), num_threads=num_threads) as ctx:
                if timeout is not None:
                    ctx.comm.set_timeout(timeout)
                lo = T.empty_lse(inputs["q"], b, hq, n) if lse_lo else None
                out, lse = ctx.attention(local["q"], local["k"], local["v"], lse_lo=lo, **kw)
                res = {"out": out, "lse": lse}
                if lse_lo:
                    res["lse_lo"] = lo
                if dout is not None:
                    grads = ctx.attention_backward(local["q"], local["k"], local["v"], out, lse,
                                                   local["dout"], lse_lo=lo, **kw)
                    res.update(zip(("dq", "dk", "dv", "dsinks"), grads))
                ctx.comm.close()
            results[r] = res
        except BaseException as e:  # handed to the caller below
            errors[r] = e

    threads = [threading.Thread(target=rank_main, args=(r,), name=f"ctxpar-rank{r}")
               for r in range(P)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    del keep
    failed = [e for e in errors if e is not None]
    if failed:
        # The cause, rather than the REMOTE errors it made the other ranks return.
        first = next((e for e in failed if getattr(e, "name", "") != "CTXPAR_ERR_REMOTE"),
                     failed[0])
        raise first

    if q_len:
        return _replicated(results, lse_lo, dtype, torch_in)
    out = {}
    for name, like, heads, dim in (("out", inputs["q"], hq, dv), ("dq", inputs["q"], hq, d),
                                   ("dk", inputs["k"], hk, d), ("dv", inputs["k"], hk, dv)):
        if name not in results[0]:
            continue
        g = T.empty(like, (b, s, heads, dim), format)
        for r in range(P):
            unshard(results[r][name], r, P, g, layout, format, asg)
        out[name] = _uncast(g, dtype, torch_in)
    for name in ("lse", "lse_lo") if lse_lo else ("lse",):
        g = T.empty_lse(inputs["q"], b, hq, s)
        for r in range(P):
            g[:, :, _index(g, positions(layout, s, r, P, asg))] = results[r][name]
        out[name] = g
    if "dsinks" in results[0]:
        out["dsinks"] = results[0]["dsinks"]  # the library writes the same bits on every rank
    return out


def _bits(x):
    """A tensor's bytes (NumPy or torch, any dtype)."""
    if T.is_torch(x):
        import torch
        return x.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes()
    return np.ascontiguousarray(x).tobytes()


def _replicated(results, lse_lo, dtype, torch_in):
    """The results every rank holds whole (q_len): rank 0's, once every rank's bits equal them."""
    names = ("out", "lse", "lse_lo") if lse_lo else ("out", "lse")
    for r, res in enumerate(results):
        for name in names:
            if _bits(res[name]) != _bits(results[0][name]):
                raise RuntimeError(f"rank {r}'s {name} differs from rank 0's: with q_len every "
                                   "rank must hold the same result")
    out = {name: results[0][name] for name in names}
    out["out"] = _uncast(out["out"], dtype, torch_in)
    return out


def _cast(x, dtype):
    """x in the dtype ctxpar computes in (NumPy bf16: uint16 bits)."""
    if T.is_torch(x):
        import torch
        return x.detach().to({"f32": torch.float32, "f16": torch.float16,
                              "bf16": torch.bfloat16}[dtype])
    if not isinstance(x, np.ndarray):
        raise TypeError(f"expected a numpy.ndarray or torch.Tensor, got {type(x).__name__}")
    if dtype == "bf16":
        return x if x.dtype == np.uint16 else T.to_bf16_bits(x)
    return x.astype({"f32": np.float32, "f16": np.float16}[dtype], copy=False)


def _uncast(x, dtype, torch_in):
    if not torch_in and dtype == "bf16":
        return T.from_bf16_bits(x)
    return x
