"""Which run the free functions of :mod:`drivetrain.utils` act on: the latest live ``drivetrain.Accelerator``'s.

Accelerate's ``gather(tensor)``, ``wait_for_everyone()`` … take no accelerator argument. Here they
use the strategy of the most recently created ``drivetrain.Accelerator`` that is still alive in
this process (the Accelerator announces itself through :func:`set_current`). It is a weak
reference, not global state to set up or reset: when the Accelerator goes, so does the answer.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
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


# Makes an owner when a view of the run (``PartialState()``) is asked for before any Accelerator exists:
# registered by ``drivetrain.Accelerator``'s module, which the views' modules do not import.
_implicit_owner_factory: list[Callable[[bool], HasStrategy]] = []


def set_implicit_owner_factory(factory: Callable[[bool], HasStrategy]) -> None:
    """Register what :func:`owner_or_implicit` calls when no owner is alive (``drivetrain.Accelerator`` does)."""
    _implicit_owner_factory[:] = [factory]


def owner_or_implicit(cpu: bool) -> HasStrategy:
    """The latest live owner, or one made now by the registered factory (on the CPU when ``cpu``)."""
    owner = current_owner()
    if owner is not None:
        return owner
    if not _implicit_owner_factory:
        raise RuntimeError(
            "No drivetrain.Accelerator exists in this process, and none can be made here. Create one first "
            "(accelerator = drivetrain.Accelerator()) and read accelerator.state, or use drivetrain.PartialState."
        )
    return _implicit_owner_factory[0](cpu)


def current_strategy() -> Strategy | None:
    """The strategy of the latest owner announced with :func:`set_current` that is still alive, if any."""
    owner = current_owner()
    return owner.strategy if owner is not None else None
