"""W&B and MLflow from both front doors as real 2-process programs (the ranks re-run this script).

    python tracker_programs.py trainer ROOT       # Trainer(strategy="ddp", devices=2) with a WandbLogger and an
                                                  # MLFlowLogger (log_model="all" / True) and a top-2 ModelCheckpoint,
                                                  # then trainer.test()
    python tracker_programs.py spawn ROOT         # the same loggers by name under strategy="ddp_spawn"
    python tracker_programs.py accelerator ROOT   # Accelerator(devices=2, log_with=["wandb", "mlflow"]) and
                                                  # init_trackers(project, config, init_kwargs)

W&B runs offline (WANDB_MODE=offline, set by the test). Each process writes one line per result
with a single os.write, so ranks never interleave.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import drivetrain as dt
from drivetrain.loggers import MLFlowLogger, WandbLogger
from drivetrain.trainer import ModelCheckpoint


def say(text: str) -> None:
    os.write(1, (text + "\n").encode())


def data(n: int = 32) -> TensorDataset:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(n, 4, generator=generator)
    return TensorDataset(x, x.sum(1, keepdim=True))


class Model(dt.TrainingModule):
    def __init__(self, lr: float = 0.05, width: int = 4) -> None:
        super().__init__()
        self.save_hyperparameters()
        torch.manual_seed(0)
        self.layer = nn.Linear(width, 1)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = nn.functional.mse_loss(self.layer(batch[0]), batch[1])
        self.log("loss", loss)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.log("val_loss", nn.functional.mse_loss(self.layer(batch[0]), batch[1]))

    def test_step(self, batch: Any, batch_idx: int) -> None:
        self.log("test_loss", nn.functional.mse_loss(self.layer(batch[0]), batch[1]))

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


def trainer_program(root: Path, strategy: str) -> None:
    if strategy == "ddp":
        loggers: Any = [
            WandbLogger(save_dir=root, project="trainer-proj", name="fit", log_model="all"),
            MLFlowLogger(experiment_name="trainer-exp", save_dir=root / "mlruns", log_model=True),
        ]
    else:
        loggers = ["wandb", "mlflow"]
    checkpoints = ModelCheckpoint(dirpath=root / "ckpt", monitor="val_loss", save_top_k=2, filename="{epoch}")
    trainer = dt.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=strategy,
        max_epochs=3,
        logger=loggers,
        callbacks=[checkpoints],
        log_every_n_steps=2,
        default_root_dir=root,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    model = Model(lr=0.05, width=4)
    loader = DataLoader(data(), batch_size=4)
    trainer.fit(model, loader, loader)
    if strategy == "ddp":
        trainer.test(model, loader, verbose=False)
    wandb_logger, mlflow_logger = trainer.loggers
    say(
        f"rank={trainer.global_rank} wandb={wandb_logger.version} mlflow={mlflow_logger.version} "
        f"best={Path(checkpoints.best_model_path).name}"
    )


def accelerator_program(root: Path) -> None:
    accelerator = dt.Accelerator(cpu=True, devices=2, log_with=["wandb", "mlflow"], project_dir=root)
    accelerator.init_trackers(
        "accelerator-proj",
        config={"lr": 0.1, "model": {"width": 4}},
        init_kwargs={"wandb": {"name": "acc-run", "tags": ["cpu"]}, "mlflow": {"run_name": "acc-run"}},
    )
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer, loader = accelerator.prepare(model, optimizer, DataLoader(data(), batch_size=4))
    for step, (x, y) in enumerate(loader):
        loss = nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        accelerator.log({"loss": accelerator.reduce(loss.detach(), "mean"), "val": {"mae": 0.5}}, step=step)
    wandb_run = accelerator.get_tracker("wandb", unwrap=True)
    run_id = wandb_run.id if accelerator.is_main_process else None
    accelerator.end_training()
    say(f"rank={accelerator.process_index} trackers={len(accelerator.trackers)} wandb={run_id}")


if __name__ == "__main__":
    case, root = sys.argv[1], Path(sys.argv[2])
    if case == "accelerator":
        accelerator_program(root)
    else:
        trainer_program(root, "ddp" if case == "trainer" else "ddp_spawn")
