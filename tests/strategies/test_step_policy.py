"""The core step policy and both front doors following it, in one process.

The policy (``drivetrain.strategies.step_policy``): accumulation windows that close every N
batches and at the data's end, clipping whose inf/NaN behaviour the precision sets (a loss
scaler skips the step; otherwise an error, before the weights change), skipped steps that do not
advance per-step schedules, and the backward/step calls the strategy picks.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Any

import pytest
import torch
from torch import nn

import drivetrain as dt
from drivetrain.plugins import MixedPrecision, Precision
from drivetrain.strategies import SingleDeviceStrategy, Strategy
from drivetrain.strategies.step_policy import (
    GradientAccumulation,
    StepFunctions,
    clip_grad_norm,
    plain_backward,
    plain_optimizer_step,
)
from helpers.step_loops import Loop, net, run_accelerator, run_by_hand, run_trainer, weights
from trainer.trainer_models import Regression, loader, quiet_trainer


def _assert_same(first: dict[str, torch.Tensor], second: dict[str, torch.Tensor]) -> None:
    assert first.keys() == second.keys()
    for name in first:
        assert torch.equal(first[name], second[name]), name


# -- the policy itself -------------------------------------------------------------------------------
class NoSyncRecorder(SingleDeviceStrategy):
    def __init__(self) -> None:
        super().__init__(device=torch.device("cpu"))
        self.no_sync_for: list[nn.Module] = []

    def no_backward_sync(self, module: nn.Module, enabled: bool = True) -> AbstractContextManager[Any]:
        self.no_sync_for.append(module)
        return nullcontext()


def test_windows_close_every_n_batches_and_at_the_data_end() -> None:
    policy = GradientAccumulation(3)
    ends = [False] * 4 + [True] + [False] * 3  # an epoch of 5 batches, then 3 of the next
    assert [policy.advance(end) for end in ends] == [False, False, True, False, True, False, False, True]
    policy.reset(batches_done=2)  # a resumed epoch: 2 batches of the window already ran
    assert policy.advance() is True
    late = GradientAccumulation(2, sync_with_dataloader=False)
    assert [late.advance(end) for end in (False, False, True, False)] == [False, True, False, True]


def test_the_loss_is_divided_and_no_sync_asked_for_only_inside_a_window() -> None:
    policy = GradientAccumulation(2)
    strategy = NoSyncRecorder()
    first, second = nn.Linear(1, 1), nn.Linear(1, 1)
    assert float(policy.scale_loss(torch.tensor(3.0))) == 1.5
    policy.advance()
    with policy.backward_context(strategy, (first, second)):
        pass
    policy.advance()
    with policy.backward_context(strategy, (first,)):
        pass
    assert strategy.no_sync_for == [first, second]
    every_batch = GradientAccumulation(2, sync_each_batch=True)
    every_batch.advance()
    assert every_batch.backward_context(strategy, (first,)) is every_batch.backward_context(
        strategy, (second,)
    )
    assert strategy.no_sync_for == [first, second]
    unchanged = torch.tensor(3.0)
    assert GradientAccumulation(1).scale_loss(unchanged) is unchanged


@pytest.mark.parametrize("steps", [0, -1, 1.5, True, "2"])
def test_bad_accumulation_steps_are_errors_in_both_doors(steps: Any) -> None:
    with pytest.raises(ValueError, match="gradient_accumulation_steps must be an int >= 1"):
        dt.Accelerator(cpu=True, gradient_accumulation_steps=steps)
    with pytest.raises((TypeError, ValueError), match="accumulate_grad_batches"):
        quiet_trainer(accumulate_grad_batches=steps)


def test_the_strategy_picks_plain_calls_only_where_it_adds_nothing() -> None:
    assert SingleDeviceStrategy(device=torch.device("cpu")).step_functions() == StepFunctions(
        plain_backward, plain_optimizer_step
    )
    scaled = SingleDeviceStrategy(
        device=torch.device("cpu"), precision=MixedPrecision("16-mixed", device="cpu")
    )
    functions = scaled.step_functions()
    assert functions.backward == scaled.backward and functions.optimizer_step == scaled.optimizer_step

    class OwnBackward(SingleDeviceStrategy):
        def backward(
            self, tensor: torch.Tensor, module: nn.Module | None = None, *args: Any, **kwargs: Any
        ) -> None:
            super().backward(tensor, module, *args, **kwargs)

    own = OwnBackward(device=torch.device("cpu")).step_functions()
    assert own.backward != plain_backward and own.optimizer_step is plain_optimizer_step


class Counting(SingleDeviceStrategy):
    """Overrides the per-step calls: both doors must go through them."""

    def __init__(self) -> None:
        super().__init__(device=torch.device("cpu"))
        self.calls: list[str] = []

    def backward(
        self, tensor: torch.Tensor, module: nn.Module | None = None, *args: Any, **kwargs: Any
    ) -> None:
        self.calls.append("backward")
        super().backward(tensor, module, *args, **kwargs)

    def optimizer_step(self, optimizer: Any, closure: Any = None, model: Any = None, **kwargs: Any) -> Any:
        self.calls.append("optimizer_step")
        return super().optimizer_step(optimizer, closure, model, **kwargs)


def test_both_doors_call_a_strategy_that_changes_backward_and_step() -> None:
    trainer_strategy = Counting()
    quiet_trainer(strategy=trainer_strategy, max_steps=3).fit(Regression(), loader())
    assert trainer_strategy.calls == ["backward", "optimizer_step"] * 3
    accelerator = dt.Accelerator(strategy=Counting())
    model = nn.Linear(2, 1)
    model, optimizer = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    for _ in range(3):
        accelerator.backward(model(torch.ones(1, 2)).sum())
        optimizer.step()
    assert accelerator.strategy.calls == ["backward", "optimizer_step"] * 3  # type: ignore[attr-defined]


# -- clipping and non-finite gradients ------------------------------------------------------------------
def test_fp16_overflow_with_clipping_skips_the_step_in_both_doors() -> None:
    """The scaler skips the overflowing steps; clipping must not raise (the Trainer did), and a skipped
    step does not advance a per-step schedule. Both doors end with the hand-written loop's weights."""
    loop = Loop(precision="16-mixed", clip=1.0, blown_batches=(0, 4))
    expected = run_by_hand(loop)
    assert expected.steps_taken <= 2 * 7 - 2  # at least the blown-up steps were skipped
    for outcome in (run_trainer(loop), run_accelerator(loop)):
        _assert_same(outcome.weights, expected.weights)
        assert (outcome.lr, outcome.steps_taken) == (expected.lr, expected.steps_taken)


