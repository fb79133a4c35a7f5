"""The CPU accelerator: always available; ``devices`` is the number of processes to start."""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import torch

from drivetrain._utilities.sizes import parse_size
from drivetrain.accelerators.accelerator import Accelerator
from drivetrain.accelerators.devices import parse_process_count

#: The environment variable that sets :class:`CPUAccelerator`'s default ``memory_limit``.
MEMORY_LIMIT_VARIABLE = "DRIVETRAIN_CPU_MEMORY_LIMIT"


class CPUAccelerator(Accelerator):
    """Runs on the host CPU.

    There is one CPU device; ``devices=N`` starts N processes that each use it, so
    :meth:`parse_devices` returns a process count rather than device indices.

    Args:
        memory_limit: the memory one process may fill with its training state (bytes, or a size
            such as ``"8GiB"``), which ``strategy="auto"`` compares with what DDP would hold per
            process (FSDP when it does not fit). Default: the ``DRIVETRAIN_CPU_MEMORY_LIMIT``
            environment variable, and without it no limit (``"auto"`` stays with DDP).
    """

    def __init__(self, memory_limit: int | str | None = None) -> None:
        self._memory_limit = None if memory_limit is None else parse_size(memory_limit, "memory_limit")
        # Baseline for the utilisation figure: each stats call reports the share of one core this
        # process used since the previous call (or since this accelerator was created).
        self._last_sample = _cpu_sample()

    @staticmethod
    def parse_devices(devices: Any) -> int:
        """The number of processes: ``"auto"`` means 1; indices and -1 are errors."""
        return parse_process_count(devices, accelerator="cpu")

    @staticmethod
    def get_parallel_devices(devices: Any) -> list[torch.device]:
        """One ``torch.device("cpu")`` per process."""
        count = parse_process_count(devices, accelerator="cpu")
        return [torch.device("cpu")] * count

    @staticmethod
    def auto_device_count() -> int:
        """One process unless told otherwise."""
        return 1

    @staticmethod
    def is_available() -> bool:
        """The CPU is always there."""
        return True

    def setup_device(self, device: torch.device) -> None:
        """Check that ``device`` is the CPU; there is nothing to select."""
        if torch.device(device).type != "cpu":
            raise ValueError(
                f"CPUAccelerator.setup_device got device={device!r}, which is not a CPU device. "
                f"Pass torch.device('cpu'), or use the accelerator that matches the device."
            )

    def training_memory(self, device: torch.device) -> tuple[int, str] | None:
        """``memory_limit``, else ``DRIVETRAIN_CPU_MEMORY_LIMIT``, else ``None`` (no limit set).

        Raises:
            ValueError: the environment variable holds no size.
        """
        if self._memory_limit is not None:
            return self._memory_limit, "CPUAccelerator(memory_limit=...)"
        value = os.environ.get(MEMORY_LIMIT_VARIABLE, "").strip()
        if not value:
            return None
        return parse_size(value, MEMORY_LIMIT_VARIABLE), f"{MEMORY_LIMIT_VARIABLE}={value}"

    def get_device_stats(self, device: torch.device | str = "cpu") -> dict[str, Any]:
        """Memory and utilisation of this process.

        Returns:
            ``cpu_rss_bytes`` (resident memory now; absent where it cannot be measured),
            ``cpu_peak_rss_bytes`` (the most resident memory so far) and ``cpu_percent`` (CPU time
            used since the previous call, in percent of one core: 200 means two cores were busy).
        """
        stats: dict[str, Any] = {}
        rss = _resident_bytes()
        if rss is not None:
            stats["cpu_rss_bytes"] = rss
        peak = _peak_resident_bytes()
        if peak is not None:
            # ru_maxrss is sampled by the kernel; keep the figure consistent with the current one.
            stats["cpu_peak_rss_bytes"] = max(peak, rss or 0)
        now = _cpu_sample()
        wall = now[0] - self._last_sample[0]
        busy = now[1] - self._last_sample[1]
        self._last_sample = now
        stats["cpu_percent"] = 100.0 * busy / wall if wall > 0 else 0.0
        return stats

    @classmethod
    def register_accelerators(cls, accelerator_registry: Any) -> None:
        """Register as ``"cpu"``."""
        accelerator_registry.register("cpu", cls, description="The host CPU; devices=N starts N processes.")


def _cpu_sample() -> tuple[float, float]:
    """(wall-clock seconds, CPU seconds this process has used in user and system mode)."""
    times = os.times()
    return time.monotonic(), times.user + times.system


def _resident_bytes() -> int | None:
    try:
        with open("/proc/self/statm", encoding="ascii") as statm:
            resident_pages = int(statm.read().split()[1])
        return resident_pages * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        pass
    try:
        import psutil
    except ImportError:
        return None
    return int(psutil.Process().memory_info().rss)


def _peak_resident_bytes() -> int | None:
    try:
        import resource
    except ImportError:  # Windows
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # Linux reports KiB, macOS bytes.
    return int(peak) if sys.platform == "darwin" else int(peak) * 1024
