"""ctxpar.audit: "third-party" results made here from the float64 oracle (ctxpar.oracle) and
rounded to the dtype are consistent; planted bugs are not, and the report names the rank that
held the bad rows; bad inputs raise with the tool's message. Needs the ctxpar tool (see
conftest.require_tool)."""
import subprocess

import numpy as np
import pytest

import ctxpar
from ctxpar import _tensor
from conftest import inputs, require_tool


@pytest.fixture(scope="module")
def tool():
    return require_tool()


def rel_error(got, ref):
    """The tool's measure, written here: max |got - ref| / max |ref|."""
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    return float(np.abs(got - ref).max() / np.abs(ref).max())


def to_format(x, fmt):
    """A [B, S, H, D] array in fmt (thd: batch 1, packed)."""
    return {"bshd": x, "bhsd": x.transpose(0, 2, 1, 3), "sbhd": x.transpose(1, 0, 2, 3),
            "thd": x[0]}[fmt]


def lse_to(lse, layout):
    """The oracle's [B, H, S] LSE in lse_layout (ht: batch 1, [heads, tokens])."""
    return {"bhs": lse, "bsh": lse.transpose(0, 2, 1), "ht": lse[0]}[layout]


def case(dtype="f32", s=64, hq=4, hk=2, d=16, seed=0, cu_seqlens=None, mask="causal",
         scale=None):
    """Inputs in dtype (NumPy bf16: uint16 bits) and a correct third-party result: the float64
    oracle on those inputs, rounded to dtype (lse to float32). All [B, S, H, D]."""
    q, k, v, do = inputs(s=s, hq=hq, hk=hk, d=d, seed=seed)
    if dtype == "bf16":
        q, k, v, do = (_tensor.to_bf16_bits(x) for x in (q, k, v, do))
    elif dtype == "f16":
        q, k, v, do = (x.astype(np.float16) for x in (q, k, v, do))
    ref = ctxpar.oracle(q, k, v, do, mask=mask, cu_seqlens=cu_seqlens, scale=scale,
                        bf16_bits=dtype == "bf16")
    res = {}
    for name in ("out", "dq", "dk", "dv"):
        x = ref[name].astype(np.float32)
        res[name] = (_tensor.to_bf16_bits(x) if dtype == "bf16" else
                     x.astype(np.float16) if dtype == "f16" else x)
    res["lse"] = ref["lse"].astype(np.float32)
    return (q, k, v, do), res, ref


def as_float(x):
    return _tensor.from_bf16_bits(x) if x.dtype == np.uint16 else x


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
def test_correct_result_rounded_to_dtype_is_consistent(dtype, tool):
    (q, k, v, do), res, ref = case(dtype)
    rep = ctxpar.audit(q, k, v, do, **res, ranks=2, layout="zigzag", mask="causal")
    assert rep.consistent and rep.exit_code == 0 and rep.within_tolerance, str(rep)
    assert set(rep.tensors) == {"out", "lse", "dq", "dk", "dv"}
    for name, verdict in rep.tensors.items():
        # The tool's error is the measure above against its own float64 attention.
        want = rel_error(as_float(res[name]), ref[name])
        assert verdict.error == pytest.approx(want, rel=1e-3), name
        assert verdict.consistent and verdict.ratio <= 2 and verdict.nonfinite == 0, name
        assert 0 < verdict.bound_ratio <= 1, name  # the verdict: every element within its bound
        assert verdict.reference_error == pytest.approx(rep.reference_errors[name]), name
        assert verdict.ratio == pytest.approx(verdict.error / verdict.reference_error, rel=1e-6)
        assert len(verdict.error_by_rank) == 2 and verdict.worst.rank in (0, 1)
        pos = ctxpar.positions("zigzag", 64, verdict.worst.rank, 2)
        assert verdict.worst.position in pos, name  # the rank is the one holding the row
    assert str(rep).splitlines()[-1].startswith("verdict: CONSISTENT")
    assert rep.failing_elements == 0 and rep.failing_rows == 0 and rep.failing_ranges == {}


