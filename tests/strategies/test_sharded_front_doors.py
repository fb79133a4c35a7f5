"""``strategy="fsdp"`` and ``strategy="deepspeed_stage_2"`` by name through both front doors, 2 gloo ranks.

Each run must match one process training on the combined batch (tolerance 1e-5: only the
summation order differs).
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch

import drivetrain as dt
from drivetrain._utilities.imports import package_available
from helpers.multiprocess import run_processes
from helpers.sharded import LR, Net, batches, loss_of, reference_run, shard
from trainer.trainer_models import Regression, loader, quiet_trainer, regression_data

pytestmark = pytest.mark.multiprocess

STRATEGIES = [
    "fsdp",
    pytest.param(
        "deepspeed_stage_2",
        marks=[
            pytest.mark.deepspeed,
            pytest.mark.skipif(not package_available("deepspeed"), reason="needs the deepspeed extra"),
        ],
    ),
]


def _quiet() -> None:
    # DeepSpeed 0.19.8 calls torch collectives that torch 2.13 deprecated and imports torch._inductor,
    # whose import uses the deprecated torch.jit.script_method; the ranks inherit warnings-as-errors.
    warnings.filterwarnings(
        "ignore", message=r".* is deprecated\. Please use .*_single", category=FutureWarning
    )
    warnings.filterwarnings(
        "ignore", message=r"`torch\.jit\.script_method` is deprecated", category=DeprecationWarning
    )


def _trainer_rank(rank: int, world_size: int, name: str) -> dict[str, Any]:
    _quiet()
    torch.manual_seed(0)
    model = Regression(lr=0.1)
    trainer = quiet_trainer(strategy=name, devices=2, max_epochs=2)
    trainer.fit(model, loader(regression_data(64), batch_size=4))
    return {"state": trainer.strategy.get_module_state_dict(model), "steps": trainer.global_step}


@pytest.mark.parametrize("name", STRATEGIES)
def test_trainer_fits_with_a_sharded_strategy_by_name(name: str) -> None:
    main = run_processes(_trainer_rank, 2, args=(name,), timeout=120)[0]
    torch.manual_seed(0)
    model = Regression(lr=0.1)
    single = quiet_trainer(max_epochs=2)
    single.fit(model, loader(regression_data(64), batch_size=8))  # one process, the combined batch
    assert main["steps"] == single.global_step == 16
    for key, expected in model.state_dict().items():
        torch.testing.assert_close(main["state"][key], expected, atol=1e-5, rtol=0)


def _accelerator_rank(rank: int, world_size: int, name: str) -> dict[str, Any]:
    _quiet()
    accelerator = dt.Accelerator(accelerator="cpu", strategy=name, devices=2)
    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    model, optimizer = accelerator.prepare(model, optimizer)
    losses = []
    for batch in batches(3):
        x, y = shard(batch, rank)
        loss = loss_of(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return {"losses": losses, "state": accelerator.get_state_dict(model)}


@pytest.mark.parametrize("name", STRATEGIES)
def test_accelerator_trains_with_a_sharded_strategy_by_name(name: str) -> None:
    results = run_processes(_accelerator_rank, 2, args=(name,), timeout=120)
    reference = reference_run(3)
    for rank, result in enumerate(results):
        assert result["losses"] == pytest.approx([step[rank] for step in reference["losses"]], abs=1e-5)
    for key, expected in reference["state"].items():
        torch.testing.assert_close(results[0]["state"][key], expected, atol=1e-5, rtol=0)
