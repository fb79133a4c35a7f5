"""The Intel XPU accelerator: Intel GPUs through ``torch.xpu``.

A user class registering ``"xpu"`` (as the seeds' custom-accelerator example does) replaces this
built-in, with a warning; ``XPUAccelerator`` from this module stays importable.
"""

from __future__ import annotations

from typing import Any

import torch

from drivetrain.accelerators.accelerator import Accelerator
from drivetrain.accelerators.devices import parse_device_indices


class XPUAccelerator(Accelerator):
    """Runs on Intel GPUs.

    ``devices`` selects GPUs by count or by index, as for CUDA. ``torch.xpu.device_count()``
    counts through Level Zero Sysman where it can, without initialising the XPU runtime.
    """

    @staticmethod
    def parse_devices(devices: Any) -> list[int]:
        """The XPU indices to use, checked against the visible devices."""
        return parse_device_indices(devices, visible=XPUAccelerator.auto_device_count(), accelerator="xpu")

    @staticmethod
    def get_parallel_devices(devices: Any) -> list[torch.device]:
        """``torch.device("xpu", i)`` for each index (an int ``n`` means indices ``0..n-1``)."""
        indices = range(devices) if isinstance(devices, int) else devices
        return [torch.device("xpu", index) for index in indices]

    @staticmethod
    def auto_device_count() -> int:
        """The number of visible Intel GPUs."""
        return torch.xpu.device_count()

    @staticmethod
    def is_available() -> bool:
        """Whether at least one Intel GPU is visible."""
        return torch.xpu.is_available()

    def setup_device(self, device: torch.device) -> None:
        """Make ``device`` the current XPU device of this process."""
        torch.xpu.set_device(_xpu_device(device, "setup_device"))

    def teardown(self) -> None:
        """Give cached, unused device memory back (a no-op before the XPU runtime started)."""
        self.empty_cache()

    def empty_cache(self) -> None:
        """Give cached, unused device memory back (a no-op before the XPU runtime started)."""
        torch.xpu.empty_cache()

    def synchronize(self, device: torch.device | None = None) -> None:
        """Wait for the kernels queued on ``device`` (the current XPU when ``None``)."""
        torch.xpu.synchronize(device)

    def get_rng_state(self) -> list[torch.Tensor] | None:
        """Every visible XPU's generator state; ``None`` while the XPU runtime has not started."""
        if not torch.xpu.is_initialized():
            return None
        return torch.xpu.get_rng_state_all()

    def set_rng_state(self, state: list[torch.Tensor] | None) -> None:
        """Restore :meth:`get_rng_state`'s states, device by device (extra ones are ignored)."""
        if state is None:
            return
        for index, device_state in enumerate(state[: torch.xpu.device_count()]):
            torch.xpu.set_rng_state(device_state, index)

    def get_device_stats(self, device: torch.device | str) -> dict[str, Any]:
        """The caching allocator's statistics for ``device`` plus a few named figures.

        Returns:
            Every entry of ``torch.xpu.memory_stats(device)`` (flat keys such as
            ``"allocated_bytes.all.current"``), plus ``memory_allocated_bytes``,
            ``memory_reserved_bytes`` and ``max_memory_allocated_bytes``.
        """
        device = _xpu_device(device, "get_device_stats")
        stats: dict[str, Any] = dict(torch.xpu.memory_stats(device))
        stats["memory_allocated_bytes"] = stats.get("allocated_bytes.all.current", 0)
        stats["memory_reserved_bytes"] = stats.get("reserved_bytes.all.current", 0)
        stats["max_memory_allocated_bytes"] = stats.get("allocated_bytes.all.peak", 0)
        return stats

    @classmethod
    def register_accelerators(cls, accelerator_registry: Any) -> None:
        """Register as ``"xpu"``."""
        accelerator_registry.register("xpu", cls, description="Intel GPUs through torch.xpu.")

    @classmethod
    def unavailable_reason(cls) -> str:
        return (
            "torch.xpu.is_available() is False: no Intel GPU is visible, or this torch build "
            f"({torch.__version__}) has no XPU support"
        )


def _xpu_device(device: torch.device | str | int, method: str) -> torch.device:
    device = torch.device("xpu", device) if isinstance(device, int) else torch.device(device)
    if device.type != "xpu":
        raise ValueError(
            f"XPUAccelerator.{method} got device={device!r}, which is not an XPU device. "
            f"Pass torch.device('xpu', index), or use the accelerator that matches the device."
        )
    return device
