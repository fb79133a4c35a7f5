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

from drivetrain._utilities.log import get_logger
from drivetrain.plugins.precision.precision import Precision
from drivetrain.strategies.step_policy import GradientAccumulation, clip_gradients
from drivetrain.strategies.strategy import Strategy
from drivetrain.trainer.hooks import overrides, takes_batch_idx, without_batch_idx
from drivetrain.trainer.loop_hooks import STEP_HOOKS
from drivetrain.trainer.module import TrainingModule
from drivetrain.trainer.optimizers import step_schedulers

_log = get_logger(__name__)

if TYPE_CHECKING:
    from drivetrain.trainer.run_state import RunState
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

    def __init__(self, trainer: Trainer, run: RunState) -> None:
        self.trainer = trainer
        self.run_state = run
        self.step: Callable[[Any, int, bool], Any] = self._not_set_up

    def _not_set_up(self, batch: Any, batch_idx: int, end_of_data: bool) -> Any:
        raise AssertionError("Optimization.setup() was not called")

    def setup(self, optimizers: list[Optimizer], scheduler_configs: list[Any]) -> None:
        trainer, run = self.trainer, self.run_state
        settings = run.settings
        module, model, strategy = run.module, run.model, trainer.strategy
        self.module, self.model, self.strategy = module, model, strategy
        self._models = (model,)
        self.precision = strategy.precision
        assert run.hooks is not None
        self.hooks = run.hooks
        self.progress = run.progress
        self.optimizers = optimizers
        self.scheduler_configs = scheduler_configs
        run.manual_optimizers = []
        self.step_schedulers = [c for c in scheduler_configs if c.interval == "step"]
        self.accumulation = GradientAccumulation(settings.accumulate_grad_batches)
        self.clip_value = settings.gradient_clip_val
        self.clip_algorithm = settings.gradient_clip_algorithm
        # Like unused hooks, steps this run does not need are None: one attribute read per step.
        self._set_loss_scaling(self.accumulation.num_steps)
        hooks = module_hooks(module, strategy)
        self._clip_hook = hooks.get("configure_gradient_clipping")
        self._zero_grad_hook = hooks.get("optimizer_zero_grad")
        self._optimizer_step_hook = hooks.get("optimizer_step")
        self.scheduler_step = hooks.get("lr_scheduler_step")
        needs_preparing = (
            self.clip_value is not None
            or self.hooks.on_before_optimizer_step is not None
            or self._clip_hook is not None
        )
        self._prepare_step = self._before_optimizer_step if needs_preparing else None
        self._backward, self._optimizer_call = strategy.step_functions()
        if "backward" in hooks:
            self._backward = _module_backward(hooks["backward"], strategy.precision)
        redirect = model is not module or strategy.requires_joint_setup
        training_step = module.training_step
        if not takes_batch_idx(training_step):  # training_step(self, batch): decided here, not per step
            training_step = without_batch_idx(training_step)
        call = redirected_call(model, module, training_step) if redirect else training_step
        self.training_step = with_precision(call, strategy.precision)
        profiler = run.features.profiler
        if profiler is not None:  # decided here, once: an unprofiled step calls the functions themselves
            from drivetrain.trainer.profiling import timed

            action = f"[TrainingModule]{type(module).__name__}.training_step"
            self.training_step = timed(profiler, action, self.training_step)
            self._backward = timed(profiler, "backward", self._backward)
            self._optimizer_call = timed(profiler, "optimizer_step", self._optimizer_call)
        accumulate = self.accumulation.num_steps
        self.manual = not module.automatic_optimization
        if self.manual:
            automatic_only = [name for name in hooks if name != "backward"]
            if automatic_only and strategy.is_global_zero:
                # Lightning accepts these overrides (a base class shared with automatic modules has them) and
                # never calls them in manual optimisation; so does drivetrain, and says so once.
                _log.info(
                    f"{type(module).__name__} overrides {', '.join(automatic_only)}, which the Trainer calls in "
                    f"automatic optimisation only; with automatic_optimization = False they run where training_step "
                    f"calls them."
                )
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
            run.manual_optimizers = [ManualOptimizer(o, self) for o in optimizers]
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
        # Overridden step hooks and closure optimizers take the general path, in Lightning's order;
        # everything else the fast one.
        general = self.closure_required or any(name in hooks for name in STEP_HOOKS)
        self.step = self._general_step if general else self._automatic_step
        self._stepping_optimizer = HookedOptimizer(self.optimizer, self)

    def set_accumulation(self, steps: int) -> None:
        """Step every ``steps`` batches from the next batch on (``trainer.accumulate_grad_batches = steps``).

        Before a fit is set up there is nothing to change: the fit reads the Trainer's setting.
        """
        accumulation = getattr(self, "accumulation", None)
        if accumulation is None:
            return
        if steps != 1:
            module = self.module
            if not module.automatic_optimization:
                raise ValueError(
                    f"trainer.accumulate_grad_batches = {steps}: the Trainer accumulates in automatic optimisation "
                    f"only, but {type(module).__name__}.automatic_optimization is False. Step the optimizer every "
                    f"N batches in training_step instead."
                )
            if getattr(self, "closure_required", False):
                raise ValueError(
                    f"trainer.accumulate_grad_batches = {steps}: {type(self.optimizer).__name__} re-evaluates the "
                    f"loss through a closure, which cannot be combined with accumulation. Keep it at 1."
                )
        accumulation.num_steps = steps
        self._set_loss_scaling(steps)

    def _set_loss_scaling(self, steps: int) -> None:
        """Divide the loss by ``steps`` for backward (nothing at 1); with a batch-end hook, also keep
        the divided loss for its ``outputs`` (Lightning's value), so the hook costs no second division."""
        if steps == 1:
            self._scale_loss: Callable[[Tensor], Tensor] | None = None
        elif self.hooks.on_train_batch_end is not None:
            self._scale_loss = self._scale_and_keep
        else:
            self._scale_loss = self.accumulation.scale_loss

    def _scale_and_keep(self, loss: Tensor) -> Tensor:
        scaled = self.accumulation.scale_loss(loss)
        self._scaled_loss = scaled.detach()
        return scaled

    def start_epoch(self, batches_done: int) -> None:
        """Accumulation windows restart with each epoch (``batches_done`` > 0 when one is resumed)."""
        self.accumulation.reset(batches_done)

    # -- automatic optimisation ------------------------------------------------------------
    def _automatic_step(self, batch: Any, batch_idx: int, end_of_data: bool) -> Any:
        """Forward, zero_grad (a window's first batch), backward; at a window's end also clip, step, schedulers.

        As in Lightning, the gradients are zeroed right after ``training_step`` of the first batch of
        an accumulation window, not after the step: they stay readable (``on_train_batch_end``)
        until the next window starts.
        """
        accumulation = self.accumulation
        first = accumulation.step % accumulation.num_steps == 0
        if accumulation.advance(end_of_data):
            output, loss = self._forward_backward(batch, batch_idx, first)
            if loss is not None:  # None: the module skipped this batch
                self._optimizer_step(None)
            return output
        # Inside a window: gradients stay local to this process until the window's last batch.
        with accumulation.backward_context(self.strategy, self._models):
            return self._forward_backward(batch, batch_idx, first)[0]

    def _forward_backward(self, batch: Any, batch_idx: int, zero_grad: bool) -> tuple[Any, Tensor | None]:
        output = self.training_step(batch, batch_idx)
        loss = output if type(output) is Tensor else extract_loss(output)
        if zero_grad:
            optimizer = self.optimizer
            if self.hooks.on_before_zero_grad is not None:
                self.hooks.on_before_zero_grad(optimizer)
            optimizer.zero_grad()  # set_to_none=True, torch's default (passing it is measurably slower)
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

    def batch_outputs(self, output: Any) -> Any:
        """What ``on_train_batch_end`` gets for ``training_step``'s ``output``, as in Lightning.

        Automatic optimisation: ``{"loss": loss}`` (a dict's other entries after it), the loss
        detached and divided by ``accumulate_grad_batches``: the very value the backward pass got
        (kept by :meth:`_scale_and_keep`); ``{}`` when the step was skipped. Manual: a tensor becomes
        ``{"loss": tensor.detach()}``, a dict is copied with its loss detached, None becomes ``{}``.
        Built only for a batch-end hook.
        """
        if output is None:
            return {}
        scaled = self._scale_loss is not None and not self.manual
        if isinstance(output, Tensor):
            return {"loss": self._scaled_loss if scaled else output.detach()}
        if not isinstance(output, Mapping):
            return output
        outputs = dict(output)
        loss = outputs.pop("loss", None)
        if isinstance(loss, Tensor):
            loss = self._scaled_loss if scaled else loss.detach()
        return {"loss": loss, **outputs} if "loss" in output else outputs

    def _before_optimizer_step(self, optimizer: Optimizer) -> None:
        """``on_before_optimizer_step``, then clipping (on unscaled gradients)."""
        hooks = self.hooks
        if hooks.on_before_optimizer_step is not None:
            hooks.on_before_optimizer_step(optimizer)
        if self._clip_hook is not None:
            self._clip_hook(optimizer, self.clip_value, self.clip_algorithm)
        elif self.clip_value is not None:
            clip_gradients(
                self.strategy, self.model, optimizer, self.clip_value, self.clip_algorithm or "norm"
            )

    def _optimizer_step(self, closure: Callable[[], Any] | None) -> Any:
        optimizer = self.optimizer
        if closure is None and self._prepare_step is not None:  # a closure prepares after each backward
            self._prepare_step(optimizer)
        result = self._optimizer_call(optimizer, closure, self.model)
        progress = self.progress
        progress.global_step += 1
        # A step the loss scaler skipped (inf/NaN gradients) does not advance per-step schedules.
        if self.step_schedulers and not self.precision.last_step_skipped:
            step_schedulers(
                self.step_schedulers,
                "step",
                progress.global_step,
                self.trainer.callback_metrics,
                self.scheduler_step,
            )
        return result

    def _general_step(self, batch: Any, batch_idx: int, end_of_data: bool) -> Any:
        """The step as Lightning structures it, for overridden step hooks and closure optimizers (LBFGS).

        A closure runs ``training_step``, zeroes the gradients at the start of an accumulation
        window (``on_before_zero_grad``, ``optimizer_zero_grad``) and runs the backward pass. Inside
        a window it is called directly; at a window's end ``optimizer_step(epoch, batch_idx,
        optimizer, closure)`` gets it, and the optimizer's ``step`` runs it (as often as the
        optimizer needs), then ``on_before_optimizer_step`` and clipping, then the update.
        """
        accumulation = self.accumulation
        closure = _Closure(self, batch, batch_idx, zero_grad=accumulation.step % accumulation.num_steps == 0)
        if not accumulation.advance(end_of_data):
            with accumulation.backward_context(self.strategy, self._models):
                closure()
            return closure.output
        epoch = self.progress.epoch
        if self._optimizer_step_hook is not None:
            self._optimizer_step_hook(epoch, batch_idx, self._stepping_optimizer, closure)
        else:
            self._stepping_optimizer.step(closure=closure)
        if not closure.called:
            raise RuntimeError(
                f"{type(self.module).__name__}.optimizer_step did not run the optimizer_closure it was given, so "
                f"training_step and the backward pass never ran for batch {batch_idx}. Call "
                f"optimizer.step(closure=optimizer_closure), or optimizer_closure() yourself when skipping the step."
            )
        progress = self.progress
        progress.global_step += 1  # counted as Lightning does: the hook ran, whether it stepped or not
        if self.step_schedulers and not self.precision.last_step_skipped:
            step_schedulers(
                self.step_schedulers,
                "step",
                progress.global_step,
                self.trainer.callback_metrics,
                self.scheduler_step,
            )
        return closure.output

    def _closure_step(self, optimizer: Optimizer, closure: Callable[[], Any] | None, **kwargs: Any) -> Any:
        """``optimizer.step(closure)`` in the general path: after each run of the closure the pre-step
        hook and clipping, then the strategy's (precision-aware) step."""

        def prepared() -> Any:
            result = closure() if closure is not None else None
            self._before_optimizer_step(optimizer)
            return result

        return self._optimizer_call(optimizer, prepared, self.model, **kwargs)

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
        output = self.training_step(batch, batch_idx)
        if output is None or isinstance(output, (Tensor, Mapping)):
            return output
        raise TypeError(
            f"training_step returned {type(output).__name__}. With automatic_optimization = False it may return "
            f"a tensor (the loss, for logging and batch-end hooks), a dict, or nothing."
        )

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


