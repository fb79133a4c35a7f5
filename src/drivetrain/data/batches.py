"""Operations on collated batches: length, slicing, concatenation.

A collated batch is a tensor, a list of plain Python values (``default_collate`` keeps strings
as a list), or a tuple, list, dict, named tuple or dataclass of those. Dispatching a batch from
rank 0 needs to cut it into per-rank slices and glue batches together. (Putting batches on the device is the
strategy's: :meth:`~drivetrain.strategies.Strategy.batch_mover`.)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor

_SCALARS = (str, bytes, int, float, bool, type(None))


def _is_value_list(data: Any) -> bool:
    """A list of plain values (strings, numbers): a batch of non-tensor items, not a structure."""
    return isinstance(data, list) and all(isinstance(item, _SCALARS) for item in data)


def batch_length(batch: Any) -> int:
    """The number of items in ``batch``: the first dimension of its first tensor (or value list).

    Raises:
        TypeError: the batch holds no tensor and no list of values to count.
    """
    length = _find_length(batch)
    if length is None:
        raise TypeError(
            f"Cannot tell how many items the batch holds: it contains no tensor with a batch dimension and "
            f"no list of values (got {type(batch).__name__}). Batches handed between processes must be "
            f"tensors, lists of values, or tuples/lists/dicts/dataclasses of them."
        )
    return length


def _find_length(batch: Any) -> int | None:
    if isinstance(batch, Tensor):
        return batch.shape[0] if batch.dim() > 0 else None
    if _is_value_list(batch):
        return len(batch)
    for child in _children(batch):
        found = _find_length(child)
        if found is not None:
            return found
    return None


def _children(batch: Any) -> list[Any]:
    if isinstance(batch, Mapping):
        return list(batch.values())
    if isinstance(batch, (list, tuple)):
        return list(batch)
    if dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        return [getattr(batch, f.name) for f in dataclasses.fields(batch)]
    return []


def _rebuild(batch: Any, function: Callable[[Any], Any]) -> Any:
    """``batch`` with ``function`` applied to every leaf (tensor or value list), containers kept."""
    if isinstance(batch, Tensor) or _is_value_list(batch):
        return function(batch)
    if isinstance(batch, Mapping):
        return type(batch)({key: _rebuild(value, function) for key, value in batch.items()})  # type: ignore[call-arg]
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(_rebuild(value, function) for value in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(_rebuild(value, function) for value in batch)
    if dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        changes = {
            f.name: _rebuild(getattr(batch, f.name), function) for f in dataclasses.fields(batch) if f.init
        }
        return dataclasses.replace(batch, **changes)
    return batch


def slice_batch(batch: Any, start: int, stop: int) -> Any:
    """Items ``start:stop`` of every tensor (with a batch dimension) and value list in ``batch``."""

    def cut(leaf: Any) -> Any:
        if isinstance(leaf, Tensor) and leaf.dim() == 0:
            return leaf
        return leaf[start:stop]

    return _rebuild(batch, cut)


def concatenate_batches(batches: list[Any], dim: int = 0) -> Any:
    """Join batches of the same structure along the batch dimension (tensors along ``dim``, and value lists)."""
    if len(batches) == 1:
        return batches[0]
    leaves = [_leaves(batch) for batch in batches]
    joined = iter([_join(group, dim) for group in zip(*leaves)])
    return _rebuild(batches[0], lambda leaf: next(joined))


def _join(group: tuple[Any, ...], dim: int = 0) -> Any:
    first = group[0]
    if isinstance(first, Tensor):
        return (
            first if first.dim() == 0 else torch.cat(group, dim=dim)
        )  # a 0-d tensor is per batch, not per item
    return [item for part in group for item in part]


def _leaves(batch: Any) -> list[Any]:
    found: list[Any] = []
    _rebuild(batch, lambda leaf: found.append(leaf))
    return found


def pad_batch(batch: Any, source: Any, count: int) -> Any:
    """``batch`` followed by the first ``count`` items of ``source``, cycling ``source`` if it is shorter."""
    if count <= 0:
        return batch
    available = batch_length(source)
    parts = [batch]
    while count > 0:
        take = min(count, available)
        parts.append(slice_batch(source, 0, take))
        count -= take
    return concatenate_batches(parts)
