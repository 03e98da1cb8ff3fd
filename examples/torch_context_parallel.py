"""The seed's PyTorch context-parallel example on CPU processes, through ctxpar: only the
import of context_parallel (ctxpar.torch's instead of torch.distributed.tensor.experimental's)
and the device ("cpu", gloo) differ from the GPU original. Needs torch >= 2.3 (init_device_mesh,
torch.nn.attention); run it with

    PYTHONPATH=/opt/ctxpar/lib/python3/site-packages \
        torchrun --standalone --nproc-per-node=2 examples/torch_context_parallel.py

It then gathers the output and the gradients (each rank's loss is the mean over its shard) and
checks them against float64 attention over the whole sequence; exits 1 outside tolerance.
"""
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.nn.attention import SDPBackend, sdpa_kernel

from ctxpar.torch import context_parallel, context_parallel_unshard

mesh = init_device_mesh("cpu", (int(os.environ["WORLD_SIZE"]),))  # torchrun sets it
torch.manual_seed(0)
qkv = [torch.randn(1, 4, 4096, 64, dtype=torch.bfloat16, requires_grad=True) for _ in range(3)]
whole = [t.detach().clone() for t in qkv]

with sdpa_kernel(SDPBackend.FLASH_ATTENTION), context_parallel(mesh, buffers=tuple(qkv), buffer_seq_dims=(2, 2, 2)):
    output = F.scaled_dot_product_attention(*qkv, is_causal=True)
output.float().square().mean().backward()

# The check: float64 attention over the whole sequence, the same loss summed over the ranks.
got = context_parallel_unshard(mesh, [output] + [t.grad for t in qkv], [2, 2, 2, 2])
ref = [t.double().requires_grad_() for t in whole]
out64 = F.scaled_dot_product_attention(*ref, is_causal=True)
(out64.square().mean() * mesh.size()).backward()
errors = {name: float((g.double() - r).abs().max() / r.abs().max())
          for name, g, r in zip(("out", "dq", "dk", "dv"), got, [out64.detach()] + [t.grad for t in ref])}
if dist.get_rank() == 0:
    print(f"torch {torch.__version__}, {mesh.size()} ranks: max error relative to max |fp64|:",
          {k: f"{e:.1e}" for k, e in errors.items()})
bad = {k: e for k, e in errors.items() if e > 1.6e-2}  # the BF16 bound of python/tests
if bad:
    raise SystemExit(f"outside tolerance: {bad}")
