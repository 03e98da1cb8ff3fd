"""One process = one rank of a torch.distributed (gloo) job: run by test_torch_dist.py through
torch_launch.py (torchrun's environment). Runs the cases named on the command line in one
launch (starting processes and torch is the slow part) and prints one line per case on rank 0:
"CASE name: max error E" (E against a float64 oracle of the whole sequence) or "CASE name: ok".
Any failure raises: the process exits non-zero."""
import ctypes
import os
import sys
import time

import numpy as np
import torch
import torch.distributed as dist

import ctxpar
import ctxpar.torch as ct
from conftest import max_error
from ctxpar import _torch_comm

dist.init_process_group("gloo")
RANK, P = dist.get_rank(), dist.get_world_size()
TOL = {torch.float32: 4e-6, torch.bfloat16: 1.6e-2}


def report(name, error=None, tol=None):
    if error is not None and error > tol:
        raise AssertionError(f"{name}: max error {error:.2e} > {tol:.1e}")
    if RANK == 0:
        print(f"CASE {name}: " + ("ok" if error is None else f"max error {error:.2e}"),
              flush=True)


def case_comm_ops():
    """The comm's ops called as the library calls them (through the ops table), on bytes whose
    expected values are computed here: tagged sendrecv around the ring, allgather, alltoall,
    reduce_scatter (added in rank order: the same float32 bits as a sum written out here),
    a sendrecv split into its send and receive halves and one with both skipped,
    allreduce_i64 (sum, min, max), barrier, test, and zero-byte transfers."""
    comm = ctxpar.Comm.torch(None)
    base = ctypes.cast(comm._handle, ctypes.POINTER(_torch_comm._CommBase))
    ops = _torch_comm._OPS
    req = ctypes.c_void_p()

    def ok(status):
        assert status == 0, ctxpar._lib.lib.ctxpar_last_error().decode()

    def pattern(rank, n, salt):
        return ((np.arange(n) * 7 + rank * 31 + salt) % 251).astype(np.uint8)

    def ptr(a):
        return a.ctypes.data

    n = 1000
    nxt, prv = (RANK + 1) % P, (RANK - 1) % P
    for tag in (5, 6):  # two transfers in flight, told apart by their tags
        send, recv = pattern(RANK, n, tag), np.zeros(n, np.uint8)
        ok(ops.sendrecv(base, ptr(send), n, nxt, ptr(recv), n, prv, tag, None,
                        ctypes.byref(req)))
        done = ctypes.c_int(-1)
        ok(ops.test(base, req, ctypes.byref(done)))
        assert done.value in (0, 1)
        ok(ops.wait(base, req, None))
        assert (recv == pattern(prv, n, tag)).all(), "sendrecv"
    # The send and the receive as two ops, retired in the other order; then both halves
    # skipped: a request that is done at once.
    send, recv = pattern(RANK, n, 7), np.zeros(n, np.uint8)
    sreq, rreq = ctypes.c_void_p(), ctypes.c_void_p()
    ok(ops.sendrecv(base, ptr(send), n, nxt, None, 0, -1, 0, None, ctypes.byref(sreq)))
    ok(ops.sendrecv(base, None, 0, -1, ptr(recv), n, prv, 0, None, ctypes.byref(rreq)))
    ok(ops.wait(base, rreq, None))
    ok(ops.wait(base, sreq, None))
    assert (recv == pattern(prv, n, 7)).all(), "sendrecv in two halves"
    ok(ops.sendrecv(base, None, 0, -1, None, 0, -1, 0, None, ctypes.byref(req)))
    done = ctypes.c_int(-1)
    ok(ops.test(base, req, ctypes.byref(done)))
    assert done.value == 1, "a sendrecv with both halves skipped is done at once"
    ok(ops.wait(base, req, None))
    send, recv = pattern(RANK, n, 1), np.zeros(n * P, np.uint8)
    ok(ops.allgather(base, ptr(send), ptr(recv), n, None, ctypes.byref(req)))
    ok(ops.wait(base, req, None))
    assert all((recv[r * n:(r + 1) * n] == pattern(r, n, 1)).all() for r in range(P))
    send = np.concatenate([pattern(RANK, n, 10 + j) for j in range(P)])
    recv = np.zeros(n * P, np.uint8)
    ok(ops.alltoall(base, ptr(send), ptr(recv), n, None, ctypes.byref(req)))
    ok(ops.wait(base, req, None))
    assert all((recv[r * n:(r + 1) * n] == pattern(r, n, 10 + RANK)).all() for r in range(P))
    rng = [np.random.default_rng(r) for r in range(P)]
    blocks = [(g.standard_normal(n * P) * 10.0 ** g.integers(-3, 4, n * P)).astype(np.float32)
              for g in rng]
    out = np.zeros(n, np.float32)
    ok(ops.reduce_scatter(base, ptr(blocks[RANK]), ptr(out), n, None, ctypes.byref(req)))
    ok(ops.wait(base, req, None))
    want = blocks[0][RANK * n:(RANK + 1) * n].copy()
    for r in range(1, P):
        want += blocks[r][RANK * n:(RANK + 1) * n]
    assert out.tobytes() == want.tobytes(), "reduce_scatter: not the rank-order sum"
    for op, fn in ((0, sum), (1, min), (2, max)):
        vals = np.array([RANK - 1, 3 * RANK + 2 ** 40], np.int64)
        ok(ops.allreduce_i64(base, ptr(vals), 2, op))
        assert list(vals) == [fn(r - 1 for r in range(P)), fn(3 * r + 2 ** 40 for r in range(P))]
    ok(ops.barrier(base))
    ok(ops.allgather(base, None, None, 0, None, ctypes.byref(req)))
    ok(ops.wait(base, req, None))
    assert ops.wait(base, 12345, None) == -2  # not a request of this comm: INVALID_USAGE
    comm.close()
    report("comm_ops")


