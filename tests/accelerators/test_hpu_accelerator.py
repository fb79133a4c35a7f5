"""HPUAccelerator and the HPU strategies against the kit's stand-in ``habana_frameworks`` (and without it).

Whole programs on the stand-in (both front doors, 1 and 2 processes, save → kill → resume) run
through the conformance kit in tests/testing/test_builtins_pass_the_kit.py.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import drivetrain as dt
from drivetrain.accelerators import HPUAccelerator, resolve_accelerator
from drivetrain.strategies import HPUParallelStrategy, SingleHPUStrategy, StrategyRegistry
from drivetrain.testing.fake import install_fake


def test_without_habana_frameworks_the_error_names_it(hardware: Any) -> None:
    assert HPUAccelerator.is_available() is False and HPUAccelerator.auto_device_count() == 0
    with pytest.raises(
        ValueError,
        match=r"accelerator='hpu' was requested but is not available here \(habana_frameworks\.torch "
        r"\(Intel Gaudi's PyTorch bridge\) is not installed",
    ):
        resolve_accelerator("hpu")
    with pytest.raises(ValueError, match="strategy='hpu_parallel' runs on Intel Gaudi cards only"):
        dt.connect(accelerator="cpu", strategy="hpu_parallel", devices=2)
    with pytest.raises(ValueError, match="strategy='hpu_single' runs on Intel Gaudi cards only"):
        dt.connect(accelerator="cpu", strategy="hpu_single", devices=1)


def test_devices_are_a_count_of_cards(hardware: Any) -> None:
    hardware.hpu(4)
    assert HPUAccelerator.is_available() and HPUAccelerator.auto_device_count() == 4
    assert HPUAccelerator.parse_devices("auto") == HPUAccelerator.parse_devices(-1) == 4
    assert HPUAccelerator.parse_devices(2) == 2
    assert HPUAccelerator.get_parallel_devices(2) == [torch.device("hpu"), torch.device("hpu")]
    with pytest.raises(ValueError, match=r"the Gaudi runtime chooses which card .* Pass devices=2"):
        HPUAccelerator.parse_devices([0, 1])
    with pytest.raises(ValueError, match="asks for 5 HPUs, but 4 are visible here"):
        HPUAccelerator.parse_devices(5)


def test_auto_picks_the_hpu_strategies_and_the_registry_names_them(hardware: Any) -> None:
    hardware.hpu(2)
    install_fake(HPUAccelerator)  # devices on CPU tensors: this machine has no cards
    single = dt.connect(accelerator="hpu", devices=1)
    assert type(single) is SingleHPUStrategy
    parallel = dt.connect(accelerator="hpu", devices=2)
    assert type(parallel) is HPUParallelStrategy and parallel.process_group_backend == "hccl"
    assert dt.connect(accelerator="auto", devices=2).accelerator.__class__.__name__ == "HPUAccelerator"
    assert StrategyRegistry["hpu_parallel"]["strategy"] is HPUParallelStrategy
    assert StrategyRegistry["hpu_single"]["strategy"] is SingleHPUStrategy
    gloo = HPUParallelStrategy(process_group_backend="gloo")
    assert gloo.process_group_backend == "gloo"  # an explicit backend wins


def test_generators_statistics_and_devices_go_through_habana(hardware: Any) -> None:
    stand_in = hardware.hpu(1)
    accelerator = HPUAccelerator()
    accelerator.setup_device(torch.device("hpu"))
    saved = accelerator.get_rng_state()
    first = stand_in.draw()
    accelerator.set_rng_state(saved)
    assert torch.equal(stand_in.draw(), first)
    assert accelerator.get_device_stats("hpu")["Limit"] > 0
    accelerator.synchronize()
    assert stand_in.calls["synchronize"] == 1
    with pytest.raises(ValueError, match="got device=device\\(type='cpu'\\), which is not an HPU"):
        accelerator.setup_device(torch.device("cpu"))


def test_training_marks_a_step_after_backward_and_after_the_optimizer_step(hardware: Any) -> None:
    stand_in = hardware.hpu(1)
    install_fake(HPUAccelerator)
    strategy = dt.connect(accelerator="hpu", devices=1)
    strategy.setup_environment()
    model = strategy.setup_module(torch.nn.Linear(2, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    strategy.backward(model(torch.ones(3, 2)).sum(), model)
    assert stand_in.calls["mark_step"] == 1
    strategy.optimizer_step(optimizer, model=model)
    assert stand_in.calls["mark_step"] == 2
