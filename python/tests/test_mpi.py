"""ctxpar.Context over an mpi4py communicator: 2 processes under mpirun (mpi_ranks.py) against
the float64 oracle. Skipped, saying so, without mpi4py or mpirun."""
import os
import shutil
import subprocess
import sys

import pytest

pytest.importorskip("mpi4py", reason="skipped: mpi4py is not installed")


def test_mpi4py_two_processes():
    mpirun = shutil.which("mpirun")
    if not mpirun:
        pytest.skip("skipped: mpirun not found")
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1")
    script = os.path.join(os.path.dirname(__file__), "mpi_ranks.py")
    run = subprocess.run([mpirun, "-np", "2", sys.executable, script], env=env,
                         capture_output=True, text=True, timeout=120)
    print(run.stdout, run.stderr)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "mpi4py, 2 processes: max error" in run.stdout
