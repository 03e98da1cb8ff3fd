#!/usr/bin/env python3
"""Baseline for the GPU benchmarks: PyTorch scaled_dot_product_attention forward, one GPU.

Same shapes as testing/gpu/cuda_bench.c: BF16, batch = 16384 / seq, heads * head_dim = 2048,
head_dim 64 and 128, seq 4k/8k/16k, causal and not, with the flash-attention and cuDNN
backends (each forced alone). TFLOP/s counts 4 * B * H * S^2 * D FLOPs, half of it when causal.
Prints one line per shape and backend, then a JSON line with the same numbers.

    python3 testing/bench/torch_sdpa.py [--quick] [--iters N]
"""
import argparse
import json
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="seq 4096 only")
    ap.add_argument("--iters", type=int, default=10, help="calls per timed round")
    args = ap.parse_args()
    try:
        import torch
        from torch.nn.attention import SDPBackend, sdpa_kernel
        import torch.nn.functional as F
    except Exception as e:  # a clear line instead of a traceback
        print(f"torch_sdpa: skipped: PyTorch not usable ({e})")
        return 0
    if not torch.cuda.is_available():
        print("torch_sdpa: skipped: no CUDA device")
        return 0
    print(f"torch_sdpa: torch {torch.__version__}, {torch.cuda.get_device_name(0)}, "
          f"cuDNN {torch.backends.cudnn.version()}")
    backends = [("torch_flash", SDPBackend.FLASH_ATTENTION),
                ("torch_cudnn", SDPBackend.CUDNN_ATTENTION)]
    seqs = [4096] if args.quick else [4096, 8192, 16384]
    for name, backend in backends:
        for d in (64, 128):
            for s in seqs:
                for causal in (False, True):
                    b, h = 16384 // s, 2048 // d
                    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16)
                               for _ in range(3))
                    try:
                        with sdpa_kernel(backend):
                            for _ in range(3):  # warm-up
                                F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                            torch.cuda.synchronize()
                            rounds = []
                            for _ in range(3):
                                e0 = torch.cuda.Event(enable_timing=True)
                                e1 = torch.cuda.Event(enable_timing=True)
                                e0.record()
                                for _ in range(args.iters):
                                    F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                                e1.record()
                                torch.cuda.synchronize()
                                rounds.append(e0.elapsed_time(e1) / args.iters)
                    except RuntimeError as e:
                        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
                        print(f"{name} d={d} s={s} causal={int(causal)} unavailable: {reason}")
                        continue
                    ms = sorted(rounds)[1]
                    flops = 4.0 * b * h * s * s * d * (0.5 if causal else 1.0)
                    tflops = flops / (ms * 1e-3) / 1e12
                    print(f"{name:<14} bf16 d={d:<3} s={s:<5} b={b:<2} h={h:<2} "
                          f"causal={int(causal)}  {ms:8.3f} ms  {tflops:6.1f} TFLOP/s")
                    print(json.dumps({"impl": name, "dtype": "bf16", "head_dim": d, "seq": s,
                                      "batch": b, "heads": h, "causal": int(causal),
                                      "ms": round(ms, 4), "tflops": round(tflops, 2)}))
                    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
