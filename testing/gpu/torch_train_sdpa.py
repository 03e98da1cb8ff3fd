#!/usr/bin/env python3
"""PyTorch baseline for run.sh's `ctxpar bench --backend cuda` step: the same shape, one GPU.

BF16, batch 2, seq 8192, 16 heads, head_dim 128, causal and not; F.scaled_dot_product_attention
in BSHD memory (as ctxpar takes it), forward alone (no_grad) and forward + backward (autograd,
a fixed dout), for PyTorch's own choice of backend and for the flash, cuDNN and efficient
backends each forced alone. FLOPs follow `ctxpar bench --help`: forward 4 * B * H * S^2 * D,
half of it causal; forward + backward 3.5x the forward. Median of --repeat timed calls (CUDA
events) after --warmup. One line per row, then one JSON line with every row.

    python3 testing/gpu/torch_train_sdpa.py [--seq 8192] [--batch 2] [--heads 16] [--dim 128]
"""
import argparse
import json
import statistics


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seq", type=int, default=8192)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    try:
        import torch
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except Exception as e:  # a clear line instead of a traceback
        print(f"torch_train_sdpa: skipped: PyTorch not usable ({e})")
        return 0
    if not torch.cuda.is_available():
        print("torch_train_sdpa: skipped: no CUDA device")
        return 0
    print(f"torch_train_sdpa: torch {torch.__version__}, {torch.cuda.get_device_name(0)}, "
          f"cuDNN {torch.backends.cudnn.version()}")
    B, S, H, D = args.batch, args.seq, args.heads, args.dim
    gen = torch.Generator(device="cuda").manual_seed(1)

    def rand():  # BSHD memory, viewed as BHSD for SDPA
        return (torch.rand(B, S, H, D, device="cuda", dtype=torch.bfloat16, generator=gen)
                * 2 - 1).transpose(1, 2)

    q, k, v, dout = rand(), rand(), rand(), rand()
    rows = []
    backends = [("default", None), ("flash", SDPBackend.FLASH_ATTENTION),
                ("cudnn", SDPBackend.CUDNN_ATTENTION),
                ("efficient", SDPBackend.EFFICIENT_ATTENTION)]

    def timed(fn):
        times = []
        for i in range(args.warmup + args.repeat):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            if i >= args.warmup:
                times.append(start.elapsed_time(end) * 1e-3)
        return statistics.median(times)

    for causal in (False, True):
        fwd_flops = 4.0 * B * H * S * S * D * (0.5 if causal else 1.0)
        for name, backend in backends:
            ql, kl, vl = (t.detach().clone().requires_grad_(True) for t in (q, k, v))

            def fwd():
                with torch.no_grad():
                    F.scaled_dot_product_attention(q, k, v, is_causal=causal)

            def fwd_bwd():
                for t in (ql, kl, vl):
                    t.grad = None
                F.scaled_dot_product_attention(ql, kl, vl, is_causal=causal).backward(dout)

            try:
                if backend is None:
                    t_f, t_fb = timed(fwd), timed(fwd_bwd)
                else:
                    with sdpa_kernel(backend):
                        t_f, t_fb = timed(fwd), timed(fwd_bwd)
            except Exception as e:  # a backend that does not take this shape
                print(f"torch_{name:<9} causal={int(causal)}  unavailable: "
                      f"{str(e).splitlines()[0][:120]}")
                continue
            row = {"impl": f"torch_{name}", "causal": int(causal), "batch": B, "seq": S,
                   "heads": H, "head_dim": D, "dtype": "bf16", "fwd_ms": t_f * 1e3,
                   "fwd_bwd_ms": t_fb * 1e3, "fwd_tflops": fwd_flops / t_f / 1e12,
                   "fwd_bwd_tflops": 3.5 * fwd_flops / t_fb / 1e12}
            rows.append(row)
            print(f"torch_{name:<9} bf16 b={B} s={S} h={H} d={D} causal={int(causal)}  "
                  f"fwd {row['fwd_ms']:8.3f} ms {row['fwd_tflops']:6.1f} TFLOP/s  "
                  f"fwd+bwd {row['fwd_bwd_ms']:8.3f} ms {row['fwd_bwd_tflops']:6.1f} TFLOP/s")
    print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
