"""The re-run-the-script launcher: real 2-process jobs, and what happens when a rank dies."""

from __future__ import annotations

import os
import re
import sys
import time
import types
from pathlib import Path

import pytest

from drivetrain.strategies.launchers.subprocess_script import script_command
from helpers.scripts import run_script

pytestmark = pytest.mark.multiprocess
JOB = Path(__file__).parent / "scripts" / "ddp_job.py"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = Path(f"/proc/{pid}/stat")
    return not (status.exists() and status.read_text().split()[2] == "Z")


def test_two_ranks_run_with_torchrun_variables_and_shared_cores(tmp_path: Path) -> None:
    result = run_script([str(JOB), "ok", str(tmp_path)], timeout=90)
    assert result.returncode == 0, result.stderr
    lines = sorted(line for line in result.stdout.splitlines() if line.startswith("rank="))
    cores = len(os.sched_getaffinity(0))
    threads = max(1, cores // 2)
    assert lines == [
        f"rank=0 world=2 local=0 sum=3.0 threads={threads} omp=None",
        f"rank=1 world=2 local=1 sum=3.0 threads={threads} omp={threads}",
    ]
    assert sorted(line for line in result.stdout.splitlines() if line.startswith("done")) == [
        "done rank=0",
        "done rank=1",
    ]


def test_a_failing_child_stops_the_job_and_is_named(tmp_path: Path) -> None:
    # Rank 0 waits in a barrier, which would only end at the process group's 30-minute timeout: a
    # job that is not stopped fails run_script's 90 s limit.
    result = run_script([str(JOB), "raise-on-1", str(tmp_path)], timeout=90)
    assert result.returncode != 0
    assert "deliberate failure on rank 1" in result.stderr
    assert "ProcessFailedError: rank 1 (pid" in result.stderr
    assert "exited with code 1" in result.stderr


def test_a_child_that_ends_well_before_joining_fails_the_job_at_once(tmp_path: Path) -> None:
    # Code 0, but rank 1 never reached the process group: rank 0 must not wait for it until the
    # rendezvous timeout (30 minutes by default). Rank 0 waits in the store, where the watcher's
    # interruption cannot reach it and nothing needs unwinding: it is ended at once (not after the
    # 10-second grace a rank inside the user's code gets), with the report.
    result = run_script([str(JOB), "exit-0-on-1-before-setup", str(tmp_path)], timeout=90)
    assert result.returncode != 0
    assert re.search(
        r"\[drivetrain\] rank 1 \(pid \d+\) exited with code 0 before joining the job's process group: "
        r"every rank must reach the same setup .*, and rank 1 ran `.*ddp_job\.py exit-0-on-1-before-setup",
        result.stderr,
    ), result.stderr
    assert "done rank=" not in result.stdout
    assert "rank 0 was waiting in the rendezvous for ranks that will not come; exiting." in result.stderr
    assert "did not stop within" not in result.stderr


def test_the_failing_child_is_named_even_when_its_peer_notices_first(tmp_path: Path) -> None:
    # Rank 0's collective breaks as soon as rank 1 closes its connections, seconds before rank 1 has
    # exited: the report must still name rank 1 and its error, not rank 0's broken connection.
    result = run_script([str(JOB), "raise-on-1-exiting-slowly", str(tmp_path)], timeout=90)
    assert result.returncode != 0
    assert "ProcessFailedError: rank 1 (pid" in result.stderr, result.stderr
    # With rank 1's exit code when it ends within the launcher's grace period ("exited with code 1
    # after ..."), from its failure record alone when load delays its exit ("failed with ..."):
    # either way the report is rank 1's own error.
    report = next(line for line in result.stderr.splitlines() if "ProcessFailedError: rank 1 (pid" in line)
    assert re.search(
        r"rank 1 \(pid \d+\) (exited with code 1 after|failed with) RuntimeError: deliberate failure on rank 1",
        report,
    ), report


def test_a_killed_child_interrupts_rank_zero_mid_computation(tmp_path: Path) -> None:
    result = run_script([str(JOB), "sigkill-1-while-0-computes", str(tmp_path)], timeout=90)
    assert result.returncode != 0
    assert "rank 1 (pid" in result.stderr and "was killed by SIGKILL" in result.stderr
    # The event, not a clock: rank 0 says so if its 60 s loop ran to the end uninterrupted.
    assert "rank 0 was never interrupted" not in result.stdout


def test_a_failing_rank_zero_leaves_no_orphans(tmp_path: Path) -> None:
    result = run_script([str(JOB), "raise-on-0", str(tmp_path)], timeout=90)
    assert result.returncode != 0
    assert "deliberate failure on rank 0" in result.stderr
    child_pid = int((tmp_path / "rank1.pid").read_text())
    deadline = time.monotonic() + 10
    while _alive(child_pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(child_pid), "rank 1 outlived the job"


@pytest.mark.parametrize("launch", ["script", "drivetrain launch"])
def test_the_process_group_can_be_set_up_again_after_teardown(tmp_path: Path, launch: str) -> None:
    prefix = [] if launch == "script" else ["-m", "drivetrain", "launch", "-n", "2"]
    result = run_script([*prefix, str(JOB), "resetup", str(tmp_path)], timeout=90)
    assert result.returncode == 0, result.stderr
    lines = sorted(line for line in result.stdout.splitlines() if line.startswith("rank="))
    assert lines == [f"rank={rank} attempt={attempt} sum=3.0" for rank in (0, 1) for attempt in range(3)]


def test_script_command_reruns_scripts_and_modules(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("")
    main = types.ModuleType("__main__")
    main.__spec__ = None
    monkeypatch.setitem(sys.modules, "__main__", main)
    monkeypatch.setattr(sys, "argv", [str(script), "--lr", "0.1"])
    assert script_command() == [sys.executable, str(script), "--lr", "0.1"]

    main.__spec__ = types.SimpleNamespace(name="mypackage.train.__main__")  # type: ignore[assignment]
    assert script_command() == [sys.executable, "-m", "mypackage.train", "--lr", "0.1"]

    main.__spec__ = None
    monkeypatch.setattr(sys, "argv", ["-c"])
    with pytest.raises(RuntimeError, match=r"not started from a script file.*ddp_notebook"):
        script_command()


def test_a_one_process_job_runs_from_python_c_where_there_is_no_script_to_rerun() -> None:
    # One process re-runs nothing: strategy='ddp' on one device works in a notebook or `python -c`
    # (and in a pytest-xdist worker, whose command line is `-c`).
    program = (
        "import drivetrain as dt\n"
        "accelerator = dt.Accelerator(strategy='ddp', cpu=True, devices=1)\n"
        "print('processes', accelerator.num_processes)\n"
        "accelerator.end_training()\n"
    )
    result = run_script(["-c", program], timeout=90)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "processes 1" in result.stdout
