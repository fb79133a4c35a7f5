"""A new strategy needs no edit outside its own module to work in both front doors.

:mod:`strategies.own_strategy` is written as a user would write it: a ``ParallelStrategy`` that
averages gradients itself, and a strategy whose engine owns accumulation. Registered by short name,
they run every Trainer stage (fit with validation, validate, test, predict, fit again) and an
Accelerator training loop on two processes with the results of the same math done by hand; what
they declare (``kind``, ``owns_accumulation``) is what the doors and callbacks act on.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import drivetrain as dt
from drivetrain.trainer import GradientAccumulationScheduler, SpikeDetection
from helpers.multiprocess import run_processes
from strategies import own_strategy  # noqa: F401  (registers "grad_average" and "engine_stepped")
from trainer.test_strategy_stages import check_stages, run_stages
from trainer.trainer_models import Regression, loader, quiet_trainer, regression_data

DATA = regression_data(32, seed=7)


def _accelerator_loop(strategy: str, world_size: int) -> dict[str, Any]:
    """Two epochs of an Accelerate-style loop with accumulation over 2 batches; the final weights."""
    accelerator = dt.Accelerator(cpu=True, strategy=strategy, gradient_accumulation_steps=2)
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    model, optimizer, data = accelerator.prepare(model, optimizer, loader(DATA, batch_size=4))
    for _ in range(2):
        for x, y in data:
            with accelerator.accumulate(model):
                accelerator.backward(nn.functional.mse_loss(model(x), y))
                optimizer.step()
                optimizer.zero_grad()
    unwrapped = accelerator.unwrap_model(model)
    return {
        "weights": {k: v.detach().clone() for k, v in unwrapped.state_dict().items()},
        "distributed_type": str(accelerator.distributed_type),
    }


def _by_hand(world_size: int) -> dict[str, torch.Tensor]:
    """The same loop in one process: each optimizer step sees the 2 x world_size batches of its window."""
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    x, y = DATA.tensors
    window = 4 * 2 * world_size
    for _ in range(2):
        for start in range(0, len(x), window):
            optimizer.zero_grad()
            for micro in range(start, start + window, 4 * world_size):  # one micro-batch per process
                part = slice(micro, micro + 4 * world_size)
                (nn.functional.mse_loss(model(x[part]), y[part]) / 2).backward()
            optimizer.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _rank(rank: int, world_size: int, root: str) -> dict[str, Any]:
    return {
        "stages": run_stages("grad_average", world_size, root),
        "loop": _accelerator_loop("grad_average", 2),
    }


@pytest.mark.multiprocess
def test_a_strategy_of_ones_own_runs_both_front_doors_on_two_processes(tmp_path: Path) -> None:
    results = run_processes(_rank, 2, args=(str(tmp_path),), timeout=110)
    check_stages([result["stages"] for result in results], 2)
    expected = _by_hand(2)
    for result in results:
        assert result["loop"]["distributed_type"].endswith("MULTI_CPU")
        for name, value in expected.items():
            torch.testing.assert_close(result["loop"]["weights"][name], value, atol=1e-6, rtol=0)


def test_a_strategy_of_ones_own_runs_every_stage_in_one_process(tmp_path: Path) -> None:
    check_stages([run_stages("grad_average", 1, str(tmp_path))], 1)
    loop = _accelerator_loop("grad_average", 1)
    # A one-process parallel strategy keeps its group for a script's next entry point: end it here.
    torch.distributed.destroy_process_group()
    assert loop["distributed_type"].endswith("NO")
    for name, value in _by_hand(1).items():
        torch.testing.assert_close(loop["weights"][name], value, atol=1e-6, rtol=0)


def test_callbacks_act_on_the_declared_capability_not_the_class() -> None:
    """A strategy whose engine owns accumulation is refused by the callbacks that change it, whatever its class."""
    for callback, refusal in (
        (
            GradientAccumulationScheduler({1: 2}),
            "GradientAccumulationScheduler cannot be used with EngineStepped",
        ),
        (SpikeDetection(action="skip"), "EngineStepped's engine"),
    ):
        trainer = quiet_trainer(strategy="engine_stepped", max_epochs=1, callbacks=[callback])
        with pytest.raises(ValueError, match=refusal):
            trainer.fit(Regression(), loader(regression_data(16)))
    # Declared otherwise, the same callbacks run.
    trainer = quiet_trainer(
        strategy="grad_average", devices=1, max_epochs=2, callbacks=[GradientAccumulationScheduler({1: 2})]
    )
    trainer.fit(Regression(), loader(regression_data(16)))
    assert trainer.global_step == 2 + 1
    trainer.strategy.teardown()
