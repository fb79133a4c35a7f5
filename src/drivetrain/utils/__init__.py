"""Accelerate-compatible helpers: ``from drivetrain.utils import set_seed`` works like ``accelerate.utils``.

Seeding (and ``SeedableRandomSampler``), the kwargs handlers, the configuration dataclasses and enums, and free collective
functions (which use the live ``drivetrain.Accelerator`` of the process).
"""

from drivetrain.data.seeding import SeedableRandomSampler
from drivetrain.strategies.collective_monitor import CollectiveMismatchError as DistributedOperationException
from drivetrain.utils.configuration import (
    DataLoaderConfiguration,
    DistributedType,
    GradientAccumulationPlugin,
    LoggerType,
    PrecisionType,
    ProjectConfiguration,
    RNGType,
)
from drivetrain.utils.kwargs_handlers import (
    AutocastKwargs,
    DDPCommunicationHookType,
    DistributedDataParallelKwargs,
    GradScalerKwargs,
    InitProcessGroupKwargs,
    KwargsHandler,
)
from drivetrain.utils.operations import (
    broadcast,
    broadcast_object_list,
    gather,
    gather_object,
    pad_across_processes,
    reduce,
    send_to_device,
    set_seed,
    wait_for_everyone,
)

__all__ = [
    "AutocastKwargs",
    "DDPCommunicationHookType",
    "DataLoaderConfiguration",
    "DistributedDataParallelKwargs",
    "DistributedOperationException",
    "DistributedType",
    "GradScalerKwargs",
    "GradientAccumulationPlugin",
    "InitProcessGroupKwargs",
    "KwargsHandler",
    "LoggerType",
    "PrecisionType",
    "ProjectConfiguration",
    "RNGType",
    "SeedableRandomSampler",
    "broadcast",
    "broadcast_object_list",
    "gather",
    "gather_object",
    "pad_across_processes",
    "reduce",
    "send_to_device",
    "set_seed",
    "wait_for_everyone",
]
