"""A small training run that a real signal may stop midway, for the preemption tests.

Usage: python preemption_program.py DOOR STRATEGY DEVICES ROOT
    DOOR      trainer | accelerator
    STRATEGY  auto (one process) | ddp (re-run the script) | ddp_spawn
    DEVICES   processes
    ROOT      default_root_dir / project_dir; rank 0 writes ROOT/weights.pt when training ends

Environment: PREEMPT_STEP (a step) makes rank PREEMPT_RANK (default 0) send PREEMPT_SIGNAL
(default SIGTERM) to PREEMPT_TARGET (``self``, or ``parent``: the process that started it) in
that training step. SLURM_REQUEUE=1 gives the Trainer SLURMEnvironment(auto_requeue=True).
USER_SIGUSR1=1 installs the program's own SIGUSR1 handler first; it writes ROOT/usr1.rank<R>.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import drivetrain as dt

STEP = int(os.environ.get("PREEMPT_STEP", "-1"))
RANK = int(os.environ.get("PREEMPT_RANK", "0"))
MAX_STEPS = 10


def data() -> TensorDataset:
    generator = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(48, 4, generator=generator), torch.randn(48, 1, generator=generator))


def maybe_signal(step: int, rank: int, root: str, strategy: Any) -> None:
    if step != STEP or rank != RANK:
        return
    Path(root, "signalled").write_text(repr(time.time()))
    if os.environ.get("PREEMPT_TARGET") != "parent":
        os.kill(os.getpid(), getattr(signal, os.environ.get("PREEMPT_SIGNAL", "SIGTERM")))
        return
    os.kill(os.getppid(), signal.SIGTERM)
    # The launcher passes it on when it next runs: wait for it here, or this short run could end first.
    deadline = time.monotonic() + 60
    while not strategy.preemption.pending and time.monotonic() < deadline:
        time.sleep(0.01)


def finished(root: str, step: int, weights: dict[str, torch.Tensor]) -> None:
    torch.save({"step": step, "weights": weights}, os.path.join(root, "weights.pt"))
    print(f"finished at step {step}", flush=True)


# -- the Trainer -------------------------------------------------------------------------------
class Model(dt.TrainingModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 1)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        maybe_signal(self.global_step, self.global_rank, self.trainer.default_root_dir, self.trainer.strategy)
        x, y = batch
        return nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def run_trainer(strategy: str, devices: int, root: str) -> None:
    plugins: list[Any] = []
    if os.environ.get("SLURM_REQUEUE") == "1":
        from drivetrain.plugins.environments import SLURMEnvironment

        plugins.append(SLURMEnvironment(auto_requeue=True, requeue_signal=signal.SIGUSR1))
    trainer = dt.Trainer(
        accelerator="cpu",
        devices=devices,
        strategy=strategy,
        plugins=plugins or None,
        max_steps=MAX_STEPS,
        default_root_dir=root,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        logger=False,
    )
    model = Model()
    trainer.fit(model, DataLoader(data(), batch_size=4, shuffle=True))
    if trainer.is_global_zero:
        finished(root, trainer.global_step, model.state_dict())


# -- the Accelerator ---------------------------------------------------------------------------
class Progress:
    def __init__(self) -> None:
        self.step = 0

    def state_dict(self) -> dict[str, int]:
        return {"step": self.step}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.step = state["step"]


def train_accelerator(accelerator: dt.Accelerator, root: str) -> None:
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer, loader = accelerator.prepare(model, optimizer, DataLoader(data(), batch_size=4))
    progress = Progress()
    accelerator.register_for_checkpointing(progress)
    if (Path(root) / "checkpoints").is_dir():
        accelerator.load_state()  # the newest complete state of the automatic naming
        print(f"resumed at step {progress.step}", flush=True)
    accelerator.handle_preemption()
    per_epoch = len(loader)
    while progress.step < MAX_STEPS:
        done_in_epoch = progress.step % per_epoch
        batches = accelerator.skip_first_batches(loader, done_in_epoch) if done_in_epoch else loader
        for x, y in batches:
            maybe_signal(progress.step, accelerator.process_index, root, accelerator.strategy)
            accelerator.backward(nn.functional.mse_loss(model(x), y))
            optimizer.step()
            optimizer.zero_grad()
            progress.step += 1
            if accelerator.check_preemption():
                accelerator.print(f"stopped at step {progress.step}")
                accelerator.end_preempted(accelerator.save_state())
            if progress.step == MAX_STEPS:
                break
    if accelerator.is_main_process:
        finished(root, progress.step, accelerator.unwrap_model(model).state_dict())


def run_accelerator(strategy: str, devices: int, root: str) -> None:
    from drivetrain.utils import ProjectConfiguration

    external = "LOCAL_RANK" in os.environ
    accelerator = dt.Accelerator(
        cpu=True,
        strategy=strategy,
        devices=None if external or devices == 1 else devices,
        project_config=ProjectConfiguration(project_dir=root, automatic_checkpoint_naming=True),
    )
    accelerator.launch(train_accelerator, accelerator, root)


if __name__ == "__main__":
    door, strategy_name, processes, directory = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    torch.manual_seed(0)  # the same initial weights in every run
    if os.environ.get("USER_SIGUSR1") == "1":

        def noted(signum: int, frame: Any) -> None:
            rank = os.environ.get("RANK", "0")
            Path(directory, f"usr1.rank{rank}").write_text("received")

        signal.signal(signal.SIGUSR1, noted)
    (run_trainer if door == "trainer" else run_accelerator)(strategy_name, processes, directory)
