"""Experiment loggers: where metrics and hyperparameters go (CSV, TensorBoard, Weights & Biases, MLflow).

``Trainer(logger=...)`` and ``Accelerator(log_with=...)`` take the same names
(:data:`LoggerRegistry`) and instances, resolved by :mod:`drivetrain.loggers.resolve`. The logger
classes are imported on first use, so importing this package stays cheap.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from drivetrain._utilities.lazy import import_submodule, public_submodules
from drivetrain.loggers.logger import Logger

if TYPE_CHECKING:  # pragma: no cover
    from drivetrain.loggers.csv_logs import CSVLogger
    from drivetrain.loggers.mlflow import MLFlowLogger
    from drivetrain.loggers.registry import LoggerRegistry
    from drivetrain.loggers.tensorboard import TensorBoardLogger
    from drivetrain.loggers.wandb import WandbLogger

_LAZY = {
    "CSVLogger": "drivetrain.loggers.csv_logs",
    "LoggerRegistry": "drivetrain.loggers.registry",
    "MLFlowLogger": "drivetrain.loggers.mlflow",
    "TensorBoardLogger": "drivetrain.loggers.tensorboard",
    "WandbLogger": "drivetrain.loggers.wandb",
}

__all__ = ["CSVLogger", "Logger", "LoggerRegistry", "MLFlowLogger", "TensorBoardLogger", "WandbLogger"]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        submodule = import_submodule(__name__, name)
        if submodule is not None:
            return submodule
        raise AttributeError(f"module 'drivetrain.loggers' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__) | public_submodules(__name__))
