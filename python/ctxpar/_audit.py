"""ctxpar.audit(): judging attention results computed elsewhere (PyTorch, TransformerEngine, your
own kernels) against full attention in float64, through the ctxpar tool's `audit --against`
(docs/auditing.md).

The arrays are written to a folder as two .safetensors files (inputs and results, in the order
the caller declares), the tool runs on them with --json, and its verdict comes back as an
AuditReport. The judgement (error measure, ctxpar's own error at the same dtype, the ratio rule,
which rank held each row) exists once, in the tool, so a verdict here and one from the command
line on the same files are the same verdict.
"""
import json
import math
import os
import pathlib
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field

import numpy as np

from . import _lib
from . import _safetensors
from ._core import ALGOS, LAYOUTS, MASKS
from ._tensor import DTYPES, window_pair

AUDIT_FORMATS = ("bshd", "bhsd", "sbhd", "thd")
LSE_LAYOUTS = ("bhs", "bsh", "ht")
LSE_BASES = ("e", "2")
RESULTS = ("out", "lse", "dq", "dk", "dv")
INPUTS_FILE, RESULTS_FILE, SINKS_FILE = "inputs.safetensors", "results.safetensors", "sinks.npy"


class AuditError(_lib.CtxparError):
    """The tool refused the inputs or results (its exit status 2: bad usage or a bad tensor):
    .status CTXPAR_ERR_INVALID_ARG, .message the tool's one line (files named as in .folder),
    .command the command that was run."""

    def __init__(self, message, command):
        super().__init__(-1, "CTXPAR_ERR_INVALID_ARG", message)
        self.command = command


@dataclass(frozen=True)
class AuditRow:
    """One row (a token of one head) of a judged tensor: its global position, head, the rank that
    held it under the declared layout and ranks, batch, its error, and the element with the
    largest error: got (the judged value) and expected (float64), NaN where not finite."""
    position: int
    head: int
    rank: int
    batch: int
    error: float
    got: float
    expected: float


@dataclass(frozen=True)
class TensorVerdict:
    """The verdict on one result tensor. error: max |got - ref| / max |ref| against float64
    (inf for a NaN or an unmatched infinity); reference_error: ctxpar's own error on the same
    inputs at the same dtype; ratio: error / reference_error; bound_ratio: the largest
    |got - ref| / bound over the elements (the verdict: consistent when <= 1; docs/numerics.md);
    worst: the worst row; worst_rows: the worst rows, worst first (only failing ones when any
    fails); error_by_rank: the error over each rank's rows. failing_elements, failing_rows: how
    many elements are out of their bound, and in how many rows (positions; lse: position and
    head); failing_ranges: the first runs of consecutive failing rows as FailingRange."""
    name: str
    error: float
    reference_error: float
    ratio: float
    consistent: bool
    nonfinite: int
    worst: AuditRow
    worst_rows: list = field(default_factory=list)
    error_by_rank: list = field(default_factory=list)
    bound_ratio: float = math.nan
    failing_elements: int = 0
    failing_rows: int = 0
    failing_ranges: list = field(default_factory=list)


@dataclass(frozen=True)
class FailingRange:
    """Consecutive failing rows first..last (global positions) of one batch row, and the ranks
    that held its two ends (with a sampled audit: every judged row between them failed)."""
    batch: int
    first: int
    last: int
    rank_first: int
    rank_last: int


