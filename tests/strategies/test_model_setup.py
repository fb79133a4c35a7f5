"""One set-up order for a model and its optimizers, followed by both front doors."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

import drivetrain as dt
from drivetrain.plugins import Precision
from drivetrain.strategies import SingleDeviceStrategy
from trainer.trainer_models import Regression, loader, quiet_trainer


class RecordingPrecision(Precision):
    def __init__(self, calls: list[Any], replace: bool = False) -> None:
        self.calls = calls
        self.replace = replace

    def convert_module(self, module: nn.Module) -> nn.Module:
        self.calls.append("convert_module")
        return nn.Linear(1, 1) if self.replace else module


class JointRecording(SingleDeviceStrategy):
    """A one-device strategy that, like FSDP and DeepSpeed, sets modules up with their optimizers."""

    def __init__(self, replace: bool = False) -> None:
        self.calls: list[Any] = []
        super().__init__(device=torch.device("cpu"), precision=RecordingPrecision(self.calls, replace))

    @property
    def requires_joint_setup(self) -> bool:
        return True

    def module_to_device(self, module: nn.Module) -> None:
        self.calls.append("module_to_device")
        super().module_to_device(module)

    def setup_module_and_optimizers(
        self, module: nn.Module, optimizers: list[Any]
    ) -> tuple[nn.Module, list[Any]]:
        parameters = {id(p) for p in module.parameters()}
        on_module = all(id(p) in parameters for o in optimizers for g in o.param_groups for p in g["params"])
        self.calls.append(("setup_module_and_optimizers", len(optimizers), on_module))
        return super().setup_module_and_optimizers(module, optimizers)


ORDER = ["convert_module", "module_to_device", ("setup_module_and_optimizers", 1, True)]


def test_both_doors_set_a_model_up_in_the_same_order() -> None:
    trainer_strategy = JointRecording()
    quiet_trainer(strategy=trainer_strategy, max_steps=1).fit(Regression(), loader())
    assert trainer_strategy.calls == ORDER
    accelerator = dt.Accelerator(strategy=JointRecording())
    model = nn.Linear(2, 1)
    accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    assert accelerator.strategy.calls == ORDER  # type: ignore[attr-defined]


def test_a_precision_that_replaces_the_module_is_the_same_error_in_both_doors() -> None:
    message = (
        "RecordingPrecision.convert_module returned a new module; it must convert the given module in place"
    )
    with pytest.raises(TypeError, match=message):
        quiet_trainer(strategy=JointRecording(replace=True), max_steps=1).fit(Regression(), loader())
    accelerator = dt.Accelerator(strategy=JointRecording(replace=True))
    model = nn.Linear(2, 1)
    with pytest.raises(TypeError, match=message):
        accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
