"""ctxpar under torch.distributed: the ProcessGroup comm and ctxpar.torch.context_parallel, in
2 and 4 gloo processes (torch_ranks.py, one launch each: every case shares it), against float64
attention over the whole sequence. Skipped, saying so, without torch or gloo."""
import os

import pytest

torch = pytest.importorskip("torch", reason="skipped: torch is not installed")
import torch.distributed as dist  # noqa: E402

import torch_launch  # noqa: E402

SCRIPT = os.path.join(os.path.dirname(__file__), "torch_ranks.py")
SEEDS = [f"seed:{d}:{m}:512" for d in ("float32", "bfloat16") for m in ("causal", "full")]


@pytest.mark.parametrize("P,cases", [
    # timeout: last
    (2, ["comm_ops", "split", "algorithms", "buffers", "repro"] + SEEDS + ["timeout"]),
    (4, ["comm_ops", "split", "algorithms", "buffers"] + SEEDS),
])
def test_process_group(P, cases):
    if not (dist.is_available() and dist.is_gloo_available()):
        pytest.skip("skipped: this torch has no torch.distributed with gloo")
    codes, out, err = torch_launch.run(P, SCRIPT, *cases)
    print(out)
    assert codes == [0] * P, f"exit codes {codes}\n{out}\n{err[-4000:]}"
    printed = [line.split(":")[0].split()[-1] for line in out.splitlines()
               if line.startswith("CASE ")]
    want = [c if not c.startswith("seed:") else "seed_{}_{}_S{}".format(*c.split(":")[1:])
            for c in cases]
    assert all(w in printed for w in want), (want, printed)


EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "examples")


def run_example(name, P):
    codes, out, err = torch_launch.run(P, os.path.join(EXAMPLES, name), timeout=300)
    print(out)
    assert codes == [0] * P, f"exit codes {codes}\n{out}\n{err[-4000:]}"
    return out


def test_example_attention_layer():
    """examples/torch_attention_layer.py: 3 training steps on 2 processes; it checks its first
    weight gradient against the whole sequence in float64 itself."""
    out = run_example("torch_attention_layer.py", 2)
    assert "vs float64 whole sequence" in out


def test_example_seed_context_parallel():
    """examples/torch_context_parallel.py, the seed's example (seq 4096, BF16): needs
    init_device_mesh and torch.nn.attention (torch >= 2.3)."""
    try:
        from torch.distributed.device_mesh import init_device_mesh  # noqa: F401
        from torch.nn.attention import sdpa_kernel  # noqa: F401
    except ImportError:
        pytest.skip(f"skipped: the seed example needs torch >= 2.3 (init_device_mesh), this "
                    f"is {torch.__version__}")
    assert "max error relative to max |fp64|" in run_example("torch_context_parallel.py", 2)
