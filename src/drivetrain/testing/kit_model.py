"""The model, data and expectations the kit's programs use: small, deterministic, with dropout.

The same regression runs through both front doors. Dropout makes the CPU generator matter on
resume; a draw from the device's own generator (:func:`device_noise`) scales each training loss,
so a device generator that is not restored shows in the weights. Evaluation sets have sizes that
two processes cannot share evenly, so a strategy whose forward pass secretly talks to the other
processes is caught (by a hang, which the kit reports).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from drivetrain.trainer.module import TrainingModule

BATCH = 4
EPOCHS = 2
LR = 0.05


def _data(size: int, seed: int) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(size, 4, generator=generator)
    return TensorDataset(x, (x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]])) + 0.1)


TRAIN = _data(32, 1)
VAL = _data(20, 2)  # 5 batches: rank 0 gets 3, rank 1 gets 2
TEST = _data(24, 3)
PREDICT = _data(18, 4)  # 5 batches, the last one short


def network() -> nn.Module:
    """The model both doors train."""
    return nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Dropout(0.2), nn.Linear(16, 1))


def loader(data: TensorDataset, shuffle: bool = False) -> DataLoader:
    generator = torch.Generator().manual_seed(7) if shuffle else None
    return DataLoader(data, batch_size=BATCH, shuffle=shuffle, generator=generator)


def steps_per_epoch(world_size: int) -> int:
    return len(TRAIN) // BATCH // world_size


#: Where device randomness comes from in this process: set by the program (a stand-in's draw, or
#: a draw on the real device); ``None``: the device has no generator of its own to test.
_device_draw: list[Any] = [None]


def set_device_draw(draw: Any) -> None:
    _device_draw[0] = draw


def device_noise(device: torch.device) -> torch.Tensor | None:
    """A number from the device's own generator (as dropout on the device would draw), or ``None``."""
    draw = _device_draw[0]
    noise = None if draw is None else draw(device)
    return None if noise is None else noise.to(device).reshape(())


def noisy_loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    loss = nn.functional.mse_loss(output.float(), target.float())
    noise = device_noise(loss.device)
    return loss if noise is None else loss * (1 + 0.01 * noise.float())


class KitModule(TrainingModule):
    """The Trainer door's module: :func:`network`, SGD with momentum, loss and sample counts logged."""

    def __init__(self) -> None:
        super().__init__()
        self.net = network()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = noisy_loss(self(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self(x).float(), y.float()), batch_size=len(x))
        self.log("val_count", float(len(x)), reduce_fx="sum", batch_size=len(x))

    def test_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("test_loss", nn.functional.mse_loss(self(x).float(), y.float()), batch_size=len(x))
        self.log("test_count", float(len(x)), reduce_fx="sum", batch_size=len(x))

    def predict_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> torch.Tensor:
        return self(batch[0]).float()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=LR, momentum=0.9)


def expected(state: dict[str, torch.Tensor]) -> dict[str, Any]:
    """What evaluation must report for a network holding ``state`` (the ``net.`` prefix optional)."""
    reference = network()
    weights = {k.removeprefix("net."): v.detach().to("cpu", torch.float32) for k, v in state.items()}
    reference.load_state_dict(weights)
    reference.eval()
    with torch.no_grad():
        return {
            "val_loss": nn.functional.mse_loss(reference(VAL.tensors[0]), VAL.tensors[1]).item(),
            "test_loss": nn.functional.mse_loss(reference(TEST.tensors[0]), TEST.tensors[1]).item(),
            "predictions": reference(PREDICT.tensors[0]),
            "val_predictions": reference(VAL.tensors[0]),
        }


class Progress:
    """Where the Accelerate-style loop is, saved with its state (``register_for_checkpointing``)."""

    def __init__(self) -> None:
        self.epoch = 0
        self.step = 0

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "step": self.step}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.step = int(state["epoch"]), int(state["step"])
