"""Strategies: how model, optimizers and data are distributed, and the collectives between processes.

Each name is imported on first use (the registry imports the built-in strategies on its first
lookup), so importing one strategy module does not import DDP, FSDP, DeepSpeed, XLA or HPU.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from drivetrain._utilities.lazy import lazy_exports

if TYPE_CHECKING:  # pragma: no cover - what type checkers and IDEs see for the lazy names below
    from drivetrain.plugins.io.checkpoint_io import CheckpointIO
    from drivetrain.strategies.ddp import DDPStrategy
    from drivetrain.strategies.deepspeed import DeepSpeedStrategy
    from drivetrain.strategies.fsdp import FSDPStrategy
    from drivetrain.strategies.hpu import HPUParallelStrategy, SingleHPUStrategy
    from drivetrain.strategies.layout import ParallelismConfig, ParallelLayout
    from drivetrain.strategies.model_parallel import ModelParallelStrategy
    from drivetrain.strategies.parallel import ParallelStrategy
    from drivetrain.strategies.registry import StrategyRegistry
    from drivetrain.strategies.single_device import SingleDeviceStrategy
    from drivetrain.strategies.single_xla import SingleDeviceXLAStrategy
    from drivetrain.strategies.strategy import Strategy
    from drivetrain.strategies.xla import XLAStrategy

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "CheckpointIO": "drivetrain.plugins.io.checkpoint_io",
        "DDPStrategy": "drivetrain.strategies.ddp",
        "DeepSpeedStrategy": "drivetrain.strategies.deepspeed",
        "FSDPStrategy": "drivetrain.strategies.fsdp",
        "HPUParallelStrategy": "drivetrain.strategies.hpu",
        "ModelParallelStrategy": "drivetrain.strategies.model_parallel",
        "ParallelLayout": "drivetrain.strategies.layout",
        "ParallelismConfig": "drivetrain.strategies.layout",
        "ParallelStrategy": "drivetrain.strategies.parallel",
        "SingleDeviceStrategy": "drivetrain.strategies.single_device",
        "SingleDeviceXLAStrategy": "drivetrain.strategies.single_xla",
        "SingleHPUStrategy": "drivetrain.strategies.hpu",
        "Strategy": "drivetrain.strategies.strategy",
        "StrategyRegistry": "drivetrain.strategies.registry",
        "XLAStrategy": "drivetrain.strategies.xla",
    },
)

__all__ = [
    "CheckpointIO",
    "DDPStrategy",
    "DeepSpeedStrategy",
    "FSDPStrategy",
    "HPUParallelStrategy",
    "ModelParallelStrategy",
    "ParallelLayout",
    "ParallelStrategy",
    "ParallelismConfig",
    "SingleDeviceStrategy",
    "SingleDeviceXLAStrategy",
    "SingleHPUStrategy",
    "Strategy",
    "StrategyRegistry",
    "XLAStrategy",
]
