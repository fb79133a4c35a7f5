"""Modules and recorders for the weight-averaging, fine-tuning and pruning callback tests."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

import drivetrain as dt
from drivetrain.trainer.callbacks import Callback


class Backboned(dt.TrainingModule):
    """A backbone (optionally with BatchNorm) and a head; the optimizer takes what is trainable at set-up."""

    def __init__(self, lr: float = 0.05, batch_norm: bool = False, scheduler: bool = False) -> None:
        super().__init__()
        self.lr = lr
        self.with_scheduler = scheduler
        self.backbone = nn.Sequential(
            nn.Linear(4, 8), nn.BatchNorm1d(8) if batch_norm else nn.Identity(), nn.Tanh()
        )
        self.head = nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(x))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self(x), y)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self(x), y))

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.SGD(
            [p for p in self.parameters() if p.requires_grad], lr=self.lr, momentum=0.5
        )
        if not self.with_scheduler:
            return optimizer
        return {
            "optimizer": optimizer,
            "lr_scheduler": torch.optim.lr_scheduler.StepLR(optimizer, 1, gamma=0.5),
        }


def params(module: nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in module.named_parameters()}


class Snapshots(Callback):
    """Records the parameters after every optimizer step and at every epoch end, and the learning rates used."""

    def __init__(self) -> None:
        self.after_step: list[dict[str, torch.Tensor]] = []
        self.epoch_end: list[dict[str, torch.Tensor]] = []
        self.epoch_lrs: list[list[float]] = []
        self.validated: list[dict[str, torch.Tensor]] = []
        self._step = 0

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if batch_idx == 0:
            self.epoch_lrs.append([group["lr"] for group in trainer.optimizers[0].param_groups])

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if trainer.global_step > self._step:
            self._step = trainer.global_step
            self.after_step.append(params(pl_module))

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        self.epoch_end.append(params(pl_module))

    def on_validation_batch_start(
        self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        if batch_idx == 0 and not trainer.sanity_checking:
            self.validated.append(params(pl_module))


def mean(snapshots: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    return {key: torch.stack([s[key] for s in snapshots]).mean(0) for key in snapshots[0]}


def assert_close(actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert actual.keys() == expected.keys()
    for key in expected:
        torch.testing.assert_close(actual[key], expected[key], rtol=1e-5, atol=1e-6, msg=key)
