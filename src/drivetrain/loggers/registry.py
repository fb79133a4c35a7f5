"""``LoggerRegistry``: the logger names both front doors accept (``"csv"``, ``"tensorboard"``, ``"wandb"``, ``"mlflow"``).

A user's logger registered here works by name everywhere a built-in one does:
``LoggerRegistry.register("mine", MyLogger)``, then ``Trainer(logger="mine")`` or
``Accelerator(log_with="mine")``. Third-party packages register through the
``drivetrain.loggers`` entry-point group.
"""

from __future__ import annotations

from typing import Any

from drivetrain._utilities.registry import Registry

LoggerRegistry: Registry[Any] = Registry(
    "logger",
    entry_point_group="drivetrain.loggers",
    builtin_modules=(
        "drivetrain.loggers.csv_logs",
        "drivetrain.loggers.tensorboard",
        "drivetrain.loggers.wandb",
        "drivetrain.loggers.mlflow",
    ),
)


def logger_kind(logger: object) -> str | None:
    """The registered name of ``logger``'s class (or of the nearest registered base class), if any."""
    by_class = {entry.cls: entry.name for entry in LoggerRegistry.describe()}
    for cls in type(logger).__mro__:
        if cls in by_class:
            return by_class[cls]
    return None
