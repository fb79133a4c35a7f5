"""The step policy both front doors follow: accumulation windows, clipping, skipped steps.

One implementation, called by ``drivetrain.Trainer`` and ``drivetrain.Accelerator`` alike:

* :class:`GradientAccumulation` counts batches, divides the loss, says when an accumulation
  window ends (every ``num_steps`` batches and at the end of the data) and hands out the
  strategy's no-sync context while gradients are being accumulated.
* :func:`clip_gradients` clips through the strategy with the non-finite policy the precision
  sets: a precision whose loss scaler skips steps with inf/NaN gradients (``"16-mixed"``) lets
  the scaler skip the step; any other precision raises, because stepping would write inf/NaN
  into the weights (:func:`nonfinite_norm_is_error`).
* Skipped steps are detected by :attr:`Precision.last_step_skipped
  <drivetrain.plugins.precision.Precision.last_step_skipped>`, which reads the device only when
  asked; a front door asks only when something depends on it (a scheduler stepping per step).
* :class:`StepFunctions` is what :meth:`Strategy.step_functions
  <drivetrain.strategies.Strategy.step_functions>` returns: the backward and optimizer-step
  callables of the per-step path, the plain torch calls when the strategy and its precision
  add nothing (the one fast path, chosen by the strategy).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager, ExitStack, nullcontext
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
from torch import Tensor, nn
from torch.optim import Optimizer

if TYPE_CHECKING:
    from drivetrain.plugins.precision.precision import Precision
    from drivetrain.strategies.strategy import Strategy

_SYNCING = nullcontext()
CLIP_ALGORITHMS = ("norm", "value")


class GradientAccumulation:
    """When gradients are synchronised and the optimizer steps, for one training loop.

    Call :meth:`advance` once per batch, before its forward pass. It counts the batch and sets
    :attr:`sync_gradients`: True when the batch completes ``num_steps`` batches, or when it is
    the last batch of the data (with ``sync_with_dataloader``), which also restarts the count.
    Divide the loss with :meth:`scale_loss` and run the backward pass inside
    :meth:`backward_context`, which skips the gradient all-reduce while accumulating.

    Args:
        num_steps: batches per optimizer step.
        sync_with_dataloader: also end the window at the data's last batch (a shorter window).
        sync_each_batch: all-reduce gradients at every batch even while accumulating (less
            memory, more communication); the optimizer still steps every ``num_steps`` batches.
    """

    __slots__ = ("num_steps", "step", "sync_each_batch", "sync_gradients", "sync_with_dataloader")

    def __init__(
        self, num_steps: int = 1, *, sync_with_dataloader: bool = True, sync_each_batch: bool = False
    ) -> None:
        self.num_steps = check_accumulation_steps(num_steps)
        self.sync_with_dataloader = sync_with_dataloader
        self.sync_each_batch = sync_each_batch
        #: False while accumulating: the optimizer does not step and DDP skips the all-reduce.
        self.sync_gradients = True
        #: Batches counted since the data last ended (or since :meth:`reset`).
        self.step = 0

    def advance(self, end_of_dataloader: bool = False) -> bool:
        """Count one batch; returns (and stores in :attr:`sync_gradients`) whether it ends a window."""
        if end_of_dataloader and self.sync_with_dataloader:
            self.step = 0
            self.sync_gradients = True
            return True
        step = self.step + 1
        self.step = step
        sync = step % self.num_steps == 0
        self.sync_gradients = sync
        return sync

    @property
    def mid_window(self) -> bool:
        """Whether the batches counted since the last step have gradients the next step still needs.

        A checkpoint taken now keeps those gradients (see :mod:`drivetrain.strategies.checkpointing`).
        """
        return self.step % self.num_steps != 0

    def reset(self, batches_done: int = 0) -> None:
        """Start counting at an epoch that has already run ``batches_done`` batches (a resumed one)."""
        self.step = batches_done
        self.sync_gradients = True

    def scale_loss(self, loss: Tensor) -> Tensor:
        """The loss divided by :attr:`num_steps`, so accumulated gradients average the window's batches."""
        steps = self.num_steps
        return loss / steps if steps != 1 else loss

    def backward_context(
        self, strategy: Strategy, modules: Sequence[nn.Module]
    ) -> AbstractContextManager[Any]:
        """The context for this batch's backward: the strategy's no-sync for ``modules`` while accumulating."""
        if self.sync_gradients or self.sync_each_batch:
            return _SYNCING
        if len(modules) == 1:
            return strategy.no_backward_sync(modules[0])
        stack = ExitStack()
        for module in modules:
            stack.enter_context(strategy.no_backward_sync(module))
        return stack

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(num_steps={self.num_steps}, step={self.step}, "
            f"sync_gradients={self.sync_gradients})"
        )


