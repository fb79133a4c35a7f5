"""DDPStrategy in real 2-process gloo jobs: training, collectives, no_sync, the seed's configure_ddp."""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import drivetrain as dt
from drivetrain.plugins import CheckpointIO
from drivetrain.strategies import DDPStrategy, StrategyRegistry
from helpers.multiprocess import RankFailed, run_processes

pytestmark = pytest.mark.multiprocess


def test_unknown_ddp_argument_is_named() -> None:
    with pytest.raises(TypeError, match=r"unknown argument\(s\) 'statc_graph'.*static_graph"):
        DDPStrategy(statc_graph=True)


def test_bad_start_method_and_timeout() -> None:
    with pytest.raises(ValueError, match="start_method='thread' is not supported; use one of popen, spawn"):
        DDPStrategy(start_method="thread")
    with pytest.raises(ValueError, match="timeout must be positive"):
        DDPStrategy(timeout=0)
    with pytest.raises(TypeError, match=r"timeout must be a datetime.timedelta or a number of seconds"):
        DDPStrategy(timeout="1h")  # type: ignore[arg-type]
    assert DDPStrategy(timeout=90).timeout == datetime.timedelta(seconds=90)
    assert DDPStrategy(static_graph=True).ddp_kwargs == {"static_graph": True}


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    return torch.randn(16, 5, generator=generator), torch.randn(16, 1, generator=generator)


def _train_single_process(steps: int) -> torch.Tensor:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = _data()
    for _ in range(steps):
        ((model(x) - y) ** 2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def _train_rank(rank: int, world_size: int, steps: int) -> dict[str, Any]:
    strategy = dt.connect(accelerator="cpu", strategy="ddp", devices=world_size)
    strategy.setup_environment()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 1))
    strategy.module_to_device(model)
    model = strategy.setup_module(model)
    optimizer = strategy.setup_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    x, y = _data()
    shard = slice(rank * 8, (rank + 1) * 8)  # each rank sees half of the combined batch
    for _ in range(steps):
        strategy.backward(((model(x[shard]) - y[shard]) ** 2).mean(), model)
        strategy.optimizer_step(optimizer)
        optimizer.zero_grad()
    return {
        "params": torch.cat([p.detach().flatten() for p in model.parameters()]),
        "wrapped": type(model).__name__,
        "ranks": (strategy.global_rank, strategy.local_rank, strategy.world_size, strategy.is_global_zero),
        "sampler": strategy.distributed_sampler_kwargs,
    }


def test_two_process_ddp_equals_single_process_on_the_combined_batch() -> None:
    results = run_processes(_train_rank, 2, args=(4,))
    expected = _train_single_process(4)
    for rank, result in enumerate(results):
        assert result["wrapped"] == "DistributedDataParallel"
        assert result["ranks"] == (rank, rank, 2, rank == 0)
        assert result["sampler"] == {"num_replicas": 2, "rank": rank}
        torch.testing.assert_close(result["params"], expected, rtol=1e-5, atol=1e-6)
    assert torch.equal(results[0]["params"], results[1]["params"])


def _collectives(rank: int, world_size: int) -> dict[str, Any]:
    strategy = dt.connect(accelerator="cpu", strategy="ddp", devices=world_size)
    strategy.setup_environment()
    value = torch.tensor([float(rank + 1)])
    out: dict[str, Any] = {
        "sum": strategy.all_reduce(value, reduce_op="sum").item(),
        "mean": strategy.all_reduce(value, reduce_op="mean").item(),
        "max": strategy.all_reduce(value, reduce_op="max").item(),
        "min": strategy.all_reduce(value, reduce_op="min").item(),
        "input_untouched": value.item(),
        "gather": strategy.all_gather(torch.tensor([rank, 10 * rank])).tolist(),
        "objects": strategy.all_gather_object({"rank": rank}),
        "broadcast_object": strategy.broadcast({"from": rank}, src=1),
        "broadcast_tensor": strategy.broadcast(torch.full((2,), float(rank)), src=0).tolist(),
        "all_agree_false": strategy.reduce_boolean_decision(rank == 0, all=True),
        "any_true": strategy.reduce_boolean_decision(rank == 0, all=False),
        "all_true": strategy.reduce_boolean_decision(True, all=True),
    }
    # all_gather with gradients flowing back to every rank's input
    leaf = torch.tensor([float(rank + 1)], requires_grad=True)
    gathered = strategy.all_gather(leaf * 2, sync_grads=True)
    gathered.sum().backward()
    out["grad"] = leaf.grad.item()
    strategy.barrier("end")
    return out


def test_collectives_across_two_processes() -> None:
    results = run_processes(_collectives, 2)
    for rank, out in enumerate(results):
        assert (out["sum"], out["mean"], out["max"], out["min"]) == (3.0, 1.5, 2.0, 1.0)
        assert out["input_untouched"] == rank + 1
        assert out["gather"] == [[0, 0], [1, 10]]
        assert out["objects"] == [{"rank": 0}, {"rank": 1}]
        assert out["broadcast_object"] == {"from": 1}
        assert out["broadcast_tensor"] == [0.0, 0.0]
        assert (out["all_agree_false"], out["any_true"], out["all_true"]) == (False, True, True)
        # d(sum over ranks of 2*x_r)/dx_r, summed over the 2 ranks' backward passes = 2 * 2
        assert out["grad"] == pytest.approx(4.0)