class _Closure:
    """``training_step`` → zero_grad (first batch of a window) → backward, for the general step path."""

    __slots__ = ("batch", "batch_idx", "called", "optimization", "output", "zero_grad")

    def __init__(self, optimization: Optimization, batch: Any, batch_idx: int, zero_grad: bool) -> None:
        self.optimization = optimization
        self.batch = batch
        self.batch_idx = batch_idx
        self.zero_grad = zero_grad
        self.called = False
        self.output: Any = None

    def __call__(self) -> Tensor | None:
        optimization = self.optimization
        self.called = True
        output = optimization.training_step(self.batch, self.batch_idx)
        self.output = output
        loss = output if type(output) is Tensor else extract_loss(output)
        if self.zero_grad or optimization.closure_required:  # each evaluation of LBFGS needs fresh gradients
            optimizer = optimization.optimizer
            hooks = optimization.hooks
            if hooks.on_before_zero_grad is not None:
                hooks.on_before_zero_grad(optimizer)
            if optimization._zero_grad_hook is not None:
                optimization._zero_grad_hook(optimization.progress.epoch, self.batch_idx, optimizer)
            else:
                optimizer.zero_grad()
        if loss is None:  # the module skipped this batch
            return None
        scaled = optimization._scale_loss(loss) if optimization._scale_loss is not None else loss
        hooks = optimization.hooks
        if hooks.on_before_backward is not None:
            hooks.on_before_backward(scaled)
        optimization._backward(scaled, optimization.model)
        if hooks.on_after_backward is not None:
            hooks.on_after_backward()
        return loss.detach()


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
        return f"{type(self).__name__}({self.optimizer!r})"


