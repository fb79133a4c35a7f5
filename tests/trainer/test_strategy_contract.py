"""The Trainer uses the strategy only through the core contract (what sharded strategies rely on)."""

from __future__ import annotations

from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import torch
from torch import nn

from drivetrain.strategies import SingleDeviceStrategy
from drivetrain.trainer import ModelCheckpoint
from trainer.trainer_models import Regression, loader, quiet_trainer


class Wrapper(nn.Module):
    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, *args: Any) -> Any:
        Recording.calls.append("wrapper.forward")
        return self.module(*args)


class Recording(SingleDeviceStrategy):
    """A one-device strategy that wraps like a sharded one and records how it is used."""

    calls: list[Any] = []

    @property
    def requires_joint_setup(self) -> bool:
        return True

    def module_init_context(self, empty_init: bool | None = None) -> AbstractContextManager[Any]:
        self.calls.append(("module_init_context", empty_init))
        return super().module_init_context(empty_init)

    def setup_module(self, module: nn.Module) -> nn.Module:
        raise AssertionError("the Trainer must call setup_module_and_optimizers")

    def setup_module_and_optimizers(
        self, module: nn.Module, optimizers: list[Any]
    ) -> tuple[nn.Module, list[Any]]:
        self.calls.append(("setup_module_and_optimizers", type(module).__name__, len(optimizers)))
        self.model = Wrapper(module)
        return self.model, optimizers

    def unwrap_module(self, module: nn.Module) -> nn.Module:
        return module.module if isinstance(module, Wrapper) else module

    def save_state(self, path: Any, state: dict[str, Any], storage_options: Any = None) -> None:
        self.calls.append(
            ("save_state", type(state["state_dict"]).__name__, type(state["optimizer_0"]).__name__)
        )
        super().save_state(path, state, storage_options)

    def clip_gradients_norm(
        self,
        module: nn.Module,
        optimizer: Any,
        max_norm: float,
        norm_type: float = 2.0,
        error_if_nonfinite: bool = True,
    ) -> torch.Tensor:
        self.calls.append(("clip_gradients_norm", type(module).__name__))
        return super().clip_gradients_norm(module, optimizer, max_norm, norm_type, error_if_nonfinite)


class Deferred(Regression):
    def configure_model(self) -> None:
        Recording.calls.append("configure_model")
        if not hasattr(self, "head"):
            self.head = nn.Linear(1, 1)

    def configure_optimizers(self) -> Any:
        Recording.calls.append(("configure_optimizers", "head" in self._modules))
        return super().configure_optimizers()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.net(x))


def test_setup_order_wrapping_clipping_and_checkpoints(tmp_path: Path) -> None:
    Recording.calls = []
    checkpoint = ModelCheckpoint(dirpath=tmp_path, filename="last", every_n_train_steps=2)
    trainer = quiet_trainer(
        strategy=Recording(),
        max_steps=2,
        gradient_clip_val=1.0,
        callbacks=[checkpoint],
        enable_checkpointing=True,
    )
    trainer.fit(Deferred(), loader())
    assert Recording.calls[:4] == [
        ("module_init_context", None),
        "configure_model",
        ("configure_optimizers", True),
        ("setup_module_and_optimizers", "Deferred", 1),
    ]
    assert Recording.calls[4:].count("wrapper.forward") == 2  # training_step runs through the wrapper
    assert ("clip_gradients_norm", "Wrapper") in Recording.calls
    assert ("save_state", "Wrapper", "SGD") in Recording.calls
    Recording.calls = []
    resumed = quiet_trainer(strategy=Recording(), max_steps=3)
    resumed.fit(Deferred(), loader(), ckpt_path=tmp_path / "last.ckpt")
    assert Recording.calls[0] == ("module_init_context", True)  # weights come from the checkpoint
    assert resumed.global_step == 3
