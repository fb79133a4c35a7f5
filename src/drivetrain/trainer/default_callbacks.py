"""The callback list of a Trainer: the user's, plus the defaults the ``enable_*`` flags ask for."""

from __future__ import annotations

from typing import Any

from drivetrain._utilities.log import get_logger
from drivetrain.trainer.callbacks.callback import Callback
from drivetrain.trainer.callbacks.model_checkpoint import ModelCheckpoint
from drivetrain.trainer.callbacks.model_summary import ModelSummary
from drivetrain.trainer.callbacks.progress import ProgressBar, TQDMProgressBar
from drivetrain.trainer.hooks import overrides
from drivetrain.trainer.module import TrainingModule


def configure_callbacks(
    callbacks: Any,
    *,
    enable_progress_bar: bool,
    enable_checkpointing: bool,
    enable_model_summary: bool,
    fast_dev_run: bool = False,
    barebones: bool = False,
) -> list[Callback]:
    """Check the user's callbacks, add the default ones, and put checkpointing last.

    Checkpoint callbacks run after the others so that what they save includes the others'
    state as of this step (an EarlyStopping counter, say).
    """

    for flag, value in (
        ("enable_progress_bar", enable_progress_bar),
        ("enable_checkpointing", enable_checkpointing),
        ("enable_model_summary", enable_model_summary),
    ):
        if not isinstance(value, bool):
            raise TypeError(f"{flag} expects True or False, got {value!r}.")
    given = (
        [] if callbacks is None else list(callbacks) if isinstance(callbacks, (list, tuple)) else [callbacks]
    )
    for callback in given:
        if not isinstance(callback, Callback):
            raise TypeError(
                f"callbacks= expects drivetrain Callback instances, got {type(callback).__name__} ({callback!r}). "
                f"Subclass drivetrain.trainer.callbacks.Callback."
            )
    result = list(given)
    _default(
        "progress bar",
        ProgressBar,
        TQDMProgressBar,
        result,
        enable_progress_bar,
        "enable_progress_bar",
        barebones=barebones,
    )
    _default(
        "checkpoint callback",
        ModelCheckpoint,
        ModelCheckpoint,
        result,
        enable_checkpointing,
        "enable_checkpointing",
        add=not fast_dev_run,  # a smoke test writes no checkpoints
        barebones=barebones,
    )
    _default(
        "model summary",
        ModelSummary,
        _summary_kind(result),
        result,
        enable_model_summary,
        "enable_model_summary",
        barebones=barebones,
    )
    checkpoints = [cb for cb in result if isinstance(cb, ModelCheckpoint)]
    # Only callbacks with state can collide in a checkpoint (two LambdaCallbacks cannot).
    keys = [cb.state_key for cb in result if overrides(cb, Callback, "state_dict")]
    duplicates = sorted({k for k in keys if keys.count(k) > 1})
    if duplicates:
        raise ValueError(
            f"Two callbacks have the same state key {duplicates[0]!r}, so their checkpointed state would collide. "
            f"Give them different settings, or use one."
        )
    return [cb for cb in result if not isinstance(cb, ModelCheckpoint)] + checkpoints


def _summary_kind(callbacks: list[Callback]) -> type:
    """The default summary: drawn with rich next to a rich progress bar (as Lightning does), else plain."""
    from drivetrain.trainer.callbacks.progress import ProgressBar

    if any(isinstance(cb, ProgressBar) and cb.summary_style == "rich" for cb in callbacks):
        from drivetrain.trainer.callbacks.rich_summary import RichModelSummary

        return RichModelSummary

    return ModelSummary


def _default(
    what: str,
    base: type,
    default: type,
    callbacks: list[Callback],
    enabled: bool,
    flag: str,
    add: bool = True,
    barebones: bool = False,
) -> None:
    present = any(isinstance(cb, base) for cb in callbacks)
    if present and not enabled:
        if barebones:
            raise ValueError(
                f"Trainer(barebones=True) runs without a {what}, but callbacks= contains one ({base.__name__}). "
                f"Remove it, or drop barebones=True."
            )
        raise ValueError(
            f"{flag}=False but callbacks= contains a {what} ({base.__name__}). Remove it, or set {flag}=True."
        )
    if enabled and not present and add:
        callbacks.append(default())


def attach_module_callbacks(callbacks: list[Callback], added: Any, owner: str) -> list[Callback]:
    """``callbacks`` plus a module's ``configure_callbacks()`` result, as Lightning merges them.

    A Trainer callback whose type is a module callback's type or one of its base classes is
    replaced (the module knows what it needs); checkpoint callbacks still run last.
    """

    if isinstance(added, Callback):
        added = [added]
    if not isinstance(added, (list, tuple)):
        raise TypeError(
            f"{owner}.configure_callbacks() returned {type(added).__name__}; return a Callback or a list of them."
        )
    for callback in added:
        if not isinstance(callback, Callback):
            raise TypeError(
                f"{owner}.configure_callbacks() returned {type(callback).__name__} ({callback!r}), which is not a "
                f"drivetrain Callback. Subclass drivetrain.trainer.callbacks.Callback."
            )
    if not added:
        return callbacks
    added_types = {type(callback) for callback in added}
    replaced = {
        type(callback)
        for callback in callbacks
        if type(callback) is not Callback and any(issubclass(kind, type(callback)) for kind in added_types)
    }
    if replaced:
        get_logger(__name__).info(
            f"{owner}.configure_callbacks() replaces the Trainer's "
            f"{', '.join(sorted(kind.__name__ for kind in replaced))} callback(s)."
        )
    result = [callback for callback in callbacks if type(callback) not in replaced] + list(added)
    return [cb for cb in result if not isinstance(cb, ModelCheckpoint)] + [
        cb for cb in result if isinstance(cb, ModelCheckpoint)
    ]


def module_callbacks(callbacks: list[Callback], module: Any) -> list[Callback]:
    """``callbacks`` with what ``module.configure_callbacks()`` returns, when the module overrides it."""

    if not overrides(module, TrainingModule, "configure_callbacks"):
        return callbacks
    return attach_module_callbacks(callbacks, module.configure_callbacks(), type(module).__name__)
