"""One training step: forward, backward, gradient clipping, optimizer step, accumulation.

Everything that can be decided once (which hooks exist, whether the model is wrapped, whether
the precision changes ``forward``, the strategy's backward and step calls) is decided in
:meth:`Optimization.setup`; accumulation, clipping and skipped steps follow the core's step
policy, which the Accelerator front door follows too.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from torch import Tensor
from torch.optim import Optimizer

from drivetrain.strategies.step_policy import GradientAccumulation, clip_gradients
from drivetrain.trainer.optimizers import step_schedulers

if TYPE_CHECKING:
    from drivetrain.trainer.trainer import Trainer

_MISSING = object()


def redirected_call(wrapped: Any, module: Any, method: Callable[..., Any]) -> Callable[..., Any]:
    """Call ``method`` of ``module`` through ``wrapped(...)``, so the wrapper's forward logic runs (DDP, FSDP).

    ``module.forward`` is replaced for one call only, and put back as soon as the wrapper reaches
    it, so ``self(x)`` inside ``method`` runs the real ``forward``.
    """
    namespace = module.__dict__

    def call(*args: Any) -> Any:
        previous = namespace.get("forward", _MISSING)

        def restore() -> None:
            if previous is _MISSING:
                namespace.pop("forward", None)
            else:
                namespace["forward"] = previous

        def redirected(*inner: Any) -> Any:
            restore()
            return method(*inner)

        namespace["forward"] = redirected
        try:
            return wrapped(*args)
        finally:
            restore()

    return call


def with_precision(step: Callable[..., Any], precision: Any) -> Callable[..., Any]:
    """Run ``step`` in the precision's forward context, with its batch conversion."""
    if not precision.changes_forward:
        return step

    def call(batch: Any, *args: Any) -> Any:
        with precision.forward_context():
            output = step(precision.convert_input(batch), *args)
        return precision.convert_output(output)

    return call


def _needs_closure(optimizer: Any) -> bool:
    step = getattr(type(optimizer), "step", None)
    try:
        parameter = inspect.signature(step).parameters.get("closure")  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False
    return parameter is not None and parameter.default is inspect.Parameter.empty


def extract_loss(output: Any, where: str = "training_step") -> Tensor | None:
    if output is None or isinstance(output, Tensor):
        return output
    if isinstance(output, Mapping):
        if "loss" not in output:
            raise ValueError(
                f"{where} returned a dict without a 'loss' entry (keys: {', '.join(map(str, output))}). "
                f"Put the loss to minimise under 'loss', or return the loss tensor itself."
            )
        return output["loss"]
    raise TypeError(
        f"{where} returned {type(output).__name__}; return the loss tensor, a dict with a 'loss' entry, or None "
        f"to skip the step."
    )