def test_scale_is_the_one_the_results_were_made_with(tool):
    # Results made at scale -0.3 (negative: the sign matters too) are consistent when the
    # audit is told so, and not at the default scale.
    (q, k, v, do), res, _ = case("f32", scale=-0.3)
    rep = ctxpar.audit(q, k, v, do, **res, ranks=2, scale=-0.3)
    assert rep.consistent, str(rep)
    assert not ctxpar.audit(q, k, v, do, **res, ranks=2).consistent
    with pytest.raises(ValueError, match="scale"):
        ctxpar.audit(q, k, v, do, **res, ranks=2, scale=0.0)


@pytest.mark.parametrize("layout,fmt,bad_rank", [("zigzag", "bshd", 2), ("striped", "bhsd", 1),
                                                 ("contiguous", "sbhd", 3)])
def test_one_ranks_rows_zeroed_names_that_rank(layout, fmt, bad_rank, tool):
    P, S = 4, 64
    (q, k, v, do), res, _ = case("f32", s=S)
    bad = res["out"].copy()
    bad[:, ctxpar.positions(layout, S, bad_rank, P)] = 0  # one rank's rows of out lost
    res["out"] = bad
    f = lambda x: to_format(x, fmt)  # noqa: E731
    rep = ctxpar.audit(f(q), f(k), f(v), f(do), out=f(res["out"]), lse=res["lse"],
                       dq=f(res["dq"]), dk=f(res["dk"]), dv=f(res["dv"]), ranks=P,
                       layout=layout, format=fmt)
    assert not rep.consistent and rep.exit_code == 1
    out = rep.tensors["out"]
    assert not out.consistent and out.ratio > 1000 and out.bound_ratio > 1
    assert out.worst.rank == bad_rank
    assert all(row.rank == bad_rank for row in out.worst_rows)
    assert out.worst.position in ctxpar.positions(layout, S, bad_rank, P)
    others = [e for r, e in enumerate(out.error_by_rank) if r != bad_rank]
    assert out.error_by_rank[bad_rank] > 0.1 and max(others) < 1e-6
    assert all(rep.tensors[n].consistent for n in ("lse", "dq", "dk", "dv"))
    # Counted: every row the rank held fails, in runs of consecutive positions, all its own.
    lost = ctxpar.positions(layout, S, bad_rank, P)
    assert out.failing_rows == len(lost) and rep.failing_rows == len(lost)
    assert 0 < out.failing_elements <= len(lost) * q.shape[2] * q.shape[3]
    runs = [(r.first, r.last) for r in out.failing_ranges]
    if layout == "striped":  # every lost row is a run of its own: 8 listed, the rest counted
        assert len(runs) == 8 and all(a == b for a, b in runs)
        assert rep.json["against"]["out"]["more_failing_ranges"] == len(lost) - 8
    else:
        covered = [p for a, b in runs for p in range(a, b + 1)]
        assert sorted(covered) == sorted(int(p) for p in lost)
    assert all(r.rank_first == r.rank_last == bad_rank for r in out.failing_ranges)
    last = str(rep).splitlines()[-1]
    assert last.startswith(f"verdict: NOT CONSISTENT: {rep.failing_elements} elements in "), last


def test_lse_in_base_2_declared_or_not(tool):
    (q, k, v, _), res, _ = case("f32", seed=4)
    lse2 = (res["lse"].astype(np.float64) / np.log(2)).astype(np.float32)
    rep = ctxpar.audit(q, k, v, out=res["out"], lse=lse2, ranks=2, lse_base=2)
    assert rep.consistent, str(rep)
    rep = ctxpar.audit(q, k, v, out=res["out"], lse=lse2, ranks=2)  # base e assumed
    assert not rep.consistent and rep.exit_code == 1
    assert not rep.tensors["lse"].consistent and rep.tensors["out"].consistent
    assert rep.tensors["lse"].error > 0.3  # off by a factor 1/ln 2 everywhere


def test_thd_packed_documents_with_lse_heads_tokens(tool):
    cu = np.array([0, 24, 64], dtype=np.int32)  # each document a multiple of 2P tokens
    (q, k, v, do), res, _ = case("bf16", cu_seqlens=cu, seed=5)
    t = lambda x: to_format(x, "thd")  # noqa: E731
    rep = ctxpar.audit(t(q), t(k), t(v), t(do), out=t(res["out"]), lse=lse_to(res["lse"], "ht"),
                       dq=t(res["dq"]), dk=t(res["dk"]), dv=t(res["dv"]), ranks=2,
                       format="thd", lse_layout="ht", cu_seqlens=cu)
    assert rep.consistent, str(rep)
    # A document boundary ignored by the other implementation: the second document's rows.
    whole = ctxpar.oracle(q, k, v, bf16_bits=True)["out"].astype(np.float32)
    rep = ctxpar.audit(t(q), t(k), t(v), out=t(_tensor.to_bf16_bits(whole)), ranks=2,
                       format="thd", cu_seqlens=cu.tolist())
    assert not rep.consistent and rep.tensors["out"].worst.position >= 24


