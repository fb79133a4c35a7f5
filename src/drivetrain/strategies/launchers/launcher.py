"""How the processes of a job are started."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any


class Launcher(ABC):
    """Starts the processes of a job and runs a function in them."""

    #: The function runs only in processes this launcher starts (``torch.multiprocessing``), never in
    #: the caller's: what the ranks change (weights, progress, metrics) must be sent back to it.
    runs_in_spawned_processes: bool = False

    @property
    @abstractmethod
    def is_interactive_compatible(self) -> bool:
        """Whether this launcher works from a notebook or another interactive session."""

    @abstractmethod
    def launch(self, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run ``function(*args, **kwargs)`` in every process; return global rank 0's result."""


class ProcessFailedError(RuntimeError):
    """A rank of the job died; the message names it and says how it ended."""

    def __init__(self, message: str, rank: int | None = None, exit_code: int | None = None) -> None:
        super().__init__(message)
        self.rank = rank
        self.exit_code = exit_code
