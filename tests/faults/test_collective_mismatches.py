"""Ranks that disagree about a collective get an error that names them and their call sites, not a hang or a wrong result.

By default the watchdog sees ranks waiting in different collectives within seconds, and a
collective waiting for ranks that sit idle elsewhere (a collective called on one rank only)
after the strategy's ``stall_timeout``. In debug mode every collective is checked before it
reaches gloo (which aborts the process on mismatched sizes). Real 2-process jobs.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any

import pytest
import torch

import drivetrain as dt
from drivetrain.strategies.collective_monitor import DEBUG_STALL_TIMEOUT
from drivetrain.utils import DistributedOperationException
from faults.jobs import Job, load_scaled, report
from helpers.multiprocess import RankFailed, run_processes
from trainer.trainer_models import Regression, loader, quiet_trainer

pytestmark = [pytest.mark.multiprocess, pytest.mark.faults]

#: As under torchrun: the test's parent hosts the rendezvous store (its agent), and the strategy in
#: each rank sets up the process group itself.
TORCHRUN = {"TORCHELASTIC_RUN_ID": "faults", "TORCHELASTIC_USE_AGENT_STORE": "True", "GROUP_RANK": "0"}
STALL = 5  # the jobs' stall_timeout, seconds
SITE = r"faults/fault_program\.py:\d+ \({}\)"

CASES = [
    # fault, door, launch mode, environment, error, what each rank was doing, bound on the time to the end
    (
        "reduce-vs-barrier",
        "accelerator",
        "script",
        {"STALL_TIMEOUT": str(STALL)},
        "CollectiveMismatchError",
        [r"rank 0: waiting in collective #\d+ all_reduce", r"rank 1: waiting in collective #\d+ barrier\(\)"],
        30,
    ),
    (
        "gather-vs-reduce",
        "trainer",
        "drivetrain launch",
        {},
        "CollectiveMismatchError",
        [r"rank 0: waiting in collective #\d+ all_gather", r"rank 1: waiting in collective #\d+ all_reduce"],
        30,
    ),
    (
        "reduce-shapes",
        "trainer",
        "script",
        {},
        "CollectiveMismatchError",
        [
            r"rank 1: waiting in collective #(\d+) all_reduce\(\[shape \(4,\)",
            r"rank 0: in no drivetrain collective",
            r"Rank 0 already completed collective #\d+, which rank 1 still waits in",
        ],
        30,
    ),
    (
        "save-on-one-rank",
        "accelerator",
        "script",
        {"STALL_TIMEOUT": str(STALL)},
        "CollectiveStuckError",
        [
            r"rank 0: waiting in collective #\d+ all_gather_object\(\) at facade/checkpointing\.py:\d+ \(save_state\)",
            r"rank 1: in no drivetrain collective \(last: #\d+\), idle, at "
            + SITE.format("train_accelerator"),
        ],
        STALL + 30,
    ),
    (
        "save-on-one-rank",
        "trainer",
        "ddp_spawn",
        {"STALL_TIMEOUT": str(STALL)},
        "CollectiveStuckError",
        [
            r"rank 0: waiting in collective #\d+ all_gather_object\(\) at trainer/checkpointing\.py",
            r"rank 1: in no drivetrain collective \(last: #\d+\), idle",
        ],
        STALL + 30,
    ),
    (
        "save-on-one-rank",
        "accelerator",
        "script",
        {"STALL_TIMEOUT": str(STALL), "DEBUG_COLLECTIVES": "1"},
        "CollectiveStuckError",
        # raised in rank 0's own thread, from the debug check's wait
        [
            r"\[rank0\]: drivetrain\.strategies\.collective_errors\.CollectiveStuckError: Rank 0: a collective waited"
        ],
        STALL + 30,
    ),
    (  # the same without a stall_timeout: debug mode's own default (10 s), not the 120 s of normal runs
        "save-on-one-rank",
        "accelerator",
        "script",
        {"DEBUG_COLLECTIVES": "1"},
        "CollectiveStuckError",
        [
            r"\[rank0\]: drivetrain\.strategies\.collective_errors\.CollectiveStuckError: Rank 0: a collective waited"
        ],
        DEBUG_STALL_TIMEOUT + 30,
    ),
    (
        "reduce-shapes",
        "accelerator",
        "script",
        {"ACCELERATE_DEBUG_MODE": "1"},
        "CollectiveMismatchError",
        [
            r"rank 0: all_reduce\(\[shape \(3,\), torch.float32, sum\]\)",
            r"rank 1: all_reduce\(\[shape \(4,\)",
        ],
        30,
    ),
]


@pytest.mark.parametrize(("fault", "door", "mode", "env", "error", "expected", "bound"), CASES)
def test_a_collective_mismatch_ends_the_job_with_an_error_naming_the_ranks(
    launch: Callable[..., Job],
    fault: str,
    door: str,
    mode: str,
    env: dict[str, str],
    error: str,
    expected: list[str],
    bound: float,
) -> None:
    job = launch(mode, door, fault, **env)
    code, _, err = job.wait(timeout=90)
    seconds = time.time() - float((job.directory / "fault").read_text())
    assert code != 0
    assert f"{error}:" in err, err
    for pattern in expected:
        assert re.search(pattern, err), f"{pattern!r} not in:\n{err}"
    debug = " (debug mode)" if env.get("ACCELERATE_DEBUG_MODE") or env.get("DEBUG_COLLECTIVES") else ""
    report(f"{fault}: {door}, {mode}{debug}", 1, 1, seconds)
    bound = load_scaled(bound)
    assert seconds < bound, f"the job took {seconds:.1f} s to end after the mismatch (bound {bound:.0f} s)"


def _run(function: Any, timeout: float = 60) -> list[Any]:
    return run_processes(function, 2, process_group=False, env=TORCHRUN, timeout=timeout)


class PerRankMetric(Regression):
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = super().training_step(batch, batch_idx)
        self.log(f"accuracy_rank{self.global_rank}", 1.0 + self.global_rank, sync_dist=True)
        return loss


def _log_a_different_name_per_rank(rank: int, world: int) -> None:
    quiet_trainer(strategy="ddp", devices=2, max_steps=2).fit(PerRankMetric(), loader())


def test_synced_metrics_with_different_names_per_rank_are_refused() -> None:
    with pytest.raises(RankFailed) as failure:
        _run(_log_a_different_name_per_rank)
    message = str(failure.value)
    assert "the ranks log different names at the same point (rank 0: 'accuracy_rank0'; rank 1: " in message
    assert "'accuracy_rank1'), so different metrics would be averaged together" in message


def _debug_mode_checks(rank: int, world: int) -> dict[str, str]:
    accelerator = dt.Accelerator(cpu=True, debug=True)
    caught = {}
    try:
        accelerator.reduce(torch.ones(3 + rank), reduction="sum")
    except DistributedOperationException as error:
        caught["reduce"] = str(error)
    try:
        accelerator.gather(torch.ones(2, dtype=torch.float32 if rank == 0 else torch.float64))
    except DistributedOperationException as error:
        caught["gather"] = str(error)
    try:
        accelerator.pad_across_processes(torch.ones(2) if rank == 0 else torch.ones(2, 2))
    except DistributedOperationException as error:
        caught["pad"] = str(error)
    try:  # rank 1 skips a reduce; its next one, of the same shape, would pair with rank 0's skipped one
        if rank == 0:
            accelerator.reduce(torch.ones(2), reduction="sum")
        caught["skipped"] = str(accelerator.reduce(torch.full((2,), 10.0), reduction="sum").tolist())
    except DistributedOperationException as error:
        caught["skipped"] = str(error)
    caught["after"] = str(accelerator.reduce(torch.ones(2), reduction="sum").tolist())  # still usable
    return caught


def test_debug_mode_raises_on_every_rank_before_the_backend_sees_a_mismatch() -> None:
    ranks = _run(_debug_mode_checks)
    for caught in ranks:
        assert re.search(
            r"rank 0: all_reduce\(\[shape \(3,\), torch.float32, sum\]\) at .*; rank 1: all_reduce\(\[shape "
            r"\(4,\), torch.float32, sum\]\)",
            caught["reduce"],
        ), caught["reduce"]
        assert "rank 0: all_gather(shape (2,), torch.float32)" in caught["gather"]
        assert "rank 1: all_gather(shape (2,), torch.float64)" in caught["gather"]
        assert "same number of dimensions on every process, got rank 0: 1-d; rank 1: 2-d" in caught["pad"]
        assert re.search(
            r"is called from different places on different ranks: rank 0: all_reduce\(\[shape \(2,\), "
            r"torch.float32, sum\]\) at .*test_collective_mismatches\.py:(\d+) .*; rank 1: all_reduce\(.*\) at "
            r".*test_collective_mismatches\.py:(?!\1)\d+ .* did a rank skip a collective\?",
            caught["skipped"],
        ), caught["skipped"]
        assert caught["after"] == "[2.0, 2.0]"
