"""Hook dispatch: call only what a module or callback actually overrides.

At the start of every entry point the Trainer builds a :class:`HookRunner`. For each hook it
looks once at the module and the callbacks and keeps the overriding methods only; a hook that
nobody overrides becomes ``None``, so the per-step cost of an unused hook is one attribute read.

Callbacks receive ``(trainer, module, *args)``, the module ``(*args)``. For most hooks the
callbacks run first; for the ``*_epoch_end`` hooks and ``on_*_end`` the module runs first, so the
callbacks (checkpointing, early stopping) see what it logged.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

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

_MODULE_FIRST = frozenset(
    name for name in HOOKS if name.endswith("_epoch_end") or (name.endswith("_end") and "batch" not in name)
)


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
    ) -> None:
        self._trainer = trainer
        self._module = module
        for name, (in_callbacks, in_module) in HOOKS.items():
            callback_fns = (
                [
                    _timed(profiler, f"[Callback]{c.state_key}.{name}", getattr(c, name))
                    for c in callbacks
                    if overrides(c, callback_base, name)
                ]
                if in_callbacks
                else []
            )
            module_fn = getattr(module, name) if in_module and overrides(module, module_base, name) else None
            if module_fn is not None:
                module_fn = _timed(profiler, f"[TrainingModule]{type(module).__name__}.{name}", module_fn)
            setattr(self, name, self._combine(name, callback_fns, module_fn))

    def call(self, name: str, *args: Any) -> Any:
        """Call hook ``name`` if anything overrides it (for hooks off the per-step path)."""
        hook = getattr(self, name)
        return hook(*args) if hook is not None else None

    def _combine(
        self, name: str, callback_fns: list[Callable[..., Any]], module_fn: Callable[..., Any] | None
    ) -> Callable[..., Any] | None:
        if not callback_fns and module_fn is None:
            return None
        trainer, module = self._trainer, self._module
        if not callback_fns:
            return module_fn
        if module_fn is None:
            if len(callback_fns) == 1:
                only = callback_fns[0]

                def run_one(*args: Any) -> None:
                    only(trainer, module, *args)

                return run_one

            def run_callbacks(*args: Any) -> None:
                for fn in callback_fns:
                    fn(trainer, module, *args)

            return run_callbacks
        if name in _MODULE_FIRST:

            def run_module_first(*args: Any) -> Any:
                result = module_fn(*args)
                for fn in callback_fns:
                    fn(trainer, module, *args)
                return result

            return run_module_first

        def run_callbacks_first(*args: Any) -> Any:
            for fn in callback_fns:
                fn(trainer, module, *args)
            return module_fn(*args)

        return run_callbacks_first


def _timed(profiler: Any, action: str, function: Callable[..., Any]) -> Callable[..., Any]:
    if profiler is None:
        return function
    from drivetrain.trainer.profiling import timed

    return timed(profiler, action, function)


def hook_runner(trainer: Any, run: Any) -> HookRunner:
    """The hooks of ``run``'s module and callbacks, resolved for the entry point starting (or a tuner trial)."""
    from drivetrain.trainer.callbacks.callback import Callback
    from drivetrain.trainer.module import TrainingModule

    return HookRunner(trainer, run.module, run.callbacks, TrainingModule, Callback, run.features.profiler)
