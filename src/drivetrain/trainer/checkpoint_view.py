"""A checkpoint dict as Lightning's hooks expect to find it, and back.

drivetrain's checkpoint keeps each optimizer's and scheduler's state under its own entry
(``"optimizer_0"``, ``"scheduler_0"``: see :mod:`drivetrain.strategies.checkpointing`); Lightning's
keeps them in two lists, ``"optimizer_states"`` and ``"lr_schedulers"``. ``on_load_checkpoint``
hooks written for Lightning read and migrate those lists, so they see them under Lightning's
names; whatever the hooks leave there is put back under drivetrain's entries before restoring.
The weights are ``"state_dict"`` in both.
"""

from __future__ import annotations

from typing import Any

from drivetrain.strategies.checkpointing import optimizer_key, scheduler_key

OPTIMIZER_STATES = "optimizer_states"
LR_SCHEDULERS = "lr_schedulers"


def lightning_view(checkpoint: dict[str, Any]) -> dict[str, Any]:
    """``checkpoint`` (changed in place and returned) with its optimizer and scheduler entries as Lightning's lists."""
    for listed, key in ((OPTIMIZER_STATES, optimizer_key), (LR_SCHEDULERS, scheduler_key)):
        states: list[Any] = []
        while key(len(states)) in checkpoint:
            states.append(checkpoint.pop(key(len(states))))
        if states:
            checkpoint[listed] = states
    return checkpoint


def from_lightning_view(checkpoint: dict[str, Any]) -> dict[str, Any]:
    """The inverse of :func:`lightning_view`: the lists (as the hooks left them) back under drivetrain's entries."""
    for listed, key in ((OPTIMIZER_STATES, optimizer_key), (LR_SCHEDULERS, scheduler_key)):
        states = checkpoint.pop(listed, None)
        if states is None:
            continue
        if not isinstance(states, (list, tuple)):
            raise TypeError(
                f"on_load_checkpoint left checkpoint[{listed!r}] as {type(states).__name__}; it must stay a list "
                f"with one state dict per {'optimizer' if listed == OPTIMIZER_STATES else 'LR scheduler'}."
            )
        for index, state in enumerate(states):
            checkpoint[key(index)] = state
    return checkpoint
