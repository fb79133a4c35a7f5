"""Making every process draw the same random numbers where the data order depends on them.

At the start of each epoch the prepared loaders copy rank 0's state of the generators named by
``rng_types`` to every process, so a shuffling sampler produces one permutation that the
processes then share out, instead of each process shuffling on its own and overlapping.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from enum import Enum
from typing import Any

import torch

from drivetrain.strategies.strategy import Strategy

#: The generators that can be synchronised: torch's global one, a device's, and the data's own.
RNG_TYPES = ("torch", "cuda", "xpu", "mps", "xla", "generator")
_DEVICE_TYPES = ("cuda", "xpu", "mps", "xla")


def validate_rng_types(rng_types: Iterable[str | Enum] | None) -> tuple[str, ...]:
    """The generator names in ``rng_types`` as strings (``None`` means only the data's generator).

    Raises:
        TypeError: ``rng_types`` is a single string rather than a list of them.
        ValueError: a name that is not one of :data:`RNG_TYPES`.
    """
    if rng_types is None:
        return ("generator",)
    if isinstance(rng_types, (str, Enum)):
        raise TypeError(
            f"rng_types expects a list of generator names, got the single value {rng_types!r}. "
            f"Write rng_types=[{_name(rng_types)!r}]."
        )
    names = tuple(_name(value) for value in rng_types)
    unknown = [name for name in names if name not in RNG_TYPES]
    if unknown:
        raise ValueError(
            f"rng_types={list(names)!r} names generator(s) drivetrain cannot synchronise: "
            f"{', '.join(map(repr, unknown))}. Use any of {', '.join(map(repr, RNG_TYPES))}."
        )
    return names


def _name(value: str | Enum) -> str:
    return str(value.value) if isinstance(value, Enum) else str(value)


def capture(
    strategy: Strategy, rng_types: Sequence[str], generator: torch.Generator | None
) -> dict[str, Any]:
    """The states of the generators named in ``rng_types`` that exist in this process.

    A device name (``"cuda"``, ``"xpu"``, ``"mps"``, ``"xla"``) stands for the strategy's hardware
    generators, read through its accelerator's ``get_rng_state`` hook, when the strategy runs on
    that kind of device; on other hardware it names nothing (see :func:`unused_device_types`).
    """
    states: dict[str, Any] = {}
    for name in rng_types:
        if name == "torch":
            states[name] = torch.get_rng_state()
        elif name == "generator":
            if generator is not None:
                states[name] = generator.get_state()
        elif name == strategy.root_device.type:
            device_state = strategy.accelerator.get_rng_state()
            if device_state is not None:
                states[name] = device_state
    return states


def restore(strategy: Strategy, states: dict[str, Any], generator: torch.Generator | None) -> None:
    """Set the generators from :func:`capture`'s output."""
    for name, state in states.items():
        if name == "torch":
            torch.set_rng_state(state)
        elif name == "generator":
            if generator is not None:
                generator.set_state(state)
        elif name == strategy.root_device.type:
            strategy.accelerator.set_rng_state(state)


def unused_device_types(strategy: Strategy, rng_types: Sequence[str]) -> list[str]:
    """The device generator names in ``rng_types`` that this strategy's hardware does not have."""
    return [name for name in rng_types if name in _DEVICE_TYPES and name != strategy.root_device.type]


def synchronize(strategy: Strategy, rng_types: Sequence[str], generator: torch.Generator | None) -> None:
    """Give every process rank 0's state of the generators in ``rng_types`` (a collective call)."""
    if strategy.world_size == 1 or not rng_types:
        return
    states = capture(strategy, rng_types, generator) if strategy.is_global_zero else None
    restore(strategy, strategy.broadcast(states, src=0), generator)
