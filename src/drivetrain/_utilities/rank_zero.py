"""Print, warn and log from one process only.

The rank is read once from the variables every launcher we support sets, so that messages
emitted before a process group exists still come from rank 0 alone.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

_RANK_VARIABLES = ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "JSM_NAMESPACE_RANK")


def _rank_from_environment() -> int:
    for name in _RANK_VARIABLES:
        value = os.environ.get(name)
        if value is not None and value.strip().isdigit():
            return int(value)
    return 0


def global_rank() -> int:
    """This process's global rank as the launcher announced it (0 when none did)."""
    return _rank_from_environment()


class RankZeroOnly:
    """``@rank_zero_only``: run a function on global rank 0 only (Lightning's ``rank_zero_only``).

    Elsewhere the call does nothing and returns ``default`` (``None`` unless given:
    ``rank_zero_only(fn, default=...)``). Public as ``drivetrain.trainer.rank_zero_only``.

    ``rank_zero_only.rank`` is this process's global rank as its launcher announced it; setting it
    (as Lightning's tests do to act as another rank) overrides that for the decorated functions.

    Example:
        >>> from drivetrain.trainer import rank_zero_only
        >>> @rank_zero_only
        ... def report(message):
        ...     print(message)
    """

    def __init__(self) -> None:
        self._rank: int | None = None

    @property
    def rank(self) -> int:
        return self._rank if self._rank is not None else global_rank()

    @rank.setter
    def rank(self, value: int | None) -> None:  # None: the launcher's again
        self._rank = value

    def __call__(self, function: F, default: Any = None) -> F:
        @functools.wraps(function)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            if self.rank == 0:
                return function(*args, **kwargs)
            return default

        return wrapped  # type: ignore[return-value]

    def __repr__(self) -> str:
        return "rank_zero_only"


rank_zero_only = RankZeroOnly()
"""Run the decorated function on global rank 0 only; elsewhere return ``default`` (``None``): see :class:`RankZeroOnly`."""
