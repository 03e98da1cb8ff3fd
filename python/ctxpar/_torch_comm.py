"""A ctxpar comm over a torch.distributed ProcessGroup (gloo on CPU): the comm ops table of
ctxpar_backend.h filled with Python functions (ctypes callbacks), each op a torch.distributed
call on the caller's host buffers (viewed in place, never copied). ctxpar then runs wherever the
trainer's processes already are (torchrun).

The library calls the ops on the thread that called it (ctypes releases the GIL around that
call, and a callback takes it back). Point-to-point transfers and the collectives are
asynchronous torch works; wait() retires them with the comm's timeout. split (the "hybrid"
algorithm's groups) makes torch.distributed groups, which is collective over every process: a comm
over the whole default group splits (its sub-comms do not: NOT_SUPPORTED). Not provided: abort (a
failed rank's peers see TIMEOUT).
"""
import ctypes
import datetime
import itertools

import torch
import torch.distributed as dist

from . import _lib

OK, ERR_INVALID_USAGE, ERR_NOT_SUPPORTED, ERR_COMM, ERR_TIMEOUT = 0, -2, -3, -6, -8
_REDUCE = {0: dist.ReduceOp.SUM, 1: dist.ReduceOp.MIN, 2: dist.ReduceOp.MAX}


class _CommBase(ctypes.Structure):
    """struct ctxpar_comm: what every op receives."""
    _fields_ = [("ops", ctypes.c_void_p), ("impl", ctypes.c_void_p), ("rank", ctypes.c_int),
                ("size", ctypes.c_int), ("timeout_s", ctypes.c_double)]


_C = ctypes.POINTER(_CommBase)
_VP, _SZ, _INT = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int
_REQ_OUT = ctypes.POINTER(ctypes.c_void_p)
_TYPES = {
    "destroy": ctypes.CFUNCTYPE(None, _C),
    "sendrecv": ctypes.CFUNCTYPE(_INT, _C, _VP, _SZ, _INT, _VP, _SZ, _INT, _INT, _VP, _REQ_OUT),
    "allgather": ctypes.CFUNCTYPE(_INT, _C, _VP, _VP, _SZ, _VP, _REQ_OUT),
    "reduce_scatter": ctypes.CFUNCTYPE(_INT, _C, _VP, _VP, _SZ, _VP, _REQ_OUT),
    "alltoall": ctypes.CFUNCTYPE(_INT, _C, _VP, _VP, _SZ, _VP, _REQ_OUT),
    "wait": ctypes.CFUNCTYPE(_INT, _C, _VP, _VP),
    "cancel": ctypes.CFUNCTYPE(None, _C, _VP),
    "allreduce_i64": ctypes.CFUNCTYPE(_INT, _C, _VP, _SZ, _INT),
    "barrier": ctypes.CFUNCTYPE(_INT, _C),
    "test": ctypes.CFUNCTYPE(_INT, _C, _VP, ctypes.POINTER(_INT)),
    "abort": ctypes.CFUNCTYPE(None, _C),
    "split": ctypes.CFUNCTYPE(_INT, _C, _INT, _INT, _REQ_OUT),
}


class _Ops(ctypes.Structure):
    """struct ctxpar_comm_ops, version 2 (abort left NULL: the library's default)."""
    _fields_ = ([("version", ctypes.c_uint32), ("struct_size", ctypes.c_size_t),
                 ("name", ctypes.c_char_p)] + [(n, t) for n, t in _TYPES.items()])


class CommFailure(Exception):
    """An op's failure: the status it returns to the library and the message it records."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status = status


def _bytes(ptr, n):
    """The caller's n bytes at ptr as a uint8 tensor over the same memory."""
    if n == 0:
        return torch.empty(0, dtype=torch.uint8)
    return torch.frombuffer((ctypes.c_char * n).from_address(ptr), dtype=torch.uint8)


class _Request:
    def __init__(self, works, finish=None):
        self.works, self.finish = works, finish


