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
RNG_TYPES = ("torch", "cuda", "xpu", "mps", "generator")


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


def _device_module(name: str) -> Any:
    module = getattr(torch, name, None)
    if module is None or not module.is_available():
        return None
    return module


def capture(rng_types: Sequence[str], generator: torch.Generator | None) -> dict[str, torch.Tensor]:
    """The states of the generators named in ``rng_types`` (those that exist in this process)."""
    states: dict[str, torch.Tensor] = {}
    for name in rng_types:
        if name == "torch":
            states[name] = torch.get_rng_state()
        elif name == "generator":
            if generator is not None:
                states[name] = generator.get_state()
        else:
            module = _device_module(name)
            if module is not None:
                states[name] = module.get_rng_state()
    return states


def restore(states: dict[str, torch.Tensor], generator: torch.Generator | None) -> None:
    """Set the generators from :func:`capture`'s output."""
    for name, state in states.items():
        if name == "torch":
            torch.set_rng_state(state)
        elif name == "generator":
            if generator is not None:
                generator.set_state(state)
        else:
            module = _device_module(name)
            if module is not None:
                module.set_rng_state(state)


def synchronize(strategy: Strategy, rng_types: Sequence[str], generator: torch.Generator | None) -> None:
    """Give every process rank 0's state of the generators in ``rng_types`` (a collective call)."""
    if strategy.world_size == 1 or not rng_types:
        return
    states = capture(rng_types, generator) if strategy.is_global_zero else None
    restore(strategy.broadcast(states, src=0), generator)
