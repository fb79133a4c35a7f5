"""Taking a model out of its wrappers: ``extract_model_from_parallel`` (as ``accelerate.utils``)."""

from __future__ import annotations

from typing import Any

from torch import nn

from drivetrain.plugins.precision.forward import remove_precision_forward
from drivetrain.strategies.strategy import unwrap_parallel


def extract_model_from_parallel(
    model: nn.Module, keep_fp32_wrapper: bool = True, keep_torch_compile: bool = True
) -> nn.Module:
    """The user's module inside ``torch.compile``, ``DistributedDataParallel``, ``nn.DataParallel`` and DeepSpeed.

    Args:
        model: the (possibly wrapped) module.
        keep_fp32_wrapper: ``False`` also takes off the precision's forward wrapper (autocast)
            that ``Accelerator.prepare`` installed.
        keep_torch_compile: return the ``torch.compile`` module when it wraps the user's module
            directly; one compiled around a parallel wrapper is stripped with it.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"extract_model_from_parallel expects a torch.nn.Module, got {type(model).__name__}.")
    inner = model
    while True:
        inner = unwrap_parallel(inner)
        engine_module = getattr(inner, "module", None)
        if type(inner).__name__ == "DeepSpeedEngine" and isinstance(engine_module, nn.Module):
            inner = engine_module
            continue
        break
    return finish_unwrap(model, inner, keep_fp32_wrapper, keep_torch_compile)


def finish_unwrap(
    model: nn.Module, inner: nn.Module, keep_fp32_wrapper: bool, keep_torch_compile: bool
) -> nn.Module:
    """``inner`` (the unwrapped ``model``) with the precision wrapper and ``torch.compile`` handled as asked."""
    if not keep_fp32_wrapper:
        remove_precision_forward(inner)
    if keep_torch_compile:
        outer: Any = model
        while not hasattr(outer, "_orig_mod") and isinstance(getattr(outer, "module", None), nn.Module):
            outer = outer.module  # DDP, DataParallel, DeepSpeed's engine
        if hasattr(outer, "_orig_mod") and outer._orig_mod is inner:
            return outer
    return inner
