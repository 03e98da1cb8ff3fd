#!/usr/bin/env python3
"""`ctxpar plan`'s predictions next to `ctxpar bench`'s measurements on this machine.

The hardware model is calibrated here first, from one run that is not in the table: `ctxpar
bench` at P = 1 with every core (the machine's forward FLOP/s and the backward's time over the
forward's). The link bandwidth and latency stay the built-in `cpu` model's (in-process ranks
copy memory; those copies overlap compute). Then each row runs `ctxpar bench` (--rounds times,
the lowest forward + backward time kept: noise only ever slows a run down) and `ctxpar plan`
with the same options and the calibrated model, and prints the markdown table of
docs/performance.md. The bytes columns must agree exactly (plan_test.cc asserts it); the times
show how far the model is from the machine.

Not part of CI:

    bazel build -c opt //tools/ctxpar
    python3 testing/bench/plan_vs_bench.py --rounds 2
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

SHAPE = ["--heads", "8", "--dim", "64", "--mask", "causal", "--layout", "zigzag", "--backward"]

# (algo, P, ulysses or None)
ROWS = [("ring", 2, None), ("ring", 4, None), ("ring", 8, None),
        ("allgather", 2, None), ("allgather", 4, None), ("allgather", 8, None),
        ("alltoall", 2, None), ("alltoall", 4, None), ("alltoall", 8, None),
        ("hybrid", 4, 2), ("hybrid", 8, 2), ("hybrid", 8, 4)]


def run_json(cmd):
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def bench(tool, seq, args, rounds):
    best = None
    for _ in range(rounds):
        r = run_json([tool, "bench", "--seq", str(seq), *SHAPE, *args, "--repeat", "3",
                      "--warmup", "1", "--json"])
        if best is None or r["fwd_bwd_time_s"] < best["fwd_bwd_time_s"]:
            best = r
    return best


def calibrate(tool, seq, rounds):
    r = bench(tool, seq, ["--ranks", "1", "--threads", "0"], rounds)
    model = {"name": "this machine (calibrated)",
             "flops_per_s": r["fwd_flops"] / r["fwd_time_s"],
             "machine_flops_per_s": r["fwd_flops"] / r["fwd_time_s"],
             "bwd_factor": r["bwd_time_s"] / r["fwd_time_s"],
             "group_size": 1 << 20,
             "links": {"group": {"bandwidth_Bps": 5.0e9, "latency_s": 2e-5},
                       "across": {"bandwidth_Bps": 5.0e9, "latency_s": 2e-5}}}
    return model, r


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ctxpar", default="bazel-bin/tools/ctxpar/ctxpar")
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    model, cal = calibrate(a.ctxpar, a.seq, a.rounds)
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(model, f)
        model_path = f.name
    try:
        print(f"calibration: P = 1, {cal['threads_per_rank']} threads, cpu {cal['cpu_uarch']}: "
              f"forward {model['machine_flops_per_s'] / 1e9:.1f} GFLOP/s, backward "
              f"{model['bwd_factor']:.2f}x the forward's time\n")
        print("| algo | P | bench s | plan s | plan / bench | bench bytes/rank | "
              "plan bytes/rank |")
        print("|---|---|---|---|---|---|---|")
        for algo, p, u in ROWS:
            args = ["--ranks", str(p), "--algo", algo] + (["--ulysses", str(u)] if u else [])
            b = bench(a.ctxpar, a.seq, args, a.rounds)
            pl = run_json([a.ctxpar, "plan", "--seq", str(a.seq), *SHAPE, *args, "--dtype",
                           "f32", "--model", model_path, "--no-coverage", "--json"])
            name = f"{algo} (u {u})" if u else algo
            t, pt = b["fwd_bwd_time_s"], pl["predicted_time_s"]
            print(f"| {name} | {p} | {t:.3f} | {pt:.3f} | {pt / t:.2f} | "
                  f"{b['bytes_sent_per_rank']} | {max(pl['bytes_per_rank'])} |")
            sys.stdout.flush()
    finally:
        os.unlink(model_path)


if __name__ == "__main__":
    main()
