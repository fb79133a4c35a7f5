"""Hook dispatch: call only what a module or callbacks actually override.

At the start of every entry point the Trainer builds a :class:`HookRunner`. For each hook it
looks once at the module and the callbacks and keeps the overriding methods only; a hook that
nobody overrides becomes ``None``, so the per-step cost of an unused hook is one attribute read.

Callbacks receive ``(trainer, module, *args)``, the module ``(*args)``. The order is Lightning
2.6's: the callbacks run before the module for every hook, the ``*_end`` hooks included (so with
weight averaging the module's ``on_train_end`` sees the averaged weights), with two exceptions:

- ``on_train_epoch_end``: the callbacks, then the module, then the monitoring callbacks
  (:class:`~drivetrain.trainer.callbacks.EarlyStopping`,
  :class:`~drivetrain.trainer.callbacks.ModelCheckpoint`), which see what the module logged;
- ``on_load_checkpoint``: the module first, then the callbacks.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

from drivetrain.trainer.callbacks.callback import Callback
from drivetrain.trainer.callbacks.model_checkpoint import ModelCheckpoint
from drivetrain.trainer.module import TrainingModule
from drivetrain.trainer.profiling import timed

#: name → (callbacks have it, the module has it)
HOOKS: dict[str, tuple[bool, bool]] = {
    "setup": (True, True),
    "teardown": (True, True),
    "on_fit_start": (True, True),
    "on_fit_end": (True, True),
    "on_sanity_check_start": (True, False),
    "on_sanity_check_end": (True, False),
    "on_train_start": (True, True),
    "on_train_end": (True, True),
    "on_train_epoch_start": (True, True),
    "on_train_epoch_end": (True, True),
    "on_train_batch_start": (True, True),
    "on_train_batch_end": (True, True),
    "on_validation_start": (True, True),
    "on_validation_end": (True, True),
    "on_validation_epoch_start": (True, True),
    "on_validation_epoch_end": (True, True),
    "on_validation_batch_start": (True, True),
    "on_validation_batch_end": (True, True),
    "on_test_start": (True, True),
    "on_test_end": (True, True),
    "on_test_epoch_start": (True, True),
    "on_test_epoch_end": (True, True),
    "on_test_batch_start": (True, True),
    "on_test_batch_end": (True, True),
    "on_predict_start": (True, True),
    "on_predict_end": (True, True),
    "on_predict_epoch_start": (True, True),
    "on_predict_epoch_end": (True, True),
    "on_predict_batch_start": (True, True),
    "on_predict_batch_end": (True, True),
    "on_before_backward": (True, True),
    "on_after_backward": (True, True),
    "on_before_optimizer_step": (True, True),
    "on_before_zero_grad": (True, True),
    "on_save_checkpoint": (True, True),
    "on_load_checkpoint": (True, True),
    "on_exception": (True, False),
}

#: The module runs before the callbacks (Lightning lets it migrate a checkpoint before anyone reads it).
_MODULE_FIRST = frozenset({"on_load_checkpoint"})
#: The monitoring callbacks run after the module, the others before it.
_MONITORS_AFTER_MODULE = frozenset({"on_train_epoch_end"})


def overrides(obj: Any, base: type, name: str) -> bool:
    """Whether ``obj`` (a class's instance) defines ``name`` differently from ``base``.

    A hook set to ``None`` (``module.validation_step = None``, on the instance or the class) is
    switched off, as in Lightning: it counts as not overridden and is never called.
    """
    if getattr(obj, name, None) is None:
        return False
    if name in getattr(obj, "__dict__", {}):  # patched onto the instance
        return True
    return getattr(type(obj), name, None) is not getattr(base, name, None)


def takes_batch_idx(step: Callable[..., Any]) -> bool:
    """Whether a step method takes ``batch_idx`` after ``batch``, decided as Lightning does.

    It does when it has a parameter named ``batch_idx``, takes ``*args``, or has at least two
    positional parameters (whatever their names); ``training_step(self, batch)`` does not.
    Asked once per run, never per batch.
    """
    step = getattr(step, "__wrapped__", step)  # a decorated step: the function underneath
    try:
        parameters = inspect.signature(step).parameters.values()
    except (TypeError, ValueError):  # no signature (a builtin): call it the usual way
        return True
    positional = [
        p
        for p in parameters
        if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    ]
    if inspect.isfunction(step) and positional and positional[0].name == "self":
        positional = positional[1:]  # unbound (a decorator's __wrapped__): ``self`` is not a step argument
    return (
        any(p.name == "batch_idx" for p in positional)
        or any(p.kind == inspect.Parameter.VAR_POSITIONAL for p in parameters)
        or len(positional) >= 2
    )


def without_batch_idx(step: Callable[..., Any]) -> Callable[..., Any]:
    """``step`` called as ``(batch, batch_idx, *rest)`` for one that takes ``(batch, *rest)`` (no ``batch_idx``)."""

    def call(batch: Any, batch_idx: int, *rest: Any) -> Any:
        return step(batch, *rest)

    return call


class HookRunner:
    """The hooks of one module and its callbacks, resolved once.

    Each hook name is an attribute: ``None`` when nothing overrides it, otherwise a function
    taking the hook's arguments (without ``trainer``/``module``) that calls every override and
    returns the module's result.
    """

    def __init__(
        self,
        trainer: Any,
        module: Any,
        callbacks: Sequence[Any],
        module_base: type,
        callback_base: type,
        profiler: Any = None,
        monitoring: tuple[type, ...] = (),
    ) -> None:
        self._trainer = trainer
        self._module = module
        # Module-first hooks also in two parts, for a caller that runs something in between.
        self._parts: dict[str, tuple[Callable[..., Any] | None, Callable[..., Any] | None]] = {}
        for name, (in_callbacks, in_module) in HOOKS.items():
            overriding = [c for c in callbacks if overrides(c, callback_base, name)] if in_callbacks else []
            if name in _MODULE_FIRST:
                after = overriding
            elif name in _MONITORS_AFTER_MODULE:
                after = [c for c in overriding if isinstance(c, monitoring)]
            else:
                after = []
            before = [c for c in overriding if all(c is not a for a in after)]
            module_fn = getattr(module, name) if in_module and overrides(module, module_base, name) else None
            if module_fn is not None:
                module_fn = _timed(profiler, f"[TrainingModule]{type(module).__name__}.{name}", module_fn)
            before_fns = [
                _timed(profiler, f"[Callback]{c.state_key}.{name}", getattr(c, name)) for c in before
            ]
            after_fns = [_timed(profiler, f"[Callback]{c.state_key}.{name}", getattr(c, name)) for c in after]
            setattr(self, name, self._combine(before_fns, module_fn, after_fns))
            if name in _MODULE_FIRST:
                self._parts[name] = (module_fn, self._combine([], None, after_fns))

    def call(self, name: str, *args: Any) -> Any:
        """Call hook ``name`` if anything overrides it (for hooks off the per-step path)."""
        hook = getattr(self, name)
        return hook(*args) if hook is not None else None

    def call_module(self, name: str, *args: Any) -> Any:
        """Call only the module's part of a module-first hook (``on_load_checkpoint``), if overridden."""
        hook = self._parts[name][0]
        return hook(*args) if hook is not None else None

    def call_callbacks(self, name: str, *args: Any) -> None:
        """Call only the callbacks' part of a module-first hook (``on_load_checkpoint``), if any overrides it."""
        hook = self._parts[name][1]
        if hook is not None:
            hook(*args)

    def _combine(
        self,
        before: list[Callable[..., Any]],
        module_fn: Callable[..., Any] | None,
        after: list[Callable[..., Any]],
    ) -> Callable[..., Any] | None:
        """One function calling ``before`` (callbacks), ``module_fn``, then ``after`` (callbacks)."""
        trainer, module = self._trainer, self._module
        if module_fn is None:
            callback_fns = before + after
            if not callback_fns:
                return None
            if len(callback_fns) == 1:
                only = callback_fns[0]

                def run_one(*args: Any) -> None:
                    only(trainer, module, *args)

                return run_one

            def run_callbacks(*args: Any) -> None:
                for fn in callback_fns:
                    fn(trainer, module, *args)

            return run_callbacks
        if not before and not after:
            return module_fn
        if not after:

            def run_callbacks_first(*args: Any) -> Any:
                for fn in before:
                    fn(trainer, module, *args)
                return module_fn(*args)

            return run_callbacks_first

        def run_around_module(*args: Any) -> Any:
            for fn in before:
                fn(trainer, module, *args)
            result = module_fn(*args)
            for fn in after:
                fn(trainer, module, *args)
            return result

        return run_around_module


def _timed(profiler: Any, action: str, function: Callable[..., Any]) -> Callable[..., Any]:
    if profiler is None:
        return function

    return timed(profiler, action, function)


def hook_runner(trainer: Any, run: Any) -> HookRunner:
    """The hooks of ``run``'s module and callbacks, resolved for the entry point starting (or a tuner trial)."""
    from drivetrain.trainer.callbacks.early_stopping import EarlyStopping

    return HookRunner(
        trainer,
        run.module,
        run.callbacks,
        TrainingModule,
        Callback,
        run.features.profiler,
        monitoring=(EarlyStopping, ModelCheckpoint),
    )