@dataclass(frozen=True)
class AuditReport:
    """consistent: every element of every judged tensor within its per-element bound (and, when
    max_ratio is set, every error within max_ratio x ctxpar's own). tensors: {name:
    TensorVerdict} for each result given. within_tolerance: ctxpar's own run was within its
    tolerance of float64 (when not, ctxpar's errors are no fair yardstick); reference_errors:
    those errors by name. exit_code: the tool's (0 consistent and within tolerance, 1 not).
    command and folder: how to rerun it by hand (folder: where the files were kept, when audit()
    was given one; None otherwise).
    json: the tool's whole report. report: the HTML report's path when audit() was asked for one
    (report=), else None."""
    consistent: bool
    tensors: dict
    max_ratio: object  # float, or None when not asked for
    within_tolerance: bool
    reference_errors: dict
    exit_code: int
    command: list
    folder: str
    json: dict
    report: object = None  # str, or None

    @property
    def failing_elements(self):
        """Elements out of their bound, over every tensor judged."""
        return sum(v.failing_elements for v in self.tensors.values())

    @property
    def failing_rows(self):
        return sum(v.failing_rows for v in self.tensors.values())

    @property
    def failing_ranges(self):
        """{tensor name: [FailingRange]} for the tensors with failing rows."""
        return {n: v.failing_ranges for n, v in self.tensors.items() if v.failing_ranges}

    def __str__(self):
        lines = [f"  {'tensor':<6} {'error':<11} {'ctxpar':<11} {'ratio':<8} {'err/bound':<9} "
                 f"{'out of bound':<16} worst row (position, head, rank)"]
        for v in self.tensors.values():
            w = v.worst
            where = f"{w.position}, {w.head}, {w.rank}" if w else "-"
            out = f"{v.failing_elements} el, {v.failing_rows} rows"
            lines.append(f"  {v.name:<6} {v.error:<11.3e} {v.reference_error:<11.3e} "
                         f"{v.ratio:<8.3g} {v.bound_ratio:<9.3g} {out:<16} {where}  "
                         f"{'ok' if v.consistent else 'NOT CONSISTENT'}")
            for r in v.failing_ranges:
                ranks = (f"rank {r.rank_first}" if r.rank_first == r.rank_last
                         else f"ranks {r.rank_first}-{r.rank_last}")
                lines.append(f"         failing rows {r.first}-{r.last} ({ranks})")
        lines.append("  yardstick: ctxpar's own run is " +
                     ("within its bound" if self.within_tolerance else
                      "NOT within its bound: its errors are no fair yardstick (reference_errors)"))
        if self.consistent:
            lines.append("verdict: CONSISTENT: every element judged is within its bound" +
                         ("" if self.max_ratio is None else
                          f" and each error at most {self.max_ratio:g} x ctxpar's own"))
        else:
            lines.append(f"verdict: NOT CONSISTENT: {self.failing_elements} elements in "
                         f"{self.failing_rows} rows out of their bound")
        return "\n".join(lines)


def _num(x):
    """An error or ratio: the tool writes non-finite numbers as null, and an error is not finite
    only when it is infinite (a NaN or an unmatched infinity in the results)."""
    return math.inf if x is None else float(x)


def _value(x):
    """A tensor element: NaN when it was not finite (JSON cannot say which)."""
    return math.nan if x is None else float(x)


def _row(j):
    return None if not j else AuditRow(int(j["position"]), int(j["head"]), int(j["rank"]),
                                       int(j["batch"]), _num(j["error"]), _value(j["got"]),
                                       _value(j["expected"]))


def _verdict(name, j):
    return TensorVerdict(name, _num(j["error"]), _num(j["reference_error"]), _num(j["ratio"]),
                         bool(j["consistent"]), int(j.get("nonfinite", 0)), _row(j.get("worst")),
                         [_row(r) for r in j.get("worst_rows", [])],
                         [_num(e) for e in j.get("error_by_rank", [])],
                         _num(j.get("bound_ratio")), int(j.get("failing_elements", 0)),
                         int(j.get("failing_rows", 0)),
                         [FailingRange(int(r["batch"]), int(r["first"]), int(r["last"]),
                                       int(r["rank_first"]), int(r["rank_last"]))
                          for r in j.get("failing_ranges", [])])


def tool_path(tool=None):
    """The ctxpar tool that audit() runs, or None when there is none: `tool`, else
    $CTXPAR_TOOL, else PREFIX/bin/ctxpar of the installed prefix this package is in (PREFIX/lib/
    python3/site-packages/ctxpar) or that libctxpar.so was loaded from (PREFIX/lib), else
    `ctxpar` on $PATH."""
    given = tool or os.environ.get("CTXPAR_TOOL")
    if given:
        return given
    here = pathlib.Path(__file__).resolve().parent
    prefixes = []
    if os.sep in _lib.library_path:  # not a bare name that the loader searched for
        prefixes.append(pathlib.Path(_lib.library_path).resolve().parent.parent)
    if here.parent.name == "site-packages" and len(here.parents) > 3 and \
            here.parents[2].name == "lib":
        prefixes.insert(0, here.parents[3])
    for prefix in prefixes:
        exe = prefix / "bin" / "ctxpar"
        if exe.is_file() and os.access(exe, os.X_OK):
            return str(exe)
    return shutil.which("ctxpar")


def _choice(kind, allowed, value):
    if value not in allowed:
        raise ValueError(f"{kind} '{value}' is not one of {sorted(allowed)}")
    return value