def _mismatched_gather(rank: int, world_size: int) -> None:
    strategy = dt.connect(accelerator="cpu", strategy="ddp", devices=world_size)
    strategy.setup_environment()
    strategy.all_gather(torch.zeros(3 + rank, 2))


def test_gather_of_different_shapes_is_an_error_naming_ranks_not_a_hang() -> None:
    with pytest.raises(RankFailed, match=r"rank 0: shape \(3, 2\), torch.float32; rank 1: shape \(4, 2\)"):
        run_processes(_mismatched_gather, 2, timeout=30)


def _no_sync(rank: int, world_size: int) -> dict[str, Any]:
    strategy = dt.connect(accelerator="cpu", strategy="ddp", devices=world_size)
    strategy.setup_environment()
    torch.manual_seed(0)
    model = strategy.setup_module(nn.Linear(2, 1, bias=False))
    x = torch.full((1, 2), float(rank + 1))
    with strategy.no_backward_sync(model):
        model(x).sum().backward()
    local = model.module.weight.grad.clone()
    model.module.weight.grad = None
    model(x).sum().backward()
    return {"local": local, "synced": model.module.weight.grad.clone()}


def test_no_backward_sync_skips_the_gradient_all_reduce() -> None:
    results = run_processes(_no_sync, 2)
    assert results[0]["local"].tolist() == [[1.0, 1.0]]
    assert results[1]["local"].tolist() == [[2.0, 2.0]]
    for result in results:
        assert result["synced"].tolist() == [[1.5, 1.5]]


class MyCustomDistributedDataParallel(DistributedDataParallel):
    pass


class CustomDDPStrategy(DDPStrategy):
    """The seed's example, with our names."""

    def configure_ddp(self) -> None:
        self.model = MyCustomDistributedDataParallel(self.model, device_ids=None)

    def setup(self, trainer: Any = None) -> None:
        # you can access the accelerator and plugins directly
        self.accelerator.setup()
        self.precision_plugin.connect(self.model, [], [])


def _custom_ddp(rank: int, world_size: int) -> str:
    strategy = dt.connect(accelerator="cpu", strategy=CustomDDPStrategy(), devices=world_size)
    strategy.setup_environment()
    strategy.setup()
    model = strategy.setup_module(nn.Linear(2, 2))
    model(torch.ones(1, 2)).sum().backward()
    return type(model).__name__


def test_seed_custom_ddp_strategy_overrides_configure_ddp() -> None:
    assert run_processes(_custom_ddp, 2) == ["MyCustomDistributedDataParallel"] * 2


def _static_graph(rank: int, world_size: int) -> bool:
    strategy = dt.connect(accelerator="cpu", strategy=DDPStrategy(static_graph=True), devices=world_size)
    strategy.setup_environment()
    model = strategy.setup_module(nn.Linear(2, 2))
    return bool(model.static_graph)


def test_ddp_kwargs_reach_distributed_data_parallel() -> None:
    assert run_processes(_static_graph, 2) == [True, True]


class RecordingCheckpointIO(CheckpointIO):
    """The seed's custom CheckpointIO: remembers which rank saved what (seed signature, no options)."""

    def __init__(self) -> None:
        self.saved: list[tuple[int, str]] = []

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | Path) -> None:  # type: ignore[override]
        self.saved.append((checkpoint["rank"], str(path)))

    def load_checkpoint(self, path: str | Path) -> dict[str, Any]:  # type: ignore[override]
        return {"path": str(path)}

    def remove_checkpoint(self, path: str | Path) -> None:
        pass


def _registered_checkpoint_io(rank: int, world_size: int) -> dict[str, Any]:
    StrategyRegistry.register(
        "ddp_custom_checkpoint_io",
        DDPStrategy,
        description="DDP Strategy with custom checkpoint io plugin",
        checkpoint_io=RecordingCheckpointIO(),
    )
    strategy = dt.connect(strategy="ddp_custom_checkpoint_io", accelerator="cpu", devices=world_size)
    strategy.setup_environment()
    strategy.save_checkpoint({"rank": rank}, "/ckpt/epoch=0.ckpt")
    io = strategy.checkpoint_io
    assert isinstance(io, RecordingCheckpointIO)
    return {"saved": io.saved, "loaded": strategy.load_checkpoint("/ckpt/epoch=0.ckpt")}


def test_seed_registered_strategy_with_a_custom_checkpoint_io_saves_on_rank_zero_only() -> None:
    results = run_processes(_registered_checkpoint_io, 2)
    assert results[0]["saved"] == [(0, "/ckpt/epoch=0.ckpt")]
    assert results[1]["saved"] == []
    assert results[1]["loaded"] == {"path": "/ckpt/epoch=0.ckpt"}
