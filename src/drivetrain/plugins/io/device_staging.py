"""Snapshots of GPU tensors for background saves: pinned host buffers filled on a side stream.

A background save must hold the checkpoint as it was at the step it names, while training goes
on. For tensors in CPU memory that takes a memory copy (:mod:`drivetrain.plugins.io.staging`):
there is no other engine to hand the copy to, so the copy's time is the floor of the loop's
stall. On a GPU the copy to host memory can run on the copy engine while the GPU computes and
the host goes on queueing the next step, provided the order is kept on the device:

1. an event ``ready`` is recorded on the tensor's device's current stream: it completes when every
   kernel queued before the save (the step's optimizer update) has run;
2. a side stream waits for ``ready`` and copies each tensor into a pinned (page-locked) host
   buffer, ``non_blocking``: the host queues the copies and returns at once;
3. an event ``copied`` is recorded on the side stream, and the current stream waits for it (on the
   device): no kernel queued after the save can overwrite a tensor before it has been copied;
4. the writer thread waits for ``copied`` (on the host), then serialises from the pinned buffers and
   writes the file.

The training thread never waits for the copy or the disk. Pinned memory is slow to allocate
(the driver page-locks it), so the buffers are kept from save to save, like the CPU staging
buffers, and a buffer goes back to the pool only once the save that used it is written.

The tensors are not marked with ``record_stream`` for the side stream: a tensor of the checkpoint
freed after ``save_checkpoint`` returns can be handed out again by the caching allocator only to
work on the current stream, which waits for ``copied`` (step 3) before it runs anything queued later.

Every device operation goes through a :class:`DeviceOps` (one per device type, :data:`DEVICE_OPS`),
so the ordering above is testable without a GPU: the tests give the CPU a fake whose streams
defer their copies until something waits for them.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any, Protocol

import torch
from torch import Tensor

from drivetrain._utilities.apply import apply_to_collection
from drivetrain.plugins.io.staging import _copy_each_tensor_once, _fresh_copy, _stageable

# At most this many idle buffer sets are kept (as in staging.py): one being written while the
# next snapshot fills the other.
_KEEP_IDLE = 2


class DeviceOps(Protocol):
    """The stream, event and memory operations of one device type that a snapshot needs."""

    def current_stream(self, device: torch.device) -> Any:
        """The stream the training thread queues its work on."""

    def side_stream(self, device: torch.device) -> Any:
        """A stream of this object's own for the copies (the same one every time)."""

    def record_event(self, stream: Any) -> Any:
        """An event that completes when the work queued on ``stream`` so far is done."""

    def wait_event(self, stream: Any, event: Any) -> None:
        """Make ``stream``'s later work wait for ``event`` (on the device; the host goes on)."""

    def use_stream(self, stream: Any) -> AbstractContextManager[Any]:
        """A context in which work is queued on ``stream``."""

    def copy(self, destination: Tensor, source: Tensor) -> None:
        """Queue ``destination.copy_(source)`` on the current stream without waiting for it."""

    def pinned_empty(self, shape: tuple[int, ...], dtype: torch.dtype) -> Tensor:
        """A host buffer the device can copy into asynchronously (page-locked)."""

    def synchronize(self, event: Any) -> None:
        """Wait, on the host, until ``event`` has completed."""


class CudaOps:
    """:class:`DeviceOps` for CUDA GPUs (``torch.cuda`` streams and events, pinned memory)."""

    def __init__(self) -> None:
        self._streams: dict[int | None, Any] = {}

    def current_stream(self, device: torch.device) -> Any:
        return torch.cuda.current_stream(device)

    def side_stream(self, device: torch.device) -> Any:
        stream = self._streams.get(device.index)
        if stream is None:
            stream = self._streams[device.index] = torch.cuda.Stream(device=device)
        return stream

    def record_event(self, stream: Any) -> Any:
        event = torch.cuda.Event()
        event.record(stream)
        return event

    def wait_event(self, stream: Any, event: Any) -> None:
        stream.wait_event(event)

    def use_stream(self, stream: Any) -> AbstractContextManager[Any]:
        return torch.cuda.stream(stream)

    def copy(self, destination: Tensor, source: Tensor) -> None:
        destination.copy_(source, non_blocking=True)

    def pinned_empty(self, shape: tuple[int, ...], dtype: torch.dtype) -> Tensor:
        return torch.empty(shape, dtype=dtype, pin_memory=True)

    def synchronize(self, event: Any) -> None:
        event.synchronize()