def audit(q, k, v, dout=None, *, out=None, lse=None, dq=None, dk=None, dv=None, ranks,
          algo="ring", layout="zigzag", mask="causal", window=0, cu_seqlens=None, scale=None,
          softcap=0.0, sinks=None, dsinks=None, format="bshd", lse_base="e", lse_layout="bhs",
          dtype=None, max_ratio=None, rows=None, seed=None, num_threads=0, folder=None,
          tool=None, timeout=None, report=None):
    """Judges results computed elsewhere on the inputs q, k, v (and dout): an AuditReport.

    out, lse, dq, dk, dv: any of the results to judge (dq, dk, dv need dout), as computed by the
    other implementation, gathered into global order; the report names, for each bad row, the
    rank that held it under `layout` and `ranks` (how the other run split the sequence).
    Tensors: NumPy arrays (float32, float16, bfloat16 as uint16 bits or ml_dtypes, float64:
    read rounded to float32, the results judged at their own dtype) or PyTorch tensors (any device: they are copied), every one in `format`: "bshd", "bhsd", "sbhd", or
    "thd" (packed [tokens, heads, dim] with cu_seqlens); K and V may have fewer heads (GQA).
    lse: float32 (or the results' dtype) in `lse_layout` ("bhs", "bsh", "ht" = [heads, tokens]),
    natural log or base 2 (`lse_base` "e" or "2"). cu_seqlens: packed documents, int32/int64.
    mask, window, algo: the attention and ctxpar's algorithm for its own reference run. dtype:
    the dtype ctxpar's own run uses (default: the results'). max_ratio: also require each error at most
    max_ratio x ctxpar's own (the tool's --max-ratio; None: the per-element bound alone).
    rows: judge only this many query rows (and key rows for dk, dv; the tool's --rows): the first
    and last row of every rank's shard and layout chunk, then random rows from `seed`; the report
    then covers those rows (json["rows_judged"]) and the reference costs O(rows x seq).
    scale: the softmax scale (None: 1/sqrt(head_dim)), the tool's --scale. softcap: the logit
    soft-capping the results were made with (0: none). sinks: float32 [Hq] attention sinks
    (written to sinks.npy for --sinks); dsinks: their gradient as the other implementation
    computed it, judged too (needs sinks and dout). v (and out, dout, dv) may have their own
    head_dim (MLA). report: a path: also write the tool's self-contained HTML report there
    (--report: error/bound by position and head per tensor with the ranks' chunks, per-rank bars,
    the failing runs of rows), written once the verdict is made.

    It runs the ctxpar tool (tool_path(tool)) as `ctxpar audit --inputs inputs.safetensors
    --against results.safetensors ... --json` in `folder` (kept; default a temporary folder,
    removed), ranks as threads (--comm local, also under mpirun). Raises ValueError for bad
    options before running anything, AuditError (a CtxparError) with the tool's one-line message
    for inputs or results it refuses (shapes, dtypes, cu_seqlens), CtxparError when ctxpar's
    own run fails, FileNotFoundError when there is no tool.
    """
    results = {n: t for n, t in zip(RESULTS + ("dsinks",), (out, lse, dq, dk, dv, dsinks))
               if t is not None}
    if not results:
        raise ValueError("give at least one of out, lse, dq, dk, dv, dsinks to judge")
    if dsinks is not None and (sinks is None or dout is None):
        raise ValueError("dsinks is judged with sinks and dout: give both")
    if int(ranks) < 1:
        raise ValueError(f"ranks ({ranks}) must be >= 1")
    _choice("algo", ALGOS, algo)
    _choice("layout", LAYOUTS, layout)
    _choice("mask", MASKS, mask)
    _choice("format", AUDIT_FORMATS, format)
    _choice("lse_layout", LSE_LAYOUTS, lse_layout)
    lse_base = _choice("lse_base", LSE_BASES, str(lse_base))
    if dtype is not None:
        _choice("dtype", DTYPES, dtype)
    window_left, window_right = window_pair(window)
    if max_ratio is not None and not float(max_ratio) >= 1:
        raise ValueError(f"max_ratio ({max_ratio}) must be >= 1")
    if scale is not None and not (math.isfinite(float(scale)) and float(scale) != 0.0):
        raise ValueError(f"scale ({scale}) must be finite and non-zero")
    if rows is not None and int(rows) < 1:
        raise ValueError(f"rows ({rows}) must be >= 1")
    exe = tool_path(tool)
    if exe is None:
        raise FileNotFoundError("ctxpar audit needs the ctxpar tool: set CTXPAR_TOOL to it, "
                                "or install ctxpar (bazel run //:install -- --prefix DIR)")
    inputs = {"q": q, "k": k, "v": v}
    if dout is not None:
        inputs["dout"] = dout
    if cu_seqlens is not None:
        # A list of ints becomes int64; an array or tensor keeps its int32/int64.
        inputs["cu_seqlens"] = (cu_seqlens if hasattr(cu_seqlens, "dtype")
                                else np.asarray(cu_seqlens, dtype=np.int64))
    command = [exe, "audit", "--inputs", INPUTS_FILE, "--against", RESULTS_FILE,
               "--format", format, "--lse-layout", lse_layout, "--lse-base", lse_base,
               "--ranks", str(int(ranks)), "--algo", algo, "--layout", layout, "--mask", mask,
               "--window", str(window_left), "--window-right", str(window_right),
               "--threads", str(int(num_threads)), "--comm", "local", "--json"]
    if dtype is not None:
        command += ["--dtype", dtype]
    if scale is not None:
        command += ["--scale", repr(float(scale))]
    if max_ratio is not None:
        command += ["--max-ratio", repr(float(max_ratio))]
    if rows is not None:
        command += ["--rows", str(int(rows))]
    if seed is not None:
        command += ["--seed", str(int(seed))]
    if report is not None:  # absolute: the tool runs in the work folder
        report = os.path.abspath(os.fspath(report))
        command += ["--report", report]
    if softcap:
        command += ["--softcap", repr(float(softcap))]
    sinks32 = None
    if sinks is not None:
        sinks32 = np.ascontiguousarray(
            sinks.detach().cpu().numpy() if hasattr(sinks, "detach") else sinks, np.float32)
        command += ["--sinks", SINKS_FILE]
    if folder is not None:
        os.makedirs(folder, exist_ok=True)
        return _run(command, str(folder), inputs, results, sinks32, timeout, keep=True,
                    report_path=report)
    with tempfile.TemporaryDirectory(prefix="ctxpar-audit-") as tmp:
        return _run(command, tmp, inputs, results, sinks32, timeout, keep=False, report_path=report)


