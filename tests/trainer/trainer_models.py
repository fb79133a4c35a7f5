"""Small modules and data shared by the Trainer tests (importable as ``trainer.trainer_models``)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import drivetrain as dt


def regression_data(n: int = 64, features: int = 4, seed: int = 0) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, features, generator=generator)
    y = x @ torch.arange(1.0, features + 1).unsqueeze(1) + 0.1 * torch.randn(n, 1, generator=generator)
    return TensorDataset(x, y)


def loader(dataset: Any = None, batch_size: int = 8, shuffle: bool = False, **kwargs: Any) -> DataLoader:
    return DataLoader(
        dataset if dataset is not None else regression_data(),
        batch_size=batch_size,
        shuffle=shuffle,
        **kwargs,
    )


class Regression(dt.TrainingModule):
    """A linear (optionally dropout) regressor that logs its losses."""

    def __init__(
        self, features: int = 4, lr: float = 0.05, dropout: float = 0.0, optimizer: str = "sgd"
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(features, 8), nn.Dropout(dropout), nn.Tanh(), nn.Linear(8, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self(x), y)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self(x), y), prog_bar=True)

    def test_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        x, y = batch
        self.log("test_loss", nn.functional.mse_loss(self(x), y))
        self.log("test_count", float(len(x)), reduce_fx="sum")

    def predict_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> torch.Tensor:
        return self(batch[0] if isinstance(batch, (list, tuple)) else batch)

    def configure_optimizers(self) -> Any:
        if self.hparams.optimizer == "adam":
            return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


def quiet_trainer(**kwargs: Any) -> dt.Trainer:
    """A single-process CPU Trainer without bar, summary, checkpoints or logger unless asked."""
    settings: dict[str, Any] = {
        "accelerator": "cpu",
        "devices": 1,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "enable_checkpointing": False,
        "logger": False,
        "num_sanity_val_steps": 0,
    }
    settings.update(kwargs)
    return dt.Trainer(**settings)


def weights(module: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def assert_same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), (
            f"{key} differs: max |diff| {(a[key] - b[key]).abs().max().item()}"
        )