def check_accumulation_steps(steps: Any, name: str = "gradient_accumulation_steps") -> int:
    """``steps`` if it is an int >= 1, else a ``ValueError`` that says so."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(
            f"{name} must be an int >= 1, got {steps!r}: it counts the batches per optimizer step."
        )
    return steps


# -- clipping -------------------------------------------------------------------------------------
def nonfinite_norm_is_error(precision: Precision) -> bool:
    """Whether a non-finite gradient norm must raise: unless the precision's optimizer step skips such steps."""
    return not precision.skips_nonfinite_steps


def clip_grad_norm(
    parameters: Iterable[Tensor],
    max_norm: float,
    norm_type: float = 2.0,
    *,
    error_if_nonfinite: bool,
    precision_name: str = "",
) -> Tensor:
    """Scale the gradients of ``parameters`` to a total ``norm_type``-norm of at most ``max_norm``.

    Returns the total norm before clipping. Sharded (DTensor) gradients are measured across all
    ranks. With ``error_if_nonfinite`` an inf/NaN norm raises before any gradient is touched.

    Raises:
        RuntimeError: the norm is inf/NaN and ``error_if_nonfinite`` (no loss scaler to skip the step).
    """
    parameters = [p for p in parameters if p.grad is not None]
    grads = [p.grad for p in parameters]
    total = torch.nn.utils.get_total_norm(grads, norm_type, error_if_nonfinite=False)  # type: ignore[arg-type]
    full_tensor = getattr(total, "full_tensor", None)
    if full_tensor is not None:  # a DTensor: the shards' partial norms, reduced across ranks
        total = full_tensor()
    if error_if_nonfinite and not bool(torch.isfinite(total)):
        precision = f"precision {precision_name!r}" if precision_name else "this precision"
        raise RuntimeError(
            f"The gradients' total {norm_type:g}-norm is {float(total)}, so clipping cannot make this step safe: "
            f"the optimizer would write inf/NaN into the weights, and {precision} has no loss scaler that "
            f"skips such steps. Find where the loss or the gradients overflow (learning rate, inputs, a log or "
            f"division of zero), or train with precision='16-mixed', whose loss scaler skips such steps."
        )
    torch.nn.utils.clip_grads_with_norm_(parameters, max_norm, total)
    return total


def unscale_and_clip(
    precision: Precision,
    optimizers: Iterable[Optimizer],
    parameters: Iterable[Tensor],
    value: float,
    algorithm: str = "norm",
    norm_type: float = 2.0,
    error_if_nonfinite: bool | None = None,
) -> Tensor | None:
    """The one unscale-then-clip: divide ``optimizers``' gradients by the loss scale, then clip ``parameters``'.

    ``error_if_nonfinite=None`` follows the precision (an inf/NaN norm raises unless its loss scaler
    skips such steps). Returns the total norm before clipping for ``"norm"``, ``None`` for ``"value"``.
    Strategies clip an optimizer's parameters through it; ``Accelerator.clip_grad_norm_`` any others.
    """
    for optimizer in optimizers:
        precision.unscale_gradients(optimizer)
    if algorithm == "value":
        torch.nn.utils.clip_grad_value_([p for p in parameters if p.grad is not None], value)
        return None
    if error_if_nonfinite is None:
        error_if_nonfinite = nonfinite_norm_is_error(precision)
    return clip_grad_norm(
        parameters, value, norm_type, error_if_nonfinite=error_if_nonfinite, precision_name=precision.name
    )


