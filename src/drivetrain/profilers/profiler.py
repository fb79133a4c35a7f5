"""The profiler interface: ``start``/``stop`` an action by name, a ``summary`` at the end."""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from drivetrain._utilities.log import get_logger

log = get_logger(__name__)


class Profiler(ABC):
    """Base class of the profilers: times named actions of a run.

    The Trainer calls :meth:`setup` when an entry point starts in a process, :meth:`start` and
    :meth:`stop` around each action it profiles (hooks, ``training_step``, ``backward``,
    ``optimizer_step``, data fetches …), then :meth:`describe` and :meth:`teardown` when the
    entry point ends. Your own code can time its parts with ``with trainer.profiler.profile("name"):``.

    Args:
        dirpath: folder for the report file (default: the Trainer's ``log_dir`` when ``filename`` is set).
        filename: write the report to ``{dirpath}/{stage}-{filename}.txt`` (one file per process in
            a multi-process run, ``-rank{N}`` added) instead of logging it on rank 0.
    """

    def __init__(self, dirpath: str | Path | None = None, filename: str | None = None) -> None:
        if filename is not None and (not isinstance(filename, str) or not filename):
            raise ValueError(f"filename={filename!r}; use a non-empty file name (without extension) or None.")
        self.dirpath = os.fspath(dirpath) if dirpath is not None else None
        self.filename = filename
        self._stage: str | None = None
        self._rank = 0
        self._world_size = 1

    @abstractmethod
    def start(self, action_name: str) -> None:
        """Begin recording ``action_name``."""

    @abstractmethod
    def stop(self, action_name: str) -> None:
        """End recording ``action_name``."""

    def summary(self) -> str:
        """The report of what was recorded since :meth:`setup`."""
        return ""

    @contextmanager
    def profile(self, action_name: str) -> Iterator[None]:
        """Record the block as ``action_name``."""
        self.start(action_name)
        try:
            yield
        finally:
            self.stop(action_name)

    def setup(
        self, stage: str, global_rank: int = 0, world_size: int = 1, log_dir: str | None = None
    ) -> None:
        """Called in each process when an entry point (``stage``: fit, validate …) starts."""
        self._stage = stage
        self._rank = global_rank
        self._world_size = world_size
        if self.dirpath is None and self.filename is not None:
            self.dirpath = log_dir

    def teardown(self, stage: str | None) -> None:
        """Called in each process when the entry point has ended (after :meth:`describe`)."""

    def output_path(self, extension: str = ".txt") -> Path | None:
        """Where this process's report goes, or ``None`` when it is logged instead."""
        if self.filename is None or self.dirpath is None:
            return None
        rank = f"-rank{self._rank}" if self._world_size > 1 else ""
        return Path(self.dirpath) / f"{self._stage or 'run'}-{self.filename}{rank}{extension}"

    def describe(self) -> None:
        """Write the summary to the report file, or log it (INFO, rank 0) when there is none."""
        text = self.summary()
        if not text:
            return
        path = self.output_path()
        if path is None:
            log.info(text)
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as stream:
            stream.write(text + "\n")


class PassThroughProfiler(Profiler):
    """Records nothing: what ``trainer.profiler`` is when no profiler was asked for."""

    def start(self, action_name: str) -> None:
        pass

    def stop(self, action_name: str) -> None:
        pass