def case_algorithms():
    """ctxpar.Context over the process group, each algorithm the comm serves, forward and
    backward (GQA, uneven shards: S = 16 P + 3) against the float64 oracle; the hybrid with
    groups of 2 (the comm's split)."""
    rng = np.random.default_rng(3)
    s = 16 * P + 3
    q, k, v, do = (rng.standard_normal((1, s, h, 16), dtype=np.float32) for h in (4, 2, 2, 4))
    ref = ctxpar.oracle(q, k, v, do)
    ctx = ctxpar.Context("cpu", dist.group.WORLD, num_threads=1)
    worst = 0.0
    for algo in ("ring", "allgather", "alltoall", "hybrid"):
        kw = dict(algo=algo, seq_len_global=s, ulysses=2 if algo == "hybrid" else 0)
        local = [ctxpar.shard(x, RANK, P) for x in (q, k, v, do)]
        out, lse = ctx.attention(*local[:3], **kw)
        grads = ctx.attention_backward(*local[:3], out, lse, local[3], **kw)
        for name, got in zip(("out", "dq", "dk", "dv"), (out,) + grads):
            whole = ct.context_parallel_unshard(None, [torch.from_numpy(got)], [1])[0]
            worst = max(worst, max_error(whole.numpy(), ref[name]))
    report("algorithms", worst, 4e-6)


