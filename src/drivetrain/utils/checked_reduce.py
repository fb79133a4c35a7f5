"""``reduce`` that finds tensors of different shapes on different processes inside its own collective.

A backend given tensors of different sizes does not say so: gloo aborts one process inside its
transport thread (or returns a wrong result on one and leaves the other waiting), NCCL returns
garbage on one rank and hangs on the other. Comparing shapes first would cost a second collective
per call. Here the comparison travels in the reduction itself, which always moves a buffer of
one fixed size, the same on every process whatever the tensor:

* ``world_size`` header slots: process ``r`` writes a code of its tensor's size, number of
  dimensions and dtype into slot ``r`` and the reduction's identity (0 for a sum, 1 for a product,
  -inf/+inf for max/min) into the others, so after the reduction every slot holds that process's
  code and every process sees at once whether they agree;
* the tensor itself, when it has at most :data:`SMALL` elements (the losses and metrics reduced
  every step), so such a reduction is still one collective. A larger tensor is reduced by a second
  collective, once the header said the processes agree.

When they do not agree, every process knows it from the same header and they exchange their
shapes (a gather of small objects, run only then) to raise one error naming every process's tensor.
The header costs no extra collective for small tensors; on gloo a one-element reduction becomes a
few-element one, which gloo runs in two steps instead of one.
The buffer is 8-byte numbers (float64, or int64 for integer and bool tensors); the tensor is
reduced in it and converted back to its dtype.
"""

from __future__ import annotations

import math
import weakref
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from drivetrain.strategies.collective_errors import CollectiveMismatchError
from drivetrain.strategies.collectives import DTYPES

if TYPE_CHECKING:
    from drivetrain.strategies.strategy import Strategy

#: Tensors with at most this many elements travel inside the checked reduction (one collective).
SMALL = 1024


class ReduceMismatchError(CollectiveMismatchError, ValueError):
    """Processes reduced tensors of different shapes or dtypes.

    A ``ValueError`` (bad input, like ``gather``'s) and a ``CollectiveMismatchError``, which is
    ``drivetrain.utils.DistributedOperationException``: what Accelerate's debug mode raises there.
    """


#: A tensor's shape and dtype name, as processes exchange them when they disagree.
Layout = tuple[tuple[int, ...], str]


def _code(tensor: Tensor) -> int:
    """The tensor's element count, number of dimensions and dtype as one number (exact in float64)."""
    dtype = DTYPES.index(tensor.dtype) if tensor.dtype in DTYPES else len(DTYPES)
    return (tensor.numel() * 64 + min(tensor.dim(), 63)) * 64 + dtype


def _identity(op: str, dtype: torch.dtype) -> float | int:
    if op == "sum":
        return 0
    if op == "product":
        return 1
    if dtype.is_floating_point:
        return -math.inf if op == "max" else math.inf
    info = torch.iinfo(dtype)
    return info.min if op == "max" else info.max


#: Per strategy, a reduction on an accelerator device whose header is read at the next one
#: (reading it at once would wait for the device, which the caller may not want to do).
_pending: weakref.WeakKeyDictionary[Any, tuple[Tensor, int, Layout, bool]] = weakref.WeakKeyDictionary()


def checked_all_reduce(strategy: Strategy, tensor: Tensor, reduction: str) -> Tensor:
    """``tensor`` reduced over the processes (``reduction``: sum, mean, max, min, product), shapes checked.

    On the CPU the header is read at once. On an accelerator device a reduction small enough to
    travel in the header's buffer does not wait for the device: its header is read at the start
    of the next reduction (by then long computed), where a mismatch raises on every process.

    Raises:
        ReduceMismatchError: (a ``ValueError``) the processes passed tensors of different shapes or
            dtypes (every process raises, naming each process's tensor).
    """
    earlier = _pending.pop(strategy, None)
    if earlier is not None:
        _verify(strategy, *earlier)
    op = "sum" if reduction == "mean" else reduction
    world, rank = strategy.world_size, strategy.global_rank
    values = torch.view_as_real(tensor) if tensor.is_complex() else tensor
    wide = torch.float64 if values.is_floating_point() else torch.int64
    count = values.numel()
    carried = count <= SMALL
    code = _code(tensor)
    # The identity everywhere: the other processes' header slots, and the elements past this tensor's.
    buffer = torch.full((world + SMALL,), _identity(op, wide), dtype=wide, device=tensor.device)
    buffer[rank] = code
    if carried:
        buffer[world : world + count] = values.detach().reshape(-1)
    reduced = strategy.all_reduce(buffer, reduce_op=op)
    layout = (tuple(tensor.shape), str(tensor.dtype).removeprefix("torch."))
    if carried and _deferred(tensor.device):
        _pending[strategy] = (reduced[:world], code, layout, True)
    else:
        _verify(strategy, reduced[:world], code, layout, False)
    if carried:
        result = reduced[world : world + count].reshape(values.shape).to(values.dtype)
        result = torch.view_as_complex(result) if tensor.is_complex() else result
    else:
        result = strategy.all_reduce(tensor, reduce_op=op)
    if reduction == "mean":
        result = (
            result / world if result.is_floating_point() or result.is_complex() else result.double() / world
        )
    return result


def _deferred(device: torch.device) -> bool:
    """Whether a small reduction's header is read at the next reduction (on accelerator devices)."""
    return device.type != "cpu"


def _verify(strategy: Strategy, codes: Tensor, code: int, layout: Layout, earlier: bool) -> None:
    if any(value != code for value in codes.tolist()):
        _raise_mismatch(strategy, layout, earlier)


def _raise_mismatch(strategy: Strategy, layout: Layout, earlier: bool) -> None:
    """Every process is here at once (the header told them all): exchange the shapes and name them."""
    everyone = strategy.all_gather_object(layout)
    groups: dict[Layout, list[int]] = {}
    for rank, each in enumerate(everyone):
        groups.setdefault((tuple(each[0]), each[1]), []).append(rank)
    detail = "; ".join(
        f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}: shape {shape}, {dtype}"
        for (shape, dtype), ranks in groups.items()
    )
    which = "the previous reduce (on the device, checked when this one started)" if earlier else "reduce"
    raise ReduceMismatchError(
        f"{which} needs tensors of the same shape and dtype on every process, but got {detail}. Reduce tensors of "
        f"one shape (pad them first with pad_across_processes), or gather them (gather / gather_object)."
    )