def _global_rank(group, r):
    get = getattr(dist, "get_global_rank", None) or dist.distributed_c10d._get_global_rank
    return get(group, r)


class TorchComm:
    """The state of one ctxpar comm over `group`. members: the global rank of each of its ranks
    (a split's order, by key; torch numbers a group's ranks in global order), or None: the
    group's own order."""

    def __init__(self, group, members=None):
        self.group = group
        self.size = dist.get_world_size(group)
        if members is None:
            members = [_global_rank(group, r) for r in range(self.size)]
        self.members = list(members)
        self.rank = self.members.index(dist.get_rank())
        # torch's rank t of the group is our rank c2t.index(t); identity: no reordering
        by_global = sorted(self.members)
        self.t2c = [self.members.index(g) for g in by_global]
        self.identity = self.t2c == list(range(self.size))
        self.requests, self.ids = {}, itertools.count(1)
        self.orphans = []  # works of cancelled requests, still running: kept referenced
        self.timeout_s = 60.0

    def global_rank(self, r):
        return self.members[r]

    def torch_order(self, x, n):
        """x's P blocks of n (ours in rank order) in torch's rank order (a copy unless the same)."""
        if self.identity:
            return x
        return torch.cat([x[c * n:(c + 1) * n] for c in self.t2c])

    def split(self, color, key):
        """The sub-comm of the ranks passing `color` (>= 0), ranked by (key, rank), or None.
        Every rank learns every (color, key), then all make every group in the same order."""
        if self.size != dist.get_world_size():
            raise CommFailure(ERR_NOT_SUPPORTED, "split: torch.distributed makes a group with "
                              "every process, so only a comm over the whole default group "
                              f"splits (this one has {self.size} of {dist.get_world_size()})")
        mine = torch.tensor([color, key], dtype=torch.int64)
        every = [torch.empty(2, dtype=torch.int64) for _ in range(self.size)]
        self.finish(self.request([dist.all_gather(every, mine, group=self.group,
                                                  async_op=True)]))
        ck = {self.t2c[t]: (int(e[0]), int(e[1])) for t, e in enumerate(every)}
        sub = None
        for col in sorted({cc for cc, _ in ck.values() if cc >= 0}):
            order = sorted((k, r) for r, (cc, k) in ck.items() if cc == col)
            members = [self.members[r] for _, r in order]
            group = dist.new_group(sorted(members))
            if col == color:
                sub = TorchComm(group, members)
        return sub

    def request(self, works, finish=None):
        rid = next(self.ids)
        self.requests[rid] = _Request(works, finish)
        return rid

    def finish(self, rid):
        """Waits for every work of request rid (the comm's timeout each) and retires it."""
        req = self.requests.pop(rid, None)
        if req is None:
            raise CommFailure(ERR_INVALID_USAGE, f"request {rid} is not one of this comm's")
        timeout = datetime.timedelta(seconds=self.timeout_s)
        for w in req.works:
            _wait(w, timeout, self.timeout_s)
        if req.finish is not None:
            req.finish()

    # ---- the ops, in terms of torch.distributed (rank numbers are the group's)

    def sendrecv(self, send, dst, recv, src, tag):
        works = []
        if dst >= 0:
            works.append(dist.isend(send, self.global_rank(dst), group=self.group, tag=tag))
        if src >= 0:
            works.append(dist.irecv(recv, self.global_rank(src), group=self.group, tag=tag))
        return self.request(works)

    def allgather(self, send, recv, nbytes):
        if nbytes == 0:
            return self.request([])
        parts = list(recv.view(self.size, nbytes).unbind(0))
        parts = [parts[c] for c in self.t2c]  # torch fills them in its rank order
        return self.request([dist.all_gather(parts, send, group=self.group, async_op=True)])

    def reduce_scatter(self, send, recv, count):
        """recv = the sum over ranks of their block `rank`, added in rank order 0..P-1 (the
        op's contract: the same bits on every run): an all-to-all of the blocks, then the sum."""
        if count == 0:
            return self.request([])
        blocks = torch.empty(self.size * count, dtype=torch.float32)
        work = dist.all_to_all_single(blocks, self.torch_order(send, count), group=self.group,
                                      async_op=True)
        at = {c: t for t, c in enumerate(self.t2c)}  # our rank c's block is torch's t

        def add_in_rank_order():
            acc = blocks[at[0] * count:(at[0] + 1) * count].clone()
            for r in range(1, self.size):
                acc += blocks[at[r] * count:(at[r] + 1) * count]
            recv.copy_(acc)

        return self.request([work], add_in_rank_order)

    def alltoall(self, send, recv, nbytes):
        if nbytes == 0:
            return self.request([])
        if self.identity:
            return self.request([dist.all_to_all_single(recv, send, group=self.group,
                                                        async_op=True)])
        got = torch.empty_like(recv)
        work = dist.all_to_all_single(got, self.torch_order(send, nbytes), group=self.group,
                                      async_op=True)

        def to_rank_order():
            for t, c in enumerate(self.t2c):
                recv[c * nbytes:(c + 1) * nbytes].copy_(got[t * nbytes:(t + 1) * nbytes])

        return self.request([work], to_rank_order)

    def allreduce(self, buf, op):
        work = dist.all_reduce(buf, op=_REDUCE[op], group=self.group, async_op=True)
        self.finish(self.request([work]))

    def barrier(self):
        self.finish(self.request([dist.barrier(group=self.group, async_op=True)]))


