"""``"16-true"`` and ``"bf16-true"``: train entirely in a 16-bit dtype, with no float32 master copy.

Halves the memory of weights, gradients and optimizer state compared with mixed precision, at
the cost of accuracy; bfloat16 keeps float32's range and is the usual choice.
"""

from __future__ import annotations

import torch

from drivetrain.plugins.precision._true_dtype import _TruePrecision

_DTYPES = {"16-true": torch.float16, "bf16-true": torch.bfloat16}


class HalfPrecision(_TruePrecision):
    """Parameters, buffers, inputs and activations in float16 or bfloat16.

    Args:
        precision: ``"16-true"`` (float16) or ``"bf16-true"`` (bfloat16).

    Raises:
        ValueError: for any other ``precision``.
    """

    def __init__(self, precision: str = "bf16-true") -> None:
        dtype = _DTYPES.get(precision) if isinstance(precision, str) else None
        if dtype is None:
            raise ValueError(
                f"HalfPrecision(precision={precision!r}) is not supported; use one of "
                f"{', '.join(map(repr, _DTYPES))}. For mixed precision use MixedPrecision, for "
                f"float64 DoublePrecision."
            )
        super().__init__(dtype)
        self.name = precision
