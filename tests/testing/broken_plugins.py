"""Plugins broken the way real ones are: each has one defect that the conformance kit must name.

Each class says in its docstring what is wrong; tests/testing/test_broken_plugins.py checks that
the kit's report fails the right row, says what went wrong and what to implement.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from drivetrain.accelerators import Accelerator, HPUAccelerator
from drivetrain.plugins import (
    ClusterEnvironment,
    LocalEnvironment,
    MixedPrecision,
    Precision,
    TorchCheckpointIO,
)
from drivetrain.plugins.io import CheckpointIO
from drivetrain.strategies import DDPStrategy, SingleDeviceStrategy


class _TwoDevices(Accelerator):
    """A well-behaved two-device accelerator on the CPU, the base of the broken ones below."""

    @staticmethod
    def parse_devices(devices: Any) -> Any:
        return devices

    @staticmethod
    def get_parallel_devices(devices: Any) -> Any:
        return [torch.device("cpu", index) for index in devices]

    @staticmethod
    def auto_device_count() -> int:
        return 2

    @staticmethod
    def is_available() -> bool:
        return True


class StringDevicesAccelerator(_TwoDevices):
    """get_parallel_devices returns device strings instead of torch.device objects."""

    @staticmethod
    def get_parallel_devices(devices: Any) -> Any:
        return [f"xpu:{index}" for index in devices]


class InstanceMethodAccelerator(_TwoDevices):
    """is_available and auto_device_count are instance methods: drivetrain calls them on the class."""

    def is_available(self) -> bool:  # type: ignore[override]
        return True

    def auto_device_count(self) -> int:  # type: ignore[override]
        return 2


class CountAsTextAccelerator(_TwoDevices):
    """auto_device_count returns the count as a string (read from an environment variable, say)."""

    @staticmethod
    def auto_device_count() -> int:
        return "2"  # type: ignore[return-value]


class ForgetfulHPUAccelerator(HPUAccelerator):
    """Gaudi cards keep a random generator each, but this accelerator forgot the RNG state hooks."""

    def get_rng_state(self) -> Any:
        return None

    def set_rng_state(self, state: Any) -> None:
        pass


class SaveOnlyRNGAccelerator(HPUAccelerator):
    """Saves the card's generator state but never restores it (set_rng_state is not overridden)."""

    set_rng_state = Accelerator.set_rng_state


class GeneratorObjectAccelerator(HPUAccelerator):
    """Returns a torch.Generator object as its state, which checkpoints (weights_only) cannot hold."""

    def get_rng_state(self) -> Any:
        return torch.Generator()

    def set_rng_state(self, state: Any) -> None:
        pass


class NonAtomicCheckpointIO(CheckpointIO):
    """Writes straight into the target file: a crash mid-save leaves a truncated checkpoint."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        torch.save(checkpoint, path)

    def load_checkpoint(self, path: Any, map_location: Any = None, **kwargs: Any) -> dict[str, Any]:
        return torch.load(path, map_location=map_location, weights_only=True)

    def remove_checkpoint(self, path: Any) -> None:
        Path(path).unlink(missing_ok=True)


class KeyDroppingCheckpointIO(TorchCheckpointIO):
    """Leaves the random generators' states out of every checkpoint (to save space, it thought)."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        super().save_checkpoint({k: v for k, v in checkpoint.items() if k != "rng"}, path, storage_options)


class LenientCheckpointIO(TorchCheckpointIO):
    """Returns an empty checkpoint for a path where nothing was saved, so a typo restarts training silently."""

    def load_checkpoint(self, path: Any, map_location: Any = None, **kwargs: Any) -> dict[str, Any]:
        try:
            return super().load_checkpoint(path, map_location, **kwargs)
        except FileNotFoundError:
            return {}


class NoBarrierStrategy(DDPStrategy):
    """DDP whose barrier() returns at once: processes race past each other."""

    def barrier(self, name: str | None = None) -> None:
        pass


class PluginSwallowingStrategy(SingleDeviceStrategy):
    """Takes checkpoint_io= in its constructor but never passes it on: connect() replaces it."""

    def __init__(self, checkpoint_io: Any = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)


class WrongDeclarationStrategy(SingleDeviceStrategy):
    """Declares wraps_models = True, but hands back the module itself."""

    wraps_models = True


class NeverUnscalesPrecision(MixedPrecision):
    """float16 with loss scaling, whose unscale_gradients forgot to divide by the scale."""

    def __init__(self) -> None:
        super().__init__("16-mixed", device="cpu")

    def unscale_gradients(self, optimizer: Any) -> None:
        pass


class ScalerObjectPrecision(MixedPrecision):
    """Puts the GradScaler object itself into checkpoints instead of its state_dict()."""

    def __init__(self) -> None:
        super().__init__("16-mixed", device="cpu")

    def state_dict(self) -> dict[str, Any]:
        return {"scaler": self.scaler}


class StepSwallowingPrecision(Precision):
    """Its optimizer_step forgets to call optimizer.step()."""

    def optimizer_step(self, optimizer: Any, closure: Any = None, **kwargs: Any) -> Any:
        return None


class HalvingPrecision(Precision):
    """Converts the module to float16 but leaves the inputs in float32."""

    def convert_module(self, module: nn.Module) -> nn.Module:
        return module.half()


class WrongWorldSizeEnvironment(LocalEnvironment):
    """A scheduler's environment that reports the processes of its node, not of the job."""

    @property
    def creates_processes_externally(self) -> bool:
        return True

    @property
    def main_address(self) -> str:
        return "127.0.0.1"

    @property
    def main_port(self) -> int:
        import os

        return int(os.environ["KIT_PORT"])

    @staticmethod
    def detect() -> bool:
        return True

    def world_size(self) -> int:
        return 1

    def global_rank(self) -> int:
        import os

        return int(os.environ["KIT_RANK"])

    def local_rank(self) -> int:
        return self.global_rank()

    def node_rank(self) -> int:
        return 0


class UndetectedEnvironment(ClusterEnvironment):
    """Reads its job from variables, but detect() looks for a variable the scheduler never sets."""

    creates_processes_externally = True  # type: ignore[assignment]
    main_address = "127.0.0.1"  # type: ignore[assignment]
    main_port = 29500  # type: ignore[assignment]

    @staticmethod
    def detect() -> bool:
        import os

        return "KIT_JOB_ID" in os.environ

    def world_size(self) -> int:
        import os

        return int(os.environ["KIT_SIZE"])

    def set_world_size(self, size: int) -> None:
        pass

    def global_rank(self) -> int:
        import os

        return int(os.environ["KIT_RANK"])

    def set_global_rank(self, rank: int) -> None:
        pass

    def local_rank(self) -> int:
        return self.global_rank()

    def node_rank(self) -> int:
        return 0
