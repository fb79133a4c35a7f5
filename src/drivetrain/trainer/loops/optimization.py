"""One training step: forward, backward, gradient clipping, optimizer step, accumulation.

Everything that can be decided once (which hooks exist, whether the model is wrapped, whether
the precision changes ``forward``, clipping, accumulation, schedulers stepping per step) is
decided in :meth:`Optimization.setup`, so the per-step functions do only what this run needs.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any

from torch import Tensor
from torch.optim import Optimizer

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
    """The training step for one fit: automatic (the Trainer steps) or manual (the module steps)."""

    def __init__(self, trainer: Trainer) -> None:
        self.trainer = trainer
        self.step: Callable[[Any, int, bool], Any] = self._not_set_up

    def _not_set_up(self, batch: Any, batch_idx: int, last_in_window: bool) -> Any:
        raise AssertionError("Optimization.setup() was not called")

    def setup(self, optimizers: list[Optimizer], scheduler_configs: list[Any]) -> None:
        trainer = self.trainer
        settings = trainer._settings
        module, model, strategy = trainer._module, trainer._model, trainer.strategy
        self.module, self.model, self.strategy = module, model, strategy
        self.hooks = trainer._hooks
        self.optimizers = optimizers
        self.scheduler_configs = scheduler_configs
        trainer._manual_optimizers = []
        self.step_schedulers = [c for c in scheduler_configs if c.interval == "step"]
        self.accumulate = settings.accumulate_grad_batches
        self.clip_value = settings.gradient_clip_val
        self.clip_algorithm = settings.gradient_clip_algorithm
        redirect = model is not module or strategy.requires_joint_setup
        training_step = module.training_step
        call = redirected_call(model, module, training_step) if redirect else training_step
        self.training_step = with_precision(call, strategy.precision)
        if not module.automatic_optimization:
            if self.clip_value is not None:
                raise ValueError(
                    f"Trainer(gradient_clip_val={self.clip_value}) clips in automatic optimisation only, but "
                    f"{type(module).__name__}.automatic_optimization is False. Clip in training_step with "
                    f"self.clip_gradients(optimizer, gradient_clip_val=...) instead."
                )
            if self.accumulate != 1:
                raise ValueError(
                    f"Trainer(accumulate_grad_batches={self.accumulate}) accumulates in automatic optimisation only, "
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
        if _needs_closure(self.optimizer):
            if self.accumulate != 1:
                raise ValueError(
                    f"{type(self.optimizer).__name__} re-evaluates the loss through a closure, which cannot be combined "
                    f"with accumulate_grad_batches={self.accumulate}. Use accumulate_grad_batches=1."
                )
            self.step = self._closure_step
        elif self.accumulate != 1:
            self.step = self._accumulating_step
        elif self._lean():
            self.step = (
                self._plain_step
                if strategy.backward_is_plain and strategy.optimizer_step_is_plain
                else self._lean_step
            )
        else:
            self.step = self._automatic_step
        self._backward = strategy.backward
        self._strategy_step = strategy.optimizer_step
        self.progress = trainer._progress

    def _lean(self) -> bool:
        """Whether a step needs nothing but forward, backward, optimizer step and zero_grad."""
        hooks = self.hooks
        return (
            self.clip_value is None
            and not self.step_schedulers
            and hooks.on_before_backward is None
            and hooks.on_after_backward is None
            and hooks.on_before_optimizer_step is None
            and hooks.on_before_zero_grad is None
        )

    # -- automatic optimisation ------------------------------------------------------------
    def _plain_step(self, batch: Any, batch_idx: int, last_in_window: bool) -> Any:
        # _lean_step for a strategy whose backward and optimizer step are the core's defaults, which
        # amount to exactly these two calls (Strategy.backward_is_plain / optimizer_step_is_plain); skipping the layers saves ~8 calls a step.
        output = self.training_step(batch, batch_idx)
        loss = output if type(output) is Tensor else extract_loss(output)
        if loss is None:
            return output
        loss.backward()
        optimizer = self.optimizer
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        self.progress.global_step += 1
        return output

    def _lean_step(self, batch: Any, batch_idx: int, last_in_window: bool) -> Any:
        # The common case kept to the calls the core contract requires (no hooks, clipping or schedulers).
        output = self.training_step(batch, batch_idx)
        loss = output if type(output) is Tensor else extract_loss(output)
        if loss is None:
            return output
        model = self.model
        self._backward(loss, model)
        optimizer = self.optimizer
        self._strategy_step(optimizer, None, model=model)
        optimizer.zero_grad(set_to_none=True)
        self.progress.global_step += 1
        return output

    def _automatic_step(self, batch: Any, batch_idx: int, last_in_window: bool) -> Any:
        # The hot path when every batch steps: no accumulation context, no loss division.
        hooks = self.hooks
        output = self.training_step(batch, batch_idx)
        loss = output if type(output) is Tensor else extract_loss(output)
        if loss is None:
            return output  # the module skipped this batch
        if hooks.on_before_backward is not None:
            hooks.on_before_backward(loss)
        self.strategy.backward(loss, self.model)
        if hooks.on_after_backward is not None:
            hooks.on_after_backward()
        self._optimizer_step(self.optimizer, None)
        return output

    def _accumulating_step(self, batch: Any, batch_idx: int, last_in_window: bool) -> Any:
        hooks = self.hooks
        # Gradients are reduced across processes only on the batch that steps.
        context = nullcontext() if last_in_window else self.strategy.no_backward_sync(self.model)
        with context:
            output = self.training_step(batch, batch_idx)
            loss = output if type(output) is Tensor else extract_loss(output)
            if loss is None:
                return output
            loss = loss / self.accumulate
            if hooks.on_before_backward is not None:
                hooks.on_before_backward(loss)
            self.strategy.backward(loss, self.model)
            if hooks.on_after_backward is not None:
                hooks.on_after_backward()
        if last_in_window:
            self._optimizer_step(self.optimizer, None)
        return output

    def _closure_step(self, batch: Any, batch_idx: int, last_in_window: bool) -> Any:
        outputs: list[Any] = []
        hooks = self.hooks

        def closure() -> Tensor | None:
            # Optimizers that re-evaluate (LBFGS) need fresh gradients on each evaluation.
            self.optimizer.zero_grad(set_to_none=True)
            output = self.training_step(batch, batch_idx)
            outputs.append(output)
            loss = extract_loss(output)
            if loss is None:
                return None
            if hooks.on_before_backward is not None:
                hooks.on_before_backward(loss)
            self.strategy.backward(loss, self.model)
            if hooks.on_after_backward is not None:
                hooks.on_after_backward()
            return loss.detach()

        self._optimizer_step(self.optimizer, closure)
        return outputs[-1] if outputs else None

    def _optimizer_step(self, optimizer: Optimizer, closure: Callable[[], Any] | None) -> Any:
        hooks = self.hooks
        if hooks.on_before_optimizer_step is not None and closure is None:
            hooks.on_before_optimizer_step(optimizer)
        if self.clip_value is not None and closure is None:
            self.clip(optimizer, self.clip_value, self.clip_algorithm)
        result = self.strategy.optimizer_step(optimizer, closure, model=self.model)
        if hooks.on_before_zero_grad is not None:
            hooks.on_before_zero_grad(optimizer)
        optimizer.zero_grad(set_to_none=True)
        progress = self.trainer._progress
        progress.global_step += 1
        if self.step_schedulers:
            step_schedulers(self.step_schedulers, "step", progress.global_step, self.trainer.callback_metrics)
        return result

    # -- clipping ----------------------------------------------------------------------------
    def clip(self, optimizer: Any, value: float | None, algorithm: str = "norm") -> Tensor | None:
        """Clip ``optimizer``'s gradients through the strategy (unscaled first under fp16)."""
        if value is None:
            return None
        optimizer = (
            getattr(optimizer, "optimizer", optimizer)
            if isinstance(optimizer, ManualOptimizer)
            else optimizer
        )
        if algorithm == "norm":
            return self.strategy.clip_gradients_norm(self.model, optimizer, value)
        if algorithm == "value":
            self.strategy.clip_gradients_value(self.model, optimizer, value)
            return None
        raise ValueError(f"gradient_clip_algorithm={algorithm!r}; use 'norm' or 'value'.")

    # -- manual optimisation -----------------------------------------------------------------
    def _manual_step(self, batch: Any, batch_idx: int, last_in_window: bool) -> Any:
        return self.training_step(batch, batch_idx)

    def manual_backward(self, loss: Tensor, *args: Any, **kwargs: Any) -> None:
        hooks = self.hooks
        if hooks.on_before_backward is not None:
            hooks.on_before_backward(loss)
        self.strategy.backward(loss, self.model, *args, **kwargs)
        if hooks.on_after_backward is not None:
            hooks.on_after_backward()

    def manual_optimizer_step(
        self, optimizer: Optimizer, closure: Callable[[], Any] | None, **kwargs: Any
    ) -> Any:
        hooks = self.hooks
        if hooks.on_before_optimizer_step is not None:
            hooks.on_before_optimizer_step(optimizer)
        result = self.strategy.optimizer_step(optimizer, closure, model=self.model, **kwargs)
        self.trainer._progress.global_step += 1
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
