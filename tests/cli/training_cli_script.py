"""The seed's CLI example: a script whose own XPUAccelerator registers "xpu", driven by drivetrain.cli.CLI.

    python training_cli_script.py fit --trainer.accelerator=xpu --trainer.devices=2 ...

The accelerator computes on the CPU (there is no xpulib here); registering "xpu" replaces the
built-in Intel XPU accelerator, with a warning, as docs/extending.md specifies.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import drivetrain as dt
from drivetrain.accelerators import Accelerator
from drivetrain.cli import CLI


class XPUAccelerator(Accelerator):
    """Support for a hypothetical XPU (a stand-in that computes on the CPU)."""

    @staticmethod
    def parse_devices(devices: Any) -> Any:
        return devices

    @staticmethod
    def get_parallel_devices(devices: Any) -> Any:
        return [torch.device("cpu") for _ in devices]

    @staticmethod
    def auto_device_count() -> int:
        return 2

    @staticmethod
    def is_available() -> bool:
        return True

    @classmethod
    def register_accelerators(cls, accelerator_registry: Any) -> None:
        accelerator_registry.register(
            "xpu", cls, description="XPU Accelerator - optimized for large-scale machine learning."
        )


class Model(dt.TrainingModule):
    def __init__(self, width: int = 8, lr: float = 0.1) -> None:
        """A small regressor.

        Args:
            width: hidden units.
            lr: learning rate.
        """
        super().__init__()
        self.save_hyperparameters()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(4, width), nn.Tanh(), nn.Linear(width, 1))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("loss", loss)
        return loss

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


class Data(dt.DataModule):
    def __init__(self, batch_size: int = 8, size: int = 32) -> None:
        """Random regression data.

        Args:
            batch_size: samples per batch and process.
            size: samples in all.
        """
        super().__init__()
        self.batch_size, self.size = batch_size, size

    def train_dataloader(self) -> DataLoader:
        generator = torch.Generator().manual_seed(0)
        x = torch.randn(self.size, 4, generator=generator)
        return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=self.batch_size)


if __name__ == "__main__":
    cli = CLI(Model, Data)
    trainer = cli.trainer
    line = (
        f"rank={trainer.global_rank} accelerator={type(trainer.accelerator).__name__} world={trainer.world_size} "
        f"steps={trainer.global_step} width={cli.model.hparams.width} batch_size={cli.datamodule.batch_size}\n"
    )
    os.write(1, line.encode())
