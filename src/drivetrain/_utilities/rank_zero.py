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


def rank_zero_only(function: F) -> F:
    """Run ``function`` on global rank 0; return ``None`` elsewhere."""

    @functools.wraps(function)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        if global_rank() == 0:
            return function(*args, **kwargs)
        return None

    return wrapped  # type: ignore[return-value]
