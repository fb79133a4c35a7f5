"""Training with drivetrain.Accelerator in 2 gloo processes, compared with one process.

One spawn runs several Accelerators one after the other (which also shows that Accelerators in
one process keep separate state): plain and split-batch training, and gradient accumulation.
"""

from __future__ import annotations

import datetime
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import drivetrain as dt
from drivetrain.utils import DistributedDataParallelKwargs, InitProcessGroupKwargs, set_seed
from helpers.multiprocess import run_processes

pytestmark = pytest.mark.multiprocess

EPOCHS = 2


def _data(size: int) -> TensorDataset:
    generator = torch.Generator().manual_seed(11)
    return TensorDataset(torch.randn(size, 6, generator=generator), torch.randn(size, 1, generator=generator))


def _net() -> nn.Module:
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 1))


def _train(accelerator: dt.Accelerator, batch_size: int) -> dict[str, torch.Tensor]:
    set_seed(0)
    model = _net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loader = DataLoader(_data(64), batch_size=batch_size, shuffle=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for _ in range(EPOCHS):
        for x, y in loader:
            accelerator.backward(nn.functional.mse_loss(model(x), y))
            optimizer.step()
            optimizer.zero_grad()
    return {k: v.clone() for k, v in accelerator.unwrap_model(model).state_dict().items()}


def _accumulate(accelerator: dt.Accelerator, size: int, batch_size: int) -> dict[str, Any]:
    set_seed(0)
    model = _net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.9**step)
    loader = DataLoader(_data(size), batch_size=batch_size)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    flags, grads, lrs = [], [], []
    for _ in range(EPOCHS):
        for x, y in loader:
            with accelerator.accumulate(model):
                accelerator.backward(nn.functional.mse_loss(model(x), y))
                flags.append(accelerator.sync_gradients)
                grads.append(accelerator.unwrap_model(model)[0].weight.grad.clone())
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
        lrs.append(scheduler.get_last_lr()[0])
    return {"flags": flags, "grads": grads, "lrs": lrs}


def _rank(rank: int, world_size: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    handlers = [
        DistributedDataParallelKwargs(find_unused_parameters=True),
        InitProcessGroupKwargs(timeout=datetime.timedelta(seconds=123)),
    ]
    plain = dt.Accelerator(cpu=True, kwargs_handlers=handlers)
    out["ranks"] = (
        plain.process_index,
        plain.num_processes,
        plain.is_main_process,
        plain.distributed_type.value,
    )
    out["timeout"] = plain.strategy.timeout.total_seconds()
    probe = plain.prepare(nn.Linear(1, 1))
    out["find_unused"] = probe.find_unused_parameters
    with plain.no_sync(probe):
        probe(torch.tensor([[float(rank)]])).sum().backward()
    out["no_sync_grad"] = plain.unwrap_model(probe).weight.grad.item()
    out["plain"] = _train(plain, batch_size=8)  # 2 processes x 8 = the single run's 16
    split = dt.Accelerator(cpu=True, split_batches=True)
    out["split"] = _train(split, batch_size=16)  # 16 split in 2 x 8
    out["odd"] = _accumulate(dt.Accelerator(cpu=True, gradient_accumulation_steps=2), size=56, batch_size=4)
    out["schedule"] = _accumulate(
        dt.Accelerator(cpu=True, gradient_accumulation_steps=2), size=64, batch_size=4
    )
    out["state_kept"] = (plain.gradient_state.num_steps, split.split_batches, plain.split_batches)
    return out


@pytest.fixture(scope="module")
def results() -> list[dict[str, Any]]:
    return run_processes(_rank, 2)


def test_the_accelerator_joins_the_launched_processes_with_the_handlers_options(
    results: list[dict[str, Any]],
) -> None:
    assert [r["ranks"] for r in results] == [(0, 2, True, "MULTI_CPU"), (1, 2, False, "MULTI_CPU")]
    assert all(r["timeout"] == 123 and r["find_unused"] is True for r in results)
    assert [r["no_sync_grad"] for r in results] == [0.0, 1.0], "no_sync: each process keeps its own gradient"
    assert results[0]["state_kept"] == (1, True, False)


@pytest.mark.parametrize("kind", ["plain", "split"])
def test_two_processes_end_with_the_weights_of_one_on_the_same_global_batches(
    results: list[dict[str, Any]], kind: str
) -> None:
    single = _train(dt.Accelerator(cpu=True), batch_size=16)
    for result in results:
        for name, value in single.items():
            torch.testing.assert_close(result[kind][name], value, rtol=1e-5, atol=1e-6)
    for name in single:
        assert torch.equal(results[0][kind][name], results[1][kind][name])


def test_accumulation_syncs_gradients_only_at_boundaries_and_at_the_loader_end(
    results: list[dict[str, Any]],
) -> None:
    per_epoch = [False, True, False, True, False, True, True]  # 7 batches per process, 2 per step
    for result in results:
        assert result["odd"]["flags"] == per_epoch * EPOCHS
    for index, synced in enumerate(per_epoch * EPOCHS):
        grads = [r["odd"]["grads"][index] for r in results]
        if synced:
            assert torch.equal(grads[0], grads[1]), f"batch {index}: all-reduced gradients must agree"
        else:
            assert not torch.allclose(grads[0], grads[1]), f"batch {index}: gradients must stay local"


def test_the_learning_rate_schedule_matches_one_process(results: list[dict[str, Any]]) -> None:
    single = _accumulate(dt.Accelerator(cpu=True, gradient_accumulation_steps=2), size=64, batch_size=4)
    assert single["flags"] == [False, True] * 8 * EPOCHS
    for result in results:
        assert result["schedule"]["lrs"] == pytest.approx(single["lrs"], rel=1e-12)
    assert single["lrs"] == pytest.approx([0.1 * 0.9**8, 0.1 * 0.9**16])
