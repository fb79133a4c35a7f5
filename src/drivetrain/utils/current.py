"""Which run the free functions of :mod:`drivetrain.utils` act on: the latest live ``drivetrain.Accelerator``'s.

Accelerate's ``gather(tensor)``, ``wait_for_everyone()`` … take no accelerator argument. Here they
use the strategy of the most recently created ``drivetrain.Accelerator`` that is still alive in
this process (the Accelerator announces itself through :func:`set_current`). It is a weak
reference, not global state to set up or reset: when the Accelerator goes, so does the answer.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from drivetrain.strategies.strategy import Strategy


class HasStrategy(Protocol):
    """An object that runs on a strategy (``drivetrain.Accelerator``)."""

    strategy: Strategy


# Weak references, oldest first: an Accelerator that goes away hands over to the one before it.
_owners: list[weakref.ref[HasStrategy]] = []


def set_current(owner: HasStrategy) -> None:
    """Make ``owner``'s strategy the one the free functions use (called by ``drivetrain.Accelerator``)."""
    _owners[:] = [ref for ref in _owners if ref() is not None and ref() is not owner]
    _owners.append(weakref.ref(owner))


def current_owner() -> HasStrategy | None:
    """The latest owner announced with :func:`set_current` that is still alive, if any."""
    while _owners:
        owner = _owners[-1]()
        if owner is not None:
            return owner
        _owners.pop()
    return None


def current_strategy() -> Strategy | None:
    """The strategy of the latest owner announced with :func:`set_current` that is still alive, if any."""
    owner = current_owner()
    return owner.strategy if owner is not None else None
