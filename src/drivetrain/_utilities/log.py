"""Library messages through stdlib ``logging``, under the ``drivetrain`` logger, from rank 0 by default.

Every drivetrain module logs with ``get_logger(__name__)``; users get the same tool from
:func:`drivetrain.logging.get_logger`. What they can rely on:

* **Levels**: ``logging.getLogger("drivetrain").setLevel(logging.WARNING)`` silences the info
  messages (checkpoint saved, early stopping, model summary); ``"drivetrain.trainer"`` and other
  sub-loggers work the same way. Unless set, the ``drivetrain`` logger's level is INFO.
* **Ranks**: a message is emitted on global rank 0 only, unless the call passes
  ``main_process_only=False`` or the environment sets ``DRIVETRAIN_LOG_ALL_RANKS=1`` (for every
  library message, on every rank; each line then starts with ``[rank N]``).
* **Output**: while the application has not configured logging (the root logger has no handler),
  messages go to stderr through a handler of the ``drivetrain`` logger that writes above the
  progress bar instead of through it. Once the root logger has handlers (``logging.basicConfig``,
  pytest's capture, a framework), drivetrain's handler stays quiet and the records reach those
  handlers as usual.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
from typing import Any

from drivetrain._utilities import console
from drivetrain._utilities.rank_zero import global_rank

LIBRARY_LOGGER = "drivetrain"
ALL_RANKS_VARIABLE = "DRIVETRAIN_LOG_ALL_RANKS"


def all_ranks_requested() -> bool:
    """Whether ``DRIVETRAIN_LOG_ALL_RANKS`` asks for library messages from every rank."""
    return os.environ.get(ALL_RANKS_VARIABLE, "").strip().lower() in ("1", "true", "yes", "on")


def _world_size() -> int:
    # The launching process (rank 0 of a re-run script) has a process group but no WORLD_SIZE variable.
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return int(dist.get_world_size())
    value = os.environ.get("WORLD_SIZE", "")
    return int(value) if value.strip().isdigit() else 1


class ConsoleHandler(logging.Handler):
    """drivetrain's default output: stderr, above any progress bar; quiet once the application configures logging."""

    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(logging.Formatter("%(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        if logging.getLogger().handlers:
            return  # the record propagates to the application's handlers, which print it their way
        try:
            console.write(self.format(record) + "\n")
        except Exception:
            self.handleError(record)


@functools.cache
def _install_default_output() -> None:
    library = logging.getLogger(LIBRARY_LOGGER)
    if library.level == logging.NOTSET:
        library.setLevel(logging.INFO)
    if not any(isinstance(handler, ConsoleHandler) for handler in library.handlers):
        library.addHandler(ConsoleHandler())


class MultiProcessAdapter(logging.LoggerAdapter):
    """A logger that knows about ranks: ``log(level, msg, main_process_only=True, in_order=False)``.

    ``main_process_only=True`` (the default) emits on global rank 0 only; ``False`` on every rank,
    with a ``[rank N]`` prefix in multi-process runs. ``in_order=True`` lets the ranks emit one
    after another (rank 0 first), waiting for each other; every rank must make the call.
    The same keywords work with ``debug``, ``info``, ``warning``, ``error``, ``critical`` and
    ``exception``.
    """

    def log(self, level: int, msg: object, *args: Any, **kwargs: Any) -> None:
        self._dispatch(level, msg, args, kwargs)

    def debug(self, msg: object, *args: Any, **kwargs: Any) -> None:
        self._dispatch(logging.DEBUG, msg, args, kwargs)

    def info(self, msg: object, *args: Any, **kwargs: Any) -> None:
        self._dispatch(logging.INFO, msg, args, kwargs)

    def warning(self, msg: object, *args: Any, **kwargs: Any) -> None:
        self._dispatch(logging.WARNING, msg, args, kwargs)

    def error(self, msg: object, *args: Any, **kwargs: Any) -> None:
        self._dispatch(logging.ERROR, msg, args, kwargs)

    def exception(self, msg: object, *args: Any, exc_info: Any = True, **kwargs: Any) -> None:
        self._dispatch(logging.ERROR, msg, args, {**kwargs, "exc_info": exc_info})

    def critical(self, msg: object, *args: Any, **kwargs: Any) -> None:
        self._dispatch(logging.CRITICAL, msg, args, kwargs)

    @functools.cache  # noqa: B019 - one warning per message for the logger's lifetime
    def warning_once(self, msg: str, *args: Any) -> None:
        """:meth:`warning`, once per distinct message (as Accelerate's and transformers' loggers offer)."""
        self._dispatch(logging.WARNING, msg, args, {})

    def _dispatch(self, level: int, msg: object, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        main_process_only = kwargs.pop("main_process_only", True)
        in_order = kwargs.pop("in_order", False)
        if not self.isEnabledFor(level):
            return
        everywhere = not main_process_only or all_ranks_requested()
        rank = global_rank()
        if everywhere and _world_size() > 1:
            msg = f"[rank {rank}] {msg}"
        # Without a stacklevel the record names the user's line, 3 frames above logger.log (public
        # method, here, there). A stacklevel given counts from this adapter's method, as Accelerate's
        # adapter counts (its log() is frame 1): a wrapper passing stacklevel=3 names its caller's line.
        given = kwargs.get("stacklevel")
        kwargs["stacklevel"] = 3 if given is None else given + 1
        if in_order and everywhere:
            _in_rank_order(functools.partial(self.logger.log, level, msg, *args, **kwargs))
        elif everywhere or rank == 0:
            self.logger.log(level, msg, *args, **kwargs)


def _in_rank_order(emit: Any) -> None:
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        emit()
        return
    for turn in range(dist.get_world_size()):
        if turn == dist.get_rank():
            emit()
        dist.barrier()


def get_logger(name: str, log_level: str | int | None = None) -> MultiProcessAdapter:
    """A rank-aware logger for ``name`` (use ``__name__``); ``log_level`` sets its level.

    Args:
        name: the logger's name; under ``drivetrain.`` it follows the ``drivetrain`` logger's level.
        log_level: a level for this logger (``"INFO"``, ``logging.DEBUG`` …); ``None`` leaves it as it is.
    """
    _install_default_output()
    logger = logging.getLogger(name)
    if log_level is not None:
        logger.setLevel(log_level.upper() if isinstance(log_level, str) else log_level)
    return MultiProcessAdapter(logger, {})