def _wait(work, timeout, seconds):
    try:
        work.wait(timeout)
    except RuntimeError as e:
        text = str(e)
        if "imed out" in text or "imeout" in text:
            raise CommFailure(ERR_TIMEOUT, f"torch.distributed: no peer after {seconds:g} s "
                              f"({text.splitlines()[0]})") from e
        raise CommFailure(ERR_COMM, f"torch.distributed: {text.splitlines()[0]}") from e


_comms = {}  # impl id -> TorchComm
_impl_ids = itertools.count(1)


def _state(comm):
    c = _comms[comm.contents.impl]
    c.timeout_s = comm.contents.timeout_s  # ctxpar_comm_set_timeout writes it there
    return c


def _record(status, message):
    _lib.lib.ctxpar_set_error(ctypes.c_int(status), b"ctxpar/_torch_comm.py", ctypes.c_int(0),
                              b"%s", str(message).encode(errors="replace"))
    return status


def _op(fn):
    """A status-returning op: every failure becomes a status and a message (an exception must
    never cross into C: ctypes would print it and return 0, a false success)."""
    def wrapper(comm, *args):
        try:
            return fn(_state(comm), *args)
        except CommFailure as e:
            return _record(e.status, e)
        except Exception as e:  # noqa: BLE001 - see above
            return _record(ERR_COMM, f"torch.distributed {fn.__name__}: {e}")
    return wrapper


def _store(req_out, rid):
    req_out[0] = rid
    return OK


@_op
def _sendrecv(c, sendbuf, send_bytes, dst, recvbuf, recv_bytes, src, tag, stream, req_out):
    # A skipped half's buffer may be NULL whatever its size.
    send = _bytes(sendbuf, send_bytes) if dst >= 0 else None
    recv = _bytes(recvbuf, recv_bytes) if src >= 0 else None
    return _store(req_out, c.sendrecv(send, dst, recv, src, tag))


@_op
def _allgather(c, sendbuf, recvbuf, nbytes, stream, req_out):
    return _store(req_out, c.allgather(_bytes(sendbuf, nbytes),
                                       _bytes(recvbuf, nbytes * c.size), nbytes))


@_op
def _reduce_scatter(c, sendbuf, recvbuf, count, stream, req_out):
    send = _bytes(sendbuf, 4 * count * c.size).view(torch.float32)
    recv = _bytes(recvbuf, 4 * count).view(torch.float32)
    return _store(req_out, c.reduce_scatter(send, recv, count))


