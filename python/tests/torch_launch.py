"""Starts P Python processes with torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK,
LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT) on this machine, as `torchrun --standalone` would.
The tests launch their processes this way because Debian 12's torchrun (torch 1.13) fails at
start under Python 3.11 (its elastic agent); the processes see what torchrun gives them."""
import os
import socket
import subprocess
import sys


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(P, script, *args, timeout=120):
    """Runs script on P processes; returns (exit codes, rank 0's stdout, everyone's stderr)."""
    port = str(free_port())
    procs = []
    for r in range(P):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(P), LOCAL_RANK=str(r),
                   LOCAL_WORLD_SIZE=str(P), MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
        procs.append(subprocess.Popen([sys.executable, script, *args], env=env, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=timeout))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            outs.append(p.communicate())
    return [p.returncode for p in procs], outs[0][0], "".join(o[1] for o in outs)
