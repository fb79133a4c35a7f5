"""Accelerate's ``accelerate.utils.modeling``: taking a model out of its wrappers (``extract_model_from_parallel``),
and the big-model utilities, defined in :mod:`drivetrain.big_modeling` (sizes, device maps, tied
parameters, placing tensors), under the module path Accelerate programs import them from."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torch import nn

from drivetrain._utilities.lazy import lazy_exports
from drivetrain.plugins.precision.forward import remove_precision_forward
from drivetrain.strategies.strategy import unwrap_parallel

if TYPE_CHECKING:  # pragma: no cover - what type checkers see for the lazy names below
    pass

_BIG_MODELING = (
    "align_module_device",
    "check_device_map",
    "clean_device_map",
    "compute_module_sizes",
    "compute_module_total_buffer_size",
    "convert_file_size_to_int",
    "dtype_byte_size",
    "find_tied_parameters",
    "get_balanced_memory",
    "get_max_memory",
    "get_non_persistent_buffers",
    "get_state_dict_offloaded_model",
    "has_offloaded_params",
    "infer_auto_device_map",
    "load_checkpoint_in_model",
    "named_module_tensors",
    "offload_state_dict",
    "retie_parameters",
    "set_module_tensor_to_device",
)
# Imported on first use: unwrapping a model (the façade's unwrap_model) does not load the big-model code.
__getattr__, __dir__ = lazy_exports(__name__, dict.fromkeys(_BIG_MODELING, "drivetrain.big_modeling"))

__all__ = ["extract_model_from_parallel", *_BIG_MODELING]


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
