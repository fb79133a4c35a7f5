"""Strategies: how model, optimizers and data are distributed, and the collectives between processes."""

from drivetrain.plugins.io.checkpoint_io import CheckpointIO
from drivetrain.strategies.ddp import DDPStrategy
from drivetrain.strategies.deepspeed import DeepSpeedStrategy
from drivetrain.strategies.fsdp import FSDPStrategy
from drivetrain.strategies.parallel import ParallelStrategy
from drivetrain.strategies.registry import StrategyRegistry
from drivetrain.strategies.single_device import SingleDeviceStrategy
from drivetrain.strategies.strategy import Strategy
from drivetrain.strategies.xla import XLAStrategy

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
