"""``"16-mixed"`` and ``"bf16-mixed"``: autocast in the forward pass, float32 weights.

Weights and optimizer state stay in float32; ``torch.autocast`` runs the forward's matmuls and
convolutions in the lower-precision dtype. float16's narrow range needs dynamic loss scaling
(``torch.amp.GradScaler``): the loss is multiplied before ``backward``, gradients are divided
again before the step, and a step whose gradients overflowed is skipped and the scale lowered.
bfloat16 has float32's range and needs no scaler.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import torch
from torch import Tensor, nn
from torch.optim import Optimizer

from drivetrain._utilities.apply import apply_to_collection
from drivetrain.plugins.precision.precision import Precision

_DTYPES = {"16-mixed": torch.float16, "bf16-mixed": torch.bfloat16}
_LOW_PRECISION = (torch.float16, torch.bfloat16)


class MixedPrecision(Precision):
    """Automatic mixed precision through ``torch.autocast``, with loss scaling for float16.

    Args:
        precision: ``"16-mixed"`` (float16, loss-scaled) or ``"bf16-mixed"`` (bfloat16).
        device: the device type autocast runs on (``"cuda"``, ``"cpu"``, ``"xpu"`` …; an index
            such as ``"cuda:1"`` is accepted and ignored).
        scaler: a ``torch.amp.GradScaler`` to use instead of the default one (float16 only).
        scaler_kwargs: options for the default ``torch.amp.GradScaler`` (``init_scale``,
            ``growth_interval`` …); with bfloat16, which needs no scaler, they have no effect
            and a warning says so.
        autocast_kwargs: further ``torch.autocast`` options (``enabled``, ``cache_enabled``).

    Raises:
        ValueError: for an unknown ``precision``, a device type without autocast, bfloat16 on a
            CUDA GPU that lacks it, or a ``scaler`` with bfloat16.
        TypeError: if ``scaler`` is not a ``torch.amp.GradScaler``.
    """

    def __init__(
        self,
        precision: str = "16-mixed",
        *,
        device: str | torch.device = "cuda",
        scaler: torch.amp.GradScaler | None = None,
        scaler_kwargs: dict[str, Any] | None = None,
        autocast_kwargs: dict[str, Any] | None = None,
    ) -> None:
        dtype = _DTYPES.get(precision) if isinstance(precision, str) else None
        if dtype is None:
            raise ValueError(
                f"MixedPrecision(precision={precision!r}) is not supported; use one of "
                f"{', '.join(map(repr, _DTYPES))}. For a model held entirely in 16 bits use "
                f"HalfPrecision ('16-true' / 'bf16-true')."
            )
        device_type = _device_type(device)
        _check_autocast(precision, dtype, device_type)
        if scaler is not None:
            if scaler_kwargs:
                raise ValueError(
                    "MixedPrecision got both scaler= and scaler_kwargs=; configure the GradScaler you pass instead."
                )
            _check_scaler(precision, scaler, device_type)
        elif dtype is torch.float16:
            scaler = torch.amp.GradScaler(device_type, **(scaler_kwargs or {}))
        elif scaler_kwargs:
            warnings.warn(
                f"scaler_kwargs={scaler_kwargs!r} has no effect: precision {precision!r} uses no loss scaler "
                f"(only '16-mixed' does).",
                UserWarning,
                stacklevel=2,
            )

        self.name = precision
        self.device = device_type
        self._dtype = dtype
        self.scaler = scaler
        self.autocast_kwargs = dict(autocast_kwargs or {})
        # The scale before the latest step, compared lazily in ``last_step_skipped``.
        self._scale_before_step: Tensor | None = None
        # Optimizers already unscaled since the last ``scaler.update()``.
        self._unscaled: set[int] = set()
        # Per optimizer class: does ``step`` require a closure (LBFGS)? Inspected once per class.
        self._closure_required: dict[type, bool] = {}

    @property
    def dtype(self) -> torch.dtype:
        """The dtype autocast computes in."""
        return self._dtype

    def forward_context(self, **autocast_options: Any) -> AbstractContextManager[Any]:
        """``torch.autocast`` for this device type and dtype (``autocast_options`` override the defaults)."""
        options = {**self.autocast_kwargs, **autocast_options} if autocast_options else self.autocast_kwargs
        return torch.autocast(device_type=self.device, dtype=self._dtype, **options)

    def convert_output(self, data: Any) -> Any:
        """Cast float16/bfloat16 tensors in ``data`` to float32, so losses and metrics computed
        outside the autocast region run in full precision (gradients flow through the cast)."""
        return apply_to_collection(data, Tensor, _to_float32)

    def pre_backward(self, tensor: Tensor, module: nn.Module | None) -> Tensor:
        """Multiply the loss by the current scale (float16); otherwise return it unchanged."""
        if self.scaler is None:
            return tensor
        return self.scaler.scale(tensor)

    def optimizer_step(
        self, optimizer: Optimizer, closure: Callable[[], Any] | None = None, **kwargs: Any
    ) -> Any:
        """Step ``optimizer``; with a scaler, unscale, skip the step on inf/NaN and update the scale.

        ``GradScaler.step`` cannot pass a closure, so a given closure (forward and backward) runs
        first and its result is returned. Optimizers that must re-evaluate the closure during the
        step (LBFGS) cannot work with float16 loss scaling and are rejected.
        """
        if self.scaler is None:
            return super().optimizer_step(optimizer, closure, **kwargs)
        if self._requires_closure(optimizer):
            raise ValueError(
                f"{type(optimizer).__name__} evaluates its closure several times inside step(), which "
                f"float16 loss scaling ('16-mixed') cannot support. Use precision='bf16-mixed' or "
                f"'32-true' with this optimizer, or choose one that does not require a closure."
            )
        closure_result = closure() if closure is not None else None
        scale = self.scaler._get_scale_async()
        # A device-side copy, not ``.item()``: reading the value would synchronise with the device
        # every step. ``update()`` changes the scale in place, so the live tensor is no record.
        self._scale_before_step = scale.clone() if scale is not None else None
        step_result = self.scaler.step(optimizer, **kwargs)
        self.scaler.update()
        self._unscaled.clear()
        return closure_result if closure is not None else step_result

    @property
    def last_step_skipped(self) -> bool:
        """Whether the latest :meth:`optimizer_step` skipped the update because of inf/NaN gradients.

        The scale only ever drops when a step is skipped (it stays or grows otherwise), so
        comparing it with its value before the step answers the question. The comparison
        synchronises with the device, which is why it happens only when this is read.
        """
        if self.scaler is None or self._scale_before_step is None:
            return False
        current = self.scaler._get_scale_async()
        return current is not None and bool(current < self._scale_before_step)

    @property
    def skips_nonfinite_steps(self) -> bool:
        """True for float16: the loss scaler skips a step whose gradients overflowed (and lowers the scale)."""
        return self.scaler is not None

    def unscale_gradients(self, optimizer: Optimizer) -> None:
        """Divide ``optimizer``'s gradients by the scale (before clipping); repeated calls are no-ops."""
        if self.scaler is None or id(optimizer) in self._unscaled:
            return
        self.scaler.unscale_(optimizer)
        self._unscaled.add(id(optimizer))

    def state_dict(self) -> dict[str, Any]:
        """The loss scaler's state (empty for bfloat16, which has none)."""
        if self.scaler is None:
            return {}
        return {"scaler": self.scaler.state_dict()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the loss scaler from :meth:`state_dict`'s output."""
        scaler_state = state_dict.get("scaler")
        if scaler_state is None:
            return
        if self.scaler is None:
            warnings.warn(
                f"The checkpoint holds loss-scaler state (saved with '16-mixed'), but precision "
                f"{self.name!r} uses no scaler, so that state is ignored.",
                UserWarning,
                stacklevel=2,
            )
            return
        self.scaler.load_state_dict(scaler_state)
        self._scale_before_step = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, device={self.device!r})"

    def _requires_closure(self, optimizer: Optimizer) -> bool:
        cls = type(optimizer)
        required = self._closure_required.get(cls)
        if required is None:
            parameter = inspect.signature(cls.step).parameters.get("closure")
            required = parameter is not None and parameter.default is inspect.Parameter.empty
            self._closure_required[cls] = required
        return required