def test_fp16_overflow_inside_accumulation_windows_skips_them_in_both_doors() -> None:
    loop = Loop(precision="16-mixed", clip=0.5, accumulate=2, blown_batches=(1, 6))
    expected = run_by_hand(loop)
    assert expected.steps_taken <= 2 * 4 - 2  # windows of 2, 2, 2 and 1 batches per epoch, two blown up
    for outcome in (run_trainer(loop), run_accelerator(loop)):
        _assert_same(outcome.weights, expected.weights)
        assert (outcome.lr, outcome.steps_taken) == (expected.lr, expected.steps_taken)


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
def test_a_nonfinite_norm_without_a_loss_scaler_is_the_same_error_in_both_doors(precision: str) -> None:
    loop = Loop(precision=precision, clip=1.0, blown_batches=(2,), blow_up=float("inf"))
    message = rf"total 2-norm is (inf|nan).*precision '{precision}' has no loss scaler"
    with pytest.raises(RuntimeError, match=message):
        run_trainer(loop)
    with pytest.raises(RuntimeError, match=message):
        run_accelerator(loop)


def test_the_error_comes_before_any_gradient_or_weight_changes() -> None:
    accelerator = dt.Accelerator(cpu=True)
    model = net()
    model, _ = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    before = weights(model)
    accelerator.backward(model(torch.ones(2, 4)).sum() * float("inf"))
    grads = [p.grad.clone() for p in model.parameters()]
    first_layer = list(model[0].parameters())  # not one optimizer's parameters: clipped by the façade itself
    for parameters in (model.parameters(), first_layer):
        with pytest.raises(RuntimeError, match="has no loss scaler"):
            accelerator.clip_grad_norm_(parameters, 1.0)
    for grad, parameter in zip(grads, model.parameters()):
        torch.testing.assert_close(parameter.grad, grad, rtol=0, atol=0, equal_nan=True)
    _assert_same(weights(model), before)


