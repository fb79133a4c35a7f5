"""Accelerate's ``accelerate.tracking``: ``from drivetrain.tracking import GeneralTracker`` works like it.

Write your own tracker by subclassing :class:`GeneralTracker` and pass an instance in
``Accelerator(log_with=[MyTracker(...)])``. The built-in trackers are faces of drivetrain's loggers
(:mod:`drivetrain.loggers.trackers`).
"""

from drivetrain.loggers.logger import Logger
from drivetrain.loggers.registry import LoggerRegistry
from drivetrain.loggers.trackers import (
    LOGGER_TYPE_TO_CLASS,
    GeneralTracker,
    LoggerTracker,
    MLflowTracker,
    TensorBoardTracker,
    WandBTracker,
    on_main_process,
    register_tracker_class,
)


def get_available_trackers() -> list[str]:
    """The names of the trackers whose packages are installed here (Accelerate's function)."""

    available = []
    for name in LOGGER_TYPE_TO_CLASS:
        cls = LoggerRegistry.entry(name).cls if name in LoggerRegistry else None
        if isinstance(cls, type) and issubclass(cls, Logger) and not cls.is_available():
            continue
        available.append(name)
    return available


__all__ = [
    "LOGGER_TYPE_TO_CLASS",
    "GeneralTracker",
    "LoggerTracker",
    "MLflowTracker",
    "TensorBoardTracker",
    "WandBTracker",
    "get_available_trackers",
    "on_main_process",
    "register_tracker_class",
]
