"""The MPS accelerator: the GPU of Apple silicon Macs through ``torch.mps``."""

from __future__ import annotations

import platform
from typing import Any

import torch

from drivetrain.accelerators.accelerator import Accelerator
from drivetrain.accelerators.devices import parse_device_indices


class MPSAccelerator(Accelerator):
    """Runs on the one GPU of an Apple silicon Mac.

    Intel Macs with an AMD GPU can also report MPS, but training there is slower than on the CPU
    and misses operators, so only Apple silicon counts as available.
    """

    @staticmethod
    def parse_devices(devices: Any) -> list[int]:
        """``[0]`` for 1, -1, ``"auto"``, ``[0]`` or ``"0,"``; anything asking for more is an error."""
        return parse_device_indices(devices, visible=MPSAccelerator.auto_device_count(), accelerator="mps")

    @staticmethod
    def get_parallel_devices(devices: Any) -> list[torch.device]:
        """``torch.device("mps", i)`` for each index (an int ``n`` means indices ``0..n-1``)."""
        indices = range(devices) if isinstance(devices, int) else devices
        return [torch.device("mps", index) for index in indices]

    @staticmethod
    def auto_device_count() -> int:
        """1 where MPS is available, 0 elsewhere."""
        return 1 if MPSAccelerator.is_available() else 0

    @staticmethod
    def is_available() -> bool:
        """Whether this is Apple silicon and torch can use its GPU."""
        return _is_apple_silicon() and torch.backends.mps.is_available()

    def setup_device(self, device: torch.device) -> None:
        """Check that ``device`` is the MPS device; there is only one, so nothing to select."""
        _mps_device(device, "setup_device")

    def teardown(self) -> None:
        """Give cached, unused GPU memory back to the system."""
        self.empty_cache()

    def empty_cache(self) -> None:
        """Give cached, unused GPU memory back to the system."""
        if MPSAccelerator.is_available():
            torch.mps.empty_cache()

    def synchronize(self, device: torch.device | None = None) -> None:
        """Wait for the kernels queued on the GPU (there is one, so ``device`` only names it)."""
        torch.mps.synchronize()

    def get_rng_state(self) -> torch.Tensor | None:
        """The GPU's generator state (``None`` where MPS is not available)."""
        if not MPSAccelerator.is_available():
            return None
        return torch.mps.get_rng_state()

    def set_rng_state(self, state: torch.Tensor | None) -> None:
        """Restore :meth:`get_rng_state`'s state."""
        if state is not None:
            torch.mps.set_rng_state(state)

    def get_device_stats(self, device: torch.device | str) -> dict[str, Any]:
        """Memory figures of the MPS allocator.

        Returns:
            ``mps_allocated_bytes`` (held by tensors), ``mps_driver_allocated_bytes`` (all the Metal
            driver holds for this process, caches included) and ``mps_recommended_max_bytes`` (the
            working-set size Metal recommends).
        """
        _mps_device(device, "get_device_stats")
        return {
            "mps_allocated_bytes": torch.mps.current_allocated_memory(),
            "mps_driver_allocated_bytes": torch.mps.driver_allocated_memory(),
            "mps_recommended_max_bytes": torch.mps.recommended_max_memory(),
        }

    @classmethod
    def register_accelerators(cls, accelerator_registry: Any) -> None:
        """Register as ``"mps"``."""
        accelerator_registry.register("mps", cls, description="The GPU of Apple silicon Macs (Metal).")

    @classmethod
    def unavailable_reason(cls) -> str:
        if not _is_apple_silicon():
            return f"MPS needs an Apple silicon Mac; this is {platform.system()} on {platform.machine()}"
        return "torch.backends.mps.is_available() is False"


def _is_apple_silicon() -> bool:
    return platform.system() == "Darwin" and platform.machine() == "arm64"


def _mps_device(device: torch.device | str | int, method: str) -> torch.device:
    device = torch.device("mps", device) if isinstance(device, int) else torch.device(device)
    if device.type != "mps":
        raise ValueError(
            f"MPSAccelerator.{method} got device={device!r}, which is not the MPS device. "
            f"Pass torch.device('mps'), or use the accelerator that matches the device."
        )
    return device
