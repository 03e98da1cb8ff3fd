#!/usr/bin/env python3
"""ctxpar's CPU backend next to PyTorch's scaled_dot_product_attention on CPU, same shapes.

For each sequence length: PyTorch SDPA (forward, float32, T threads) is timed, and
`ctxpar bench --json` times the ctxpar CPU backend on one rank with the same T threads and on
P in-process ranks (T / P threads each, ring attention). Both throughputs and their ratio are
printed as a markdown table. The outputs are checked to agree: the same random Q, K, V go to
PyTorch and, as .npy files, to `ctxpar audit --save` (P ranks, which also checks ctxpar against
float64 attention); max |out_ctxpar - out_torch| / max |out_torch| must stay within 1e-5, the
float32 tolerance of testing/tolerance.c.

FLOPs count 4 * batch * heads * seq^2 * head_dim for the forward, half of it when causal (the
convention of `ctxpar bench --help`).

Not part of CI. Needs numpy and PyTorch (CPU is enough), e.g. in a virtual environment:

    python3 -m venv /tmp/torchenv
    /tmp/torchenv/bin/pip install numpy torch
    bazel build //testing:ctxpar
    /tmp/torchenv/bin/python testing/bench/compare_torch.py --seq 2048,4096,8192

(PyPI's default torch wheel also carries CUDA libraries, a few GB; PyTorch's CPU-only index,
--index-url https://download.pytorch.org/whl/cpu, is smaller where it can be reached.)
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ctxpar", default="bazel-bin/testing/ctxpar", help="the ctxpar binary")
    ap.add_argument("--seq", default="2048,4096,8192", help="comma list of sequence lengths")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=0, help="0: the same as --heads")
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--mask", choices=["causal", "none"], default="causal")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                    help="threads for PyTorch and for ctxpar's one rank")
    ap.add_argument("--ranks", type=int, default=2, help="ctxpar's ranks for the P-rank run")
    ap.add_argument("--repeat", type=int, default=5, help="timed calls (median)")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--no-agree", action="store_true", help="skip the output comparison")
    ap.add_argument("--json", action="store_true", help="also print one JSON line per shape")
    return ap.parse_args()


def run(cmd):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if p.returncode != 0:
        sys.exit(f"compare_torch: {' '.join(cmd)} failed ({p.returncode}): {p.stderr.strip()}")
    return p.stdout


def torch_forward(torch, q, k, v, causal, repeat, warmup):
    """Median seconds of SDPA on BSHD numpy arrays, and its output as BSHD numpy."""
    import torch.nn.functional as F
    tq, tk, tv = (torch.from_numpy(a).permute(0, 2, 1, 3).contiguous() for a in (q, k, v))
    gqa = {"enable_gqa": True} if tk.shape[1] != tq.shape[1] else {}
    times = []
    with torch.no_grad():
        for i in range(warmup + repeat):
            t0 = time.perf_counter()
            out = F.scaled_dot_product_attention(tq, tk, tv, is_causal=causal, **gqa)
            if i >= warmup:
                times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 2], out.permute(0, 2, 1, 3).contiguous().numpy()


def main():
    args = parse_args()
    try:
        import numpy as np
        import torch
    except ImportError as e:
        sys.exit(f"compare_torch: needs numpy and PyTorch ({e}); see the top of this file")
    if not os.access(args.ctxpar, os.X_OK):
        sys.exit(f"compare_torch: {args.ctxpar} not found: bazel build //testing:ctxpar")
    torch.set_num_threads(args.threads)
    kvh = args.kv_heads or args.heads
    causal = args.mask == "causal"
    per_rank = max(1, args.threads // args.ranks)
    print(f"compare_torch: torch {torch.__version__} ({torch.get_num_threads()} threads), "
          f"ctxpar {run([args.ctxpar, '--version']).split()[-1]}, float32, batch {args.batch}, "
          f"heads {args.heads}/{kvh}, dim {args.dim}, {args.mask} mask, median of "
          f"{args.repeat} after {args.warmup} warm-up\n")
    print(f"| seq | torch SDPA ms | torch GFLOP/s | ctxpar 1 rank x {args.threads} thr ms | "
          f"GFLOP/s | ctxpar / torch | ctxpar {args.ranks} ranks x {per_rank} thr ms | "
          f"GFLOP/s | ctxpar / torch | max rel diff of out |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    rng = np.random.default_rng(0)
    for seq in (int(s) for s in args.seq.split(",")):
        q = rng.uniform(-1, 1, (args.batch, seq, args.heads, args.dim)).astype(np.float32)
        k = rng.uniform(-1, 1, (args.batch, seq, kvh, args.dim)).astype(np.float32)
        v = rng.uniform(-1, 1, (args.batch, seq, kvh, args.dim)).astype(np.float32)
        t_torch, out_torch = torch_forward(torch, q, k, v, causal, args.repeat, args.warmup)
        flops = 4.0 * args.batch * args.heads * seq * seq * args.dim * (0.5 if causal else 1.0)

        shape = ["--batch", str(args.batch), "--seq", str(seq), "--heads", str(args.heads),
                 "--kv-heads", str(kvh), "--dim", str(args.dim), "--mask", args.mask]
        bench = json.loads(run([args.ctxpar, "bench", "--json", "--ranks", str(args.ranks),
                                "--threads", str(per_rank), "--repeat", str(args.repeat),
                                "--warmup", str(args.warmup), "--algo", "ring"] + shape))
        one, par = bench["baseline"], bench
        if one["threads_per_rank"] != args.threads:
            print(f"note: ctxpar's one rank ran {one['threads_per_rank']} threads")

        diff = float("nan")
        if not args.no_agree:
            with tempfile.TemporaryDirectory() as d:
                for name, a in (("q", q), ("k", k), ("v", v)):
                    np.save(os.path.join(d, name + ".npy"), a)
                audit = json.loads(run(
                    [args.ctxpar, "audit", "--json", "--ranks", str(args.ranks), "--algo", "ring",
                     "--mask", args.mask, "--save", os.path.join(d, "out"),
                     "--q", os.path.join(d, "q.npy"), "--k", os.path.join(d, "k.npy"),
                     "--v", os.path.join(d, "v.npy")]))
                if not audit["ok"]:
                    sys.exit(f"compare_torch: ctxpar audit out of tolerance: {audit['errors']}")
                out = np.load(os.path.join(d, "out", "out.npy"))
            diff = float(np.max(np.abs(out - out_torch)) / np.max(np.abs(out_torch)))
        print(f"| {seq} | {t_torch * 1e3:.1f} | {flops / t_torch / 1e9:.1f} | "
              f"{one['fwd_time_s'] * 1e3:.1f} | {one['fwd_flops_per_s'] / 1e9:.1f} | "
              f"{t_torch / one['fwd_time_s']:.2f} | {par['fwd_time_s'] * 1e3:.1f} | "
              f"{par['fwd_flops_per_s'] / 1e9:.1f} | {t_torch / par['fwd_time_s']:.2f} | "
              f"{diff:.1e} |")
        if args.json:
            print(json.dumps({"seq": seq, "torch_s": t_torch, "torch_flops_per_s": flops / t_torch,
                              "ctxpar_1rank_s": one["fwd_time_s"],
                              "ctxpar_prank_s": par["fwd_time_s"], "ranks": args.ranks,
                              "max_rel_diff_out": diff}))
        sys.stdout.flush()
        if not args.no_agree and not diff <= 1e-5:
            sys.exit(f"compare_torch: outputs disagree at seq {seq}: {diff:.3e} > 1e-5")
    print("\nctxpar / torch: PyTorch's time over ctxpar's (above 1: ctxpar is faster).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