def _run(command, folder, inputs, results, sinks, timeout, keep, report_path):
    _safetensors.write(os.path.join(folder, INPUTS_FILE), inputs)
    _safetensors.write(os.path.join(folder, RESULTS_FILE), results)
    if sinks is not None:
        np.save(os.path.join(folder, SINKS_FILE), sinks)
    # In the folder, so that the tool's messages name the files as the caller sees them there.
    # No progress lines: stderr is read for the tool's one-line message.
    env = dict(os.environ, CTXPAR_PROGRESS_AFTER="inf")
    p = subprocess.run(command, cwd=folder, capture_output=True, text=True, timeout=timeout,
                       env=env)
    message = p.stderr.strip().splitlines()[-1] if p.stderr.strip() else ""
    if p.returncode == 2:
        raise AuditError(message or f"{command[0]} audit exited with status 2", command)
    try:
        report = json.loads(p.stdout)
    except ValueError:
        raise _lib.CtxparError(-9, "CTXPAR_ERR_INTERNAL",
                               f"{command[0]} audit exited with status {p.returncode} and no "
                               f"JSON report: {message or p.stdout[-200:]}") from None
    status = report.get("status", "CTXPAR_ERR_INTERNAL")
    if status != "CTXPAR_OK":
        codes = {name: code for code, name in _lib.STATUS_NAMES.items()}
        raise _lib.CtxparError(codes.get(status, -9), status, message or status)
    if "against" not in report:
        raise _lib.CtxparError(-9, "CTXPAR_ERR_INTERNAL",
                               f"the tool's report has no verdict (exit {p.returncode}): "
                               f"{message}")
    tensors = {n: _verdict(n, j) for n, j in report["against"].items()}
    max_ratio = report.get("max_ratio")
    return AuditReport(bool(report["consistent"]), tensors,
                       None if max_ratio is None else float(max_ratio),
                       bool(report.get("ok", False)),
                       {n: _num(e) for n, e in report.get("errors", {}).items()},
                       p.returncode, command, folder if keep else None, report, report_path)
