"""Mixed precision with ``torch.autocast`` options from ``AutocastKwargs``.

The core's :class:`~drivetrain.plugins.precision.MixedPrecision` autocasts with torch's defaults;
Accelerate users can change ``enabled`` and ``cache_enabled``, for every forward (a kwargs
handler) or for one block (``accelerator.autocast(handler)``).
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch

from drivetrain.plugins.precision.amp import MixedPrecision
from drivetrain.plugins.precision.precision import Precision


class AutocastOptionsPrecision(MixedPrecision):
    """:class:`MixedPrecision` whose autocast takes extra options.

    Args:
        precision: ``"16-mixed"`` or ``"bf16-mixed"``.
        device: the device type autocast runs on.
        scaler: the loss scaler (float16).
        autocast_kwargs: ``enabled`` / ``cache_enabled`` for ``torch.autocast``.
    """

    def __init__(
        self,
        precision: str = "16-mixed",
        *,
        device: str | torch.device = "cuda",
        scaler: torch.amp.GradScaler | None = None,
        autocast_kwargs: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(precision, device=device, scaler=scaler)
        self.autocast_kwargs = dict(autocast_kwargs or {})

    def forward_context(self) -> AbstractContextManager[Any]:
        return autocast_context(self, self.autocast_kwargs)


def autocast_context(precision: Precision, options: dict[str, Any]) -> AbstractContextManager[Any]:
    """``precision``'s autocast with ``options`` (no-op for precisions that do not autocast)."""
    if not isinstance(precision, MixedPrecision):
        return nullcontext()
    return torch.autocast(device_type=precision.device, dtype=precision.dtype, **options)