def test_empty_documents_are_allowed(tool):
    # TransformerEngine's THD tests draw zero-length documents: repeated boundaries.
    cu = np.array([0, 20, 20, 37, 64, 64], dtype=np.int64)
    (q, k, v, do), res, _ = case("f32", cu_seqlens=cu, seed=7)
    rep = ctxpar.audit(q, k, v, do, **res, ranks=2, cu_seqlens=cu)
    assert rep.consistent, str(rep)
    sim = ctxpar.simulate(q, k, v, do, ranks=4, cu_seqlens=cu)
    ref = ctxpar.oracle(q, k, v, do, cu_seqlens=cu)
    for name in ("out", "dq", "dk", "dv"):
        assert np.abs(sim[name] - ref[name]).max() <= 1e-5 * max(1.0, np.abs(ref[name]).max())


def test_folder_keeps_the_files_and_the_command_reruns(tmp_path, tool):
    (q, k, v, do), res, _ = case("f32", s=32)
    res["dk"] = res["dk"] * np.float32(1.01)
    rep = ctxpar.audit(q, k, v, do, **res, ranks=2, folder=tmp_path)
    assert rep.folder == str(tmp_path) and not rep.consistent
    assert not rep.tensors["dk"].consistent and rep.tensors["dv"].consistent
    assert (tmp_path / "inputs.safetensors").is_file()
    again = subprocess.run(rep.command, cwd=tmp_path, capture_output=True, text=True)
    assert again.returncode == 1 and '"consistent":false' in again.stdout


def test_bad_results_raise_with_the_tools_message(tool):
    (q, k, v, do), res, _ = case("f32", s=32)
    with pytest.raises(ctxpar.CtxparError) as e:
        ctxpar.audit(q, k, v, do, out=res["out"][:, :16], ranks=2)
    assert isinstance(e.value, ctxpar.AuditError) and e.value.status == -1
    assert e.value.name == "CTXPAR_ERR_INVALID_ARG"
    assert "results.safetensors" in e.value.message and "out has dims" in e.value.message
    with pytest.raises(ctxpar.AuditError, match="no dout"):
        ctxpar.audit(q, k, v, dq=res["dq"], ranks=2)
    with pytest.raises(ctxpar.AuditError, match="does not match"):
        ctxpar.audit(q, k[:, :, :, :8], v, out=res["out"], ranks=2)
    with pytest.raises(ctxpar.AuditError, match="cu_seqlens"):
        ctxpar.audit(q, k, v, out=res["out"], ranks=2, cu_seqlens=[0, 20, 16, 32])
    # Only the library knows: all-to-all splits the 4 query heads over the ranks.
    (q, k, v, _), res, _ = case("f32", s=48)
    with pytest.raises(ctxpar.CtxparError, match="divide by the ranks"):
        ctxpar.audit(q, k, v, out=res["out"], ranks=3, algo="alltoall", layout="contiguous")


def test_bad_options_raise_before_the_tool_runs(monkeypatch):
    monkeypatch.setenv("CTXPAR_TOOL", "/nonexistent/ctxpar")  # running it would fail otherwise
    (q, k, v, _), res, _ = case("f32", s=32)
    out = res["out"]
    for kw, match in ((dict(), "at least one"), (dict(out=out, format="bsdh"), "format"),
                      (dict(out=out, lse_base=10), "lse_base"), (dict(out=out, ranks=0), "ranks"),
                      (dict(out=out, scale=float("nan")), "scale"), (dict(out=out, mask="sliding"), "mask"),
                      (dict(out=out, max_ratio=0.5), "max_ratio"),
                      (dict(out=out.astype(np.complex64)), "complex64")):
        kw.setdefault("ranks", 2)
        with pytest.raises(ValueError, match=match):
            ctxpar.audit(q, k, v, **kw)
    assert ctxpar.tool_path() == "/nonexistent/ctxpar"
    assert ctxpar.tool_path("/x/ctxpar") == "/x/ctxpar"


