"""The Strategy base and SingleDeviceStrategy, without process groups."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import drivetrain as dt
from drivetrain.accelerators import CPUAccelerator
from drivetrain.plugins import CheckpointIO, HalfPrecision, Precision, TorchCheckpointIO
from drivetrain.strategies import SingleDeviceStrategy, Strategy


def test_precision_and_precision_plugin_are_one_setting() -> None:
    plugin = Precision()
    assert SingleDeviceStrategy("cpu", precision_plugin=plugin).precision is plugin
    assert SingleDeviceStrategy("cpu", precision=plugin).precision_plugin is plugin
    with pytest.raises(ValueError, match="same setting, pass only one"):
        SingleDeviceStrategy("cpu", precision=Precision(), precision_plugin=Precision())


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"accelerator": "cpu"},
            r"accelerator= expects an instance of drivetrain.accelerators.Accelerator, got str",
        ),
        ({"precision": "bf16-mixed"}, r"precision= expects an instance of drivetrain.plugins.Precision"),
        (
            {"checkpoint_io": object()},
            r"checkpoint_io= expects an instance of drivetrain.plugins.CheckpointIO",
        ),
    ],
)
def test_constructor_rejects_strings_and_wrong_types(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(TypeError, match=message):
        SingleDeviceStrategy("cpu", **kwargs)


def test_bad_device_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="not a device torch understands"):
        SingleDeviceStrategy("quantum:0")
    with pytest.raises(TypeError, match="device= expects"):
        SingleDeviceStrategy(3.5)  # type: ignore[arg-type]


def test_unwired_strategy_says_how_to_wire_it() -> None:
    with pytest.raises(RuntimeError, match="no accelerator yet"):
        _ = SingleDeviceStrategy().accelerator
    with pytest.raises(RuntimeError, match="no device yet"):
        _ = SingleDeviceStrategy().root_device


def test_connected_single_device_strategy_trains_like_plain_pytorch() -> None:
    strategy = dt.connect(accelerator="cpu")
    assert isinstance(strategy, SingleDeviceStrategy)
    assert isinstance(strategy.accelerator, CPUAccelerator)
    assert isinstance(strategy.checkpoint_io, TorchCheckpointIO)
    assert (strategy.world_size, strategy.global_rank, strategy.is_global_zero) == (1, 0, True)
    strategy.setup_environment()

    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    reference = nn.Linear(3, 1)
    reference.load_state_dict(model.state_dict())
    model = strategy.setup_module(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    reference_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    x, y = torch.randn(8, 3), torch.randn(8, 1)
    for _ in range(3):
        batch = strategy.batch_to_device((x, y))
        strategy.backward(((model(batch[0]) - batch[1]) ** 2).mean(), model)
        strategy.optimizer_step(optimizer)
        optimizer.zero_grad()
        ((reference(x) - y) ** 2).mean().backward()
        reference_optimizer.step()
        reference_optimizer.zero_grad()
    assert torch.equal(model.weight, reference.weight)
    strategy.teardown()


def test_collectives_are_identities_on_one_process() -> None:
    strategy = dt.connect(accelerator="cpu")
    t = torch.arange(3.0)
    assert strategy.all_reduce(t) is t
    assert strategy.all_gather(t).shape == (1, 3)
    assert strategy.all_gather_object({"a": 1}) == [{"a": 1}]
    assert strategy.broadcast("x") == "x"
    assert strategy.reduce_boolean_decision(False) is False
    strategy.barrier()
    with pytest.raises(ValueError, match="reduce_op='avg' is not supported; use one of sum, mean"):
        strategy.all_reduce(t, reduce_op="avg")


@dataclasses.dataclass
class Batch:
    x: torch.Tensor
    meta: str


def test_batch_to_device_handles_nested_structures() -> None:
    strategy = dt.connect(accelerator="cpu")
    batch = {"a": [torch.ones(1, dtype=torch.float64)], "b": Batch(torch.zeros(2), "keep")}
    moved = strategy.batch_to_device(batch, torch.device("meta"))
    assert moved["a"][0].device.type == "meta"
    assert moved["b"].x.device.type == "meta"
    assert moved["b"].meta == "keep"


def test_clipping_unscales_and_clips() -> None:
    strategy = dt.connect(accelerator="cpu")
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    (model(torch.full((2, 4), 100.0)).sum()).backward()
    norm = strategy.clip_gradients_norm(model, optimizer, max_norm=1.0)
    assert norm > 1.0
    total = torch.norm(torch.stack([p.grad.norm() for p in model.parameters()]))
    assert total == pytest.approx(1.0, rel=1e-4)
    strategy.clip_gradients_value(model, optimizer, clip_val=0.01)
    assert all(p.grad.abs().max() <= 0.01 + 1e-7 for p in model.parameters())


def test_module_init_context_applies_precision_and_empty_init() -> None:
    strategy = dt.connect(accelerator="cpu", precision="bf16-true")
    assert isinstance(strategy.precision, HalfPrecision)
    with strategy.module_init_context():
        model = nn.Linear(2, 2)
    assert model.weight.dtype == torch.bfloat16

    plain = dt.connect(accelerator="cpu")
    original_init = torch.nn.init.kaiming_uniform_
    torch.manual_seed(0)
    with plain.module_init_context(empty_init=True):
        skipped = nn.Linear(64, 64)
    torch.manual_seed(0)
    initialised = nn.Linear(64, 64)
    assert not torch.equal(skipped.weight, initialised.weight)  # init was skipped
    assert torch.nn.init.kaiming_uniform_ is original_init  # restored after the context


class SeedStyleCheckpointIO(CheckpointIO):
    """Written as in the seeds: no storage_options, no map_location."""

    def __init__(self) -> None:
        self.saved: list[tuple[dict[str, Any], Path]] = []

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | Path) -> None:  # type: ignore[override]
        self.saved.append((checkpoint, Path(path)))

    def load_checkpoint(self, path: str | Path) -> dict[str, Any]:  # type: ignore[override]
        return next(c for c, p in self.saved if p == Path(path))

    def remove_checkpoint(self, path: str | Path) -> None:
        self.saved = [(c, p) for c, p in self.saved if p != Path(path)]


def test_seed_style_checkpoint_io_is_called_with_its_own_signature(tmp_path: Path) -> None:
    io = SeedStyleCheckpointIO()
    strategy = dt.connect(accelerator="cpu", plugins=[io])
    strategy.save_checkpoint({"step": 3}, tmp_path / "a.ckpt")
    assert strategy.load_checkpoint(tmp_path / "a.ckpt") == {"step": 3}
    strategy.remove_checkpoint(tmp_path / "a.ckpt")
    assert io.saved == []


def test_unwrap_module_removes_compile_and_ddp_wrappers() -> None:
    strategy = dt.connect(accelerator="cpu")
    model = nn.Linear(2, 2)

    class Wrapper(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self._orig_mod = model

    assert strategy.unwrap_module(Wrapper()) is model
    state = strategy.get_module_state_dict(Wrapper())
    assert set(state) == {"weight", "bias"}


def test_connect_attaches_a_model_as_lightning_does() -> None:
    strategy = dt.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False).strategy
    assert strategy.lightning_module is None
    model = nn.Linear(2, 2)
    strategy.connect(model)
    assert strategy.model is model and strategy.lightning_module is model
    strategy.model = torch.compile(model)  # whatever wraps it, lightning_module is the user's module
    assert strategy.lightning_module is model
    with pytest.raises(
        TypeError, match=r"SingleDeviceStrategy.connect\(model\) expects a torch.nn.Module .* got str"
    ):
        strategy.connect("model")  # type: ignore[arg-type]


def test_subclass_defining_register_strategies_is_registered() -> None:
    class MyStrategy(SingleDeviceStrategy):
        @classmethod
        def register_strategies(cls, strategy_registry: Any) -> None:
            strategy_registry.register("my_single", cls, description="mine")

    strategy = dt.connect(accelerator="cpu", strategy="my_single")
    assert type(strategy) is MyStrategy
    assert isinstance(strategy, Strategy)


def test_save_state_and_load_state_round_trip_live_objects(tmp_path: Path) -> None:
    strategy = dt.connect(accelerator="cpu")
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    scheduler.step()
    strategy.save_state(
        tmp_path / "state.ckpt", {"model": model, "optimizer": optimizer, "scheduler": scheduler, "step": 7}
    )

    torch.manual_seed(1)
    fresh = nn.Linear(3, 2)
    fresh_optimizer = torch.optim.Adam(fresh.parameters(), lr=0.1)
    fresh_scheduler = torch.optim.lr_scheduler.StepLR(fresh_optimizer, step_size=1, gamma=0.5)
    state: dict[str, Any] = {
        "model": fresh,
        "optimizer": fresh_optimizer,
        "scheduler": fresh_scheduler,
        "step": 0,
    }
    rest = strategy.load_state(tmp_path / "state.ckpt", state)
    assert rest == {}
    assert torch.equal(fresh.weight, model.weight)
    assert fresh_optimizer.state_dict()["state"][0]["step"] == 1
    assert fresh_scheduler.get_last_lr() == scheduler.get_last_lr()
    assert state["step"] == 7

    with pytest.raises(KeyError, match=r"no entry for 'ema'.*strict=False"):
        strategy.load_state(tmp_path / "state.ckpt", {"ema": nn.Linear(1, 1)})
    assert set(strategy.load_state(tmp_path / "state.ckpt", {"model": fresh})) == {
        "optimizer",
        "scheduler",
        "step",
    }
