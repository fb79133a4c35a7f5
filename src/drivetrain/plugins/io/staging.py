"""CPU snapshots of a checkpoint's tensors for background saves, in memory reused from save to save.

A background save copies the checkpoint's tensors before it returns, because the training loop
goes on changing them. Copying into freshly allocated memory pays a page fault for every 4 KiB
page it touches first, several times the cost of the copy itself; :class:`StagingPool` keeps the
memory of finished saves and copies the next snapshot into it with ``Tensor.copy_`` (torch's
parallel copy). Buffers go back to the pool only once the save that used them is written, so one
save never sees another's data; saves that overlap get buffers of their own.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from typing import Any

import torch
from torch import Tensor

from drivetrain._utilities.apply import apply_to_collection

# A buffer fits a tensor of the same shape and dtype (both contiguous, on the CPU).
_Key = tuple[tuple[int, ...], torch.dtype]
# At most this many idle buffer sets are kept: one being written while the next snapshot fills
# the other covers saves that overlap; more would only hold memory.
_KEEP_IDLE = 2


class Lease:
    """The buffers one snapshot filled; handed back to :meth:`StagingPool.release` once written."""

    def __init__(self) -> None:
        self.buffers: dict[_Key, list[Tensor]] = defaultdict(list)


class StagingPool:
    """Reusable CPU buffers for :func:`snapshot` (thread-safe: released from the writer thread)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle: list[Lease] = []

    def snapshot(self, checkpoint: Any) -> tuple[Any, Lease]:
        """``checkpoint`` with its tensors copied into idle buffers (new ones where none fits)."""
        with self._lock:
            spare = self._idle.pop() if self._idle else Lease()
        lease = Lease()

        def stage(tensor: Tensor) -> Tensor:
            if not _stageable(tensor):
                return _fresh_copy(tensor)
            key = (tuple(tensor.shape), tensor.dtype)
            free = spare.buffers.get(key)
            buffer = free.pop() if free else torch.empty(key[0], dtype=key[1], device="cpu")
            buffer.copy_(tensor.detach())
            lease.buffers[key].append(buffer)
            return buffer

        return _copy_each_tensor_once(checkpoint, stage), lease

    def release(self, lease: Lease) -> None:
        """Return the buffers of a snapshot whose save is over (written or failed)."""
        with self._lock:
            if len(self._idle) < _KEEP_IDLE:
                self._idle.append(lease)

    def clear(self) -> None:
        """Drop the idle buffers (their memory goes back to the allocator)."""
        with self._lock:
            self._idle.clear()


def snapshot(checkpoint: Any) -> Any:
    """``checkpoint`` with every tensor replaced by a detached CPU copy in new memory (containers rebuilt)."""
    return _copy_each_tensor_once(checkpoint, _fresh_copy)


def _copy_each_tensor_once(checkpoint: Any, copy: Any) -> Any:
    copies: dict[int, Tensor] = {}

    def once(tensor: Tensor) -> Tensor:
        # A tensor that appears twice (tied weights) is copied once and stays shared in the file.
        found = copies.get(id(tensor))
        if found is None:
            found = copies[id(tensor)] = copy(tensor)
        return found

    return apply_to_collection(checkpoint, Tensor, once)


def _fresh_copy(tensor: Tensor) -> Tensor:
    return tensor.detach().to("cpu", copy=True)


def _stageable(tensor: Tensor) -> bool:
    """Plain dense tensors only: subclasses (DTensor ...), sparse, nested, quantized and meta tensors get new copies."""
    return (
        type(tensor) in (Tensor, torch.nn.Parameter)
        and tensor.layout == torch.strided
        and not tensor.is_nested
        and not tensor.is_quantized
        and tensor.device.type != "meta"
        and tensor.is_contiguous()
    )
