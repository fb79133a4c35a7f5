"""Functions run by spawned processes in the launcher tests (spawn needs them importable by name)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


def train_and_return_weights(strategy: Any, steps: int) -> dict[str, Any]:
    strategy.setup_environment()
    torch.manual_seed(0)
    model = strategy.setup_module(nn.Linear(3, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    generator = torch.Generator().manual_seed(3)
    x, y = torch.randn(8, 3, generator=generator), torch.randn(8, 1, generator=generator)
    shard = slice(strategy.global_rank * 4, (strategy.global_rank + 1) * 4)
    for _ in range(steps):
        strategy.backward(((model(x[shard]) - y[shard]) ** 2).mean(), model)
        strategy.optimizer_step(optimizer)
        optimizer.zero_grad()
    weights = strategy.unwrap_module(model).state_dict()
    result = {"rank": strategy.global_rank, "world": strategy.world_size, "weights": weights}
    strategy.teardown()
    return result


def fail_on_rank_one(strategy: Any) -> None:
    strategy.setup_environment()
    if strategy.global_rank == 1:
        raise ValueError("rank one is unhappy")
    strategy.barrier()


def train_given_model(strategy: Any, model: nn.Module, steps: int) -> dict[str, Any]:
    strategy.setup_environment()
    wrapped = strategy.setup_module(model)
    optimizer = torch.optim.SGD(wrapped.parameters(), lr=0.1)
    generator = torch.Generator().manual_seed(3)
    x, y = torch.randn(8, 3, generator=generator), torch.randn(8, 1, generator=generator)
    shard = slice(strategy.global_rank * 4, (strategy.global_rank + 1) * 4)
    for _ in range(steps):
        strategy.backward(((wrapped(x[shard]) - y[shard]) ** 2).mean(), wrapped)
        strategy.optimizer_step(optimizer)
        optimizer.zero_grad()
    weights = {name: value.clone() for name, value in strategy.unwrap_module(wrapped).state_dict().items()}
    strategy.teardown()
    return weights