class HookedOptimizer(ManualOptimizer):
    """The optimizer that ``optimizer_step`` receives: ``step(closure)`` runs the closure, the pre-step
    hook and clipping, then the strategy's step (loss scaling, engines)."""

    def step(self, closure: Callable[[], Any] | None = None, **kwargs: Any) -> Any:
        return self._optimization._closure_step(self.optimizer, closure, **kwargs)


def module_hooks(module: Any, strategy: Any) -> dict[str, Callable[..., Any]]:
    """The step hooks ``module`` overrides (bound), checked against what ``strategy`` can honour."""

    found = {
        name: getattr(module, name)
        for name in (*STEP_HOOKS, "lr_scheduler_step")
        if overrides(module, TrainingModule, name)
    }
    if "backward" in found and (
        type(strategy).backward is not Strategy.backward
        or type(strategy.precision).backward is not Precision.backward
    ):
        # Lightning (with DeepSpeed) accepts the override, warns and ignores it: so does drivetrain.
        import warnings

        del found["backward"]
        warnings.warn(
            f"{type(module).__name__} overrides backward(), but {type(strategy).__name__} runs the backward pass "
            f"itself (its own backward(), as DeepSpeed's engine does, or its precision's), so the override is "
            f"ignored. Move that code to on_before_backward/on_after_backward, or use another strategy.",
            UserWarning,
            stacklevel=2,
        )
    return found


def _module_backward(hook: Callable[..., Any], precision: Any) -> Callable[..., None]:
    """The strategy's backward with the module's ``backward`` hook in place of ``loss.backward()``:
    the precision still scales the loss before it (float16) and sees it after."""

    def backward(tensor: Tensor, model: Any = None, *args: Any, **kwargs: Any) -> None:
        tensor = precision.pre_backward(tensor, model)
        hook(tensor, *args, **kwargs)
        precision.post_backward(tensor, model)

    return backward
