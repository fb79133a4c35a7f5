"""A user's own tracker (Accelerate's ``GeneralTracker``) in a program that runs unchanged but for its imports.

The program (``scripts/custom_tracker_program.py``) runs under real Accelerate (the peers'
environment, the pinned version) and under drivetrain, on one process and on two (torchrun): the
tracker must receive the same calls with the same values, on the main process only, and the
Accelerator must show each process the same trackers.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import pytest

from helpers.peers import peers_python
from helpers.scripts import clean_env, run_command

SCRIPT = Path(__file__).parent / "scripts" / "custom_tracker_program.py"

pytestmark = pytest.mark.multiprocess


def _run(python: Path | str, framework: str, processes: int, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    launch = (
        ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={processes}"]
        if processes > 1
        else []
    )
    # ACCELERATE_USE_CPU: what `accelerate launch --cpu` sets, without which Accelerate runs each
    # torchrun process on its own on a machine without GPUs.
    completed = run_command(
        [str(python), *launch, str(SCRIPT), framework, str(out)],
        timeout=240,
        env=clean_env(ACCELERATE_USE_CPU="1", OMP_NUM_THREADS="1"),
    )
    assert completed.returncode == 0, f"{framework}:\n{completed.stdout[-3000:]}\n{completed.stderr[-3000:]}"


def _accelerate_files(processes: int, request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    """What the program wrote under Accelerate (kept in pytest's cache per program version)."""
    python = peers_python()
    key = hashlib.sha256(SCRIPT.read_bytes() + str(python).encode()).hexdigest()[:16]
    cache = getattr(request.config, "cache", None)
    out = cache.mkdir(f"custom-tracker-{processes}-{key}") if cache is not None else tmp_path / "accelerate"
    if not (out / "seen-rank0.json").exists():
        _run(python, "accelerate", processes, out)
    return out


@pytest.mark.parametrize("processes", [1, 2])
def test_a_custom_tracker_sees_what_it_sees_under_accelerate(
    processes: int, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    expected = _accelerate_files(processes, request, tmp_path)
    _run(sys.executable, "drivetrain", processes, tmp_path / "drivetrain")
    files = sorted(path.name for path in expected.iterdir())
    # The tracker is called on the main process only; every process writes what it was shown.
    assert files == ["records-rank0.json", *[f"seen-rank{rank}.json" for rank in range(processes)]]
    assert sorted(path.name for path in (tmp_path / "drivetrain").iterdir()) == files
    for name in files:
        assert (tmp_path / "drivetrain" / name).read_text() == (expected / name).read_text(), name
