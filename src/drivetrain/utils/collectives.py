"""Collective operations on nested data through a given strategy.

Each function takes the strategy that does the talking and data that may be a tensor, a plain
object, or a tuple/list/dict/dataclass of them. With one process every function returns its
input (or a copy) without communicating. ``drivetrain.Accelerator``'s methods call them with
their own strategy, and the free functions of :mod:`drivetrain.utils.operations` with the live
Accelerator's.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from drivetrain.strategies.collective_errors import CollectiveMismatchError
from drivetrain.utils.checked_reduce import checked_all_reduce

if TYPE_CHECKING:
    from drivetrain.strategies.strategy import Strategy

REDUCTIONS = ("sum", "mean", "max", "min", "product", "none")


def map_tensors(data: Any, function: Callable[[Tensor], Any], operation: str) -> Any:
    """``data`` with ``function`` applied to every tensor; any other leaf is a ``TypeError``."""
    if isinstance(data, Tensor):
        return function(data)
    if isinstance(data, Mapping):
        return type(data)({key: map_tensors(value, function, operation) for key, value in data.items()})  # type: ignore[call-arg]
    if isinstance(data, tuple) and hasattr(data, "_fields"):
        return type(data)(*(map_tensors(value, function, operation) for value in data))
    if isinstance(data, (list, tuple)):
        return type(data)(map_tensors(value, function, operation) for value in data)
    if dataclasses.is_dataclass(data) and not isinstance(data, type):
        return dataclasses.replace(
            data,
            **{
                f.name: map_tensors(getattr(data, f.name), function, operation)
                for f in dataclasses.fields(data)
                if f.init
            },
        )
    raise TypeError(
        f"{operation} works on tensors and tuples/lists/dicts/dataclasses of tensors, but found a "
        f"{type(data).__name__} ({data!r:.80}). Gather Python objects with gather_object (or "
        f"gather_for_metrics(..., use_gather_object=True))."
    )


def gather(strategy: Strategy, data: Any, uneven: bool = False) -> Any:
    """Concatenate every tensor of ``data`` from all processes along the first dimension.

    0-dimensional tensors become 1-dimensional (one value per process). Tensors whose shapes or
    dtypes differ between processes raise a ``ValueError`` naming the ranks (from the strategy),
    unless ``uneven``: then their first dimensions may differ (the last batches of a loader with
    ``even_batches=False``), at the cost of one more collective per tensor.
    """
    if strategy.world_size == 1:
        return map_tensors(data, lambda tensor: tensor, "gather")

    def one(tensor: Tensor) -> Tensor:
        if uneven and tensor.dim() > 0:
            return _gather_uneven(strategy, tensor)
        stacked = strategy.all_gather(tensor)
        return stacked if tensor.dim() == 0 else stacked.reshape(-1, *tensor.shape[1:])

    return map_tensors(data, one, "gather")


def _gather_uneven(strategy: Strategy, tensor: Tensor) -> Tensor:
    sizes = strategy.all_gather(torch.tensor(tensor.shape[0], device=tensor.device)).tolist()
    longest = max(sizes)
    if tensor.shape[0] < longest:
        filler = tensor.new_zeros((longest - tensor.shape[0], *tensor.shape[1:]))
        tensor = torch.cat([tensor, filler])
    stacked = strategy.all_gather(tensor)
    return torch.cat([stacked[rank, :size] for rank, size in enumerate(sizes)])


def gather_object(strategy: Strategy, obj: Any) -> Any:
    """Gather picklable objects: lists and tuples are concatenated, anything else listed per process."""
    if strategy.world_size == 1:
        return obj
    gathered = strategy.all_gather_object(obj)
    if all(isinstance(part, (list, tuple)) for part in gathered):
        return [item for part in gathered for item in part]
    return gathered


def gather_leaves(strategy: Strategy, data: Any, uneven: bool = False) -> Any:
    """Gather each leaf of ``data`` its own way: tensors with :func:`gather` (``uneven`` as there),
    lists of Python values and other objects with :func:`gather_object`; the structure is kept."""
    if isinstance(data, Tensor):
        return gather(strategy, data, uneven)
    if isinstance(data, Mapping):
        return type(data)({key: gather_leaves(strategy, value, uneven) for key, value in data.items()})  # type: ignore[call-arg]
    if isinstance(data, (list, tuple)) and any(_is_structure(item) for item in data):
        items = [gather_leaves(strategy, value, uneven) for value in data]
        return type(data)(*items) if hasattr(data, "_fields") else type(data)(items)
    if dataclasses.is_dataclass(data) and not isinstance(data, type):
        return dataclasses.replace(
            data,
            **{
                f.name: gather_leaves(strategy, getattr(data, f.name), uneven)
                for f in dataclasses.fields(data)
                if f.init
            },
        )
    return gather_object(strategy, data)


def _is_structure(item: Any) -> bool:
    return isinstance(item, (Tensor, Mapping, list, tuple)) or (
        dataclasses.is_dataclass(item) and not isinstance(item, type)
    )


def drop_repeated(data: Any, count: int) -> Any:
    """``data`` without its last ``count`` items (tensors with a batch dimension and lists)."""
    if count <= 0:
        return data
    if isinstance(data, Tensor):
        return data if data.dim() == 0 else data[: max(0, data.shape[0] - count)]
    if isinstance(data, list) and not any(_is_structure(item) for item in data):
        return data[: max(0, len(data) - count)]
    if isinstance(data, Mapping):
        return type(data)({key: drop_repeated(value, count) for key, value in data.items()})  # type: ignore[call-arg]
    if isinstance(data, tuple) and hasattr(data, "_fields"):
        return type(data)(*(drop_repeated(value, count) for value in data))
    if isinstance(data, (list, tuple)):
        return type(data)(drop_repeated(value, count) for value in data)
    if dataclasses.is_dataclass(data) and not isinstance(data, type):
        return dataclasses.replace(
            data,
            **{
                f.name: drop_repeated(getattr(data, f.name), count)
                for f in dataclasses.fields(data)
                if f.init
            },
        )
    return data


def reduce(strategy: Strategy, data: Any, reduction: str = "sum", scale: float = 1.0) -> Any:
    """Reduce every tensor of ``data`` over all processes, elementwise, then multiply it by ``scale``.

    ``reduction`` is ``"sum"``, ``"mean"``, ``"max"``, ``"min"``, ``"product"`` (the strategy's
    collectives), or ``"none"`` (a copy, no communication).

    Raises:
        ValueError: the processes passed tensors of different shapes or dtypes (on every process,
            naming each one's tensor).
    """
    if reduction not in REDUCTIONS:
        raise ValueError(
            f"reduction={reduction!r} is not supported; use one of {', '.join(map(repr, REDUCTIONS))}."
        )

    checks_every_collective = getattr(strategy, "debug_collectives", False)

    def one(tensor: Tensor) -> Tensor:
        if reduction == "none" or strategy.world_size == 1:
            result = tensor.clone()
        elif checks_every_collective:
            # Debug mode compares every collective's shapes and call sites already, with more detail.
            result = strategy.all_reduce(tensor, reduce_op=reduction)
        else:
            # Shapes are compared inside the reduction itself (see checked_reduce): different
            # shapes on different processes are an error naming them all, not a hang or garbage.
            result = checked_all_reduce(strategy, tensor, reduction)
        return result * scale if scale != 1.0 else result

    return map_tensors(data, one, "reduce")


def check_same_layout(strategy: Strategy, operation: str, data: Any) -> None:
    """Debug mode: raise if the processes hold tensors of different shapes or dtypes in ``data``.

    For collectives whose transport would not notice (``broadcast`` pickles its payload); a
    collective call itself, so every process must make it.
    """
    everyone = strategy.all_gather_object(_layout(data))
    if any(layout != everyone[0] for layout in everyone):
        described = "; ".join(f"rank {rank}: {layout}" for rank, layout in enumerate(everyone))
        raise CollectiveMismatchError(
            f"{operation} needs the same tensor shapes and dtypes on every process (debug mode), got {described}. "
            f"Give every process tensors of the same layout."
        )


def _layout(data: Any) -> Any:
    if isinstance(data, Tensor):
        return f"shape {tuple(data.shape)}, {data.dtype}"
    if isinstance(data, Mapping):
        return {key: _layout(value) for key, value in data.items()}
    if isinstance(data, (list, tuple)):
        return [_layout(value) for value in data]
    return type(data).__name__


def pad_across_processes(
    strategy: Strategy, data: Any, dim: int = 0, pad_index: int = 0, pad_first: bool = False
) -> Any:
    """Pad every tensor of ``data`` along ``dim`` to its largest size on any process."""

    def one(tensor: Tensor) -> Tensor:
        if strategy.world_size == 1:
            return tensor
        axis = dim + tensor.dim() if dim < 0 else dim
        size = tensor.shape[axis] if 0 <= axis < tensor.dim() else -1
        # Every process takes part, whatever its tensor: one that skipped the gather would leave the others in it.
        everyone = strategy.all_gather(torch.tensor([tensor.dim(), size], device=tensor.device)).tolist()
        dims = [ndim for ndim, _ in everyone]
        if len(set(dims)) > 1:
            described = "; ".join(f"rank {rank}: {ndim}-d" for rank, ndim in enumerate(dims))
            raise CollectiveMismatchError(
                f"pad_across_processes needs tensors with the same number of dimensions on every process, got "
                f"{described} (this process: shape {tuple(tensor.shape)}). Give every process a tensor of the "
                f"same rank (unsqueeze or reshape), then pad."
            )
        if tensor.dim() == 0:
            return tensor  # a scalar everywhere: nothing to pad
        if size < 0:
            raise ValueError(
                f"pad_across_processes(dim={dim}) is out of range for tensors of {tensor.dim()} dimensions; use a dim "
                f"between {-tensor.dim()} and {tensor.dim() - 1}."
            )
        longest = max(length for _, length in everyone)
        own = tensor.shape[axis]
        if own == longest:
            return tensor
        shape = list(tensor.shape)
        shape[axis] = longest
        padded = tensor.new_full(shape, pad_index)
        where = slice(longest - own, longest) if pad_first else slice(0, own)
        padded[(slice(None),) * axis + (where,)] = tensor
        return padded

    return map_tensors(data, one, "pad_across_processes")


@contextmanager
def split_between_processes(strategy: Strategy, inputs: Any, apply_padding: bool = False) -> Iterator[Any]:
    """This process's contiguous share of ``inputs`` (a list, tuple, tensor, Hugging Face
    ``datasets.Dataset``, or dict of them).

    The first ``len % num_processes`` processes get one item more; with ``apply_padding`` the
    others repeat their last item so every share has the same length. A ``datasets.Dataset``
    share is ``dataset.select(indices)``, a ``Dataset`` too.
    """
    n, rank = strategy.world_size, strategy.global_rank
    if n == 1:
        yield inputs
        return
    if isinstance(inputs, Mapping):
        lengths = {key: _length(value) for key, value in inputs.items()}
        if len(set(lengths.values())) > 1:
            raise ValueError(
                f"split_between_processes needs every value of the dict to have the same length, got "
                f"{lengths}. Split them separately, or make them the same length."
            )
        yield type(inputs)({key: _share(value, n, rank, apply_padding) for key, value in inputs.items()})  # type: ignore[call-arg]
        return
    yield _share(inputs, n, rank, apply_padding)


def _is_hf_dataset(value: Any) -> bool:
    # Only a program that imported `datasets` can hold one: never imported here for the check.
    datasets = sys.modules.get("datasets")
    dataset_class = getattr(datasets, "Dataset", None)
    return isinstance(dataset_class, type) and isinstance(value, dataset_class)


def _length(value: Any) -> int:
    if isinstance(value, Tensor):
        return value.shape[0] if value.dim() else 1
    if isinstance(value, (list, tuple)) or _is_hf_dataset(value):
        return len(value)
    raise TypeError(
        f"split_between_processes splits lists, tuples, tensors, datasets.Dataset and dicts of them, got "
        f"{type(value).__name__}."
    )


def _share(value: Any, n: int, rank: int, apply_padding: bool) -> Any:
    length = _length(value)
    base, extra = divmod(length, n)
    start = rank * base + min(rank, extra)
    stop = start + base + (1 if rank < extra else 0)
    if _is_hf_dataset(value):
        indices = list(range(start, stop))
        if apply_padding and extra and rank >= extra and length:
            indices.append(stop - 1 if stop > start else length - 1)
        return value.select(indices)
    share = value[start:stop]
    if not apply_padding or not extra or rank < extra or length == 0:
        return share
    filler = value[stop - 1 : stop] if stop > start else value[length - 1 : length]
    if isinstance(value, Tensor):
        return torch.cat([share, filler])
    return share + type(value)(filler)
