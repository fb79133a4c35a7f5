"""DeepSpeed jobs started for real: by drivetrain's re-run launcher, and by DeepSpeed's own launcher,
which appends ``--local_rank=N`` to the script's arguments."""

from __future__ import annotations

import base64
import json
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from drivetrain._utilities.imports import package_available
from drivetrain.cli.launcher_arguments import drop_launcher_arguments
from helpers.scripts import clean_env, run_command, run_script
from helpers.sharded import reference_run

SCRIPT = Path(__file__).with_name("scripts_deepspeed_train.py")


def test_local_rank_arguments_are_dropped() -> None:
    assert drop_launcher_arguments(["--steps", "3", "--local_rank=1"]) == ["--steps", "3"]
    assert drop_launcher_arguments(["--local-rank", "0", "--lr=1"]) == ["--lr=1"]
    assert drop_launcher_arguments(["--local_rank=x", "--", "--local_rank=0"]) == [
        "--local_rank=x",
        "--",
        "--local_rank=0",
    ]


def _report(stdout: str) -> dict[int, tuple[bool, list[float]]]:
    found = re.findall(
        r"^rank (\d) of 2 --local_rank=(True|False) losses \[(.*)\]$", stdout, flags=re.MULTILINE
    )
    return {
        int(rank): (given == "True", [float(v) for v in values.split(", ")]) for rank, given, values in found
    }


def _free_port() -> int:
    with socket.socket() as probe:  # only for DeepSpeed's launcher, which needs a port up front
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _deepspeed_launch(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """DeepSpeed's launcher on a port probed here and released before rank 0 binds it: another program
    may take it in between, which rank 0 reports at once (``Cannot listen on``); then again on a fresh one."""
    world_info = base64.urlsafe_b64encode(json.dumps({"localhost": [0, 1]}).encode()).decode()
    for _ in range(3):
        port = _free_port()
        command = [sys.executable, "-m", "deepspeed.launcher.launch", f"--world_info={world_info}",
                   "--master_addr=127.0.0.1", f"--master_port={port}", str(SCRIPT), "--steps", "2"]  # fmt: skip
        result = run_command(command, env=env, timeout=240)  # 136 s seen at load 12 on 2 cores
        if f"Cannot listen on 127.0.0.1:{port}" not in result.stderr:
            break
    return result


@pytest.mark.deepspeed
@pytest.mark.multiprocess
@pytest.mark.timeout(600)  # a second launch when the probed port was taken
@pytest.mark.skipif(not package_available("deepspeed"), reason="needs the deepspeed extra")
@pytest.mark.parametrize("launcher", ["drivetrain", "deepspeed"])
def test_script_trains_under_either_launcher(launcher: str) -> None:
    env = clean_env(OMP_NUM_THREADS="1")
    if launcher == "drivetrain":
        result = run_script([str(SCRIPT), "--steps", "2"], env=env, timeout=150)
    else:
        result = _deepspeed_launch(env)
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"
    expected = reference_run(2)["losses"]
    report = _report(result.stdout)
    assert sorted(report) == [0, 1], result.stdout
    for rank, (local_rank_given, losses) in report.items():
        assert local_rank_given is (launcher == "deepspeed")  # DeepSpeed's launcher appended it; no harm done
        assert losses == pytest.approx([step[rank] for step in expected], abs=1e-5)
