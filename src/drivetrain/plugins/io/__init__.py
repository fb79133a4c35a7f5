"""Checkpoint IO plugins: how a checkpoint dict reaches storage and comes back."""

from drivetrain.plugins.io.async_io import AsyncCheckpointIO
from drivetrain.plugins.io.checkpoint_io import CheckpointIO
from drivetrain.plugins.io.safe_loading import DamagedCheckpointError, UnsafeCheckpointError
from drivetrain.plugins.io.torch_io import TorchCheckpointIO

__all__ = [
    "AsyncCheckpointIO",
    "CheckpointIO",
    "DamagedCheckpointError",
    "TorchCheckpointIO",
    "UnsafeCheckpointError",
]
