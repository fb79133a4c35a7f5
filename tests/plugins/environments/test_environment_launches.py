"""The environments under the real launchers: torchrun, and Open MPI's mpirun.

One launch each (every torch process takes seconds to import on a small machine), under a hard
timeout that kills the whole process group.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from helpers.scripts import clean_env, run_command

HERE = Path(__file__).parent


def _lines(stdout: str) -> list[str]:
    return sorted(line for line in stdout.splitlines() if line.startswith("rank="))


@pytest.mark.multiprocess
def test_torchrun_is_detected_and_its_values_rendezvous():
    # --standalone rendezvouses on localhost:0 (c10d), so no port is guessed; `--master-port=0` with
    # the static rendezvous would hand the workers MASTER_PORT=0.
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=2",
        str(HERE / "torchrun_check_environment.py"),
    ]
    result = run_command(command, timeout=90, env=clean_env(OMP_NUM_THREADS="1"))
    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    assert _lines(result.stdout) == [
        "rank=0 local_rank=0 agent_store=True sum=3",
        "rank=1 local_rank=1 agent_store=True sum=3",
    ], result.stderr


@pytest.mark.mpi
@pytest.mark.multiprocess
def test_mpirun_is_detected_and_mpi4py_agrees_on_the_rendezvous():
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        pytest.skip("mpirun is not on PATH; run scripts/install-test-deps to install Open MPI and mpi4py")
    try:
        import mpi4py  # noqa: F401  (only checks it is installed; importing mpi4py.MPI would init MPI here)
    except ImportError:
        pytest.skip("mpi4py is not installed; run scripts/install-test-deps")
    command = [
        mpirun,
        "-n",
        "2",
        "--allow-run-as-root",
        "--oversubscribe",
        sys.executable,
        str(HERE / "mpi_check_environment.py"),
    ]
    result = run_command(command, timeout=60, env=clean_env(OMP_NUM_THREADS="1"))
    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    assert _lines(result.stdout) == [
        "rank=0 address=127.0.0.1 sum=3 derived_ports_agree=True",
        "rank=1 address=127.0.0.1 sum=3 derived_ports_agree=True",
    ], result.stderr