def test_clipping_thresholds_are_checked_in_both_doors() -> None:
    accelerator = dt.Accelerator(cpu=True)
    model = nn.Linear(2, 1)
    model, _ = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    accelerator.backward(model(torch.ones(1, 2)).sum())
    with pytest.raises(ValueError, match=r"max_norm=-1.0 is not a clipping threshold"):
        accelerator.clip_grad_norm_(model.parameters(), -1.0)
    with pytest.raises(ValueError, match=r"max_norm=-1.0 is not a clipping threshold"):
        accelerator.clip_grad_norm_(model.weight, -1.0)
    with pytest.raises(TypeError, match="clip_value expects a number"):
        accelerator.clip_grad_value_(model.weight, "1")

    class ClipsBadly(Regression):
        def __init__(self) -> None:
            super().__init__()
            self.automatic_optimization = False

        def training_step(self, batch: Any, batch_idx: int) -> None:
            self.manual_backward(super().training_step(batch, batch_idx))
            self.clip_gradients(self.optimizers(), gradient_clip_val=-1.0)

    with pytest.raises(ValueError, match=r"gradient_clip_val=-1.0 is not a clipping threshold"):
        quiet_trainer(max_steps=1).fit(ClipsBadly(), loader())


def test_clip_grad_norm_returns_the_norm_before_clipping() -> None:
    parameter = nn.Parameter(torch.zeros(2))
    parameter.grad = torch.tensor([3.0, 4.0])
    norm = clip_grad_norm([parameter], 1.0, error_if_nonfinite=True)
    assert float(norm) == 5.0
    torch.testing.assert_close(parameter.grad, torch.tensor([0.6, 0.8]))


def test_the_precision_says_whether_it_skips_nonfinite_steps() -> None:
    assert MixedPrecision("16-mixed", device="cpu").skips_nonfinite_steps
    assert not MixedPrecision("bf16-mixed", device="cpu").skips_nonfinite_steps
    assert not Precision().skips_nonfinite_steps


# -- one loop, three ways -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "loop",
    [Loop(), Loop(accumulate=2, clip=0.5), Loop(accumulate=3, clip=0.2, precision="bf16-mixed")],
    ids=["plain", "accumulate-clip", "bf16-accumulate-clip"],
)
def test_both_doors_end_with_the_weights_of_the_hand_written_loop(loop: Loop) -> None:
    expected = run_by_hand(loop) if loop.precision == "32-true" else run_accelerator(loop)
    for outcome in (run_trainer(loop), run_accelerator(loop)):
        _assert_same(outcome.weights, expected.weights)
        assert outcome.lr == expected.lr
        assert len(outcome.grads) == len(expected.grads) == 2 * 7
        assert all(torch.equal(mine, theirs) for mine, theirs in zip(outcome.grads, expected.grads))


def test_an_lbfgs_closure_is_clipped_like_by_hand() -> None:
    """Clipping used to be skipped silently for optimizers that step with a closure."""

    class WithLBFGS(Regression):
        def configure_optimizers(self) -> Any:
            return torch.optim.LBFGS(self.parameters(), lr=0.5, max_iter=3)

    torch.manual_seed(0)
    model = WithLBFGS()
    reference = WithLBFGS()
    reference.load_state_dict(model.state_dict())
    optimizer = torch.optim.LBFGS(reference.parameters(), lr=0.5, max_iter=3)
    for x, y in loader(batch_size=32):

        def closure(x: torch.Tensor = x, y: torch.Tensor = y) -> torch.Tensor:
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(reference(x), y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(reference.parameters(), 0.01)
            return loss

        optimizer.step(closure)
    quiet_trainer(max_epochs=1, gradient_clip_val=0.01).fit(model, loader(batch_size=32))
    _assert_same(weights(model), weights(reference))


def test_base_strategy_methods_follow_the_precision_when_not_told() -> None:
    strategy: Strategy = SingleDeviceStrategy(
        device=torch.device("cpu"), precision=MixedPrecision("16-mixed", device="cpu")
    )
    model = nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    strategy.backward(model(torch.ones(1, 2)).sum() * float("inf"), model)
    assert not torch.isfinite(strategy.clip_gradients_norm(model, optimizer, 1.0))  # left to the scaler
    plain = SingleDeviceStrategy(device=torch.device("cpu"))
    with pytest.raises(RuntimeError, match="precision '32-true' has no loss scaler"):
        plain.clip_gradients_norm(model, optimizer, 1.0)
