"""Hyperparameters: capturing a module's ``__init__`` arguments, and rebuilding it from a checkpoint."""

from __future__ import annotations

import inspect
import warnings
from argparse import Namespace
from collections.abc import Mapping, Sequence
from dataclasses import asdict, is_dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import torch

from drivetrain._utilities import paths


class AttributeDict(dict[str, Any]):
    """A dict whose keys are also attributes: ``hparams.lr`` is ``hparams["lr"]``."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(
                f"No hyperparameter {name!r}; saved: {', '.join(self) or '(none)'}."
            ) from None

    def __setattr__(self, name: str, value: Any) -> None:
        self[name] = value


def init_arguments(frame: FrameType) -> dict[str, Any]:
    """The arguments of the ``__init__`` running in ``frame`` (``self`` left out, ``**kwargs`` merged)."""
    info = inspect.getargvalues(frame)
    values = {name: info.locals[name] for name in info.args if name in info.locals}
    values.pop(info.args[0] if info.args else "self", None)
    if info.keywords and isinstance(info.locals.get(info.keywords), Mapping):
        values.update(info.locals[info.keywords])
    code = frame.f_code
    for name in code.co_varnames[code.co_argcount : code.co_argcount + code.co_kwonlyargcount]:
        if name in info.locals:
            values[name] = info.locals[name]
    return values


def collect_hyperparameters(
    args: Sequence[Any], frame: FrameType | None, ignore: str | Sequence[str] | None
) -> dict[str, Any]:
    """What ``save_hyperparameters(*args, ignore=...)`` saves.

    No ``args``: every ``__init__`` argument. Names: those arguments only. One mapping, namespace
    or dataclass: its contents.
    """
    ignored = {ignore} if isinstance(ignore, str) else set(ignore or ())
    if len(args) == 1 and not isinstance(args[0], str):
        source = args[0]
        if isinstance(source, Namespace):
            found = dict(vars(source))
        elif is_dataclass(source) and not isinstance(source, type):
            found = asdict(source)
        elif isinstance(source, Mapping):
            found = dict(source)
        else:
            raise TypeError(
                f"save_hyperparameters got {type(source).__name__} ({source!r}); pass argument names, a dict, "
                f"an argparse.Namespace or a dataclass instance, or nothing to save every __init__ argument."
            )
        return {k: v for k, v in found.items() if k not in ignored}
    if frame is None:
        raise RuntimeError("save_hyperparameters() must be called from the module's __init__.")
    arguments = init_arguments(frame)
    if args:
        unknown = [name for name in args if name not in arguments]
        if unknown:
            raise ValueError(
                f"save_hyperparameters({', '.join(map(repr, args))}): {', '.join(map(repr, unknown))} "
                f"{'is not an argument' if len(unknown) == 1 else 'are not arguments'} of __init__ "
                f"(its arguments: {', '.join(arguments) or '(none)'})."
            )
        arguments = {name: arguments[name] for name in args}
    return {k: v for k, v in arguments.items() if k not in ignored}


_SAFE_LEAVES = (
    type(None),
    bool,
    int,
    float,
    complex,
    str,
    bytes,
    torch.Tensor,
    torch.dtype,
    torch.device,
    torch.Size,
)


def checkpoint_safe(value: Any) -> bool:
    """Whether ``torch.load(weights_only=True)`` can read ``value`` back."""
    if isinstance(value, _SAFE_LEAVES):
        return True
    if isinstance(value, (list, tuple, set)):
        return type(value) in (list, tuple, set) and all(checkpoint_safe(v) for v in value)
    if isinstance(value, dict):
        return type(value) in (dict, AttributeDict) and all(
            isinstance(k, (str, int)) and checkpoint_safe(v) for k, v in value.items()
        )
    return False


def hyperparameters_for_checkpoint(hparams: Mapping[str, Any]) -> dict[str, Any]:
    """The hyperparameters a checkpoint can hold; others are left out with a warning naming them."""
    kept = {
        k: (dict(v) if isinstance(v, AttributeDict) else v) for k, v in hparams.items() if checkpoint_safe(v)
    }
    dropped = [k for k in hparams if k not in kept]
    if dropped:
        warnings.warn(
            f"The hyperparameters {', '.join(map(repr, dropped))} are objects a safely loaded checkpoint cannot "
            f"hold; they are not saved. Exclude them with save_hyperparameters(ignore=[...]) and pass them to "
            f"load_from_checkpoint(path, {dropped[0]}=...) when you load.",
            UserWarning,
            stacklevel=3,
        )
    return kept


def load_module_from_checkpoint(
    cls: type,
    checkpoint_path: str | Path,
    map_location: Any,
    strict: bool | None,
    overrides: dict[str, Any],
    weights_only: bool | None = None,
) -> Any:
    """Build ``cls`` from the hyperparameters saved in a Trainer checkpoint and load its weights."""
    from drivetrain.plugins.io.safe_loading import UnsafeCheckpointError, load_torch_file

    path = paths.normalize(checkpoint_path)
    if paths.isdir(path):
        from drivetrain.strategies.consolidate import checkpoint_kind

        try:
            checkpoint_kind(path)
        except ValueError:  # a folder, but not a sharded checkpoint: perhaps one that holds checkpoint files
            files = sorted(name for name in paths.listdir(path) if name.endswith(".ckpt"))[:5]
            held = f" It holds {', '.join(files)}: pass one of them." if files else ""
            raise ValueError(
                f"'{path}' is a folder, not a checkpoint: load_from_checkpoint reads a checkpoint file (such as "
                f"'.../checkpoints/last.ckpt').{held}"
            ) from None
        raise ValueError(
            f"'{path}' is a sharded checkpoint (a directory). load_from_checkpoint reads single-file checkpoints; "
            f"load it with Trainer.fit(model, ckpt_path=...) under the strategy that wrote it, or consolidate it "
            f"into one file first."
        )
    if weights_only is not None and not isinstance(weights_only, bool):
        raise TypeError(
            f"load_from_checkpoint(weights_only={weights_only!r}): use True, False or None (safe)."
        )
    try:
        checkpoint = load_torch_file(
            path, map_location=map_location or "cpu", weights_only=weights_only is not False
        )
    except UnsafeCheckpointError as error:
        raise error.with_opt_out(f"{cls.__name__}.load_from_checkpoint(path, weights_only=False)") from None
    if "state_dict" not in checkpoint:
        raise ValueError(
            f"'{path}' has no 'state_dict' entry (it has {', '.join(map(repr, checkpoint))}); it was not written "
            f"by drivetrain's Trainer."
        )
    hparams = {**checkpoint.get("hyper_parameters", {}), **overrides}
    model = cls(**hparams)
    model.configure_model()
    model.on_load_checkpoint(checkpoint)
    try:
        model.load_state_dict(
            checkpoint["state_dict"], strict=model.strict_loading if strict is None else strict
        )
    except RuntimeError as error:
        from drivetrain.strategies.state_dicts import explain_size_mismatch

        explained = explain_size_mismatch(error, cls.__name__)
        if explained is None:
            raise
        overridden = f" (overridden here: {', '.join(map(repr, overrides))})" if overrides else ""
        raise ValueError(f"{cls.__name__}.load_from_checkpoint('{path}'): {explained}{overridden}") from None
    return model