class Optimization:
    """The training step for one fit: automatic (the Trainer steps) or manual (the module steps).

    Automatic optimisation has one step path, :meth:`_automatic_step`. The core decides what
    it calls: the step policy (:mod:`drivetrain.strategies.step_policy`) when an accumulation
    window ends and how clipping treats an inf/NaN norm, and ``strategy.step_functions()`` the
    backward and optimizer-step calls (plain torch calls when the strategy adds nothing: the one
    fast path). Hooks nobody overrides are ``None`` and cost one attribute read.
    """

    def __init__(self, trainer: Trainer) -> None:
        self.trainer = trainer
        self.step: Callable[[Any, int, bool], Any] = self._not_set_up

    def _not_set_up(self, batch: Any, batch_idx: int, end_of_data: bool) -> Any:
        raise AssertionError("Optimization.setup() was not called")

    def setup(self, optimizers: list[Optimizer], scheduler_configs: list[Any]) -> None:
        trainer = self.trainer
        settings = trainer._settings
        module, model, strategy = trainer._module, trainer._model, trainer.strategy
        self.module, self.model, self.strategy = module, model, strategy
        self._models = (model,)
        self.precision = strategy.precision
        self.hooks = trainer._hooks
        self.progress = trainer._progress
        self.optimizers = optimizers
        self.scheduler_configs = scheduler_configs
        trainer._manual_optimizers = []
        self.step_schedulers = [c for c in scheduler_configs if c.interval == "step"]
        self.accumulation = GradientAccumulation(settings.accumulate_grad_batches)
        self.clip_value = settings.gradient_clip_val
        self.clip_algorithm = settings.gradient_clip_algorithm
        # Like unused hooks, steps this run does not need are None: one attribute read per step.
        accumulating = self.accumulation.num_steps != 1
        self._scale_loss = self.accumulation.scale_loss if accumulating else None
        needs_preparing = self.clip_value is not None or self.hooks.on_before_optimizer_step is not None
        self._prepare_step = self._before_optimizer_step if needs_preparing else None
        self._backward, self._optimizer_call = strategy.step_functions()
        redirect = model is not module or strategy.requires_joint_setup
        training_step = module.training_step
        call = redirected_call(model, module, training_step) if redirect else training_step
        self.training_step = with_precision(call, strategy.precision)
        accumulate = self.accumulation.num_steps
        if not module.automatic_optimization:
            if self.clip_value is not None:
                raise ValueError(
                    f"Trainer(gradient_clip_val={self.clip_value}) clips in automatic optimisation only, but "
                    f"{type(module).__name__}.automatic_optimization is False. Clip in training_step with "
                    f"self.clip_gradients(optimizer, gradient_clip_val=...) instead."
                )
            if accumulate != 1:
                raise ValueError(
                    f"Trainer(accumulate_grad_batches={accumulate}) accumulates in automatic optimisation only, "
                    f"but {type(module).__name__}.automatic_optimization is False. Step the optimizer every N "
                    f"batches in training_step instead."
                )
            trainer._manual_optimizers = [ManualOptimizer(o, self) for o in optimizers]
            self.step = self._manual_step
            return
        if len(optimizers) != 1:
            raise ValueError(
                f"configure_optimizers() returned {len(optimizers)} optimizers; automatic optimisation steps exactly "
                f"one. Set self.automatic_optimization = False in {type(module).__name__}.__init__ and step them "
                f"in training_step (self.optimizers(), self.manual_backward(loss))."
            )
        self.optimizer = optimizers[0]
        self.closure_required = _needs_closure(self.optimizer)
        if self.closure_required and accumulate != 1:
            raise ValueError(
                f"{type(self.optimizer).__name__} re-evaluates the loss through a closure, which cannot be combined "
                f"with accumulate_grad_batches={accumulate}. Use accumulate_grad_batches=1."
            )
        self.step = self._automatic_step

    def start_epoch(self, batches_done: int) -> None:
        """Accumulation windows restart with each epoch (``batches_done`` > 0 when one is resumed)."""
        self.accumulation.reset(batches_done)

    # -- automatic optimisation ------------------------------------------------------------
    def _automatic_step(self, batch: Any, batch_idx: int, end_of_data: bool) -> Any:
        """Forward and backward; at the end of an accumulation window also clip, step, zero_grad, schedulers."""
        accumulation = self.accumulation
        if accumulation.advance(end_of_data):
            if self.closure_required:
                return self._step_through_closure(batch, batch_idx)
            output, loss = self._forward_backward(batch, batch_idx)
            if loss is not None:  # None: the module skipped this batch
                self._optimizer_step(None)
            return output
        # Inside a window: gradients stay local to this process until the window's last batch.
        with accumulation.backward_context(self.strategy, self._models):
            return self._forward_backward(batch, batch_idx)[0]

    def _forward_backward(self, batch: Any, batch_idx: int) -> tuple[Any, Tensor | None]:
        output = self.training_step(batch, batch_idx)
        loss = output if type(output) is Tensor else extract_loss(output)
        if loss is None:
            return output, None
        if self._scale_loss is not None:
            loss = self._scale_loss(loss)
        hooks = self.hooks
        if hooks.on_before_backward is not None:
            hooks.on_before_backward(loss)
        self._backward(loss, self.model)
        if hooks.on_after_backward is not None:
            hooks.on_after_backward()
        return output, loss

    def _before_optimizer_step(self, optimizer: Optimizer) -> None:
        """``on_before_optimizer_step``, then clipping (on unscaled gradients)."""
        hooks = self.hooks
        if hooks.on_before_optimizer_step is not None:
            hooks.on_before_optimizer_step(optimizer)
        if self.clip_value is not None:
            clip_gradients(self.strategy, self.model, optimizer, self.clip_value, self.clip_algorithm)

    def _optimizer_step(self, closure: Callable[[], Any] | None) -> Any:
        optimizer = self.optimizer
        if closure is None and self._prepare_step is not None:  # a closure prepares after each backward
            self._prepare_step(optimizer)
        result = self._optimizer_call(optimizer, closure, self.model)
        hooks = self.hooks
        if hooks.on_before_zero_grad is not None:
            hooks.on_before_zero_grad(optimizer)
        optimizer.zero_grad()  # set_to_none=True, torch's default (passing it is measurably slower)
        progress = self.progress
        progress.global_step += 1
        # A step the loss scaler skipped (inf/NaN gradients) does not advance per-step schedules.
        if self.step_schedulers and not self.precision.last_step_skipped:
            step_schedulers(self.step_schedulers, "step", progress.global_step, self.trainer.callback_metrics)
        return result

    def _step_through_closure(self, batch: Any, batch_idx: int) -> Any:
        """Optimizers that re-evaluate the loss (LBFGS) run forward, backward, the pre-step hook and
        clipping inside ``step``, as often as they call the closure."""
        optimizer = self.optimizer
        outputs: list[Any] = []

        def closure() -> Tensor | None:
            optimizer.zero_grad()  # each evaluation needs fresh gradients
            output, loss = self._forward_backward(batch, batch_idx)
            outputs.append(output)
            if loss is None:
                return None
            self._before_optimizer_step(optimizer)
            return loss.detach()

        self._optimizer_step(closure)
        return outputs[-1] if outputs else None

    # -- clipping ----------------------------------------------------------------------------
    def clip(self, optimizer: Any, value: float | None, algorithm: str = "norm") -> Tensor | None:
        """Clip ``optimizer``'s gradients through the core step policy (unscaled first under fp16)."""
        if value is None:
            return None
        if isinstance(optimizer, ManualOptimizer):
            optimizer = optimizer.optimizer
        return clip_gradients(self.strategy, self.model, optimizer, value, algorithm)

    # -- manual optimisation -----------------------------------------------------------------
    def _manual_step(self, batch: Any, batch_idx: int, end_of_data: bool) -> Any:
        return self.training_step(batch, batch_idx)

    def manual_backward(self, loss: Tensor, *args: Any, **kwargs: Any) -> None:
        hooks = self.hooks
        if hooks.on_before_backward is not None:
            hooks.on_before_backward(loss)
        self._backward(loss, self.model, *args, **kwargs)
        if hooks.on_after_backward is not None:
            hooks.on_after_backward()

    def manual_optimizer_step(
        self, optimizer: Optimizer, closure: Callable[[], Any] | None, **kwargs: Any
    ) -> Any:
        hooks = self.hooks
        if hooks.on_before_optimizer_step is not None:
            hooks.on_before_optimizer_step(optimizer)
        result = self._optimizer_call(optimizer, closure, self.model, **kwargs)
        self.progress.global_step += 1
        return result


class ManualOptimizer:
    """What ``self.optimizers()`` returns: the optimizer, with ``step`` routed through the strategy.

    ``step()`` applies the precision (loss scaling) and counts a global step; everything else
    (``zero_grad``, ``param_groups``, ``state_dict`` …) is the optimizer's own.
    """

    def __init__(self, optimizer: Optimizer, optimization: Optimization) -> None:
        self.__dict__["optimizer"] = optimizer
        self.__dict__["_optimization"] = optimization

    def step(self, closure: Callable[[], Any] | None = None, **kwargs: Any) -> Any:
        return self._optimization.manual_optimizer_step(self.optimizer, closure, **kwargs)

    def zero_grad(self, set_to_none: bool = True) -> None:
        hooks = self._optimization.hooks
        if hooks.on_before_zero_grad is not None:
            hooks.on_before_zero_grad(self.optimizer)
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["optimizer"], name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self.optimizer, name, value)

    def __repr__(self) -> str:
        return f"ManualOptimizer({self.optimizer!r})"
