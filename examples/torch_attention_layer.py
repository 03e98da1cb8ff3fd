"""A trainer-style attention layer over ctxpar: an nn.Module whose forward calls
F.scaled_dot_product_attention, trained under ctxpar.torch.context_parallel on the
torch.distributed default group (gloo, CPU); torch 1.13 (Debian's) and newer.

    PYTHONPATH=/opt/ctxpar/lib/python3/site-packages torchrun --nproc-per-node=2 \
        examples/torch_attention_layer.py
    python3 examples/torch_attention_layer.py     # starts 2 processes itself (no torchrun)

Each rank holds a zigzag shard of the batch's tokens (context_parallel shards x in place);
the weights' gradients are all-reduced over the group as a data-parallel trainer does. Prints
the loss per step, and checks the first step's weight gradient against the same layer run on
the whole sequence in float64 on one process (exits 1 outside tolerance).
"""
import os
import socket

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import ctxpar.torch as ct


class Attention(nn.Module):
    """Multi-head causal self-attention: [B, S, E] -> [B, S, E]."""

    def __init__(self, embed, heads):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(embed, 3 * embed)
        self.proj = nn.Linear(embed, embed)

    def forward(self, x):
        b, s, e = x.shape
        q, k, v = (t.view(b, s, self.heads, e // self.heads).transpose(1, 2)
                   for t in self.qkv(x).chunk(3, dim=-1))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # ctxpar inside the block
        return self.proj(y.transpose(1, 2).reshape(b, s, e))


def whole_sequence_grad(layer, x):
    """The first step's weight gradient on one process, the whole sequence, float64, with
    attention written out (torch 1.13 has no F.scaled_dot_product_attention)."""
    ref = Attention(x.shape[-1], layer.heads).double()
    ref.load_state_dict(layer.state_dict())
    b, s, e = x.shape
    q, k, v = (t.view(b, s, ref.heads, -1).transpose(1, 2)
               for t in ref.qkv(x.double()).chunk(3, dim=-1))
    scores = (q @ k.transpose(-1, -2)) / (e // ref.heads) ** 0.5
    scores = scores.masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), float("-inf"))
    y = ref.proj((scores.softmax(-1) @ v).transpose(1, 2).reshape(b, s, e))
    y.square().mean().backward()
    return ref.qkv.weight.grad


def main():
    dist.init_process_group("gloo")
    P = dist.get_world_size()
    torch.manual_seed(0)  # the same weights and data on every rank
    layer = Attention(64, 4)
    opt = torch.optim.SGD(layer.parameters(), lr=0.1)
    x_all = torch.randn(2, 256, 64)
    want = whole_sequence_grad(layer, x_all)
    for step in range(3):
        x = x_all.clone()
        with ct.context_parallel(None, buffers=[x], buffer_seq_dims=[1], no_restore_buffers={x}):
            loss = layer(x).square().mean() / P  # this rank's tokens: x is its shard here
        opt.zero_grad()
        loss.backward()
        for p in layer.parameters():  # the context-parallel group's gradient sum
            dist.all_reduce(p.grad)
        if step == 0:
            err = float((layer.qkv.weight.grad.double() - want).abs().max() / want.abs().max())
        total = loss.detach().clone()
        dist.all_reduce(total)
        opt.step()
        if dist.get_rank() == 0:
            print(f"step {step}: loss {float(total):.6f}")
    if dist.get_rank() == 0:
        print(f"first step's qkv weight gradient vs float64 whole sequence: {err:.1e}")
    dist.destroy_process_group()
    if err > 1e-5:
        raise SystemExit(f"gradient outside tolerance: {err:.1e}")


def _spawned(rank, port, P):
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(P), LOCAL_WORLD_SIZE=str(P),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    main()


if __name__ == "__main__":
    if "RANK" in os.environ:  # under torchrun
        main()
    else:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        torch.multiprocessing.spawn(_spawned, args=(port, 2), nprocs=2)