#: Device type -> the factory of its :class:`DeviceOps`. Tensors of other types are copied as before.
DEVICE_OPS: dict[str, Callable[[], DeviceOps]] = {"cuda": CudaOps}

# A buffer fits a tensor of the same shape and dtype; pinned and plain buffers are kept apart.
_Key = tuple[tuple[int, ...], torch.dtype, bool]


class DeviceLease:
    """The buffers one snapshot filled, and the events its copies complete at."""

    def __init__(self) -> None:
        self.buffers: dict[_Key, list[Tensor]] = defaultdict(list)
        self.copies: list[tuple[DeviceOps, Any]] = []

    def wait(self) -> None:
        """Wait on the host until every copy into this lease's buffers has completed."""
        for ops, event in self.copies:
            ops.synchronize(event)


class DeviceStagingPool:
    """Reusable host buffers for snapshots of checkpoints that hold device tensors (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle: list[DeviceLease] = []
        self._ops: dict[str, DeviceOps] = {}

    def holds_device_tensors(self, checkpoint: Any) -> bool:
        """Whether ``checkpoint`` has a tensor on a device type with :class:`DeviceOps`."""
        return any(_stageable(t) and t.device.type in DEVICE_OPS for t in _tensors(checkpoint))

    def snapshot(self, checkpoint: Any) -> tuple[Any, DeviceLease]:
        """``checkpoint`` with its tensors in host buffers, the device copies queued (see the module doc).

        The host buffers of device tensors are complete only once :meth:`DeviceLease.wait` returns.
        """
        with self._lock:
            spare = self._idle.pop() if self._idle else DeviceLease()
        lease = DeviceLease()
        queued: dict[torch.device, list[tuple[Tensor, Tensor]]] = defaultdict(list)

        def stage(tensor: Tensor) -> Tensor:
            if not _stageable(tensor):
                return _fresh_copy(tensor)
            ops = self._ops_for(tensor.device.type)
            key = (tuple(tensor.shape), tensor.dtype, ops is not None)
            free = spare.buffers.get(key)
            if free:
                buffer = free.pop()
            elif ops is not None:
                buffer = ops.pinned_empty(key[0], key[1])
            else:
                buffer = torch.empty(key[0], dtype=key[1], device="cpu")
            if ops is None:
                buffer.copy_(tensor.detach())
            else:
                queued[tensor.device].append((buffer, tensor.detach()))
            lease.buffers[key].append(buffer)
            return buffer

        staged = _copy_each_tensor_once(checkpoint, stage)
        for device, pairs in queued.items():
            ops = self._ops[device.type]
            current, side = ops.current_stream(device), ops.side_stream(device)
            ops.wait_event(side, ops.record_event(current))
            with ops.use_stream(side):
                for buffer, tensor in pairs:
                    ops.copy(buffer, tensor)
            copied = ops.record_event(side)
            ops.wait_event(current, copied)
            lease.copies.append((ops, copied))
        return staged, lease

    def release(self, lease: DeviceLease) -> None:
        """Return the buffers of a snapshot whose save is over (written or failed)."""
        lease.copies = []
        with self._lock:
            if len(self._idle) < _KEEP_IDLE:
                self._idle.append(lease)

    def clear(self) -> None:
        """Drop the idle buffers (pinned memory goes back to the driver's allocator)."""
        with self._lock:
            self._idle.clear()

    def _ops_for(self, device_type: str) -> DeviceOps | None:
        ops = self._ops.get(device_type)
        if ops is None and device_type in DEVICE_OPS:
            ops = self._ops[device_type] = DEVICE_OPS[device_type]()
        return ops


def _tensors(checkpoint: Any) -> Iterator[Tensor]:
    found: list[Tensor] = []
    apply_to_collection(checkpoint, Tensor, found.append)
    return iter(found)
