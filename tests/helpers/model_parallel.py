"""A small tensor-parallel model, its data and a one-process reference run for the model-parallel tests.

``TPNet`` splits ``up`` column-wise and ``down`` row-wise over the tensor-parallel ranks (the MLP
pattern of a transformer block); ``head`` is left to FSDP. The reference trains the same model
in one process on each step's combined batch (every data-parallel rank's part), which N-D
training must reproduce up to summation order.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.data import TensorDataset

LR = 1e-2
PER_RANK = 4
PLAN = {"up": "colwise", "down": "rowwise"}


class TPNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(16, 32)
        self.down = nn.Linear(32, 16)
        self.head = nn.Linear(16, 1)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(torch.tanh(self.down(torch.tanh(self.up(x)))))


def dataset(steps: int, data_parallel: int) -> TensorDataset:
    """``steps`` global batches of ``PER_RANK`` items per data-parallel rank, in order."""
    generator = torch.Generator().manual_seed(1)
    size = steps * PER_RANK * data_parallel
    return TensorDataset(
        torch.randn(size, 16, generator=generator), torch.randn(size, 1, generator=generator)
    )


def part(data: TensorDataset, step: int, dp_rank: int, data_parallel: int) -> tuple[Tensor, Tensor]:
    """What data-parallel rank ``dp_rank`` trains on at ``step`` (whole batches dealt in turn)."""
    start = (step * data_parallel + dp_rank) * PER_RANK
    x, y = data.tensors
    return x[start : start + PER_RANK], y[start : start + PER_RANK]


def loss_of(output: Tensor, target: Tensor) -> Tensor:
    return ((output - target) ** 2).mean()


def reference_run(steps: int, data_parallel: int, *, stop_after: int | None = None) -> dict[str, Any]:
    """Adam on each step's combined batch in one process: per-step losses of each part, final weights."""
    torch.manual_seed(0)
    model = TPNet()
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    data = dataset(steps, data_parallel)
    losses = []
    for step in range(steps if stop_after is None else stop_after):
        parts = [
            loss_of(model(x), y)
            for x, y in (part(data, step, d, data_parallel) for d in range(data_parallel))
        ]
        (sum(parts) / data_parallel).backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append([p.item() for p in parts])
    return {"losses": losses, "state": {k: v.detach().clone() for k, v in model.state_dict().items()}}
