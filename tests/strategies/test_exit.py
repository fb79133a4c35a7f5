"""A finished multi-process job ends with nothing left holding its process group for the interpreter's finalisation."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from helpers.scripts import run_command

PROGRAM = """
import atexit, gc, sys
from torch.nn.parallel import DistributedDataParallel


def count_wrappers():
    # Registered before drivetrain's own exit handler, so it runs after it; counts without collecting.
    alive = sum(isinstance(o, DistributedDataParallel) for o in gc.get_objects())
    print(f"rank wrappers alive at exit: {alive}", flush=True)


atexit.register(count_wrappers)

import torch
import drivetrain as dt


def main():
    accelerator = dt.Accelerator(cpu=True)
    model = torch.nn.Linear(2, 2)
    model, optimizer = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    accelerator.backward(model(torch.randn(4, 2)).sum())
    optimizer.step()
    assert isinstance(model, DistributedDataParallel)


main()  # the model is now garbage in a reference cycle, its reducer still holding the group
"""


@pytest.mark.multiprocess
@pytest.mark.timeout(180)
def test_the_ddp_wrapper_of_a_returned_main_is_freed_before_the_interpreter_finalises(tmp_path: Path) -> None:
    # torch frees a gloo group left to the interpreter's finalisation from its worker threads, which
    # can abort a finished process ("terminate called without an active exception"): so the exit
    # handler that leaves the group also collects what only a reference cycle keeps alive.
    program = tmp_path / "returned_main.py"
    program.write_text(PROGRAM)
    drivetrain = str(Path(sys.executable).with_name("drivetrain"))
    result = run_command([drivetrain, "launch", "-n", "2", str(program)], timeout=150)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("rank wrappers alive at exit: 0") == 2, result.stdout + result.stderr
