"""Between live training objects and checkpoint entries, for :class:`~drivetrain.strategies.Strategy`.

:meth:`Strategy.save_state <drivetrain.strategies.Strategy.save_state>` turns modules,
optimizers and stateful objects into entries (:func:`state_to_checkpoint`), and
:meth:`Strategy.load_state <drivetrain.strategies.Strategy.load_state>` puts entries back into
them (:func:`checkpoint_into_state`). Modules and optimizers go through the strategy's own
``get_*``/``load_*`` methods, so sharded strategies gather or shard them.
:func:`read_through` is how a strategy reads a file through its CheckpointIO.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torch import nn
from torch.optim import Optimizer

if TYPE_CHECKING:
    from drivetrain.plugins.io.checkpoint_io import CheckpointIO
    from drivetrain.strategies.strategy import Strategy


def state_to_checkpoint(strategy: Strategy, state: dict[str, Any]) -> dict[str, Any]:
    """``state``'s values as checkpoint entries: modules and optimizers converted by ``strategy``."""
    converted: dict[str, Any] = {}
    for name, value in state.items():
        if isinstance(value, nn.Module):
            converted[name] = strategy.get_module_state_dict(value)
        elif isinstance(value, Optimizer):
            converted[name] = strategy.get_optimizer_state(value)
        elif callable(getattr(value, "state_dict", None)):
            converted[name] = value.state_dict()
        else:
            converted[name] = value
    return converted


def checkpoint_into_state(
    strategy: Strategy, checkpoint: dict[str, Any], state: dict[str, Any], strict: bool
) -> dict[str, Any]:
    """Restore ``state``'s live objects from ``checkpoint``; returns the entries ``state`` does not name."""
    missing = [name for name in state if name not in checkpoint]
    if strict and missing:
        raise KeyError(
            f"The checkpoint has no entry for {', '.join(map(repr, missing))} (it has "
            f"{', '.join(map(repr, checkpoint))}). Pass strict=False to load the rest."
        )
    for name, target in state.items():
        if name not in checkpoint:
            continue
        saved = checkpoint[name]
        if isinstance(target, nn.Module):
            load_module_weights(strategy, target, saved, strict=strict)
        elif isinstance(target, Optimizer):
            strategy.load_optimizer_state(target, saved)
        elif callable(getattr(target, "load_state_dict", None)):
            target.load_state_dict(saved)
        else:
            state[name] = saved  # plain values come back through the dict
    return {name: value for name, value in checkpoint.items() if name not in state}


def load_module_weights(strategy: Strategy, module: nn.Module, weights: dict[str, Any], strict: bool) -> None:
    """``strategy.load_module_state_dict``, with weights of other shapes named (:func:`explain_size_mismatch`)."""
    try:
        strategy.load_module_state_dict(module, weights, strict=strict)
    except RuntimeError as error:
        explained = explain_size_mismatch(error, type(strategy.unwrap_module(module)).__name__)
        if explained is None:
            raise
        raise explained from None


_SIZE_MISMATCH = re.compile(
    r"size mismatch for (\S+): copying a param with shape torch\.Size\((\[[^\]]*\])\) from checkpoint, "
    r"the shape in current model is torch\.Size\((\[[^\]]*\])\)"
)


def explain_size_mismatch(error: RuntimeError, model: str) -> ValueError | None:
    """The error to raise when ``load_state_dict`` refused weights of other shapes (``None``: another failure)."""
    found = _SIZE_MISMATCH.findall(str(error))
    if not found:
        return None
    shown = "; ".join(
        f"{name}: {_shape(saved)} in the checkpoint, {_shape(own)} in the model"
        for name, saved, own in found[:3]
    )
    more = f" (and {len(found) - 3} more)" if len(found) > 3 else ""
    return ValueError(
        f"The checkpoint's weights do not fit {model}: {shown}{more}. The checkpoint was saved from a model built "
        f"with other sizes (other hyperparameters or layers). Build the model as it was when the checkpoint was "
        f"saved; loading with strict=False does not skip weights of another shape."
    )


def _shape(text: str) -> str:
    return "(" + ", ".join(part.strip() for part in text.strip("[]").split(",") if part.strip()) + ")"


def read_through(
    checkpoint_io: CheckpointIO, path: str | Path, map_location: Any | None, weights_only: bool
) -> dict[str, Any]:
    """Read the checkpoint at ``path`` with ``checkpoint_io`` (safely unless ``weights_only=False``)."""
    # User CheckpointIOs written after the seeds take (path, map_location) only: pass the rest
    # only when it differs from the default.
    kwargs: dict[str, Any] = {} if map_location is None else {"map_location": map_location}
    if not weights_only:
        kwargs["weights_only"] = False
    try:
        return checkpoint_io.load_checkpoint(path, **kwargs)
    except TypeError as error:
        if weights_only or "weights_only" not in str(error):
            raise
        raise TypeError(
            f"weights_only=False was requested, but {type(checkpoint_io).__name__}.load_checkpoint takes "
            f"no weights_only argument: it decides itself how it unpickles. Load without weights_only=False, or "
            f"give the CheckpointIO that argument."
        ) from None
