"""Loader workers seeded by seed_everything(workers=True), in a real two-process run of either door.

    python seeded_workers.py accelerator   # drivetrain.Accelerator(devices=2) starts the second process
    python seeded_workers.py trainer       # drivetrain.Trainer(strategy="ddp", devices=2) does

Both processes give their loaders the same generator, so torch hands their workers the same base
seeds; the workers must still draw different numbers on the two ranks. Each process prints one
JSON line: its rank and, per worker, the (torch, random, NumPy) draws of its first item.
"""

from __future__ import annotations

import json
import os
import random
import sys
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

import drivetrain as dt


class Draws(Dataset):  # type: ignore[type-arg]
    def __len__(self) -> int:
        return 16

    def __getitem__(self, index: int) -> tuple[int, float, float, float]:
        worker = torch.utils.data.get_worker_info()
        return worker.id, float(torch.rand(())), random.random(), float(np.random.rand())


def loader() -> DataLoader:
    return DataLoader(Draws(), batch_size=2, num_workers=2, generator=torch.Generator().manual_seed(0))


def first_draws(batches: Any) -> dict[int, list[float]]:
    draws: dict[int, list[float]] = {}
    for workers, torch_draws, python_draws, numpy_draws in batches:
        draws.setdefault(
            int(workers[0]), [float(torch_draws[0]), float(python_draws[0]), float(numpy_draws[0])]
        )
    return draws


class Recorder(dt.TrainingModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.batches: list[Any] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.batches.append(batch)
        return self.layer(batch[1].float().unsqueeze(1)).sum()

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.0)


def main(door: str) -> None:
    dt.seed_everything(7, workers=True)
    if door == "accelerator":
        accelerator = dt.Accelerator(cpu=True, devices=2)
        rank, draws = accelerator.process_index, first_draws(accelerator.prepare(loader()))
    else:
        model = Recorder()
        trainer = dt.Trainer(
            accelerator="cpu",
            strategy="ddp",
            devices=2,
            max_epochs=1,
            logger=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            enable_checkpointing=False,
        )
        trainer.fit(model, loader())
        rank, draws = trainer.global_rank, first_draws(model.batches)
    os.write(1, (json.dumps({"rank": rank, "draws": draws}) + "\n").encode())


if __name__ == "__main__":
    main(sys.argv[1])
