"""The forward wrapper that runs a module in its precision's forward context (autocast).

``drivetrain.Accelerator.prepare`` installs it as a module's ``forward`` when the precision changes
the forward pass; unwrapping (``unwrap_model(keep_fp32_wrapper=False)``,
``drivetrain.utils.extract_model_from_parallel``) removes it again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from torch import nn

if TYPE_CHECKING:
    from drivetrain.plugins.precision.precision import Precision


class PrecisionForward:
    """A module's ``forward`` run inside the precision's forward context, outputs converted back.

    Installed as the module's ``forward`` only when ``precision.changes_forward`` (autocast, a
    16-bit model): with full precision the module is not touched at all.
    """

    def __init__(self, forward: Callable[..., Any], precision: Precision) -> None:
        self.original = forward
        self.precision = precision

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        precision = self.precision
        args = precision.convert_input(args)
        if kwargs:
            kwargs = precision.convert_input(kwargs)
        with precision.forward_context():
            output = self.original(*args, **kwargs)
        return precision.convert_output(output)


def remove_precision_forward(module: nn.Module) -> None:
    """Take an installed :class:`PrecisionForward` off ``module`` (its class's ``forward`` applies again)."""
    if isinstance(module.__dict__.get("forward"), PrecisionForward):
        del module.forward
