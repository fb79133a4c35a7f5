"""XLAStrategy against a stand-in torch_xla (torch-xla cannot be installed next to our torch)."""

from __future__ import annotations

import os
import sys
from typing import Any

import pytest
import torch
from torch import nn

import drivetrain as dt
from drivetrain.strategies import DDPStrategy, SingleDeviceXLAStrategy, StrategyRegistry, XLAStrategy
from drivetrain.utils import DistributedType


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
    assert type(single) is SingleDeviceXLAStrategy and single.launcher is None
    assert single.root_device == torch.device("xla", 0) and single.world_size == 1
    assert type(dt.connect(accelerator="tpu", devices=[3])) is SingleDeviceXLAStrategy


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
    hardware.torch_xla(count=2)
    calls: list[str] = []
    _record_xla_model_calls(calls)
    strategy = dt.connect(accelerator="xla", devices=2)
    assert type(strategy) is XLAStrategy
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


def _stepped(strategy: Any, calls: list[str]) -> tuple[torch.Tensor, nn.Module]:
    model = nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    original_step = optimizer.step

    def step(*args: Any, **kwargs: Any) -> Any:
        calls.append("step")
        return original_step(*args, **kwargs)

    optimizer.step = step  # type: ignore[method-assign]
    model(torch.ones(1, 2)).sum().backward()
    before = model.weight.detach().clone()
    # What the front doors call on every step.
    strategy.step_functions().optimizer_step(optimizer, model=model)
    return before, model


def test_single_xla_steps_then_marks_the_step_without_reducing(hardware: Any) -> None:
    hardware.torch_xla(count=4)
    calls: list[str] = []
    _record_xla_model_calls(calls)
    strategy = dt.connect(accelerator="xla", strategy="single_xla", devices=1)
    assert type(strategy) is SingleDeviceXLAStrategy
    before, model = _stepped(strategy, calls)
    assert calls == ["step", "mark_step"]  # one device: no gradients to reduce
    assert not torch.equal(before, model.weight)
    assert strategy.all_reduce(torch.tensor(3.0), reduce_op="sum") == 3.0 and strategy.barrier() is None


def test_single_xla_by_name_picks_the_device_and_refuses_what_it_cannot_run(hardware: Any) -> None:
    hardware.torch_xla(count=8)
    entry = StrategyRegistry["single_xla"]
    assert entry["strategy"] is SingleDeviceXLAStrategy and dict(entry["init_params"]) == {}
    assert dt.connect(accelerator="tpu", strategy="single_xla", devices=[5]).root_device == torch.device(
        "xla", 5
    )
    assert SingleDeviceXLAStrategy(device=2).given_devices() == [torch.device("xla", 2)]
    with pytest.raises(
        ValueError, match=r"strategy='single_xla' runs a single process, but the job has 8 processes"
    ):
        dt.connect(accelerator="xla", strategy="single_xla", devices=8)
    with pytest.raises(
        ValueError, match=r"strategy='single_xla' runs on one XLA device, but the accelerator is CPU"
    ):
        dt.connect(accelerator="cpu", strategy="single_xla")
    with pytest.raises(
        ValueError, match=r"SingleDeviceStrategy cannot run on XLA devices; use strategy='xla'"
    ):
        dt.connect(accelerator="xla", strategy="single_device", devices=1)


def test_single_xla_debug_output_is_turned_on_at_set_up(
    hardware: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    hardware.torch_xla(count=1)
    monkeypatch.delenv("PT_XLA_DEBUG_LEVEL", raising=False)
    quiet = dt.connect(accelerator="xla", devices=1)
    quiet.setup_environment()
    assert "PT_XLA_DEBUG_LEVEL" not in os.environ
    loud = dt.connect(accelerator="xla", strategy=SingleDeviceXLAStrategy(debug=True))
    try:
        loud.setup_environment()
        assert os.environ["PT_XLA_DEBUG_LEVEL"] == "1"
    finally:
        os.environ.pop("PT_XLA_DEBUG_LEVEL", None)


def test_both_front_doors_pick_single_xla_for_one_tpu_core(hardware: Any) -> None:
    hardware.torch_xla(count=8)
    assert type(dt.Trainer(accelerator="tpu", devices=1, logger=False).strategy) is SingleDeviceXLAStrategy
    accelerator = dt.Accelerator(accelerator="xla", devices=1)
    assert type(accelerator.strategy) is SingleDeviceXLAStrategy
    assert accelerator.distributed_type == DistributedType.XLA  # as Accelerate reports one TPU core
    assert accelerator.device == torch.device("xla", 0) and accelerator.num_processes == 1
