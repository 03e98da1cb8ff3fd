#!/usr/bin/env python3
"""ctxpar's CPU backend next to PyTorch's scaled_dot_product_attention on CPU, same shapes.

For each sequence length, float32, BSHD inputs uniform in [-1, 1):

- PyTorch (torch.set_num_threads(T)) is timed twice: the forward alone, F.sdpa under no_grad;
  and forward + backward, one timed call being `out = F.sdpa(q, k, v); out.backward(dout)` on
  leaf tensors with requires_grad and a fixed random dout (the grads are set to None between
  calls, outside the timed region). Each time is the median of --repeat calls after --warmup.
- One `ctxpar bench --json --backward` run per length times the ctxpar CPU backend on one rank
  with the same T threads (its "baseline") and on P in-process ranks with T / P threads each
  (ring attention). Each timed call is the forward (which also writes the log-sum-exp the
  backward needs) followed by the backward; fwd_time_s is the forward part of those calls and
  fwd_bwd_time_s the whole call, each the median of --repeat after --warmup, as for PyTorch.

Ratio = PyTorch's time / ctxpar's time (above 1: ctxpar is faster); the project's target is a
ratio >= 1.0 for the forward and for forward + backward. FLOPs (the GFLOP/s of --gflops and
--json) follow `ctxpar bench --help`: forward 4 * batch * heads * seq^2 * head_dim, half of it
when causal; backward 2.5x the forward, so forward + backward counts 3.5x.

Agreement: the same q, k, v and dout go, as .npy files, to `ctxpar audit --dout --save` (P ranks;
audit also checks ctxpar against float64 attention and exits 1 when out of tolerance), and its
out, dq, dk, dv are compared with PyTorch's: max |ctxpar - torch| / max |torch| must be within
the float32 tolerance of reference/tolerance.c, 1e-5 for out, dq, dk and dv alike, grown by
sqrt(seq / 4096) above seq 4096 as F32 summation errors grow (cpt_tolerance_for_seq; the
value used is the one audit reports for that seq). Otherwise the script exits 1 naming the
tensor. The table's last column is the worst of the four.

--no-backward keeps the forward-only mode (no backward timed, audit without --dout, only out
compared). --no-agree skips the comparison. --json also prints one JSON object per length.

Not part of CI. Needs numpy and PyTorch (CPU is enough), e.g. in a virtual environment:

    python3 -m venv /tmp/torchenv
    /tmp/torchenv/bin/pip install numpy torch
    bazel build //tools/ctxpar
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

GRAD_NAMES = ("dq", "dk", "dv")


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ctxpar", default="bazel-bin/tools/ctxpar/ctxpar", help="the ctxpar binary")
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
    ap.add_argument("--no-backward", action="store_true",
                    help="forward only: no backward timed, only out compared")
    ap.add_argument("--no-agree", action="store_true", help="skip the output comparison")
    ap.add_argument("--gflops", action="store_true", help="add GFLOP/s columns to the table")
    ap.add_argument("--json", action="store_true", help="also print one JSON line per shape")
    return ap.parse_args()


def run(cmd, ok_codes=(0,)):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if p.returncode not in ok_codes:
        sys.exit(f"compare_torch: {' '.join(cmd)} failed ({p.returncode}): {p.stderr.strip()}")
    return p.stdout


def median(times):
    times = sorted(times)
    return times[len(times) // 2]


def to_torch(torch, a, dtype=None):
    """BSHD numpy -> BHSD contiguous torch tensor (in dtype when given: torch.bfloat16, which
    NumPy lacks)."""
    t = torch.from_numpy(a).permute(0, 2, 1, 3).contiguous()
    return t if dtype is None else t.to(dtype)


def to_numpy(t):
    """BHSD torch tensor -> BSHD contiguous numpy array."""
    t = t.detach()
    if str(t.dtype) in ("torch.bfloat16", "torch.float16"):
        t = t.float()  # NumPy has no bfloat16: half types come back as float32
    return t.permute(0, 2, 1, 3).contiguous().numpy()


def torch_forward(torch, q, k, v, causal, repeat, warmup, dtype=None):
    """Median seconds of SDPA under no_grad, and its output (BSHD numpy)."""
    import torch.nn.functional as F
    tq, tk, tv = (to_torch(torch, a, dtype) for a in (q, k, v))
    gqa = {"enable_gqa": True} if tk.shape[1] != tq.shape[1] else {}
    times = []
    with torch.no_grad():
        for i in range(warmup + repeat):
            t0 = time.perf_counter()
            out = F.scaled_dot_product_attention(tq, tk, tv, is_causal=causal, **gqa)
            if i >= warmup:
                times.append(time.perf_counter() - t0)
    return median(times), to_numpy(out)


def torch_forward_backward(torch, q, k, v, dout, causal, repeat, warmup, dtype=None):
    """Median seconds of SDPA forward + out.backward(dout), and {out, dq, dk, dv} (BSHD numpy)
    of the last call."""
    import torch.nn.functional as F
    tq, tk, tv = (to_torch(torch, a, dtype).requires_grad_(True) for a in (q, k, v))
    tdout = to_torch(torch, dout, dtype)
    gqa = {"enable_gqa": True} if tk.shape[1] != tq.shape[1] else {}
    times = []
    for i in range(warmup + repeat):
        for t in (tq, tk, tv):
            t.grad = None
        t0 = time.perf_counter()
        out = F.scaled_dot_product_attention(tq, tk, tv, is_causal=causal, **gqa)
        out.backward(tdout)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    res = {"out": to_numpy(out)}
    res.update({n: to_numpy(t.grad) for n, t in zip(GRAD_NAMES, (tq, tk, tv))})
    return median(times), res


def ctxpar_audit(np, args, per_rank, q, k, v, dout):
    """ctxpar's out (and dq, dk, dv with dout) on the same inputs, and the tolerances audit
    applies to them (reference/tolerance.c for this seq)."""
    with tempfile.TemporaryDirectory() as d:
        inputs = [("q", q), ("k", k), ("v", v)] + ([("dout", dout)] if dout is not None else [])
        cmd = [args.ctxpar, "audit", "--json", "--ranks", str(args.ranks), "--threads",
               str(per_rank), "--algo", "ring", "--mask", args.mask,
               "--save", os.path.join(d, "out")]
        for name, a in inputs:
            np.save(os.path.join(d, name + ".npy"), a)
            cmd += ["--" + name, os.path.join(d, name + ".npy")]
        audit = json.loads(run(cmd, ok_codes=(0, 1)))
        if not audit.get("ok"):
            sys.exit(f"compare_torch: ctxpar audit failed or out of tolerance against float64: "
                     f"{audit.get('status')} {audit.get('errors')}")
        names = ["out"] + (list(GRAD_NAMES) if dout is not None else [])
        got = {n: np.load(os.path.join(d, "out", n + ".npy")) for n in names}
    return got, {n: float(audit["tolerance"][n]) for n in names}


def fmt_ms(s):
    return f"{s * 1e3:.1f}"


def main():
    args = parse_args()
    try:
        import numpy as np
        import torch
    except ImportError as e:
        sys.exit(f"compare_torch: needs numpy and PyTorch ({e}); see the top of this file")
    if not os.access(args.ctxpar, os.X_OK):
        sys.exit(f"compare_torch: {args.ctxpar} not found: bazel build //tools/ctxpar")
    torch.set_num_threads(args.threads)
    kvh = args.kv_heads or args.heads
    causal = args.mask == "causal"
    backward = not args.no_backward
    per_rank = max(1, args.threads // args.ranks)
    print(f"compare_torch: torch {torch.__version__} ({torch.get_num_threads()} threads), "
          f"ctxpar {run([args.ctxpar, '--version']).split()[-1]}, float32, batch {args.batch}, "
          f"heads {args.heads}/{kvh}, dim {args.dim}, {args.mask} mask, median of "
          f"{args.repeat} after {args.warmup} warm-up, "
          f"{'forward and forward+backward' if backward else 'forward only'}\n")

    # (header, cell) pairs; the cell reads from one row dict. GFLOP/s columns only on request.
    g = args.gflops
    one, par = f"ctxpar 1 rank x {args.threads} thr", f"ctxpar {args.ranks} ranks x {per_rank} thr"
    cols = [("seq", lambda r: str(r["seq"])),
            ("torch fwd ms", lambda r: fmt_ms(r["torch_fwd_s"]))]
    if g:
        cols.append(("GFLOP/s", lambda r: f"{r['torch_fwd_flops_per_s'] / 1e9:.1f}"))
    if backward:
        cols.append(("torch fwd+bwd ms", lambda r: fmt_ms(r["torch_fwd_bwd_s"])))
        if g:
            cols.append(("GFLOP/s", lambda r: f"{r['torch_fwd_bwd_flops_per_s'] / 1e9:.1f}"))
    for label, key in ((one, "ctxpar_1rank"), (par, "ctxpar_prank")):
        cols.append((f"{label} fwd ms", lambda r, k=key: fmt_ms(r[k + "_fwd_s"])))
        if g:
            cols.append(("GFLOP/s", lambda r, k=key: f"{r[k + '_fwd_flops_per_s'] / 1e9:.1f}"))
        cols.append(("fwd ratio", lambda r, k=key: f"{r[k + '_fwd_ratio']:.2f}"))
        if backward:
            cols.append(("fwd+bwd ms", lambda r, k=key: fmt_ms(r[k + "_fwd_bwd_s"])))
            if g:
                cols.append(("GFLOP/s",
                             lambda r, k=key: f"{r[k + '_fwd_bwd_flops_per_s'] / 1e9:.1f}"))
            cols.append(("fwd+bwd ratio", lambda r, k=key: f"{r[k + '_fwd_bwd_ratio']:.2f}"))
    cols.append(("max rel diff (" + ("out, dq, dk, dv" if backward else "out") + ")",
                 lambda r: f"{r['max_rel_diff']:.1e}"))
    print("| " + " | ".join(h for h, _ in cols) + " |")
    print("|" + "---:|" * len(cols))

    rng = np.random.default_rng(0)
    below = []  # (seq, which) where ctxpar is slower than PyTorch
    for seq in (int(s) for s in args.seq.split(",")):
        q = rng.uniform(-1, 1, (args.batch, seq, args.heads, args.dim)).astype(np.float32)
        k = rng.uniform(-1, 1, (args.batch, seq, kvh, args.dim)).astype(np.float32)
        v = rng.uniform(-1, 1, (args.batch, seq, kvh, args.dim)).astype(np.float32)
        dout = (rng.uniform(-1, 1, q.shape).astype(np.float32) if backward else None)
        fwd_flops = 4.0 * args.batch * args.heads * seq * seq * args.dim * (0.5 if causal else 1)
        row = {"seq": seq, "batch": args.batch, "heads": args.heads, "kv_heads": kvh,
               "dim": args.dim, "mask": args.mask, "threads": args.threads,
               "ranks": args.ranks, "threads_per_rank": per_rank, "fwd_flops": fwd_flops}

        t, ref = torch_forward(torch, q, k, v, causal, args.repeat, args.warmup)
        row.update(torch_fwd_s=t, torch_fwd_flops_per_s=fwd_flops / t)
        refs = {"out": ref}
        if backward:
            t, refs = torch_forward_backward(torch, q, k, v, dout, causal, args.repeat,
                                             args.warmup)
            row.update(fwd_bwd_flops=3.5 * fwd_flops, torch_fwd_bwd_s=t,
                       torch_fwd_bwd_flops_per_s=3.5 * fwd_flops / t)

        shape = ["--batch", str(args.batch), "--seq", str(seq), "--heads", str(args.heads),
                 "--kv-heads", str(kvh), "--dim", str(args.dim), "--mask", args.mask]
        bench = json.loads(run([args.ctxpar, "bench", "--json", "--ranks", str(args.ranks),
                                "--threads", str(per_rank), "--repeat", str(args.repeat),
                                "--warmup", str(args.warmup), "--algo", "ring"] + shape
                               + (["--backward"] if backward else [])))
        if bench["baseline"]["threads_per_rank"] != args.threads:
            print(f"note: ctxpar's one rank ran {bench['baseline']['threads_per_rank']} threads")
        for key, res in (("ctxpar_1rank", bench["baseline"]), ("ctxpar_prank", bench)):
            row[key + "_fwd_s"] = res["fwd_time_s"]
            row[key + "_fwd_flops_per_s"] = res["fwd_flops_per_s"]
            row[key + "_fwd_ratio"] = row["torch_fwd_s"] / res["fwd_time_s"]
            if backward:
                row[key + "_fwd_bwd_s"] = res["fwd_bwd_time_s"]
                row[key + "_fwd_bwd_flops_per_s"] = res["fwd_bwd_flops_per_s"]
                row[key + "_fwd_bwd_ratio"] = row["torch_fwd_bwd_s"] / res["fwd_bwd_time_s"]
            for part in ("fwd", "fwd_bwd") if backward else ("fwd",):
                if row[f"{key}_{part}_ratio"] < 1.0:
                    below.append(f"seq {seq} {key[7:]} {part.replace('_', '+')}")

        bad = []
        row["max_rel_diff"] = float("nan")
        if not args.no_agree:
            got, tol = ctxpar_audit(np, args, per_rank, q, k, v, dout)
            for name in got:
                d = float(np.max(np.abs(got[name] - refs[name])) / np.max(np.abs(refs[name])))
                row["rel_diff_" + name], row["tolerance_" + name] = d, tol[name]
                if not d <= tol[name]:
                    bad.append(f"{name} {d:.3e} > {tol[name]:.1e}")
            row["max_rel_diff"] = max(row["rel_diff_" + n] for n in got)
        print("| " + " | ".join(cell(row) for _, cell in cols) + " |")
        if args.json:
            print(json.dumps(row))
        sys.stdout.flush()
        if bad:
            sys.exit(f"compare_torch: ctxpar and PyTorch disagree at seq {seq}: "
                     + ", ".join(bad))
    print("\nratio: PyTorch's time over ctxpar's (above 1: ctxpar is faster); target >= 1.0.")
    print("below target: " + (", ".join(below) if below else "none"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
