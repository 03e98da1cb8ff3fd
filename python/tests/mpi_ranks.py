"""One MPI process = one rank: run by test_mpi.py under mpirun. Every process builds the same
global inputs, runs ctxpar on its zigzag shard through an mpi4py communicator, and rank 0
gathers the shards and compares them with the float64 oracle. Exit code 0 when within
tolerance."""
import sys

import numpy as np
from mpi4py import MPI

import ctxpar
from conftest import inputs, max_error

world = MPI.COMM_WORLD
rank, P = world.Get_rank(), world.Get_size()
q, k, v, do = inputs(s=16 * P, hq=4, hk=2, d=16, seed=5)
local = {n: ctxpar.shard(x, rank, P, "zigzag") for n, x in
         (("q", q), ("k", k), ("v", v), ("do", do))}
with ctxpar.Context("cpu", world, num_threads=1) as ctx:
    assert (ctx.rank, ctx.size) == (rank, P)
    out, lse = ctx.attention(local["q"], local["k"], local["v"])
    grads = ctx.attention_backward(local["q"], local["k"], local["v"], out, lse, local["do"])
    ctx.comm.close()
parts = world.gather((out,) + grads, root=0)
if rank == 0:
    ref = ctxpar.oracle(q, k, v, do)
    worst = 0.0
    for i, (name, like) in enumerate((("out", q), ("dq", q), ("dk", k), ("dv", v))):
        g = np.empty_like(like)
        for r in range(P):
            ctxpar.unshard(parts[r][i], r, P, g, "zigzag")
        worst = max(worst, max_error(g, ref[name]))
    print(f"mpi4py, {P} processes: max error {worst:.2e}")
    sys.exit(0 if worst <= 4e-6 else 1)
