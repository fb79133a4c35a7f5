"""The Accelerate-style front door: ``drivetrain.Accelerator`` and what its ``prepare`` returns.

Each name is imported on first use; the data layer, the loggers and the core are imported when
an Accelerator is built or used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from drivetrain._utilities.lazy import lazy_exports

if TYPE_CHECKING:  # pragma: no cover - what type checkers and IDEs see for the lazy names below
    from drivetrain.facade.accelerator import Accelerator
    from drivetrain.facade.process_state import AcceleratorState, PartialState
    from drivetrain.facade.state import GradientState
    from drivetrain.facade.wrappers import PreparedOptimizer, PreparedScheduler
    from drivetrain.plugins.precision.forward import PrecisionForward

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "Accelerator": "drivetrain.facade.accelerator",
        # Through the Accelerator's module: the views make an Accelerator when none exists yet.
        "AcceleratorState": "drivetrain.facade.accelerator",
        "PartialState": "drivetrain.facade.accelerator",
        "GradientState": "drivetrain.facade.state",
        "PrecisionForward": "drivetrain.plugins.precision.forward",
        "PreparedOptimizer": "drivetrain.facade.wrappers",
        "PreparedScheduler": "drivetrain.facade.wrappers",
    },
)

__all__ = [
    "Accelerator",
    "AcceleratorState",
    "GradientState",
    "PartialState",
    "PrecisionForward",
    "PreparedOptimizer",
    "PreparedScheduler",
]
