"""``"64-true"``: train entirely in float64, for numerically sensitive work and gradient checks."""

from __future__ import annotations

import torch

from drivetrain.plugins.precision._true_dtype import _TruePrecision


class DoublePrecision(_TruePrecision):
    """Parameters, buffers, inputs and activations in float64; outputs handed back in float32.

    Example:
        >>> precision = DoublePrecision()
        >>> with precision.module_init_context():
        ...     layer = torch.nn.Linear(2, 2)
        >>> layer.weight.dtype
        torch.float64
    """

    name = "64-true"

    def __init__(self) -> None:
        super().__init__(torch.float64)