def clip_gradients(
    strategy: Strategy,
    module: nn.Module,
    optimizer: Optimizer,
    value: float,
    algorithm: str = "norm",
    norm_type: float = 2.0,
) -> Tensor | None:
    """Clip ``optimizer``'s gradients through ``strategy``, unscaled first, with the precision's non-finite policy.

    Returns the total norm before clipping for ``algorithm="norm"``, ``None`` for ``"value"``.

    Raises:
        TypeError, ValueError: an unknown ``algorithm``, or a ``value`` that is not a number >= 0.
        RuntimeError: a non-finite norm where the precision does not skip such steps.
    """
    check_clip_value(value)
    if algorithm == "norm":
        return strategy.clip_gradients_norm(
            module,
            optimizer,
            value,
            norm_type,
            error_if_nonfinite=nonfinite_norm_is_error(strategy.precision),
        )
    if algorithm == "value":
        strategy.clip_gradients_value(module, optimizer, value)
        return None
    raise ValueError(
        f"gradient_clip_algorithm={algorithm!r} is not supported; use one of {', '.join(map(repr, CLIP_ALGORITHMS))}."
    )


def check_clip_value(value: Any, name: str = "gradient_clip_val") -> float:
    """``value`` as a float if it is a number >= 0, else a ``TypeError``/``ValueError`` that says so."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} expects a number >= 0 (the clipping threshold), got {value!r}.")
    if math.isnan(value) or value < 0:
        raise ValueError(
            f"{name}={value} is not a clipping threshold; use a number >= 0 (a negative one would flip the "
            f"gradients' sign)."
        )
    return float(value)


# -- the per-step calls ----------------------------------------------------------------------------
class StepFunctions(NamedTuple):
    """The backward and optimizer-step callables a front door calls on every step.

    ``backward(loss, module, *args, **kwargs)`` and ``optimizer_step(optimizer, closure=None,
    model=None, **kwargs)``, with the signatures of :meth:`Strategy.backward` and
    :meth:`Strategy.optimizer_step`.
    """

    backward: Callable[..., None]
    optimizer_step: Callable[..., Any]


def plain_backward(tensor: Tensor, module: nn.Module | None = None, *args: Any, **kwargs: Any) -> None:
    """``tensor.backward()``: the core's backward when neither the strategy nor the precision changes it."""
    try:  # free unless it raises (Python 3.11+): the explanation costs nothing per step
        tensor.backward(*args, **kwargs)
    except RuntimeError as error:
        explained = explain_backward_failure(error, tensor)
        if explained is None:
            raise
        raise explained from None  # torch's own traceback is the autograd engine's


def explain_backward_failure(error: RuntimeError, loss: Any) -> Exception | None:
    """An error that says what was wrong with a backward pass torch refused, and the fix (``None``: unknown).

    Read only once the backward has failed.
    """
    text = str(error)
    if "grad can be implicitly created only for scalar outputs" in text and isinstance(loss, Tensor):
        return ValueError(
            f"backward needs the loss as one number, but it has shape {tuple(loss.shape)} ({loss.numel()} values). "
            f"Reduce it first: loss.mean() or loss.sum() (torch's loss functions reduce unless given "
            f"reduction='none', which keeps one value per item)."
        )
    if "backward through the graph a second time" in text:
        return RuntimeError(
            "backward ran a second time through a graph the first backward already freed (the same loss, or one "
            "computed from the same forward pass). Call backward once per forward pass: add the losses and call it "
            "once (loss = loss_a + loss_b), or pass retain_graph=True to the first backward if both are needed."
        )
    return None


def plain_optimizer_step(
    optimizer: Optimizer,
    closure: Callable[[], Any] | None = None,
    model: nn.Module | None = None,
    **kwargs: Any,
) -> Any:
    """``optimizer.step()``: the core's step when neither the strategy nor the precision changes it."""
    if closure is None:
        # torch's Optimizer.step wrapper is measurably slower with keyword arguments, even empty ones.
        return optimizer.step(**kwargs) if kwargs else optimizer.step()
    return optimizer.step(closure, **kwargs)


PLAIN_STEP_FUNCTIONS = StepFunctions(plain_backward, plain_optimizer_step)