@_op
def _alltoall(c, sendbuf, recvbuf, nbytes, stream, req_out):
    n = nbytes * c.size
    return _store(req_out, c.alltoall(_bytes(sendbuf, n), _bytes(recvbuf, n), nbytes))


@_op
def _wait_op(c, req, stream):
    c.finish(req)
    return OK


@_op
def _test(c, req, done_out):
    r = c.requests.get(req)
    if r is None:
        raise CommFailure(ERR_INVALID_USAGE, f"test: request {req} is not one of this comm's")
    done_out[0] = int(all(w.is_completed() for w in r.works))
    return OK


@_op
def _allreduce_i64(c, buf, count, op):
    c.allreduce(_bytes(buf, 8 * count).view(torch.int64), op)
    return OK


@_op
def _barrier(c):
    c.barrier()
    return OK


@_op
def _split(c, color, key, comm_out):
    comm_out[0] = None
    sub = c.split(color, key)
    if sub is not None:
        comm_out[0] = _handle(sub).value
    return OK


def _cancel(comm, req):
    # torch works cannot be cancelled: wait a moment for the transfer, else keep it referenced
    # (its buffers may still be touched until the process group is destroyed).
    try:
        c = _comms[comm.contents.impl]
        r = c.requests.pop(req, None)
        if r is not None:
            for w in r.works:
                try:
                    w.wait(datetime.timedelta(seconds=1))
                except Exception:  # noqa: BLE001 - the transfer is being abandoned
                    c.orphans.append(w)
    except Exception:  # noqa: BLE001 - cancel has no status to return
        pass


def _destroy(comm):
    _comms.pop(comm.contents.impl, None)


_CALLBACKS = dict(destroy=_destroy, sendrecv=_sendrecv, allgather=_allgather,
                  reduce_scatter=_reduce_scatter, alltoall=_alltoall, wait=_wait_op,
                  cancel=_cancel, allreduce_i64=_allreduce_i64, barrier=_barrier, test=_test,
                  split=_split)
_OPS = _Ops(version=2, struct_size=ctypes.sizeof(_Ops), name=b"torch",
            **{n: _TYPES[n](f) for n, f in _CALLBACKS.items()})

_lib.lib.ctxpar_comm_create.restype = ctypes.c_int
_lib.lib.ctxpar_comm_create.argtypes = [ctypes.POINTER(_Ops), ctypes.c_void_p, ctypes.c_int,
                                        ctypes.c_int, ctypes.POINTER(ctypes.c_void_p)]


def process_group(group_or_mesh):
    """The ProcessGroup of a ProcessGroup, a 1-D DeviceMesh or None (the default group)."""
    if group_or_mesh is None or not hasattr(group_or_mesh, "get_group"):
        if not dist.is_initialized():
            raise RuntimeError("torch.distributed is not initialized: call "
                               "torch.distributed.init_process_group (torchrun sets it up)")
        if group_or_mesh is None:  # the group itself: a new one after re-initialising differs
            return dist.distributed_c10d._get_default_group()
        return group_or_mesh
    if group_or_mesh.ndim != 1:
        raise ValueError(f"a {group_or_mesh.ndim}-D DeviceMesh: pass a 1-D one (or "
                         "mesh['cp'], its context-parallel dimension)")
    return group_or_mesh.get_group()


def create(group_or_mesh):
    """(handle, state) of a new ctxpar comm over the group; the state must outlive the handle."""
    state = TorchComm(process_group(group_or_mesh))
    return _handle(state), state


def _handle(state):
    """A new ctxpar comm over state (kept in _comms until the comm's destroy)."""
    impl = next(_impl_ids)
    _comms[impl] = state
    h = ctypes.c_void_p()
    try:
        _lib.check(_lib.lib.ctxpar_comm_create(ctypes.byref(_OPS), impl, state.rank, state.size,
                                               ctypes.byref(h)))
    except Exception:
        _comms.pop(impl, None)
        raise
    return h
