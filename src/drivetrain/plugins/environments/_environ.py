"""Reading launcher variables strictly, and the helpers every cluster environment shares.

A garbled variable (``RANK=abc``) is a ``ValueError`` that names the variable and its value,
raised when the value is first asked for — never a silent fallback to a default.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from drivetrain.plugins.environments.cluster_environment import ClusterEnvironment

# Ports derived from a job id fall in [_DERIVED_PORT_MIN, _DERIVED_PORT_MAX]: above the
# well-known and common service ports, and below Linux's default ephemeral range (32768-60999),
# so that a derived port rarely collides with an outgoing connection's local port.
_DERIVED_PORT_MIN = 10000
_DERIVED_PORT_MAX = 32767


def parent_at_start() -> int:
    """The process that started (or forked) this one, as seen when drivetrain was first imported here."""
    import drivetrain

    return drivetrain._started_by[0]


def is_set(name: str) -> bool:
    """Whether ``name`` is present in the environment (even if empty)."""
    return name in os.environ


def get_str(name: str) -> str | None:
    """The value of ``name`` with surrounding whitespace removed, or ``None`` when unset."""
    value = os.environ.get(name)
    return None if value is None else value.strip()


def require_str(name: str, *, who: str) -> str:
    """The non-empty value of ``name``; ``ValueError`` naming ``who`` expected it otherwise."""
    value = get_str(name)
    if not value:
        state = "is not set" if value is None else "is empty"
        raise ValueError(f"{who} expected the environment variable {name} to hold a value, but it {state}.")
    return value


def parse_int(name: str, value: str, *, minimum: int = 0, maximum: int | None = None) -> int:
    """Parse ``value`` (read from variable ``name``) as an integer in ``[minimum, maximum]``."""
    try:
        number = int(value.strip())
    except ValueError:
        raise ValueError(
            f"The environment variable {name}={value!r} is not an integer; it must be a whole number "
            f">= {minimum}. Check the launcher or job script that sets it."
        ) from None
    if number < minimum or (maximum is not None and number > maximum):
        allowed = f">= {minimum}" if maximum is None else f"between {minimum} and {maximum}"
        raise ValueError(
            f"The environment variable {name}={value!r} is out of range; it must be {allowed}. "
            "Check the launcher or job script that sets it."
        )
    return number


def get_int(name: str, *, minimum: int = 0, maximum: int | None = None) -> int | None:
    """The integer value of ``name``, or ``None`` when unset; ``ValueError`` when garbled."""
    value = os.environ.get(name)
    if value is None:
        return None
    return parse_int(name, value, minimum=minimum, maximum=maximum)


def require_int(name: str, *, who: str, minimum: int = 0, maximum: int | None = None) -> int:
    """The integer value of ``name``; ``ValueError`` when it is unset or garbled."""
    value = os.environ.get(name)
    if value is None:
        raise ValueError(f"{who} expected the environment variable {name} to be set, but it is not.")
    return parse_int(name, value, minimum=minimum, maximum=maximum)


def get_port(name: str) -> int | None:
    """A TCP port (1-65535) from ``name``, or ``None`` when unset."""
    return get_int(name, minimum=1, maximum=65535)


def port_from_job_id(job_id: str) -> int:
    """A port every process of one job computes identically from the job's id.

    The port is ``10000 + crc32(job_id) % 22768``, i.e. within 10000-32767. CRC32 (not
    ``hash()``, which is salted per process) keeps it identical across processes and hosts;
    two jobs sharing a node collide with probability about 1 in 22768 — set ``MASTER_PORT`` to
    choose the port yourself.
    """
    span = _DERIVED_PORT_MAX - _DERIVED_PORT_MIN + 1
    return _DERIVED_PORT_MIN + zlib.crc32(job_id.encode()) % span


def check_fixed(what: str, requested: int, actual: int, *, source: str, fix: str) -> None:
    """Refuse to change a value the launcher fixed (setters of externally launched environments).

    Args:
        what: The quantity, e.g. ``"world size"``.
        requested: The value a caller tried to set.
        actual: The value the launcher announced.
        source: Where ``actual`` comes from, e.g. ``"WORLD_SIZE=4 (set by torchrun)"``.
        fix: How to get ``requested`` instead.
    """
    if requested != actual:
        raise ValueError(
            f"Cannot set the {what} to {requested}: the launcher fixed it at {actual} ({source}). {fix}"
        )


def check_world_size_arg(size: int) -> None:
    """``ValueError`` unless ``size`` is an int >= 1 (argument of ``set_world_size``)."""
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"The world size must be an integer >= 1, got {size!r}.")


def check_rank_arg(rank: int) -> None:
    """``ValueError`` unless ``rank`` is an int >= 0 (argument of ``set_global_rank``)."""
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
        raise ValueError(f"The global rank must be an integer >= 0, got {rank!r}.")


def describe(**getters: Callable[[], object]) -> str:
    """``name=value, ...`` for a ``__repr__``; a getter that raises shows ``<invalid>``.

    A repr must never raise, even when a variable is garbled; the getter raises when used.
    """
    parts = []
    for name, getter in getters.items():
        try:
            value: object = getter()
        except ValueError:
            value = "<invalid>"
        parts.append(f"{name}={value!r}")
    return ", ".join(parts)


def environment_repr(environment: ClusterEnvironment, **extra: Callable[[], object]) -> str:
    """``Name(world_size=..., global_rank=..., local_rank=..., node_rank=..., **extra)``."""
    facts = describe(
        world_size=environment.world_size,
        global_rank=environment.global_rank,
        local_rank=environment.local_rank,
        node_rank=environment.node_rank,
        **extra,
    )
    return f"{type(environment).__name__}({facts})"
