"""Accelerate's helpers for nested data: ``recursively_apply``, ``concatenate``, ``convert_to_fp32``.

Nested data is tensors (or other leaves) inside tuples, lists, named tuples, dicts and
dataclasses. The walking is the project's one walker, :func:`~drivetrain._utilities.apply.apply_to_collection`,
and joining batches is the data layer's :func:`~drivetrain.data.batches.concatenate_batches`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import torch

from drivetrain._utilities.apply import apply_to_collection
from drivetrain.data.batches import concatenate_batches


def is_torch_tensor(value: Any) -> bool:
    """Whether ``value`` is a ``torch.Tensor``."""
    return isinstance(value, torch.Tensor)


def _is_container(value: Any) -> bool:
    return isinstance(value, (Mapping, list, tuple)) or (
        dataclasses.is_dataclass(value) and not isinstance(value, type)
    )


class _LeafType(type):
    # ``apply_to_collection`` takes the leaf *type*; with this one every non-container counts as a
    # leaf, so a predicate can decide about it while the containers are walked as everywhere else.
    def __instancecheck__(cls, value: Any) -> bool:
        return not _is_container(value)


class _Leaf(metaclass=_LeafType):
    pass


def recursively_apply(
    func: Callable[..., Any],
    data: Any,
    *args: Any,
    test_type: Callable[[Any], bool] = is_torch_tensor,
    error_on_other_type: bool = False,
    **kwargs: Any,
) -> Any:
    """``data`` with ``func(leaf, *args, **kwargs)`` applied to every leaf for which ``test_type`` is true.

    Args:
        func: applied to the chosen leaves.
        data: tensors (or other leaves) nested in tuples, lists, named tuples, dicts and dataclasses.
        test_type: which leaves ``func`` applies to (default: tensors).
        error_on_other_type: a ``TypeError`` for any other leaf (default: left as it is).

    Returns:
        The same structure (containers rebuilt with their own types).
    """

    def leaf(value: Any) -> Any:
        if test_type(value):
            return func(value, *args, **kwargs)
        if error_on_other_type:
            raise TypeError(
                f"{getattr(func, '__name__', 'the function')} applies to nested lists/tuples/dicts of values for which "
                f"{getattr(test_type, '__name__', 'test_type')} is true, but found a {type(value).__name__}."
            )
        return value

    return apply_to_collection(data, _Leaf, leaf)


def concatenate(data: list[Any] | tuple[Any, ...], dim: int = 0) -> Any:
    """Join a list of batches of one structure: their tensors concatenated along ``dim``.

    One batch comes back as it is. Lists of plain values (strings, numbers) are joined too.

    Raises:
        TypeError: ``data`` is not a non-empty list or tuple of batches.
    """

    if not isinstance(data, (list, tuple)) or not data:
        raise TypeError(
            f"concatenate takes a non-empty list of batches, got {type(data).__name__} {data!r:.60}."
        )
    return concatenate_batches(list(data), dim=dim)


def _is_half(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.dtype in (torch.float16, torch.bfloat16)


def convert_to_fp32(tensor: Any) -> Any:
    """Every float16/bfloat16 tensor in ``tensor`` (nested allowed) as float32; other leaves unchanged."""
    return recursively_apply(lambda value: value.float(), tensor, test_type=_is_half)
