"""A small 2-rank training job with one injected fault, for either front door and any launch mode.

Usage: python fault_program.py DOOR STRATEGY FAULT DIR
    DOOR      trainer | accelerator
    STRATEGY  ddp (re-run the script; also under drivetrain launch / torchrun) | ddp_spawn | ddp_fork
    FAULT     none     train to the end
              raise    rank FAULT_RANK raises at step FAULT_STEP
              train    train without end (until killed from outside)
    DIR       each rank writes rank<R>.pid there when it starts training, and the failing rank
              writes ``fault`` (the time of the fault) just before raising

FAULT_RANK (default 1) and FAULT_STEP (default 3) come from the environment.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import drivetrain as dt

FAULT_RANK = int(os.environ.get("FAULT_RANK", "1"))
FAULT_STEP = int(os.environ.get("FAULT_STEP", "3"))


def data(n: int = 64) -> TensorDataset:
    generator = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(n, 4, generator=generator), torch.randn(n, 1, generator=generator))


def started(directory: Path, rank: int) -> None:
    (directory / f"rank{rank}.pid").write_text(str(os.getpid()))


def maybe_fail(fault: str, directory: Path, rank: int, step: int) -> None:
    if fault == "raise" and rank == FAULT_RANK and step == FAULT_STEP:
        (directory / "fault").write_text(repr(time.time()))
        raise RuntimeError(f"injected failure on rank {rank} at step {step}")
    if fault == "train":
        time.sleep(0.05)


class Model(dt.TrainingModule):
    def __init__(self, fault: str, directory: str) -> None:
        super().__init__()
        self.fault, self.directory = fault, Path(directory)
        self.layer = nn.Linear(4, 1)

    def on_train_start(self) -> None:
        started(self.directory, self.global_rank)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        maybe_fail(self.fault, self.directory, self.global_rank, self.global_step)
        x, y = batch
        return nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def run_trainer(strategy: str, fault: str, directory: str) -> None:
    trainer = dt.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=strategy,
        max_epochs=-1 if fault == "train" else 2,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        logger=False,
    )
    trainer.fit(Model(fault, directory), DataLoader(data(), batch_size=4))
    print(f"finished rank={trainer.global_rank}", flush=True)


def train_accelerator(accelerator: dt.Accelerator, fault: str, directory: str) -> None:
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model, optimizer, loader = accelerator.prepare(model, optimizer, DataLoader(data(), batch_size=4))
    rank = accelerator.process_index
    started(Path(directory), rank)
    step = 0
    for _ in range(10**6 if fault == "train" else 2):
        for x, y in loader:
            maybe_fail(fault, Path(directory), rank, step)
            accelerator.backward(nn.functional.mse_loss(model(x), y))
            optimizer.step()
            optimizer.zero_grad()
            step += 1
    print(f"finished rank={rank}", flush=True)


def run_accelerator(strategy: str, fault: str, directory: str) -> None:
    external = "LOCAL_RANK" in os.environ
    accelerator = dt.Accelerator(cpu=True, strategy=strategy, devices=None if external else 2)
    accelerator.launch(train_accelerator, accelerator, fault, directory)


if __name__ == "__main__":
    door, strategy_name, fault_name, out = sys.argv[1:5]
    (run_trainer if door == "trainer" else run_accelerator)(strategy_name, fault_name, out)