def case_split():
    """The comm's split called as the library calls it: colors by parity, keys reversing the
    order (rank and size in the sub-comm, a sum over it, a ring shift and an all-to-all in its
    order), a rank that joins none, and a sub-comm's own split refused (torch makes groups with
    every process)."""
    comm = ctxpar.Comm.torch(None)
    base = ctypes.cast(comm._handle, ctypes.POINTER(_torch_comm._CommBase))
    ops = _torch_comm._OPS
    sub_h, req = ctypes.c_void_p(), ctypes.c_void_p()

    def ok(status):
        assert status == 0, ctxpar._lib.lib.ctxpar_last_error().decode()

    ok(ops.split(base, RANK % 2, -RANK, ctypes.byref(sub_h)))
    sub = ctypes.cast(sub_h, ctypes.POINTER(_torch_comm._CommBase))
    mates = sorted((r for r in range(P) if r % 2 == RANK % 2), reverse=True)  # by key -r
    n = len(mates)
    assert (sub.contents.rank, sub.contents.size) == (mates.index(RANK), n), "rank, size"
    vals = np.array([RANK], np.int64)
    ok(ops.allreduce_i64(sub, vals.ctypes.data, 1, 0))
    assert vals[0] == sum(mates), "sum over the sub-comm"
    me = mates.index(RANK)
    if n > 1:  # (2 processes: sub-comms of one)
        send, recv = np.full(64, RANK, np.uint8), np.zeros(64, np.uint8)
        ok(ops.sendrecv(sub, send.ctypes.data, 64, (me + 1) % n, recv.ctypes.data, 64,
                        (me - 1) % n, 0, None, ctypes.byref(req)))
        ok(ops.wait(sub, req, None))
        assert (recv == mates[(me - 1) % n]).all(), "ring shift in the sub-comm's order"
    send = np.array([[RANK * 16 + j] * 8 for j in range(n)], np.uint8)  # block j for rank j
    recv = np.zeros((n, 8), np.uint8)
    ok(ops.alltoall(sub, send.ctypes.data, recv.ctypes.data, 8, None, ctypes.byref(req)))
    ok(ops.wait(sub, req, None))
    assert all((recv[j] == mates[j] * 16 + me).all() for j in range(n)), "all-to-all order"
    nested = ctypes.c_void_p()
    assert ops.split(sub, 0, 0, ctypes.byref(nested)) == -3 and not nested.value, "nested"
    ctxpar._lib.lib.ctxpar_comm_destroy(sub_h)
    none = ctypes.c_void_p(1)
    ok(ops.split(base, -1 if RANK == 0 else 5, 0, ctypes.byref(none)))
    assert (none.value is None) == (RANK == 0), "a negative color joins no sub-comm"
    if none.value:
        ctxpar._lib.lib.ctxpar_comm_destroy(none)
    comm.close()
    report("split")


def case_seed(dtype_name, causal, seq=512):
    """The seed's example with the group for a mesh: qkv [1, 4, S, 64] requiring grad, sharded
    by context_parallel, F.scaled_dot_product_attention inside it, the loss's backward after
    it; output and gradients unsharded against float64 attention (ctxpar.oracle) on the same
    rounded inputs, with the loss's own dout: each rank's mean(out^2) over its shard."""
    import torch.nn.functional as F
    dtype = getattr(torch, dtype_name)
    g = torch.Generator().manual_seed(7)
    qkv = [torch.randn(1, 4, seq, 64, generator=g).to(dtype).requires_grad_()
           for _ in range(3)]
    whole = [x.detach().clone() for x in qkv]
    with ct.context_parallel(dist.group.WORLD, buffers=tuple(qkv), buffer_seq_dims=(2, 2, 2)):
        output = F.scaled_dot_product_attention(*qkv, is_causal=causal)
    output.float().square().mean().backward()
    assert qkv[0].shape[2] == ctxpar.shard_count("zigzag", seq, RANK, P)  # they require grad
    got = ct.context_parallel_unshard(dist.group.WORLD, [output] + [x.grad for x in qkv],
                                      [2, 2, 2, 2])
    mask = "causal" if causal else "none"
    out64 = ctxpar.oracle(*whole, mask=mask, format="bhsd")["out"]
    dout = 2.0 * P * out64 / out64.size  # d/d out of the ranks' losses summed
    ref = ctxpar.oracle(*whole, dout, mask=mask, format="bhsd")
    worst = max(max_error(x.double().numpy(), ref[n])
                for x, n in zip(got, ("out", "dq", "dk", "dv")))
    report(f"seed_{dtype_name}_{'causal' if causal else 'full'}_S{seq}", worst, TOL[dtype])


