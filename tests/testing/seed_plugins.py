"""The seeds' own extension examples, as a plugin author's module would hold them.

* ``XPUAccelerator``: the custom accelerator of the accelerator seed, verbatim, on the fictional
  ``xpulib`` (a stand-in here: tests/testing/stand_in_libs/xpulib.py). It registers ``"xpu"``,
  replacing drivetrain's built-in Intel XPU accelerator (with a warning, at import).
* ``CustomDDPStrategy``: the strategy seed's DDP subclass with its own DDP wrapper and ``setup``.
* ``CustomCheckpointIO`` and the preset ``"ddp_custom_checkpoint_io"``: the strategy registry seed's
  DDP strategy registered with a custom checkpoint IO.
"""
# ruff: noqa: UP006, UP035, F541

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, Union

import torch
import xpulib
from torch.nn.parallel import DistributedDataParallel

from drivetrain.accelerators import Accelerator
from drivetrain.plugins import TorchCheckpointIO
from drivetrain.strategies import DDPStrategy, StrategyRegistry


class XPUAccelerator(Accelerator):
    """Support for a hypothetical XPU, optimized for large-scale machine learning."""

    @staticmethod
    def parse_devices(devices: Any) -> Any:
        # Put parsing logic here how devices can be passed into the Trainer
        # via the `devices` argument
        return devices

    @staticmethod
    def get_parallel_devices(devices: Any) -> Any:
        # Here, convert the device indices to actual device objects
        return [torch.device("xpu", idx) for idx in devices]

    @staticmethod
    def auto_device_count() -> int:
        # Return a value for auto-device selection when `Trainer(devices="auto")`
        return xpulib.available_devices()

    @staticmethod
    def is_available() -> bool:
        return xpulib.is_available()

    def get_device_stats(self, device: Union[str, torch.device]) -> Dict[str, Any]:
        # Return optional device statistics for loggers
        return {}

    @classmethod
    def register_accelerators(cls, accelerator_registry):
        accelerator_registry.register(
            "xpu",
            cls,
            description=f"XPU Accelerator - optimized for large-scale machine learning.",
        )


class MyCustomDistributedDataParallel(DistributedDataParallel):
    """The seed's own DDP wrapper (communication hooks, bucketing … would go here)."""


class CustomDDPStrategy(DDPStrategy):
    def configure_ddp(self):
        self.model = MyCustomDistributedDataParallel(
            self.model,
            device_ids=None,
        )

    def setup(self, trainer=None):
        # you can access the accelerator and plugins directly
        self.accelerator.setup()
        self.precision_plugin.connect(self.model, None, None)


class CustomCheckpointIO(TorchCheckpointIO):
    """The seed's custom checkpoint IO: writes as the built-in one does (atomically), and counts its saves."""

    saves = 0

    def save_checkpoint(
        self, checkpoint: Dict[str, Any], path: Union[str, Path], storage_options: Any = None
    ) -> None:
        type(self).saves += 1
        super().save_checkpoint(checkpoint, path, storage_options)

    def load_checkpoint(
        self, path: Union[str, Path], map_location: Any = None, **kwargs: Any
    ) -> Dict[str, Any]:
        return super().load_checkpoint(path, map_location, **kwargs)


custom_checkpoint_io = CustomCheckpointIO()

# Register the DDP Strategy with your custom CheckpointIO plugin
StrategyRegistry.register(
    "ddp_custom_checkpoint_io",
    DDPStrategy,
    description="DDP Strategy with custom checkpoint io plugin",
    checkpoint_io=custom_checkpoint_io,
)
