"""Precision under DeepSpeed: the engine owns casting and loss scaling, this plugin feeds it.

DeepSpeed has its own mixed precision: with ``"bf16"`` or ``"fp16"`` enabled in its config
the engine holds the model in 16 bits, keeps float32 master weights inside its ZeRO
optimizer and (for fp16) scales the loss dynamically. So our names map onto the config, not
onto autocast:

=============================  ======================================================
name                           DeepSpeed config
=============================  ======================================================
32-true                        neither ``bf16`` nor ``fp16`` enabled
bf16-mixed, bf16-true          ``{"bf16": {"enabled": true}}``
16-mixed, 16-true              ``{"fp16": {"enabled": true}}`` (dynamic loss scale)
=============================  ======================================================

The plugin casts floating-point inputs to the engine's dtype (the engine's weights are in it)
and outputs back to float32. ``"64-true"`` has no DeepSpeed counterpart and is an error.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from drivetrain._utilities.apply import apply_to_collection
from drivetrain.plugins.precision.precision import Precision

_DTYPES: dict[str, torch.dtype] = {
    "32-true": torch.float32,
    "bf16-mixed": torch.bfloat16,
    "bf16-true": torch.bfloat16,
    "16-mixed": torch.float16,
    "16-true": torch.float16,
}


class DeepSpeedPrecision(Precision):
    """Tell the DeepSpeed engine which dtype to train in, and cast batches to it.

    Args:
        precision: ``"32-true"``, ``"bf16-mixed"``, ``"bf16-true"``, ``"16-mixed"`` or ``"16-true"``.

    Raises:
        ValueError: for another name (``"64-true"`` included).
    """

    def __init__(self, precision: str = "32-true") -> None:
        if precision not in _DTYPES:
            raise ValueError(
                f"DeepSpeed cannot train with precision={precision!r}; it supports "
                f"{', '.join(map(repr, _DTYPES))}. Pick one of those, or another strategy (e.g. 'fsdp', 'ddp')."
            )
        self.name = precision
        self._dtype = _DTYPES[precision]
        #: The engine whose fp16 overflow state :attr:`last_step_skipped` reads (set by the strategy).
        self.engine: Any = None

    @property
    def dtype(self) -> torch.dtype:
        """The dtype the engine holds the model in and computes in."""
        return self._dtype

    @property
    def changes_forward(self) -> bool:
        return self._dtype is not torch.float32

    def convert_input(self, data: Any) -> Any:
        """Cast floating-point tensors to the engine's dtype (integer tensors are kept)."""
        if self._dtype is torch.float32:
            return data
        return apply_to_collection(data, Tensor, self._to_compute_dtype)

    def convert_output(self, data: Any) -> Any:
        """Cast tensors in the engine's 16-bit dtype back to float32 (gradients flow through)."""
        if self._dtype is torch.float32:
            return data
        return apply_to_collection(data, Tensor, self._to_float32)

    @property
    def skips_nonfinite_steps(self) -> bool:
        """True for float16: DeepSpeed's loss scaler skips a step whose gradients overflowed."""
        return self._dtype is torch.float16

    @property
    def last_step_skipped(self) -> bool:
        """Whether DeepSpeed's fp16 loss scaler skipped the latest step (gradient overflow)."""
        if self._dtype is not torch.float16 or self.engine is None:
            return False
        return bool(getattr(self.engine.optimizer, "overflow", False))

    def _to_compute_dtype(self, tensor: Tensor) -> Tensor:
        return tensor.to(self._dtype) if tensor.is_floating_point() else tensor

    def _to_float32(self, tensor: Tensor) -> Tensor:
        return tensor.to(torch.float32) if tensor.dtype == self._dtype else tensor