def _to_float32(tensor: Tensor) -> Tensor:
    return tensor.to(torch.float32) if tensor.dtype in _LOW_PRECISION else tensor


def _device_type(device: str | torch.device) -> str:
    if isinstance(device, torch.device):
        return device.type
    if not isinstance(device, str):
        raise TypeError(
            f"MixedPrecision(device=...) expects a device type string such as 'cuda' or 'cpu' "
            f"(or a torch.device), got {device!r}."
        )
    try:
        return torch.device(device).type
    except RuntimeError:
        raise ValueError(
            f"MixedPrecision(device={device!r}) is not a device torch knows; pass a device type "
            f"such as 'cuda', 'cpu', 'mps' or 'xpu'."
        ) from None


def _check_autocast(precision: str, dtype: torch.dtype, device_type: str) -> None:
    # Looked up through the module each time so a test can fake it at torch's boundary.
    if not torch.amp.autocast_mode.is_autocast_available(device_type):
        raise ValueError(
            f"precision={precision!r} needs torch.autocast, which this PyTorch build does not offer "
            f"for device type {device_type!r}. Run on a device with autocast support (cuda, cpu, "
            f"xpu, mps …), or use a precision without autocast: '32-true', or "
            f"'{'bf16' if dtype is torch.bfloat16 else '16'}-true'."
        )
    if (
        dtype is torch.bfloat16
        and device_type == "cuda"
        and torch.cuda.is_available()
        and not torch.cuda.is_bf16_supported()
    ):
        raise ValueError(
            f"precision={precision!r} needs bfloat16 support, which this CUDA GPU "
            f"({torch.cuda.get_device_name()}) lacks (it arrived with compute capability 8.0). "
            f"Use precision='16-mixed' instead."
        )


def _check_scaler(precision: str, scaler: Any, device_type: str) -> None:
    if not isinstance(scaler, torch.amp.GradScaler):
        raise TypeError(
            f"MixedPrecision(scaler=...) expects a torch.amp.GradScaler, got {type(scaler).__name__}. "
            f"Pass torch.amp.GradScaler({device_type!r}, ...) or leave it out for the default."
        )
    if precision != "16-mixed":
        raise ValueError(
            f"A loss scaler was passed with precision={precision!r}, but only '16-mixed' scales the "
            f"loss (bfloat16 has float32's range). Remove scaler=..., or use precision='16-mixed'."
        )
    scaler_device = getattr(scaler, "_device", device_type)
    if scaler_device != device_type:
        raise ValueError(
            f"The GradScaler was built for device type {scaler_device!r}, but autocast runs on "
            f"{device_type!r}. Build it with torch.amp.GradScaler({device_type!r})."
        )
