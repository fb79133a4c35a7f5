"""Strategies: how model, optimizers and data are distributed, and the collectives between processes.

The sharded (FSDP, DeepSpeed) and XLA strategies are imported on first use of their names or of
the registry, so importing this package stays cheap.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from drivetrain.plugins.io.checkpoint_io import CheckpointIO
from drivetrain.strategies.ddp import DDPStrategy
from drivetrain.strategies.parallel import ParallelStrategy
from drivetrain.strategies.registry import StrategyRegistry
from drivetrain.strategies.single_device import SingleDeviceStrategy
from drivetrain.strategies.strategy import Strategy

if TYPE_CHECKING:  # pragma: no cover
    from drivetrain.strategies.deepspeed import DeepSpeedStrategy
    from drivetrain.strategies.fsdp import FSDPStrategy
    from drivetrain.strategies.xla import XLAStrategy

_LAZY = {
    "DeepSpeedStrategy": "drivetrain.strategies.deepspeed",
    "FSDPStrategy": "drivetrain.strategies.fsdp",
    "XLAStrategy": "drivetrain.strategies.xla",
}

__all__ = [
    "CheckpointIO",
    "DDPStrategy",
    "DeepSpeedStrategy",
    "FSDPStrategy",
    "ParallelStrategy",
    "SingleDeviceStrategy",
    "Strategy",
    "StrategyRegistry",
    "XLAStrategy",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'drivetrain.strategies' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
