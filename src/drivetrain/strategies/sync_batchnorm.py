"""Batch normalisation whose statistics span every process (``Trainer(sync_batchnorm=True)``).

:func:`convert_sync_batchnorm` swaps each ``BatchNorm*d`` of a module for a synchronised one,
keeping its parameters and buffers (same names, same tensors). On accelerators that is torch's
``nn.SyncBatchNorm``. torch's layer refuses CPU inputs (and DDP refuses it in a CPU module), so
on the CPU it is :class:`CPUSyncBatchNorm`, which computes the same statistics with two
differentiable all-reduces over the process group (sum and count, then the summed squared
deviations): gradients flow through the shared statistics as through torch's kernels. Outside
training, or in a one-process group, both are an ordinary batch norm.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.nn.modules.batchnorm import _BatchNorm


class CPUSyncBatchNorm(_BatchNorm):
    """Batch norm over the inputs of every process in ``process_group`` (default: all), for CPU modules."""

    def __init__(self, *args: Any, process_group: Any = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.process_group = process_group

    def _check_input_dim(self, input: Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def forward(self, input: Tensor) -> Tensor:
        group = self.process_group if self.process_group is not None else dist.group.WORLD
        if not self.training or not dist.is_initialized() or dist.get_world_size(group) == 1:
            return super().forward(input)
        self._check_input_dim(input)
        factor = 0.0 if self.momentum is None else self.momentum
        if self.track_running_stats:
            assert self.num_batches_tracked is not None
            self.num_batches_tracked.add_(1)
            if self.momentum is None:  # a cumulative moving average
                factor = 1.0 / float(self.num_batches_tracked.item())
        dims = [0, *range(2, input.dim())]
        shape = [1, -1] + [1] * (input.dim() - 2)
        count = torch.tensor([input.numel() / input.size(1)], dtype=input.dtype)
        totals = _SumAcrossProcesses.apply(torch.cat([input.sum(dims), count]), group)
        total = totals[-1]
        mean = totals[:-1] / total
        centred = input - mean.reshape(shape)
        var = _SumAcrossProcesses.apply((centred * centred).sum(dims), group) / total
        output = centred * torch.rsqrt(var + self.eps).reshape(shape)
        if self.weight is not None:
            output = output * self.weight.reshape(shape)
        if self.bias is not None:
            output = output + self.bias.reshape(shape)
        if self.track_running_stats and self.running_mean is not None and self.running_var is not None:
            with torch.no_grad():
                size = float(total)
                unbiased = var.detach() * (size / max(size - 1.0, 1.0))
                self.running_mean.mul_(1 - factor).add_(mean.detach(), alpha=factor)
                self.running_var.mul_(1 - factor).add_(unbiased, alpha=factor)
        return output


class _SumAcrossProcesses(torch.autograd.Function):
    """The sum of a tensor over the processes of ``group``; its gradient is summed the same way
    (every process's loss depends on every process's input through the shared statistics)."""

    @staticmethod
    def forward(ctx: Any, tensor: Tensor, group: Any) -> Tensor:
        ctx.group = group
        total = tensor.clone()
        dist.all_reduce(total, group=group)
        return total

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        total = grad.clone()
        dist.all_reduce(total, group=ctx.group)
        return total, None


def convert_sync_batchnorm(module: nn.Module, device_type: str) -> nn.Module:
    """``module`` with every ``BatchNorm*d`` synchronised across processes (see the module docstring).

    Children are replaced in place, so only a module that is itself a batch norm comes back as a
    new object. Parameters and buffers move over as they are.
    """
    if device_type != "cpu":
        return nn.SyncBatchNorm.convert_sync_batchnorm(module)
    if isinstance(module, _BatchNorm) and not isinstance(module, (nn.SyncBatchNorm, CPUSyncBatchNorm)):
        return _converted(module)
    for name, child in module.named_children():
        converted = convert_sync_batchnorm(child, device_type)
        if converted is not child:
            setattr(module, name, converted)
    return module


def _converted(layer: _BatchNorm) -> CPUSyncBatchNorm:
    synced = CPUSyncBatchNorm(
        layer.num_features, layer.eps, layer.momentum, layer.affine, layer.track_running_stats
    )
    if layer.affine:
        synced.weight = layer.weight
        synced.bias = layer.bias
    synced.running_mean = layer.running_mean
    synced.running_var = layer.running_var
    synced.num_batches_tracked = layer.num_batches_tracked
    synced.training = layer.training
    return synced