def case_buffers():
    """Buffers that need no grad get their whole data back after the block, no_restore_buffers
    keep their shard; shard + unshard is the identity for uneven lengths and every layout;
    inside the block F.scaled_dot_product_attention exists even on torch 1.13."""
    import torch.nn.functional as F
    had = hasattr(F, "scaled_dot_product_attention")
    for layout in ("zigzag", "contiguous", "striped"):
        x = torch.arange(2 * (5 * P + 3)).reshape(2, 5 * P + 3).float()
        (back,) = ct.context_parallel_unshard(None, ct.context_parallel_shard(None, [x], [1],
                                                                              layout), [1],
                                              layout)
        assert torch.equal(back, x), layout
    a, b = torch.randn(1, 2, 8 * P, 4), torch.randn(1, 2, 8 * P, 4)
    a0, b0 = a.clone(), b.clone()
    with ct.context_parallel(None, buffers=[a, b], buffer_seq_dims=[2, 2],
                             no_restore_buffers={b}):
        assert a.shape[2] == 8 and b.shape[2] == 8
        assert hasattr(F, "scaled_dot_product_attention")
        assert torch.equal(a, ct.context_parallel_shard(None, [a0], [2])[0])
    assert torch.equal(a, a0) and torch.equal(b, ct.context_parallel_shard(None, [b0], [2])[0])
    assert hasattr(F, "scaled_dot_product_attention") == had
    report("buffers")


def case_repro():
    """context_parallel(reproducible=True): F.scaled_dot_product_attention (causal) in the block
    and a loss whose dout is a fixed tensor's shard; the unsharded output and q, k, v gradients
    have the bits of the same attention on the whole sequence by this process alone (a one-rank
    context, reproducible too). Zigzag shards of whole 256-position chunks: S = 512 P."""
    import torch.nn.functional as F
    seq = 512 * P
    g = torch.Generator().manual_seed(11)
    whole = [torch.randn(1, 4, seq, 32, generator=g) for _ in range(3)]
    weight = torch.randn(1, 4, seq, 32, generator=g)  # d loss / d out
    qkv = [x.clone().requires_grad_() for x in whole]
    (w_local,) = ct.context_parallel_shard(None, [weight], [2])
    with ct.context_parallel(dist.group.WORLD, buffers=tuple(qkv), buffer_seq_dims=(2, 2, 2),
                             reproducible=True):
        output = F.scaled_dot_product_attention(*qkv, is_causal=True)
    (output * w_local).sum().backward()
    got = ct.context_parallel_unshard(dist.group.WORLD, [output] + [x.grad for x in qkv],
                                      [2, 2, 2, 2])
    alone = [x.clone().requires_grad_() for x in whole]
    out1 = ct.scaled_dot_product_attention(*alone, is_causal=True, reproducible=True)
    (out1 * weight).sum().backward()
    want = [out1.detach()] + [x.grad for x in alone]
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, want):
        assert torch.equal(a.view(torch.int32), b.view(torch.int32)), f"repro: {name} bits"
    report("repro")


def case_timeout():
    """A receive from a peer that never sends gives CTXPAR_ERR_TIMEOUT after the comm's
    timeout (ctxpar_comm_set_timeout), not a hang. gloo then closes its connections: the
    process group is done for, so this case comes last, and rank 1 stays up meanwhile (its
    exit would close them first)."""
    comm = ctxpar.Comm.torch(None)
    comm.set_timeout(1.0)
    base = ctypes.cast(comm._handle, ctypes.POINTER(_torch_comm._CommBase))
    ops, req = _torch_comm._OPS, ctypes.c_void_p()
    if RANK == 0:
        buf = np.zeros(8, np.uint8)
        assert ops.sendrecv(base, None, 0, -1, buf.ctypes.data, 8, 1, 77, None,
                            ctypes.byref(req)) == 0
        status = ops.wait(base, req, None)
        message = ctxpar._lib.lib.ctxpar_last_error().decode()
        assert status == -8 and "no peer after 1 s" in message, (status, message)  # TIMEOUT
    else:
        time.sleep(2.5)
    report("timeout")
    sys.stdout.flush()
    os._exit(0)  # no destroy_process_group on a group gloo has closed


CASES = {"comm_ops": case_comm_ops, "timeout": case_timeout, "algorithms": case_algorithms,
         "buffers": case_buffers, "split": case_split, "repro": case_repro}
for name in sys.argv[1:]:
    if name.startswith("seed:"):
        _, dtype_name, causal, seq = name.split(":")
        case_seed(dtype_name, causal == "causal", int(seq))
    else:
        CASES[name]()
dist.destroy_process_group()
