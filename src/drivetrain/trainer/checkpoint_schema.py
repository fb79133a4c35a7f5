"""The checkpoint as ``on_save_checkpoint`` and ``on_load_checkpoint`` hooks see it: Lightning's keys.

The core checkpoint names each optimizer's and scheduler's state ``"optimizer_<i>"`` and
``"scheduler_<i>"`` (:mod:`drivetrain.strategies.checkpointing`); hooks written for Lightning read
and change ``checkpoint["optimizer_states"]``, ``checkpoint["lr_schedulers"]`` and
``checkpoint["state_dict"]`` as plain states. The Trainer shows its hooks that dictionary and
translates it back before writing, so what a hook changes is what is saved.

Where the strategy shards the model and its optimizers (FSDP, DeepSpeed: set up together), their
states exist only as the strategy writes them; the hooks then see the live module under
``"state_dict"`` and the live optimizers under ``"optimizer_states"``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from drivetrain.strategies.checkpointing import optimizer_key, scheduler_key

if TYPE_CHECKING:
    from drivetrain.strategies.strategy import Strategy

#: Lightning's name → the core's numbered entries it lists.
_LISTS = {"optimizer_states": re.compile(r"optimizer_(\d+)"), "lr_schedulers": re.compile(r"scheduler_(\d+)")}
_KEYS = {"optimizer_states": optimizer_key, "lr_schedulers": scheduler_key}


def as_saved(strategy: Strategy, checkpoint: dict[str, Any]) -> None:
    """Replace the live module, optimizers and schedulers by the states the writer would make of them.

    Schedulers always (small, never sharded); the module and optimizers unless the strategy shards them.
    """
    sharded = strategy.requires_joint_setup
    for name, value in list(checkpoint.items()):
        if isinstance(value, Mapping):
            continue  # already a state (read from a file)
        if name == "state_dict" and not sharded and hasattr(value, "parameters"):
            checkpoint[name] = strategy.get_module_state_dict(value)
        elif _LISTS["optimizer_states"].fullmatch(name) and not sharded:
            checkpoint[name] = strategy.get_optimizer_state(value)
        elif _LISTS["lr_schedulers"].fullmatch(name) and callable(getattr(value, "state_dict", None)):
            checkpoint[name] = value.state_dict()


def lightning_names(checkpoint: dict[str, Any]) -> dict[str, Any]:
    """``checkpoint`` (changed in place, and returned) with ``optimizer_states`` and ``lr_schedulers`` lists in
    place of the numbered entries, in their order (empty lists where there are none, as in Lightning)."""
    for name, pattern in _LISTS.items():
        if name in checkpoint:
            continue
        numbered = sorted(
            (int(match.group(1)), key) for key in checkpoint if (match := pattern.fullmatch(key))
        )
        checkpoint[name] = [checkpoint.pop(key) for _, key in numbered]
    return checkpoint


def core_names(checkpoint: dict[str, Any]) -> dict[str, Any]:
    """The inverse of :func:`lightning_names`: the lists (as the hooks left them) back to numbered entries."""
    for name, key in _KEYS.items():
        states = checkpoint.pop(name, None) or []
        if not isinstance(states, (list, tuple)):
            raise TypeError(
                f"on_load_checkpoint/on_save_checkpoint left checkpoint[{name!r}] as {type(states).__name__}; it must "
                f"stay a list with one state dict per {'optimizer' if name == 'optimizer_states' else 'LR scheduler'}."
            )
        for index, value in enumerate(states):
            checkpoint[key(index)] = value
    return checkpoint