def test_nan_in_one_rank_is_an_infinite_error_on_that_rank(tool):
    (q, k, v, do), res, _ = case("f32", s=32, seed=6)
    pos = ctxpar.positions("zigzag", 32, 1, 2)
    res["dv"] = res["dv"].copy()
    res["dv"][0, pos[3], 1, 2] = np.nan
    rep = ctxpar.audit(q, k, v, do, **res, ranks=2)
    dv = rep.tensors["dv"]
    assert not rep.consistent and dv.nonfinite == 1 and dv.error == np.inf
    assert (dv.worst.position, dv.worst.head, dv.worst.rank) == (pos[3], 1, 1)
    assert np.isnan(dv.worst.got) and np.isfinite(dv.worst.expected)
    assert dv.error_by_rank[1] == np.inf and np.isfinite(dv.error_by_rank[0])


def test_mla_sinks_softcap_and_dsinks_are_judged(tool):
    # MLA (v's head_dim 8 beside 16), sinks with their gradient, soft-capping, 30 tokens on 4
    # ranks (uneven shards): the oracle's results are consistent, a dsinks off by 2x is not.
    rng = np.random.default_rng(9)
    q, k = rng.standard_normal((1, 30, 4, 16), np.float32), rng.standard_normal((1, 30, 2, 16),
                                                                                np.float32)
    v, do = rng.standard_normal((1, 30, 2, 8), np.float32), rng.standard_normal((1, 30, 4, 8),
                                                                                np.float32)
    sinks = np.array([0.5, -1.0, 2.0, 0.0], np.float32)
    ref = ctxpar.oracle(q, k, v, do, sinks=sinks, softcap=3.0)
    res = {n: ref[n].astype(np.float32) for n in ("out", "lse", "dq", "dk", "dv", "dsinks")}
    rep = ctxpar.audit(q, k, v, do, ranks=4, sinks=sinks, softcap=3.0, tool=tool, **res)
    assert rep.consistent, rep
    assert set(rep.tensors) == {"out", "lse", "dq", "dk", "dv", "dsinks"}
    assert rep.tensors["dsinks"].bound_ratio <= 1
    res["dsinks"] = 2 * res["dsinks"]
    rep = ctxpar.audit(q, k, v, do, ranks=4, sinks=sinks, softcap=3.0, tool=tool, **res)
    assert not rep.consistent and not rep.tensors["dsinks"].consistent
    assert rep.tensors["out"].consistent
    with pytest.raises(ValueError, match="dsinks"):
        ctxpar.audit(q, k, v, ranks=4, sinks=sinks, tool=tool, dsinks=res["dsinks"])


def test_sampled_rows_still_name_the_rank_of_a_lost_ring_step(tool):
    # rows=24 of 256: the report covers 24 rows, every rank's first and last among them, and a
    # block of rows lost on one rank (its first rows included) is still found and named.
    P, S, bad_rank = 4, 256, 2
    (q, k, v, do), res, _ = case("f32", s=S)
    mine = ctxpar.positions("contiguous", S, bad_rank, P)
    res["out"] = res["out"].copy()
    res["out"][:, mine[:16]] = 0
    rep = ctxpar.audit(q, k, v, do, **res, ranks=P, layout="contiguous", rows=24, seed=3)
    assert rep.json["rows_judged"] == 24 and rep.json["rows_total"] == S
    assert rep.json["rows_boundaries"] >= 2 * P
    out = rep.tensors["out"]
    assert not rep.consistent and not out.consistent and out.worst.rank == bad_rank
    assert out.worst.position in mine[:16]
    assert all(rep.tensors[n].consistent for n in ("lse", "dq", "dk", "dv"))
    # The same correct results, sampled, are consistent.
    (q, k, v, do), res, _ = case("f32", s=S)
    assert ctxpar.audit(q, k, v, do, **res, ranks=P, rows=24).consistent
    with pytest.raises(ValueError, match="rows"):
        ctxpar.audit(q, k, v, do, **res, ranks=P, rows=0)


