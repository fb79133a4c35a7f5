"""What "a batch fits" means on the CPU: the memory a few training steps need stays under a limit.

A CPU does not run out of memory the way a GPU does (the operating system swaps, or kills the
process), so the batch-size search asks for a limit instead: ``max_memory=`` of
``Tuner.scale_batch_size`` and ``BatchSizeFinder``. A trial's footprint is measured, not estimated:
the bytes of the module's parameters and buffers and of the optimizer's state when the trial starts,
plus the peak of what the trial allocates on top (batches, activations, gradients, new optimizer
state), as torch's CPU allocator reports each allocation and release to ``torch.profiler``
(``profile_memory=True``). The same steps on the same batch size allocate the same tensors, so the
measure does not depend on the machine's load or on other processes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch

from drivetrain._utilities.sizes import parse_size


def parse_memory(value: Any, name: str = "max_memory") -> int | None:
    """Bytes from ``value``: ``None``, an int number of bytes, or a size such as ``"2GB"`` or ``"512MiB"``."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise TypeError(
            f"{name} expects a number of bytes (int) or a size such as '2GB' or '512MiB', got {value!r}."
        )
    size = parse_size(value, name)
    if size <= 0:
        raise ValueError(f"{name}={value!r} is not a positive size.")
    return size


def format_bytes(size: float) -> str:
    """``size`` in MiB (or KiB when small), for messages."""
    if size >= 2**20:
        return f"{size / 2**20:.1f} MiB"
    return f"{size / 2**10:.1f} KiB"


def resident_bytes(tensors: Iterable[Any]) -> int:
    """Bytes held by the distinct storages of ``tensors`` (views of one storage count once)."""
    seen: set[int] = set()
    total = 0
    for tensor in tensors:
        if not isinstance(tensor, torch.Tensor) or tensor.device.type != "cpu":
            continue
        storage = tensor.untyped_storage()
        pointer = storage.data_ptr()
        if pointer in seen or pointer == 0:
            continue
        seen.add(pointer)
        total += storage.nbytes()
    return total


@dataclass(frozen=True)
class Footprint:
    """What a trial held: ``resident`` bytes when it started, and the ``peak`` of its allocations on top."""

    resident: int
    peak: int

    @property
    def total(self) -> int:
        return self.resident + self.peak


def measure_cpu_footprint(run: Callable[[], Any], resident: int) -> Footprint:
    """Run ``run()`` while torch's CPU allocator reports to the profiler; the peak it allocated on top.

    The running sum of allocations (positive) and releases (negative) in time order is what the
    trial holds beyond ``resident`` at each moment; its maximum is the peak. A release of memory the
    trial did not allocate is not reported by torch, so it never lowers the sum below what it held.
    """
    from torch.autograd import DeviceType
    from torch.autograd.profiler import profile

    # The autograd profiler itself (torch.profiler's wrapper adds schedules, and warnings about them).
    with profile(use_cpu=True, use_kineto=True, profile_memory=True) as session:
        run()
    raw: Any = session.kineto_results
    host = (DeviceType.CPU, DeviceType.MKLDNN, DeviceType.IDEEP)
    events = [
        event
        for event in raw.events()  # the raw events, without building the op table
        if event.name() == "[memory]" and event.device_type() in host
    ]
    events.sort(key=lambda event: event.start_ns())
    current = peak = 0
    for event in events:
        current += event.nbytes()
        peak = max(peak, current)
    return Footprint(resident=resident, peak=peak)


class MemoryLimitExceeded(torch.OutOfMemoryError):
    """A batch size's trial needed more CPU memory than ``max_memory`` allows: it does not fit.

    An out-of-memory error, so the batch-size search treats it as a device's own.
    """

    def __init__(self, batch_size: int, footprint: Footprint, limit: int) -> None:
        super().__init__(
            f"out of memory: batch size {batch_size} needs {format_bytes(footprint.total)} "
            f"({format_bytes(footprint.resident)} held + {format_bytes(footprint.peak)} allocated at the peak), "
            f"more than max_memory={format_bytes(limit)}"
        )
        self.batch_size = batch_size
        self.footprint = footprint
        self.limit = limit
