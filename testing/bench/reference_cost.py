#!/usr/bin/env python3
"""What a check and an audit cost: the float64 reference next to the library, on this machine.

Table 1: `ctxpar check --ranks 4 --backward` (causal, zigzag, 4 heads, dim 64) at each --seq,
judging every row and --rows N: wall time of the whole command, the library at P ranks and at
P = 1, the reference, and the reference over P = 1.

Table 2: `ctxpar audit --against` of forward results made elsewhere, with one rank's rows
corrupted (a lost ring step: the rank's first 128 rows zeroed): the wall time of the audit, its
verdict and the rank it names. The "elsewhere" results are ctxpar's own, saved by a first audit
(`--save`) and then damaged here. --big adds the 128k-token case (8 heads, dim 128, BF16,
--rows 2048), minutes of work and ~2 GiB of files in a temporary folder.

Not part of CI:

    bazel build -c opt //tools/ctxpar //:libctxpar.so
    python3 testing/bench/reference_cost.py [--big]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "python"))
os.environ.setdefault("CTXPAR_LIBRARY", os.path.join(ROOT, "bazel-bin", "libctxpar.so"))
from ctxpar import _safetensors  # noqa: E402  (writes BF16 from uint16 bits)

CHECK = ["--ranks", "4", "--heads", "4", "--dim", "64", "--mask", "causal", "--layout", "zigzag",
         "--backward", "--json"]


def run(cmd):
    """(wall seconds, exit code, parsed JSON on stdout)."""
    env = dict(os.environ, CTXPAR_PROGRESS_AFTER="inf")
    t0 = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.monotonic() - t0
    try:
        report = json.loads(p.stdout)
    except ValueError:
        sys.exit(f"{' '.join(cmd)}: exit {p.returncode}, no JSON: {p.stderr[-500:]}")
    return wall, p.returncode, report


def check_table(tool, seqs, rows):
    print("| seq | rows judged | wall s | library P=4 s | P=1 s | reference s | reference / P=1 |")
    print("|---|---|---|---|---|---|---|")
    for seq in seqs:
        for n in [None] + rows:
            if n is not None and n >= seq:
                continue
            cmd = [tool, "check", "--seq", str(seq)] + CHECK + ([] if n is None else
                                                                ["--rows", str(n)])
            wall, rc, j = run(cmd)
            if rc != 0:
                sys.exit(f"{' '.join(cmd)}: exit {rc}")
            ref, one = j["reference_time_s"], j["single_rank_time_s"]
            print(f"| {seq} | {j['rows_judged']} | {wall:.1f} | {j['time_s']:.2f} | {one:.2f} | "
                  f"{ref:.2f} | {ref / one:.1f}x |", flush=True)


def bf16_bits(x):
    """float32 -> bfloat16 bits, rounded to nearest even."""
    b = x.astype(np.float32).view(np.uint32)
    return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)


def audit_case(tool, folder, seq, heads, dim, dtype, rows, no_single, ranks=4, bad_rank=2):
    rng = np.random.default_rng(7)
    shape = (1, seq, heads, dim)
    x = {n: rng.standard_normal(shape, dtype=np.float32) for n in ("q", "k", "v")}
    if dtype == "bf16":
        x = {n: bf16_bits(a) for n, a in x.items()}
    inputs = os.path.join(folder, "inputs.safetensors")
    _safetensors.write(inputs, x)
    del x
    common = ["--inputs", inputs, "--ranks", str(ranks), "--mask", "causal", "--layout",
              "zigzag", "--rows", str(rows), "--json"] + (["--no-single"] if no_single else [])
    # The results "made elsewhere": ctxpar's own, saved, then one rank's first rows zeroed.
    saved = os.path.join(folder, "saved")
    wall_save, rc, _ = run([tool, "audit", "--save", saved] + common)
    if rc != 0:
        sys.exit(f"audit --save: exit {rc}")
    out = _load_saved(saved)
    pos = _rank_positions(seq, ranks, bad_rank)
    out["out"][:, pos[:128]] = 0
    bad = os.path.join(folder, "results.safetensors")
    _safetensors.write(bad, out)
    wall, rc, j = run([tool, "audit", "--against", bad] + common)
    worst = j["against"]["out"]["worst"]
    return wall_save, wall, rc, j, worst, bad_rank


def _load_saved(folder):
    """cpt_results.safetensors as {name: array} (BF16 as uint16 bits): an 8-byte header length,
    the JSON header, then the tensors' bytes."""
    with open(os.path.join(folder, "cpt_results.safetensors"), "rb") as f:
        blob = f.read()
    n = int.from_bytes(blob[:8], "little")
    header = json.loads(blob[8:8 + n])
    dtypes = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16}
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        a, b = t["data_offsets"]
        out[name] = np.frombuffer(blob[8 + n + a:8 + n + b], dtypes[t["dtype"]]).reshape(
            t["shape"]).copy()
    return out


def _rank_positions(seq, ranks, rank):
    """Zigzag: 2P chunks, rank r holds chunks r and 2P-1-r (seq a multiple of 2P here)."""
    c = seq // (2 * ranks)
    return np.concatenate([np.arange(rank * c, (rank + 1) * c),
                           np.arange((2 * ranks - 1 - rank) * c, (2 * ranks - rank) * c)])


def audit_table(tool, big):
    # (seq, heads, dim, dtype, rows, --no-single): the big one skips the one-rank run.
    cases = [(16384, 4, 64, "f32", 1024, False)]
    if big:
        cases.append((131072, 8, 128, "bf16", 2048, True))
    print("\n| seq | heads | dim | dtype | rows | --no-single | audit --save s | "
          "audit --against s | verdict | worst at (position, rank) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for seq, heads, dim, dtype, rows, no_single in cases:
        with tempfile.TemporaryDirectory(prefix="ctxpar-cost-") as folder:
            ws, wall, rc, j, worst, bad = audit_case(tool, folder, seq, heads, dim, dtype, rows,
                                                     no_single)
        verdict = "CONSISTENT" if j["consistent"] else "NOT CONSISTENT"
        print(f"| {seq} | {heads} | {dim} | {dtype} | {rows} | {'yes' if no_single else 'no'} | "
              f"{ws:.1f} | {wall:.1f} | {verdict} (exit {rc}) | {worst['position']}, rank "
              f"{worst['rank']} (rank {bad} corrupted) |", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tool", default="bazel-bin/tools/ctxpar/ctxpar")
    ap.add_argument("--seqs", default="2048,4096,8192,16384")
    ap.add_argument("--rows", default="1024")
    ap.add_argument("--big", action="store_true", help="also the 128k-token audit")
    ap.add_argument("--audits-only", action="store_true", help="skip the check table")
    args = ap.parse_args()
    if not args.audits_only:
        check_table(args.tool, [int(s) for s in args.seqs.split(",")],
                    [int(r) for r in args.rows.split(",") if r])
    audit_table(args.tool, args.big)


if __name__ == "__main__":
    main()