def test_report_writes_a_self_contained_page_of_the_failing_rows(tmp_path, tool):
    P, S = 4, 64
    (q, k, v, do), res, _ = case("f32", s=S)
    res["out"] = res["out"].copy()
    res["out"][:, 20:27] = 0  # rows 20-26 lost: zigzag chunk 2 (rank 2) and chunk 3 (rank 3)
    page = tmp_path / "audit.html"
    rep = ctxpar.audit(q, k, v, out=res["out"], lse=res["lse"], ranks=P, report=page)
    assert not rep.consistent and rep.report == str(page)
    html = page.read_text()
    assert "http://" not in html and "https://" not in html and "<script" not in html
    assert html.count('class="heat" data-tensor=') == 2  # out and lse
    assert html.count('<rect class="bar') == 2 * P  # a bar per rank, per tensor
    out = rep.tensors["out"]
    assert [(r.first, r.last) for r in out.failing_ranges] == [(20, 26)]
    assert (f"<td>20-26</td><td>7</td><td>2-3</td><td>{out.failing_elements}</td>" in html)
    # A report that cannot be written is the tool's error, raised with its message.
    with pytest.raises(ctxpar.AuditError, match="cannot write the report"):
        ctxpar.audit(q, k, v, out=res["out"], ranks=P, report=tmp_path / "no" / "such.html")


MASK_HINT = "is the mask right? (--mask none for non-causal results)"


def test_a_non_causal_result_judged_as_causal_gets_the_mask_hint(tool):
    """PyTorch's SDPA is non-causal by default: such a result audited with the default causal
    mask fails from position 0 on, and the verdict asks about the mask; with mask "none" it is
    consistent, and a lost rank's rows (a real bug) get no such hint."""
    (q, k, v, do), res, _ = case("f32", mask="none")
    rep = ctxpar.audit(q, k, v, do, **res, ranks=2)
    assert not rep.consistent and rep.json.get("hint") == MASK_HINT
    assert rep.tensors["out"].worst.position == 0 or rep.tensors["out"].failing_rows >= 32
    assert ctxpar.audit(q, k, v, do, **res, ranks=2, mask="none").consistent
    (q, k, v, do), res, _ = case("f32")
    res["out"] = res["out"].copy()
    res["out"][:, ctxpar.positions("zigzag", 64, 1, 2)] = 0
    rep = ctxpar.audit(q, k, v, do, **res, ranks=2)
    assert not rep.consistent and "hint" not in rep.json


def test_bhsd_files_read_as_bshd_get_a_warning(tmp_path, tool):
    """[B, H, S, D] files (4 heads, 64 tokens) audited in the default bshd order read as 64
    heads of 4 tokens: the tool warns and names --format bhsd; read as bhsd, no warning."""
    (q, k, v, _), _, _ = case("f32", hk=4)
    for name, x in zip("qkv", (q, k, v)):
        np.save(tmp_path / f"{name}.npy", np.ascontiguousarray(to_format(x, "bhsd")))
    files = [arg for n in "qkv" for arg in (f"--{n}", str(tmp_path / f"{n}.npy"))]
    run = subprocess.run([tool, "audit", *files, "--ranks", "2"], capture_output=True,
                         text=True)
    assert "more heads than tokens" in run.stderr and "--format bhsd" in run.stderr, run.stderr
    run = subprocess.run([tool, "audit", *files, "--ranks", "2", "--format", "bhsd"],
                         capture_output=True, text=True)
    assert run.returncode == 0 and "warning" not in run.stderr, run.stderr


def test_float64_inputs_are_reference_data_results_judged_at_their_dtype(tool):
    """NumPy's float64 inputs (here with more digits than float32 holds): the tool reads them
    rounded to float32 (saying so on stderr) and judges the results at their own dtype: float64
    attention on the float64 inputs, stored as float32 results, is consistent; a lost rank's
    dv rows are not."""
    q, k, v, do = (x.astype(np.float64) * (1 + 1e-9) for x in inputs(s=64, hq=4, hk=2, d=16))
    ref = ctxpar.oracle(q, k, v, do)
    res = {n: ref[n].astype(np.float32) for n in ("out", "lse", "dq", "dk", "dv")}
    rep = ctxpar.audit(q, k, v, do, **res, ranks=2)
    assert rep.consistent, str(rep)
    res["dv"][:, ctxpar.positions("zigzag", 64, 1, 2)] = 0
    rep = ctxpar.audit(q, k, v, do, **res, ranks=2)
    assert not rep.consistent and rep.tensors["dv"].worst.rank == 1
