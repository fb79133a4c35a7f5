"""The x-axis (``step``) of every logged row, on Lightning or on drivetrain: one program, only the imports differ.

``python logging_steps.py lightning|drivetrain OUT.pt`` runs a few small fits (plain, gradient
accumulation, validation inside the epoch, manual optimisation with two optimizers, then
``validate``/``test`` after a fit) with a CSVLogger and saves, for each, the rows of
``metrics.csv`` as ``(step, epoch, names logged in that row)``.
"""

from __future__ import annotations

import csv
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def _framework(name: str) -> Any:
    if name == "lightning":
        import lightning.pytorch as framework
        from lightning.pytorch.loggers import CSVLogger
    else:
        import drivetrain as framework
        from drivetrain.loggers import CSVLogger
    return framework, CSVLogger


def run_all(name: str) -> dict[str, list[tuple[int, int, tuple[str, ...]]]]:
    framework, CSVLogger = _framework(name)
    base = framework.LightningModule if name == "lightning" else framework.TrainingModule

    class Net(base):  # type: ignore[misc, valid-type]
        def __init__(self, manual: bool = False) -> None:
            super().__init__()
            self.layer = nn.Linear(4, 1)
            self.other = nn.Linear(4, 1)
            self.automatic_optimization = not manual

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            x, y = batch
            loss = nn.functional.mse_loss(self.layer(x), y)
            self.log("train_loss", loss, on_step=True, on_epoch=True)
            if self.automatic_optimization:
                return loss
            first, second = self.optimizers()
            for optimizer, layer in ((first, self.layer), (second, self.other)):
                optimizer.zero_grad()
                self.manual_backward(nn.functional.mse_loss(layer(x), y))
                optimizer.step()
            return None

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            self.log("val_loss", nn.functional.mse_loss(self.layer(batch[0]), batch[1]))

        def test_step(self, batch: Any, batch_idx: int) -> None:
            self.log("test_loss", nn.functional.mse_loss(self.layer(batch[0]), batch[1]))

        def configure_optimizers(self) -> Any:
            if self.automatic_optimization:
                return torch.optim.SGD(self.parameters(), lr=0.01)
            return [
                torch.optim.SGD(self.layer.parameters(), lr=0.01),
                torch.optim.SGD(self.other.parameters(), lr=0.01),
            ]

    x = torch.randn(40, 4, generator=torch.Generator().manual_seed(0))
    loader = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4)  # 10 batches

    def rows(folder: str) -> list[tuple[int, int, tuple[str, ...]]]:
        path = next(Path(folder).rglob("metrics.csv"))
        with open(path, newline="") as file:
            table = list(csv.DictReader(file))
        return [
            (
                int(row["step"]),
                int(float(row["epoch"])) if row.get("epoch") else -1,
                tuple(sorted(k for k, v in row.items() if v != "" and k not in ("step", "epoch"))),
            )
            for row in table
        ]

    def fit(*, after: tuple[str, ...] = (), manual: bool = False, **settings: Any) -> list[Any]:
        with tempfile.TemporaryDirectory() as folder:
            trainer = framework.Trainer(
                accelerator="cpu",
                devices=1,
                logger=CSVLogger(folder, name="run"),
                enable_progress_bar=False,
                enable_model_summary=False,
                enable_checkpointing=False,
                num_sanity_val_steps=0,
                **settings,
            )
            model = Net(manual=manual)
            trainer.fit(model, loader, loader)
            for entry in after:
                getattr(trainer, entry)(model, loader, verbose=False)
            trainer.loggers[0].save()
            return rows(folder)

    return {
        "plain": fit(max_epochs=3, log_every_n_steps=4, after=("validate", "test")),
        "accumulation": fit(max_epochs=2, log_every_n_steps=2, accumulate_grad_batches=3),
        "validation_inside_the_epoch": fit(max_epochs=2, log_every_n_steps=3, val_check_interval=5),
        "manual_two_optimizers": fit(max_epochs=2, log_every_n_steps=2, manual=True),
        "max_steps_mid_epoch": fit(max_steps=7, log_every_n_steps=2),
    }


if __name__ == "__main__":
    torch.save(run_all(sys.argv[1]), sys.argv[2])
