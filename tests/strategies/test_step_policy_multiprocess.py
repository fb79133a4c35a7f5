"""Both front doors follow the core step policy in 2 real gloo DDP processes.

One launch runs every loop through ``drivetrain.Trainer(strategy="ddp", devices=2)`` and through
``drivetrain.Accelerator(split_batches=True)`` (4 samples per process and batch): each must end
with the weights of the hand-written single-process loop on the combined batch of 8 (tolerance for
the summation order: float32 rounding, or float16 rounding where fp16 autocast computes),
keep gradients local inside accumulation windows and all-reduce them on the window's last batch
(the data's end included), and skip the same fp16 steps.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from helpers.multiprocess import run_processes
from helpers.step_loops import Loop, Outcome, run_accelerator, run_by_hand, run_trainer

pytestmark = pytest.mark.multiprocess

LOOPS = {
    "accumulate-clip": Loop(accumulate=2, clip=0.5),
    "fp16-overflow-accumulate-clip": Loop(precision="16-mixed", accumulate=2, clip=1.0, blown_batches=(0, 3)),
}
PER_PROCESS = 4  # half of Loop.batch_size: two processes make the single process's batch


def _rank(rank: int, world_size: int) -> dict[str, dict[str, Outcome]]:
    return {
        name: {
            "trainer": run_trainer(loop, batch_size=PER_PROCESS, strategy="ddp", devices=2),
            # Global batches split in two: the LR schedule then counts steps as one process does.
            "accelerator": run_accelerator(loop, split_batches=True),
        }
        for name, loop in LOOPS.items()
    }


@pytest.fixture(scope="module")
def ranks() -> list[dict[str, dict[str, Outcome]]]:
    return run_processes(_rank, 2, timeout=110)


def _window_ends(loop: Loop) -> list[bool]:
    batches = -(-loop.samples // loop.batch_size)
    per_epoch = [(i + 1) % loop.accumulate == 0 or i + 1 == batches for i in range(batches)]
    return per_epoch * 2


@pytest.mark.parametrize("name", list(LOOPS))
@pytest.mark.parametrize("door", ["trainer", "accelerator"])
def test_two_processes_end_with_the_weights_of_one(ranks: list[Any], name: str, door: str) -> None:
    loop = LOOPS[name]
    expected = run_by_hand(loop)
    first, second = (rank[name][door] for rank in ranks)
    tolerance = 1e-3 if loop.precision == "16-mixed" else 1e-5
    for key, value in expected.weights.items():
        torch.testing.assert_close(first.weights[key], value, rtol=tolerance, atol=tolerance)
        assert torch.equal(first.weights[key], second.weights[key]), "the replicas must stay identical"
    assert first.lr == pytest.approx(expected.lr) and first.steps_taken == expected.steps_taken


@pytest.mark.parametrize("name", list(LOOPS))
@pytest.mark.parametrize("door", ["trainer", "accelerator"])
def test_gradients_stay_local_inside_a_window_and_are_reduced_at_its_end(
    ranks: list[Any], name: str, door: str
) -> None:
    first, second = (rank[name][door] for rank in ranks)
    ends = _window_ends(LOOPS[name])
    assert len(first.grads) == len(ends)
    for index, (mine, theirs, synced) in enumerate(zip(first.grads, second.grads, ends)):
        if not torch.isfinite(mine).all():
            continue  # a blown-up batch: inf/NaN either way
        if synced:
            assert torch.equal(mine, theirs), f"batch {index}: the window's last backward all-reduces"
        else:
            assert not torch.allclose(mine, theirs), f"batch {index}: inside a window gradients stay local"


def test_both_doors_skip_the_same_fp16_steps(ranks: list[Any]) -> None:
    name = "fp16-overflow-accumulate-clip"
    for rank in ranks:
        assert rank[name]["trainer"].steps_taken == rank[name]["accelerator"].steps_taken < 2 * 4
