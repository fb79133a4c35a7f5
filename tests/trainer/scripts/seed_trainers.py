"""The seeds' Trainer examples as real programs (one per run: the processes re-run this script).

    python seed_trainers.py ddp3        # Trainer(strategy="ddp", accelerator="cpu", devices=3)
    python seed_trainers.py xpu_custom_io  # Trainer(strategy="ddp_custom_checkpoint_io", accelerator=XPUAccelerator(),
                                           # devices=2): a registered preset with a custom CheckpointIO, on a
                                           # user's accelerator (a CPU stand-in for the seed's XPU)
    python seed_trainers.py spawn       # Trainer(strategy="ddp_spawn", ...): the parent gets the trained model
    python seed_trainers.py fork        # the same with ddp_fork
    python seed_trainers.py ddp1        # Trainer(strategy="ddp", devices=1): a process group of one process
    python seed_trainers.py custom_ddp1 # the seed's CustomDDPStrategy(...) with plugins, on one CPU device

Each process writes one line per result with a single os.write, so ranks never interleave.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import drivetrain as dt
from drivetrain.accelerators import Accelerator
from drivetrain.plugins import Precision, TorchCheckpointIO
from drivetrain.strategies import DDPStrategy, StrategyRegistry
from drivetrain.trainer import ModelCheckpoint


def say(text: str) -> None:
    os.write(1, (text + "\n").encode())


def data(n: int = 48, seed: int = 0) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=generator)
    return TensorDataset(x, x.sum(1, keepdim=True))


class Model(dt.TrainingModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layer = nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self(x), y)
        self.log("loss", loss)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.log("val_loss", nn.functional.mse_loss(self(batch[0]), batch[1]))

    def test_step(self, batch: Any, batch_idx: int) -> None:
        self.log("seen", float(len(batch[0])), reduce_fx="sum")

    def predict_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> torch.Tensor:
        return self(batch[0])

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.05)


class XPUAccelerator(Accelerator):
    """The seed's XPUAccelerator, computing on the CPU (no xpulib here)."""

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

    def get_device_stats(self, device: Any) -> dict[str, Any]:
        return {}


class CustomCheckpointIO(TorchCheckpointIO):
    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        say(f"custom-io saved {Path(path).name}")
        super().save_checkpoint(checkpoint, path, storage_options)


QUIET = {"enable_progress_bar": False, "enable_model_summary": False, "logger": False}


def loader(dataset: TensorDataset, batch_size: int = 4) -> DataLoader:
    return DataLoader(dataset, batch_size=batch_size)


