"""The Accelerate-style example under every way of starting it, and launch() for forked processes."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import drivetrain as dt
from helpers.scripts import REPO, run_command, run_script

pytestmark = pytest.mark.multiprocess

EXAMPLE = str(REPO / "examples" / "accelerate_style_digits.py")


def _finished(output: str, processes: int) -> None:
    done = [line for line in output.splitlines() if line.startswith("done:")]
    assert len(done) == 1, f"printed once, by the main process:\n{output}"
    match = re.match(r"done: (\d+) process\(es\), accuracy ([0-9.]+) on (\d+) validation items", done[0])
    assert match is not None, done[0]
    assert int(match.group(1)) == processes
    assert int(match.group(3)) == 297, "gather_for_metrics counts every validation item once"
    assert float(match.group(2)) > 0.5


@pytest.mark.parametrize(
    "how",
    ["python", "python --devices 2", "drivetrain launch -n 2", "torchrun"],
)
def test_the_example_runs_however_it_is_started(how: str) -> None:
    arguments = [EXAMPLE, "--epochs", "1"]
    if how == "python":
        result, processes = run_script(arguments), 1
    elif how == "python --devices 2":
        result, processes = run_script([*arguments, "--devices", "2"]), 2
    elif how == "torchrun":
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node=2",
            *arguments,
        ]
        result, processes = run_command(command), 2
    else:
        drivetrain = str(Path(sys.executable).with_name("drivetrain"))
        result, processes = run_command([drivetrain, "launch", "-n", "2", *arguments]), 2
    assert result.returncode == 0, result.stderr
    _finished(result.stdout, processes)


def _in_forked_process(accelerator: dt.Accelerator, scale: float) -> dict[str, Any]:
    model = accelerator.prepare(torch.nn.Linear(1, 1))
    total = accelerator.reduce(torch.tensor(float(accelerator.process_index + 1)) * scale)
    return {"ranks": accelerator.num_processes, "total": total.item(), "wrapped": type(model).__name__}


def test_launch_runs_a_function_in_forked_processes() -> None:
    accelerator = dt.Accelerator(cpu=True, devices=2, strategy="ddp_fork")
    result = accelerator.launch(_in_forked_process, accelerator, 10.0)
    assert result == {"ranks": 2, "total": 30.0, "wrapped": "DistributedDataParallel"}
    single = dt.Accelerator(cpu=True)
    assert single.launch(lambda: "ran here") == "ran here"
