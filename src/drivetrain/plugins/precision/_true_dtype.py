"""The shared machinery of the "true" precisions: everything computes in one floating dtype.

``"64-true"``, ``"16-true"`` and ``"bf16-true"`` differ only in the dtype, so they share this
one private base: the module is cast, created and run in ``dtype``, batches are cast into it and
outputs are cast back to float32 so that losses and metrics computed outside ``forward`` see
the dtype the rest of a training program expects.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import torch
from torch import Tensor, nn

from drivetrain._utilities.apply import apply_to_collection
from drivetrain.plugins.precision.precision import Precision, default_dtype

# nn.Module's casts that change floating-point parameters and buffers only, per dtype.
_FLOATING_ONLY_CASTS: dict[torch.dtype, Callable[[nn.Module], nn.Module]] = {
    torch.float64: nn.Module.double,
    torch.float16: nn.Module.half,
    torch.bfloat16: nn.Module.bfloat16,
}


class _TruePrecision(Precision):
    """Run the whole model in ``dtype`` (parameters, buffers, inputs and activations)."""

    def __init__(self, dtype: torch.dtype) -> None:
        self._dtype = dtype

    @property
    def dtype(self) -> torch.dtype:
        """The dtype the model is converted to and computes in."""
        return self._dtype

    def convert_module(self, module: nn.Module) -> nn.Module:
        """Cast every floating-point parameter and buffer of ``module`` to :attr:`dtype`, in place.

        Only floating-point tensors change: integer buffers (counters) and complex ones (FFT
        filters, rotary tables) keep their dtype. ``module.to(dtype=...)`` would also cast complex
        tensors, and to a real dtype that throws their imaginary part away; torch's own
        ``double()``/``half()``/``bfloat16()`` touch floating-point tensors only.
        """
        return _FLOATING_ONLY_CASTS[self._dtype](module)

    def module_init_context(self) -> AbstractContextManager[Any]:
        """Make :attr:`dtype` the default so a model built inside is born in it (no fp32 copy)."""
        return default_dtype(self._dtype)

    def forward_context(self) -> AbstractContextManager[Any]:
        """Make :attr:`dtype` the default so tensors created inside ``forward`` match the weights."""
        return default_dtype(self._dtype)

    def convert_input(self, data: Any) -> Any:
        """Cast every floating-point tensor in ``data`` to :attr:`dtype` (integer tensors are kept)."""
        return apply_to_collection(data, Tensor, self._to_compute_dtype)

    def convert_output(self, data: Any) -> Any:
        """Cast every tensor of :attr:`dtype` in ``data`` back to float32 (gradients flow through)."""
        return apply_to_collection(data, Tensor, self._to_float32)

    def _to_compute_dtype(self, tensor: Tensor) -> Tensor:
        return tensor.to(self._dtype) if tensor.is_floating_point() else tensor

    def _to_float32(self, tensor: Tensor) -> Tensor:
        # Only tensors in the compute dtype came out of the converted model; a float64 metric
        # a user computes inside a half-precision forward is theirs to keep.
        return tensor.to(torch.float32) if tensor.dtype == self._dtype else tensor
