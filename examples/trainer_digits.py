"""Train a digits classifier with ``drivetrain.Trainer``: DDP on 2 CPU processes, a progress bar on rank 0.

The model and the data are a ``TrainingModule`` and a ``DataModule``; the Trainer starts the
second process (by re-running this script), shards the data, averages the gradients, reduces
the validation accuracy across both processes, logs to CSV and keeps the best checkpoint.

    python examples/trainer_digits.py                       # 2 processes, CPU
    python examples/trainer_digits.py --devices 1           # one process
    python examples/trainer_digits.py --strategy ddp_spawn  # processes started by torch.multiprocessing
"""

from __future__ import annotations

import argparse
import getpass
import os
import tempfile
import time
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import drivetrain as dt
from drivetrain.trainer import ModelCheckpoint


class DigitsClassifier(dt.TrainingModule):
    """A two-layer perceptron over the 8x8 digit images."""

    def __init__(self, hidden: int = 128, lr: float = 3e-3) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.cross_entropy(self(x), y)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        logits = self(x)
        self.log("val_loss", nn.functional.cross_entropy(logits, y))
        self.log("val_acc", (logits.argmax(1) == y).float().mean(), prog_bar=True)

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.Adam(self.parameters(), lr=self.hparams.lr)
        scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=self.trainer.max_epochs)
        return {"optimizer": optimizer, "lr_scheduler": scheduler}


class Digits(dt.DataModule):
    """scikit-learn's bundled digits (1,797 images): 1,500 to train on, the rest to validate."""

    def __init__(self, batch_size: int = 32) -> None:
        super().__init__()
        self.batch_size = batch_size

    def setup(self, stage: str) -> None:
        from sklearn.datasets import load_digits

        digits = load_digits()
        x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
        y = torch.tensor(digits.target, dtype=torch.long)
        order = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
        self.train_set = TensorDataset(x[order[:1500]], y[order[:1500]])
        self.val_set = TensorDataset(x[order[1500:]], y[order[1500:]])

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=128)


def _user() -> str:
    """The user's name for a folder of their own (the same in every process of the run, unlike a fresh temp dir)."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (some containers)
        return str(os.getuid()) if hasattr(os, "getuid") else "user"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--strategy", default="ddp")
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument(
        "--root",
        default=os.path.join(tempfile.gettempdir(), f"drivetrain-digits-{_user()}"),
        help="where logs and checkpoints go (default: a folder of your own in the temporary directory; "
        "each run gets a version_N folder in it)",
    )
    args = parser.parse_args()

    dt.seed_everything(0)
    started = time.perf_counter()
    trainer = dt.Trainer(
        accelerator="cpu",
        devices=args.devices,
        strategy=args.strategy if args.devices > 1 else "auto",
        max_epochs=args.epochs,
        default_root_dir=args.root,
        callbacks=[ModelCheckpoint(monitor="val_acc", mode="max")],
        log_every_n_steps=10,
    )
    model = DigitsClassifier()
    trainer.fit(model, datamodule=Digits())
    if trainer.is_global_zero:
        accuracy = float(trainer.callback_metrics["val_acc"])
        best = trainer.checkpoint_callback
        print(
            f"trained on {trainer.world_size} process(es) with {type(trainer.strategy).__name__} in "
            f"{time.perf_counter() - started:.1f} s; logs in {trainer.log_dir}\n"
            f"best checkpoint: {best.best_model_path} (val_acc {best.best_model_score:.3f})\n"
            f"final validation accuracy: {accuracy:.3f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
