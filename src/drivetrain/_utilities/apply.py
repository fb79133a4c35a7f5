"""Apply a function to every tensor (or other leaf type) inside nested user data.

Batches and outputs arrive as tensors, or tuples, lists, dicts, named tuples and dataclasses of
them. Everything that moves or converts user data goes through :func:`apply_to_collection`.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Callable, Mapping
from typing import Any

import torch


def apply_to_collection(
    data: Any, dtype: type | tuple[type, ...], function: Callable[..., Any], *args: Any, **kwargs: Any
) -> Any:
    """Return ``data`` with ``function(leaf, *args, **kwargs)`` applied to every ``dtype`` leaf.

    Containers are rebuilt with their own type; anything else is returned unchanged.
    """
    if isinstance(data, dtype):  # the per-step fast path: a bare tensor
        return function(data, *args, **kwargs)
    if isinstance(data, Mapping):
        items = {k: apply_to_collection(v, dtype, function, *args, **kwargs) for k, v in data.items()}
        if type(data) is dict:
            return items
        if isinstance(data, defaultdict):
            return type(data)(data.default_factory, items)
        return type(data)(items)  # type: ignore[call-arg]
    if isinstance(data, tuple) and hasattr(data, "_fields"):  # named tuple
        return type(data)(*(apply_to_collection(v, dtype, function, *args, **kwargs) for v in data))
    if isinstance(data, (list, tuple)):
        return type(data)(apply_to_collection(v, dtype, function, *args, **kwargs) for v in data)
    if dataclasses.is_dataclass(data) and not isinstance(data, type):
        changes = {
            f.name: apply_to_collection(getattr(data, f.name), dtype, function, *args, **kwargs)
            for f in dataclasses.fields(data)
            if f.init
        }
        return dataclasses.replace(data, **changes)
    return data


def move_to_device(data: Any, device: torch.device | str, non_blocking: bool = True) -> Any:
    """Move every tensor in ``data`` (and every object with a ``.to``) onto ``device``."""
    device = torch.device(device)

    def move(t: torch.Tensor) -> torch.Tensor:
        if t.device == device:
            return t
        # non_blocking only helps host → accelerator copies; keep the CPU path synchronous.
        return t.to(device, non_blocking=non_blocking and device.type != "cpu")

    return apply_to_collection(data, torch.Tensor, move)


def device_mover(device: torch.device, move: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """A per-step function putting a batch on ``device``: ``move(batch)``, skipped when it is there.

    Batches that are a tensor, or a flat tuple/list of tensors, already on ``device`` come back
    as they are after a few attribute reads; everything else goes through ``move``.
    """

    def to_device(batch: Any) -> Any:
        kind = type(batch)
        if kind is tuple or kind is list:
            for item in batch:
                if type(item) is not torch.Tensor or item.device != device:
                    return move(batch)
            return batch
        if kind is torch.Tensor:
            return batch if batch.device == device else batch.to(device, non_blocking=True)
        return move(batch)

    return to_device
