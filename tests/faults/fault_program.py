"""A small 2-rank training job with one injected fault, for either front door and any launch mode.

Usage: python fault_program.py DOOR STRATEGY FAULT DIR
    DOOR      trainer | accelerator
    STRATEGY  ddp (re-run the script; also under drivetrain launch / torchrun) | ddp_spawn | ddp_fork
    FAULT     none               train to the end
              train              train without end (until killed from outside)
              raise              rank FAULT_RANK raises
              reduce-vs-barrier  rank 0 reduces a tensor while rank 1 waits in a barrier
              gather-vs-reduce   rank 0 gathers a tensor while rank 1 reduces one
              reduce-shapes      the ranks reduce tensors of different shapes
              save-on-one-rank   rank 0 saves a checkpoint (save_state / save_checkpoint), rank 1 trains on
    DIR       each rank writes rank<R>.pid there when it starts training (and rank<R>.rendezvous:
              the MASTER_ADDR and MASTER_PORT it was given); a rank about to inject the fault
              writes ``fault`` (the time)

Environment: FAULT_RANK (default 1) and FAULT_STEP (default 3) place the fault; STALL_TIMEOUT
and DEBUG_COLLECTIVES=1 configure the strategy's collective checks. FAULT_PAUSE=S makes the other
ranks wait S seconds at the fault step (so the launcher sees the failed rank end first);
SLOW_LOG=S configures logging with a handler that takes S seconds to write each error (a slow
log sink: a network handler, a full pipe).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import drivetrain as dt
from drivetrain.strategies import DDPStrategy

FAULT_RANK = int(os.environ.get("FAULT_RANK", "1"))
FAULT_STEP = int(os.environ.get("FAULT_STEP", "3"))


def strategy(name: str) -> Any:
    """The strategy name, or a DDPStrategy with the collective-check options the environment asks for."""
    options: dict[str, Any] = {}
    if "STALL_TIMEOUT" in os.environ:
        options["stall_timeout"] = float(os.environ["STALL_TIMEOUT"])
    if os.environ.get("DEBUG_COLLECTIVES") == "1":
        options["debug_collectives"] = True
    if not options:
        return name
    start = {"ddp": "popen", "ddp_spawn": "spawn", "ddp_fork": "fork"}[name]
    return DDPStrategy(start_method=start, **options)


def data(n: int = 64) -> TensorDataset:
    generator = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(n, 4, generator=generator), torch.randn(n, 1, generator=generator))


def started(directory: Path, rank: int) -> None:
    given = {name: os.environ.get(name) for name in ("MASTER_ADDR", "MASTER_PORT")}
    (directory / f"rank{rank}.rendezvous").write_text(json.dumps(given))
    (directory / f"rank{rank}.pid").write_text(str(os.getpid()))


class Door:
    """The collectives and saving of one front door, for injecting faults."""

    def reduce(self, tensor: torch.Tensor) -> Any: ...
    def gather(self, tensor: torch.Tensor) -> Any: ...
    def barrier(self) -> None: ...
    def save(self, directory: Path) -> None: ...


def inject(fault: str, door: Door, directory: Path, rank: int, step: int) -> None:
    if fault == "train":
        time.sleep(0.05)
    if step != FAULT_STEP or fault in ("none", "train"):
        return
    if fault == "raise":
        if rank == FAULT_RANK:
            (directory / "fault").write_text(repr(time.time()))
            raise RuntimeError(f"injected failure on rank {rank} at step {step}")
        time.sleep(float(os.environ.get("FAULT_PAUSE", "0")))
        return
    (directory / "fault").write_text(repr(time.time()))
    if fault == "reduce-vs-barrier":
        door.reduce(torch.ones(3)) if rank == 0 else door.barrier()
    elif fault == "gather-vs-reduce":
        door.gather(torch.ones(3)) if rank == 0 else door.reduce(torch.ones(3))
    elif fault == "reduce-shapes":
        door.reduce(torch.ones(3 + rank))
    elif fault == "save-on-one-rank":
        if rank == 0:
            door.save(directory / "checkpoint")
    else:
        raise ValueError(f"unknown fault {fault!r}")


# -- the Trainer -------------------------------------------------------------------------------
class TrainerDoor(Door):
    def __init__(self, module: dt.TrainingModule) -> None:
        self.module = module

    def reduce(self, tensor: torch.Tensor) -> Any:
        return self.module.trainer.strategy.all_reduce(tensor, reduce_op="sum")

    def gather(self, tensor: torch.Tensor) -> Any:
        return self.module.all_gather(tensor)

    def barrier(self) -> None:
        self.module.trainer.strategy.barrier()

    def save(self, directory: Path) -> None:
        self.module.trainer.save_checkpoint(directory / "model.ckpt")


class Model(dt.TrainingModule):
    def __init__(self, fault: str, directory: str) -> None:
        super().__init__()
        self.fault, self.directory = fault, Path(directory)
        self.layer = nn.Linear(4, 1)

    def on_train_start(self) -> None:
        started(self.directory, self.global_rank)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        inject(self.fault, TrainerDoor(self), self.directory, self.global_rank, self.global_step)
        x, y = batch
        return nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def run_trainer(name: str, fault: str, directory: str) -> None:
    trainer = dt.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=strategy(name),
        max_epochs=-1 if fault == "train" else 2,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        logger=False,
    )
    trainer.fit(Model(fault, directory), DataLoader(data(), batch_size=4))
    print(f"finished rank={trainer.global_rank}", flush=True)


# -- the Accelerator ---------------------------------------------------------------------------
class AcceleratorDoor(Door):
    def __init__(self, accelerator: dt.Accelerator) -> None:
        self.accelerator = accelerator

    def reduce(self, tensor: torch.Tensor) -> Any:
        return self.accelerator.reduce(tensor)

    def gather(self, tensor: torch.Tensor) -> Any:
        return self.accelerator.gather(tensor)

    def barrier(self) -> None:
        self.accelerator.wait_for_everyone()

    def save(self, directory: Path) -> None:
        self.accelerator.save_state(directory)


def train_accelerator(accelerator: dt.Accelerator, fault: str, directory: str) -> None:
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model, optimizer, loader = accelerator.prepare(model, optimizer, DataLoader(data(), batch_size=4))
    rank = accelerator.process_index
    started(Path(directory), rank)
    door = AcceleratorDoor(accelerator)
    step = 0
    for _ in range(10**6 if fault == "train" else 2):
        for x, y in loader:
            inject(fault, door, Path(directory), rank, step)
            accelerator.backward(nn.functional.mse_loss(model(x), y))
            optimizer.step()
            optimizer.zero_grad()
            step += 1
    print(f"finished rank={rank}", flush=True)


def run_accelerator(name: str, fault: str, directory: str) -> None:
    external = "LOCAL_RANK" in os.environ
    accelerator = dt.Accelerator(cpu=True, strategy=strategy(name), devices=None if external else 2)
    accelerator.launch(train_accelerator, accelerator, fault, directory)


class SlowHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes each error only after a while, as a log sink that is slow to take it."""

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno >= logging.ERROR:
            time.sleep(float(os.environ["SLOW_LOG"]))
        super().emit(record)


if __name__ == "__main__":
    if "SLOW_LOG" in os.environ:
        logging.basicConfig(handlers=[SlowHandler(sys.stderr)], format="%(message)s")
    door_name, strategy_name, fault_name, out = sys.argv[1:5]
    (run_trainer if door_name == "trainer" else run_accelerator)(strategy_name, fault_name, out)
