"""``drivetrain launch`` (on torch.distributed.run) and ``drivetrain env``, run as real commands."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from drivetrain.cli.main import main
from helpers.scripts import clean_env, run_command

SCRIPT = Path(__file__).parent / "scripts_register_and_run.py"
DRIVETRAIN = [sys.executable, "-m", "drivetrain"]


@pytest.mark.multiprocess
def test_launch_runs_two_ranks_with_a_custom_accelerator_chosen_by_name() -> None:
    result = run_command(
        [*DRIVETRAIN, "launch", "--accelerator", "fakexpu", "-n", "2", str(SCRIPT)], timeout=120
    )
    assert result.returncode == 0, result.stderr
    lines = sorted(line for line in result.stdout.splitlines() if line.startswith("rank="))
    assert lines == [
        f"rank={r} accelerator=FakeXPUAccelerator strategy=DDPStrategy world=2 sum=2.0 env=TorchElasticEnvironment attempt=0"
        for r in (0, 1)
    ]


@pytest.mark.multiprocess
def test_launch_names_the_failed_rank_and_exits_non_zero() -> None:
    result = run_command(
        [*DRIVETRAIN, "launch", "--accelerator", "fakexpu", "-n", "2", str(SCRIPT)],
        timeout=120,
        env=clean_env(FAIL_RANK="1"),
    )
    assert result.returncode == 1
    summary = next(line for line in result.stderr.splitlines() if line.startswith("drivetrain launch:"))
    # Rank 0 fails too (it loses rank 1 in a barrier), and torchrun stamps failures to the second:
    # whichever torchrun saw first, rank 1 is named as the cause (usually with its exit code; stopped
    # by the launcher if torchrun's signal caught it while it was exiting).
    assert "scripts_register_and_run.py failed: rank 1 (pid " in summary, summary


@pytest.mark.multiprocess
def test_launch_restarts_the_ranks_after_a_failure_when_asked() -> None:
    # One node rendezvouses on the launcher's own store in every round: the restarted ranks meet
    # again there, in a process group of their own (their keys are the new attempt's).
    result = run_command(
        [*DRIVETRAIN, "launch", "--accelerator", "fakexpu", "-n", "2", "--max-restarts", "1", str(SCRIPT)],
        timeout=120,
        env=clean_env(FAIL_FIRST_ATTEMPT="1"),
    )
    assert result.returncode == 0, result.stderr
    lines = sorted(line for line in result.stdout.splitlines() if line.startswith("rank="))
    second = [line for line in lines if line.endswith("attempt=1")]
    assert second == [
        f"rank={r} accelerator=FakeXPUAccelerator strategy=DDPStrategy world=2 sum=2.0 env=TorchElasticEnvironment attempt=1"
        for r in (0, 1)
    ], result.stdout


def test_launch_cannot_count_devices_of_an_accelerator_it_does_not_know(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(
        SystemExit, match=r"cannot count the devices of accelerator 'fakexpu'.*--nproc-per-node"
    ):
        main(["launch", "--accelerator", "fakexpu", str(SCRIPT)])


def test_launch_rejects_bad_values() -> None:
    with pytest.raises(SystemExit, match=r"--nproc-per-node must be a positive number or 'auto', got '0'"):
        main(["launch", "-n", "0", str(SCRIPT)])
    with pytest.raises(SystemExit, match=r"the script 'missing.py' does not exist"):
        main(["launch", "missing.py"])


def test_env_reports_hardware_environment_registries_and_auto(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["env"]) == 0
    out = capsys.readouterr().out
    assert "cpu      available, 1 device(s)" in out
    assert "cuda     not available" in out
    assert "Cluster environment: LocalEnvironment" in out
    assert "-> strategy='auto': SingleDeviceStrategy (one device in one process)" in out
    assert "ddp_spawn" in out and "DDPStrategy(start_method='spawn')" in out
    assert "bf16-mixed" in out