def main(case: str, root: str) -> None:
    model = Model()
    if case == "ddp3":
        trainer = dt.Trainer(
            strategy="ddp", accelerator="cpu", devices=3, max_epochs=2, enable_checkpointing=False, **QUIET
        )
        trainer.fit(model, loader(data()), loader(data(12, seed=1)))
        tested = trainer.test(model, loader(data(20, seed=2)), verbose=False)
        predictions = trainer.predict(model, loader(data(20, seed=2)))
        say(
            f"rank={trainer.global_rank} world={trainer.world_size} steps={trainer.global_step} "
            f"seen={tested[0]['seen']:.0f} predicted={sum(len(p) for p in predictions)} "
            f"checksum={float(model.layer.weight.detach().sum()):.6f} state={trainer.state.status.value}"
        )
    elif case == "xpu_custom_io":
        StrategyRegistry.register(
            "ddp_custom_checkpoint_io",
            DDPStrategy,
            description="DDP Strategy with custom checkpoint io plugin",
            checkpoint_io=CustomCheckpointIO(),
        )
        checkpoint = ModelCheckpoint(dirpath=root, filename="{epoch}")
        trainer = dt.Trainer(
            strategy="ddp_custom_checkpoint_io",
            accelerator=XPUAccelerator(),
            devices=2,
            max_epochs=2,
            callbacks=[checkpoint],
            **QUIET,
        )
        trainer.fit(model, loader(data()))
        # Rank 0 wrote and removed the files; the others may finish before it is done.
        files = sorted(os.listdir(root)) if trainer.is_global_zero else "-"
        say(
            f"rank={trainer.global_rank} accelerator={type(trainer.accelerator).__name__} world={trainer.world_size} "
            f"steps={trainer.global_step} io={type(trainer.strategy.checkpoint_io).__name__} files={files}"
        )
    elif case in ("spawn", "fork"):
        reference = Model()
        dt.Trainer(accelerator="cpu", devices=1, max_epochs=2, enable_checkpointing=False, **QUIET).fit(
            reference, loader(data(), batch_size=8)
        )
        checkpoint = ModelCheckpoint(dirpath=root, filename="{epoch}")
        trainer = dt.Trainer(
            strategy=f"ddp_{case}",
            accelerator="cpu",
            devices=2,
            max_epochs=2,
            callbacks=[checkpoint],
            **QUIET,
        )
        trainer.fit(model, loader(data()), loader(data(12, seed=1)))
        same = torch.allclose(model.layer.weight, reference.layer.weight, rtol=1e-5, atol=1e-6)
        say(
            f"parent same_as_single={same} steps={trainer.global_step} epoch={trainer.current_epoch} "
            f"finished={trainer.state.finished} metrics={sorted(trainer.callback_metrics)} "
            f"best={Path(checkpoint.best_model_path).name}"
        )
        if case == "fork":  # a second entry point starts new ranks again (spawn would re-import: slow)
            tested = trainer.test(model, loader(data(20, seed=2)), verbose=False)
            say(f"parent tested={tested}")
    elif case in ("ddp1", "custom_ddp1"):
        reference = Model()
        dt.Trainer(accelerator="cpu", devices=1, max_epochs=2, enable_checkpointing=False, **QUIET).fit(
            reference, loader(data())
        )
        if case == "ddp1":  # Lightning runs strategy="ddp" with one device as a one-process group
            trainer = dt.Trainer(
                strategy="ddp",
                accelerator="cpu",
                devices=1,
                max_epochs=2,
                enable_checkpointing=False,
                **QUIET,
            )
        else:  # the seed's CustomDDPStrategy, with plugins of its own, on a one-device CPU machine
            precision = CountingPrecision()
            strategy = CustomDDPStrategy(checkpoint_io=CustomCheckpointIO(), precision_plugin=precision)
            trainer = dt.Trainer(
                strategy=strategy, accelerator="cpu", max_epochs=2, enable_checkpointing=False, **QUIET
            )
        trainer.fit(model, loader(data()))
        same = torch.allclose(model.layer.weight, reference.layer.weight, rtol=1e-5, atol=1e-6)
        wrapper = type(trainer.model).__name__
        say(f"world={trainer.world_size} steps={trainer.global_step} same_as_single={same} wrapper={wrapper}")
        if case == "custom_ddp1":
            trainer.save_checkpoint(Path(root) / "final.ckpt")  # through the strategy's own CheckpointIO
            say(f"setup_calls={trainer.strategy.setup_calls} backward_calls={precision.backward_calls}")
    else:
        raise SystemExit(f"unknown case {case!r}")


class CustomDistributedDataParallel(nn.parallel.DistributedDataParallel):
    """The seed's MyCustomDistributedDataParallel."""


class CustomDDPStrategy(DDPStrategy):
    """The seed's CustomDDPStrategy: its own DDP wrapper, and a setup that reaches its plugins."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.setup_calls = 0

    def configure_ddp(self) -> None:
        self.model = CustomDistributedDataParallel(self.model, device_ids=None)

    def setup(self, trainer: Any = None) -> None:
        self.setup_calls += 1
        assert isinstance(self.precision_plugin, CountingPrecision)
        assert isinstance(self.checkpoint_io, CustomCheckpointIO)
        super().setup(trainer)


class CountingPrecision(Precision):
    """A user's precision plugin (full precision) that counts the backward passes it sees."""

    def __init__(self) -> None:
        super().__init__()
        self.backward_calls = 0

    def pre_backward(self, tensor: torch.Tensor, module: Any) -> torch.Tensor:
        self.backward_calls += 1
        return super().pre_backward(tensor, module)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else tempfile.mkdtemp())
