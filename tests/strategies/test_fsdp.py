"""FSDPStrategy (FSDP2) in real 2-process gloo jobs: equivalence with data parallel, memory, set-up.

Tolerance: FSDP's reduce-scatter sums the same numbers as DDP's all-reduce in a different
order, so float32 results agree with the single-process reference to ~1e-7; we assert 1e-5.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

import drivetrain as dt
from drivetrain.accelerators import CPUAccelerator, MPSAccelerator, XLAAccelerator
from drivetrain.strategies import FSDPStrategy, StrategyRegistry
from helpers.multiprocess import run_processes
from helpers.sharded import LR, Net, batches, loss_of, numel, optimizer_state_numel, reference_run, shard

TOLERANCE = 1e-5


# -- pure: arguments, presets, connect() checks -----------------------------------------------
def test_bad_arguments_are_named() -> None:
    with pytest.raises(ValueError, match=r"state_dict_type='local' is not supported; use 'sharded'"):
        FSDPStrategy(state_dict_type="local")
    with pytest.raises(ValueError, match=r"reshard_after_forward=1: .* at least 2"):
        FSDPStrategy(reshard_after_forward=1)
    with pytest.raises(TypeError, match=r"reshard_after_forward= expects a bool or an int"):
        FSDPStrategy(reshard_after_forward="yes")  # type: ignore[arg-type]
    with pytest.raises(
        TypeError, match=r"auto_wrap_policy= got \{'Linear'\}; a collection must hold nn.Module"
    ):
        FSDPStrategy(auto_wrap_policy={"Linear"})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"activation_checkpointing_policy= does not take a number"):
        FSDPStrategy(activation_checkpointing_policy=100)  # type: ignore[arg-type]
    with pytest.raises(
        TypeError, match=r"mixed_precision= expects a torch.distributed.fsdp.MixedPrecisionPolicy"
    ):
        FSDPStrategy(mixed_precision="bf16")
    with pytest.raises(ValueError, match=r"start_method='thread' is not supported"):
        FSDPStrategy(start_method="thread")


def test_presets_resolve_through_connect() -> None:
    assert {"fsdp", "fsdp_cpu_offload"} <= set(StrategyRegistry.available_strategies())
    strategy = dt.connect(accelerator="cpu", strategy="fsdp", devices=2, precision="bf16-mixed")
    assert isinstance(strategy, FSDPStrategy) and strategy.requires_joint_setup
    assert strategy.state_dict_type == "sharded" and not strategy.cpu_offload
    from drivetrain.plugins.precision.fsdp import fsdp_mixed_precision_policy

    policy = fsdp_mixed_precision_policy(strategy.precision)
    assert policy.param_dtype is torch.bfloat16 and policy.reduce_dtype is torch.float32
    with pytest.warns(UserWarning, match=r"cpu_offload=True\) on the CPU accelerator changes nothing"):
        offload = dt.connect(accelerator="cpu", strategy="fsdp_cpu_offload", devices=2)
    assert offload.cpu_offload


def test_fp16_gets_a_scaler_that_agrees_across_ranks() -> None:
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

    strategy = dt.connect(accelerator="cpu", strategy="fsdp", devices=2, precision="16-mixed")
    assert isinstance(strategy.precision.scaler, ShardedGradScaler)


@pytest.mark.parametrize("accelerator", [MPSAccelerator, XLAAccelerator])
def test_accelerators_fsdp_cannot_run_on_are_refused(accelerator: type) -> None:
    with pytest.raises(ValueError, match=rf"FSDPStrategy cannot run on {accelerator.__name__}"):
        FSDPStrategy().check_accelerator(accelerator())
    FSDPStrategy().check_accelerator(CPUAccelerator())  # no error


# -- 2 ranks: training equals the single-process reference; memory is split --------------------
def _setup(rank: int, world_size: int, **strategy_kwargs: Any) -> tuple[FSDPStrategy, nn.Module, Any]:
    precision = strategy_kwargs.pop("precision", None)
    strategy = dt.connect(
        accelerator="cpu", strategy=FSDPStrategy(**strategy_kwargs), devices=world_size, precision=precision
    )
    strategy.setup_environment()
    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    model, [optimizer] = strategy.setup_module_and_optimizers(model, [optimizer])
    return strategy, model, optimizer


def _train(strategy: FSDPStrategy, model: nn.Module, optimizer: Any, rank: int, steps: int) -> list[float]:
    losses = []
    precision = strategy.precision
    for batch in batches(steps):
        x, y = shard(batch, rank)
        with precision.forward_context():
            output = precision.convert_output(model(precision.convert_input(x)))
        loss = loss_of(output, y)
        strategy.backward(loss, model)
        strategy.optimizer_step(optimizer, model=model)
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def _training_rank(rank: int, world_size: int) -> dict[str, Any]:
    results: dict[str, Any] = {}
    strategy, model, optimizer = _setup(rank, world_size, auto_wrap_policy={nn.Linear})
    results["losses"] = _train(strategy, model, optimizer, rank, 3)
    results["state"] = strategy.get_module_state_dict(model)
    results["param_local"] = numel(model.parameters())
    results["param_total"] = sum(p.numel() for p in model.parameters())
    results["optimizer_local"] = optimizer_state_numel(optimizer)
    results["head_local_rows"] = model.head.weight.to_local().shape[0]

    # Gradient accumulation with the sync off, then one step: the same as one full step.
    strategy, model, optimizer = _setup(rank, world_size)
    x, y = shard(batches(1)[0], rank)
    with strategy.no_backward_sync(model):
        strategy.backward(loss_of(model(x[:2]), y[:2]) / 2, model)
    strategy.backward(loss_of(model(x[2:]), y[2:]) / 2, model)
    strategy.optimizer_step(optimizer, model=model)
    results["accumulated_state"] = strategy.get_module_state_dict(model)

    # Gradient clipping by the global norm of all ranks' shards.
    strategy, model, optimizer = _setup(rank, world_size, auto_wrap_policy=300)
    strategy.backward(loss_of(model(x), y), model)
    results["norm"] = strategy.clip_gradients_norm(model, optimizer, max_norm=0.01).item()
    grads = [p.grad for p in model.parameters()]
    results["clipped_norm"] = torch.nn.utils.get_total_norm(grads).full_tensor().item()

    # Activation checkpointing and (meaningless on CPU, but the same code path) CPU offload.
    with pytest.warns(UserWarning, match=r"changes nothing"):
        strategy, model, optimizer = _setup(
            rank, world_size, activation_checkpointing_policy={nn.Sequential}, cpu_offload=True
        )
    results["checkpointed_losses"] = _train(strategy, model, optimizer, rank, 2)

    # bf16 mixed precision: the gathered weights compute in bfloat16, the shards stay float32.
    strategy, model, optimizer = _setup(
        rank, world_size, auto_wrap_policy={nn.Linear}, precision="bf16-mixed"
    )
    seen: list[torch.dtype] = []
    model.head.register_forward_pre_hook(lambda module, args: seen.append(module.weight.dtype))
    results["bf16_losses"] = _train(strategy, model, optimizer, rank, 2)
    results["bf16_dtypes"] = (seen[0], next(model.parameters()).dtype)
    return results


@pytest.mark.multiprocess
def test_two_ranks_train_like_one_process_with_half_the_memory() -> None:
    reference = reference_run(3)
    results = run_processes(_training_rank, 2, timeout=90)
    for rank, result in enumerate(results):
        assert result["losses"] == pytest.approx([step[rank] for step in reference["losses"]], abs=TOLERANCE)
        assert result["checkpointed_losses"] == pytest.approx(
            [step[rank] for step in reference["losses"][:2]], abs=TOLERANCE
        )
        assert result["bf16_losses"] == pytest.approx(
            [step[rank] for step in reference["losses"][:2]], abs=3e-2
        )
        assert result["bf16_dtypes"] == (torch.bfloat16, torch.float32)
    state = results[0]["state"]
    assert results[1]["state"] == {}  # the full state dict is gathered on rank 0 only
    for name, expected in reference["state"].items():
        torch.testing.assert_close(state[name], expected, atol=TOLERANCE, rtol=0)

    # Memory: each rank holds about half of the parameters and of Adam's two state tensors.
    total = results[0]["param_total"]
    assert results[0]["param_local"] + results[1]["param_local"] == total
    for result in results:
        assert result["param_local"] <= 0.55 * total
        assert result["optimizer_local"] == 2 * result["param_local"]
    # Linear(64, 1): one row for two ranks. Rank 1's shard is empty, and it still trains and reloads.
    assert [r["head_local_rows"] for r in results] == [1, 0]

    one_step = reference_run(1)["state"]
    for name, expected in one_step.items():
        torch.testing.assert_close(results[0]["accumulated_state"][name], expected, atol=TOLERANCE, rtol=0)

    torch.manual_seed(0)
    single = Net()
    x, y = batches(1)[0]
    loss_of(single(x), y).backward()
    expected_norm = torch.nn.utils.clip_grad_norm_(single.parameters(), 0.01).item()
    for result in results:
        assert result["norm"] == pytest.approx(expected_norm, rel=1e-5)
        assert result["clipped_norm"] == pytest.approx(0.01, rel=1e-4)


# -- set-up errors ---------------------------------------------------------------------------------
class _NoReset(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale


def _setup_errors_rank(rank: int, world_size: int) -> dict[str, str]:
    strategy = dt.connect(accelerator="cpu", strategy="fsdp", devices=world_size)
    strategy.setup_environment()
    errors = {}
    with strategy.module_init_context(empty_init=True):
        model = _NoReset()
    try:
        strategy.setup_module_and_optimizers(model, [])
    except TypeError as error:
        errors["no_reset"] = str(error)
    other = nn.Linear(2, 2)
    try:
        strategy.setup_module_and_optimizers(Net(), [torch.optim.SGD(other.parameters(), lr=0.1)])
    except ValueError as error:
        errors["foreign"] = str(error)
    try:
        strategy.no_backward_sync(nn.Linear(2, 2)).__enter__()
    except TypeError as error:
        errors["no_sync"] = str(error)
    return errors


@pytest.mark.multiprocess
def test_setup_errors_say_what_to_do() -> None:
    errors = run_processes(_setup_errors_rank, 2, timeout=60)[0]
    assert "_NoReset own parameters or buffers and define no reset_parameters()" in errors["no_reset"]
    assert "holds 2 parameter(s) that do not belong to the module being set up" in errors["foreign"]
    assert "no_backward_sync needs the module returned by FSDPStrategy.setup_module" in errors["no_sync"]
