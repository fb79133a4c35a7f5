"""Hardware accelerators: the :class:`Accelerator` plugin interface, the built-ins and their registry.

The built-in accelerators (``cpu``, ``cuda``, ``mps``, ``xla`` with its alias ``tpu``, ``xpu``, ``hpu``)
are in :data:`AcceleratorRegistry` from its first lookup. Each name here is imported on first use,
and none creates a CUDA context or imports ``torch_xla`` or ``habana_frameworks``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from drivetrain._utilities.lazy import lazy_exports

if TYPE_CHECKING:  # pragma: no cover - what type checkers and IDEs see for the lazy names below
    from drivetrain.accelerators.accelerator import Accelerator
    from drivetrain.accelerators.cpu import CPUAccelerator
    from drivetrain.accelerators.cuda import CUDAAccelerator
    from drivetrain.accelerators.hpu import HPUAccelerator
    from drivetrain.accelerators.mps import MPSAccelerator
    from drivetrain.accelerators.registry import AcceleratorRegistry
    from drivetrain.accelerators.selection import available_here, devices_for, resolve_accelerator
    from drivetrain.accelerators.xla import XLAAccelerator
    from drivetrain.accelerators.xpu import XPUAccelerator

_SELECTION = "drivetrain.accelerators.selection"
__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "Accelerator": "drivetrain.accelerators.accelerator",
        "AcceleratorRegistry": "drivetrain.accelerators.registry",
        "CPUAccelerator": "drivetrain.accelerators.cpu",
        "CUDAAccelerator": "drivetrain.accelerators.cuda",
        "HPUAccelerator": "drivetrain.accelerators.hpu",
        "MPSAccelerator": "drivetrain.accelerators.mps",
        "XLAAccelerator": "drivetrain.accelerators.xla",
        "XPUAccelerator": "drivetrain.accelerators.xpu",
        "available_here": _SELECTION,
        "devices_for": _SELECTION,
        "resolve_accelerator": _SELECTION,
    },
)

__all__ = [
    "Accelerator",
    "AcceleratorRegistry",
    "CPUAccelerator",
    "CUDAAccelerator",
    "HPUAccelerator",
    "MPSAccelerator",
    "XLAAccelerator",
    "XPUAccelerator",
    "available_here",
    "devices_for",
    "resolve_accelerator",
]
