"""XLAStrategy against a stand-in torch_xla (torch-xla cannot be installed next to our torch)."""

from __future__ import annotations

import sys
from typing import Any

import pytest
import torch
from torch import nn

import drivetrain as dt
from drivetrain.strategies import DDPStrategy, XLAStrategy


def _record_xla_model_calls(calls: list[str]) -> None:
    xla_model = sys.modules["torch_xla.core.xla_model"]
    xla_model.reduce_gradients = lambda optimizer: calls.append("reduce_gradients")  # type: ignore[attr-defined]
    xla_model.mark_step = lambda: calls.append("mark_step")  # type: ignore[attr-defined]


def test_auto_picks_xla_strategy_on_xla_hardware(hardware: Any) -> None:
    hardware.torch_xla(count=8)
    strategy = dt.connect(accelerator="tpu", devices=8)
    assert type(strategy) is XLAStrategy
    assert strategy.parallel_devices == [torch.device("xla", i) for i in range(8)]
    assert strategy.launcher is not None and strategy.launcher.is_interactive_compatible
    assert (strategy.world_size, strategy.global_rank) == (1, 0)  # the XLA runtime says more once launched
    single = dt.connect(accelerator="xla", devices=1)
    assert type(single) is XLAStrategy and single.launcher is None


def test_xla_and_other_strategies_refuse_each_others_hardware(hardware: Any) -> None:
    hardware.torch_xla(count=8)
    with pytest.raises(ValueError, match=r"DDPStrategy cannot run on XLA devices; use strategy='xla'"):
        dt.connect(accelerator="xla", strategy="ddp", devices=8)
    with pytest.raises(
        ValueError, match=r"strategy='xla' runs on XLA devices only, but the accelerator is CPU"
    ):
        dt.connect(accelerator="cpu", strategy="xla", devices=2)
    assert isinstance(dt.connect(accelerator="cpu", strategy="ddp", devices=2), DDPStrategy)


def test_optimizer_step_reduces_gradients_before_stepping_and_marks_the_step(hardware: Any) -> None:
    hardware.torch_xla(count=1)
    calls: list[str] = []
    _record_xla_model_calls(calls)
    strategy = dt.connect(accelerator="xla", devices=1)
    model = nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    original_step = optimizer.step

    def step(*args: Any, **kwargs: Any) -> Any:
        calls.append("step")
        return original_step(*args, **kwargs)

    optimizer.step = step  # type: ignore[method-assign]
    model(torch.ones(1, 2)).sum().backward()
    before = model.weight.detach().clone()
    strategy.optimizer_step(optimizer, model=model)
    assert calls == ["reduce_gradients", "step", "mark_step"]
    assert not torch.equal(before, model.weight)


def test_xla_debug_preset(hardware: Any) -> None:
    hardware.torch_xla(count=8)
    strategy = dt.connect(accelerator="xla", strategy="xla_debug", devices=8)
    assert type(strategy) is XLAStrategy and strategy._debug is True
