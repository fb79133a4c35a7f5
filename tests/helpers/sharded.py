"""A small model, data and a single-process reference run for the FSDP and DeepSpeed tests.

The model ends in ``Linear(64, 1)``: its weight has fewer rows than there are ranks, the case
PyTorch's older FSDP could not reload. The reference trains on the combined batch in one
process, which is what N data-parallel ranks on 1/N of it each must reproduce.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

LR = 1e-2


class Net(nn.Module):
    def __init__(self, width: int = 64) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(16, width), nn.Tanh(), nn.Linear(width, width), nn.Tanh())
        self.head = nn.Linear(width, 1)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.body(x))


def batches(steps: int, per_rank: int = 4, world_size: int = 2) -> list[tuple[Tensor, Tensor]]:
    generator = torch.Generator().manual_seed(1)
    size = per_rank * world_size
    return [
        (torch.randn(size, 16, generator=generator), torch.randn(size, 1, generator=generator))
        for _ in range(steps)
    ]


def shard(batch: tuple[Tensor, Tensor], rank: int, world_size: int = 2) -> tuple[Tensor, Tensor]:
    x, y = batch
    size = x.shape[0] // world_size
    return x[rank * size : (rank + 1) * size], y[rank * size : (rank + 1) * size]


def loss_of(output: Tensor, target: Tensor) -> Tensor:
    return ((output.float() - target) ** 2).mean()


def reference_run(steps: int, world_size: int = 2) -> dict[str, Any]:
    """Adam on the combined batch in one process; per-step losses of each rank's part, final weights."""
    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    losses = []
    for batch in batches(steps, world_size=world_size):
        parts = [
            loss_of(model(shard(batch, r, world_size)[0]), shard(batch, r, world_size)[1])
            for r in range(world_size)
        ]
        (sum(parts) / world_size).backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append([p.item() for p in parts])
    return {"losses": losses, "state": {k: v.detach().clone() for k, v in model.state_dict().items()}}


def numel(tensors: Any) -> int:
    """Elements this rank holds of ``tensors`` (a DTensor counts its local shard only)."""
    from torch.distributed.tensor import DTensor

    total = 0
    for tensor in tensors:
        if isinstance(tensor, DTensor):
            tensor = tensor.to_local()
        if isinstance(tensor, Tensor):
            total += tensor.numel()
    return total


def optimizer_state_numel(optimizer: torch.optim.Optimizer) -> int:
    """Elements of the optimizer's per-parameter state tensors held by this rank (``step`` excluded)."""
    return numel(
        value
        for state in optimizer.state.values()
        for value in state.values()
        if getattr(value, "dim", lambda: 0)()
    )
