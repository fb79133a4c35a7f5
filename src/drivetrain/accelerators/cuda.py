"""The CUDA accelerator: NVIDIA (and ROCm) GPUs through ``torch.cuda``."""

from __future__ import annotations

from typing import Any

import torch

from drivetrain.accelerators.accelerator import Accelerator
from drivetrain.accelerators.devices import parse_device_indices

#: The share of a GPU's memory ``strategy="auto"`` lets the training state take under DDP; the rest
#: is left for activations, the CUDA context and the allocator's workspace.
TRAINING_MEMORY_FRACTION = 0.8


class CUDAAccelerator(Accelerator):
    """Runs on CUDA GPUs.

    ``devices`` selects GPUs by count (``2``: the first two) or by index (``[1, 3]``, ``"1,3"``).
    Availability and the device count are asked of ``torch.cuda.device_count()``, which counts
    through NVML without creating a CUDA context, so fork-based launchers stay usable.
    """

    @staticmethod
    def parse_devices(devices: Any) -> list[int]:
        """The GPU indices to use, checked against the visible GPUs."""
        return parse_device_indices(devices, visible=CUDAAccelerator.auto_device_count(), accelerator="cuda")

    @staticmethod
    def get_parallel_devices(devices: Any) -> list[torch.device]:
        """``torch.device("cuda", i)`` for each index (an int ``n`` means indices ``0..n-1``)."""
        indices = range(devices) if isinstance(devices, int) else devices
        return [torch.device("cuda", index) for index in indices]

    @staticmethod
    def auto_device_count() -> int:
        """The number of visible GPUs."""
        return torch.cuda.device_count()

    @staticmethod
    def is_available() -> bool:
        """Whether at least one GPU is visible.

        This is the check ``torch.cuda.is_available()`` makes in its NVML mode: unlike its default
        mode it does not initialise the CUDA driver, which would make later forks unusable.
        """
        return torch.cuda.device_count() > 0

    def setup_device(self, device: torch.device) -> None:
        """Make ``device`` the current CUDA device of this process."""
        torch.cuda.set_device(_cuda_device(device, "setup_device"))

    def teardown(self) -> None:
        """Give cached, unused GPU memory back to the driver (a no-op before CUDA started)."""
        self.empty_cache()

    def empty_cache(self) -> None:
        """Give cached, unused GPU memory back to the driver (a no-op before CUDA started)."""
        torch.cuda.empty_cache()

    def training_memory(self, device: torch.device) -> tuple[int, str] | None:
        """The GPU's total memory, less a margin for activations and the CUDA workspace.

        Reads the device's properties, which starts CUDA in this process.
        """
        index = _cuda_device(device, "training_memory")
        properties = torch.cuda.get_device_properties(index)
        usable = int(properties.total_memory * TRAINING_MEMORY_FRACTION)
        return usable, (
            f"{TRAINING_MEMORY_FRACTION:.0%} of {properties.name}'s {properties.total_memory / 2**30:.1f} GiB"
        )

    def synchronize(self, device: torch.device | None = None) -> None:
        """Wait for the kernels queued on ``device`` (the current GPU when ``None``)."""
        torch.cuda.synchronize(device)

    def get_rng_state(self) -> list[torch.Tensor] | None:
        """Every visible GPU's generator state; ``None`` while CUDA has not started in this process.

        Asking before CUDA started would start it (and make later forks unusable) only to read
        generators that nothing has drawn from yet.
        """
        if not torch.cuda.is_initialized():
            return None
        return torch.cuda.get_rng_state_all()

    def set_rng_state(self, state: list[torch.Tensor] | None) -> None:
        """Restore :meth:`get_rng_state`'s states, GPU by GPU (those beyond the visible GPUs are ignored)."""
        if state is None:
            return
        for index, device_state in enumerate(state[: torch.cuda.device_count()]):
            torch.cuda.set_rng_state(device_state, index)

    def get_device_stats(self, device: torch.device | str) -> dict[str, Any]:
        """The caching allocator's statistics for ``device`` plus a few named figures.

        Returns:
            Every entry of ``torch.cuda.memory_stats(device)`` (flat keys such as
            ``"allocated_bytes.all.current"``), plus ``memory_allocated_bytes``,
            ``memory_reserved_bytes`` and ``max_memory_allocated_bytes``, and, once CUDA has
            started, ``device_free_bytes`` and ``device_total_bytes``.
        """
        device = _cuda_device(device, "get_device_stats")
        stats: dict[str, Any] = dict(torch.cuda.memory_stats(device))
        stats["memory_allocated_bytes"] = stats.get("allocated_bytes.all.current", 0)
        stats["memory_reserved_bytes"] = stats.get("reserved_bytes.all.current", 0)
        stats["max_memory_allocated_bytes"] = stats.get("allocated_bytes.all.peak", 0)
        if torch.cuda.is_initialized():
            free, total = torch.cuda.mem_get_info(device)
            stats["device_free_bytes"] = free
            stats["device_total_bytes"] = total
        return stats

    @classmethod
    def register_accelerators(cls, accelerator_registry: Any) -> None:
        """Register as ``"cuda"``."""
        accelerator_registry.register("cuda", cls, description="NVIDIA (or ROCm) GPUs through torch.cuda.")

    @classmethod
    def unavailable_reason(cls) -> str:
        if not torch.backends.cuda.is_built():
            return (
                f"torch.cuda.is_available() is False: this torch build ({torch.__version__}) "
                f"has no CUDA support"
            )
        return "torch.cuda.is_available() is False: no CUDA GPU is visible to this process"


def _cuda_device(device: torch.device | str | int, method: str) -> torch.device:
    device = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
    if device.type != "cuda":
        raise ValueError(
            f"CUDAAccelerator.{method} got device={device!r}, which is not a CUDA device. "
            f"Pass torch.device('cuda', index), or use the accelerator that matches the device."
        )
    return device
