"""Collective operations over ``torch.distributed`` with the checks users need.

``torch.distributed`` hangs or returns garbage when ranks pass tensors of different shapes to a
gather; here every gather first compares shapes and dtypes across ranks and raises an error
naming the ranks that disagree.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

_BACKEND_FOR_DEVICE = {"cuda": "nccl", "xpu": "xccl", "hpu": "hccl"}
_MAX_CHECKED_DIMS = 16
#: The dtypes collectives can exchange, by index: what a tensor's layout code carries.
DTYPES = [
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.int64,
    torch.int32,
    torch.int16,
    torch.int8,
    torch.uint8,
    torch.bool,
    torch.complex64,
    torch.complex128,
]


def process_group_backend_for(device: torch.device) -> str:
    """The process-group backend for processes computing on ``device``: NCCL for CUDA, gloo on CPU."""
    return _BACKEND_FOR_DEVICE.get(device.type, "gloo")


def _reduce_op(name: str) -> Any:
    return {
        "sum": dist.ReduceOp.SUM,
        "mean": dist.ReduceOp.SUM,  # gloo has no AVG: sum, then divide
        "max": dist.ReduceOp.MAX,
        "min": dist.ReduceOp.MIN,
        "product": dist.ReduceOp.PRODUCT,
    }[name]


def all_reduce_copy(tensor: Tensor, reduce_op: str, group: Any | None = None) -> Tensor:
    """Reduce ``tensor`` across ranks into a new tensor (the input is left untouched)."""
    result = tensor.detach().clone()
    dist.all_reduce(result, op=_reduce_op(reduce_op), group=group)
    if reduce_op == "mean":
        world = dist.get_world_size(group)
        result = result / world if result.is_floating_point() else result.double() / world
    return result


def all_gather_objects(obj: Any) -> list[Any]:
    """Every rank's ``obj`` (picklable), by rank."""
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, obj)
    return gathered


def broadcast_object(obj: Any, src: int, device: torch.device | None) -> Any:
    """Rank ``src``'s ``obj`` on every rank (sent through ``device``: the rank's GPU under NCCL)."""
    payload = [obj]
    dist.broadcast_object_list(payload, src=src, device=device)
    return payload[0]


def device_barrier(device_ids: list[int] | None) -> None:
    """``dist.barrier``, on ``device_ids`` when given (NCCL)."""
    if device_ids is None:
        dist.barrier()
    else:
        dist.barrier(device_ids=device_ids)


def _signature(tensor: Tensor) -> Tensor:
    """A fixed-length int64 description of a tensor's dtype and shape, for comparing across ranks."""
    signature = torch.full((2 + _MAX_CHECKED_DIMS,), -1, dtype=torch.int64)
    signature[0] = tensor.dim()
    signature[1] = DTYPES.index(tensor.dtype) if tensor.dtype in DTYPES else 99
    dims = list(tensor.shape)[:_MAX_CHECKED_DIMS]
    if dims:
        signature[2 : 2 + len(dims)] = torch.tensor(dims, dtype=torch.int64)
    return signature


def _describe(signature: list[int]) -> str:
    ndim, dtype_code = signature[0], signature[1]
    dtype = DTYPES[dtype_code] if 0 <= dtype_code < len(DTYPES) else "other dtype"
    shape = tuple(signature[2 : 2 + min(ndim, _MAX_CHECKED_DIMS)])
    return f"shape {shape}, {dtype}"


def check_same_signature(tensor: Tensor, group: Any | None = None, operation: str = "all_gather") -> None:
    """Raise ``ValueError`` naming the ranks whose tensor shape/dtype differs from rank 0's."""
    world = dist.get_world_size(group)
    device = tensor.device if dist.get_backend(group) == "nccl" else torch.device("cpu")
    mine = _signature(tensor).to(device)
    everyone = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(everyone, mine, group=group)
    rows = [row.tolist() for row in everyone]
    if all(row == rows[0] for row in rows):
        return
    groups: dict[str, list[int]] = {}
    for rank, row in enumerate(rows):
        groups.setdefault(_describe(row), []).append(rank)
    detail = "; ".join(
        f"rank{'s' if len(r) > 1 else ''} {', '.join(map(str, r))}: {d}" for d, r in groups.items()
    )
    raise ValueError(
        f"{operation} needs the same shape and dtype on every rank, but got {detail}. "
        f"Pad the tensors first (Accelerator.pad_across_processes), or gather Python objects instead."
    )


def all_gather_checked(tensor: Tensor, group: Any | None = None, sync_grads: bool = False) -> Tensor:
    """Stack ``tensor`` from every rank along a new first dimension, after checking shapes agree."""
    check_same_signature(tensor, group)
    if sync_grads:
        return _AllGatherWithGradients.apply(tensor, group)
    return _stacked_all_gather(tensor, group)


def _stacked_all_gather(tensor: Tensor, group: Any | None) -> Tensor:
    tensor = tensor.contiguous()
    gathered = [torch.empty_like(tensor) for _ in range(dist.get_world_size(group))]
    dist.all_gather(gathered, tensor, group=group)
    return torch.stack(gathered)


class _AllGatherWithGradients(torch.autograd.Function):
    """All-gather whose backward sends each rank the gradient of its own slice, summed over ranks."""

    @staticmethod
    def forward(ctx: Any, tensor: Tensor, group: Any | None) -> Tensor:
        ctx.group = group
        return _stacked_all_gather(tensor.detach(), group)

    @staticmethod
    def backward(ctx: Any, grad_output: Tensor) -> tuple[Tensor, None]:
        grad = grad_output.contiguous()
        dist.all_reduce(grad, op=dist.ReduceOp.SUM, group=ctx.group)
        return grad[dist.get_rank(ctx.group)], None
