"""Hardware accelerators: the :class:`Accelerator` plugin interface, the built-ins and their registry.

Importing this package registers the built-in accelerators (``cpu``, ``cuda``, ``mps``, ``xla``
with its alias ``tpu``, ``xpu``) in :data:`AcceleratorRegistry`. It stays cheap: no CUDA context
is created and ``torch_xla`` is not imported.
"""

from drivetrain.accelerators.accelerator import Accelerator
from drivetrain.accelerators.cpu import CPUAccelerator
from drivetrain.accelerators.cuda import CUDAAccelerator
from drivetrain.accelerators.mps import MPSAccelerator
from drivetrain.accelerators.registry import AcceleratorRegistry
from drivetrain.accelerators.selection import available_here, devices_for, resolve_accelerator
from drivetrain.accelerators.xla import XLAAccelerator
from drivetrain.accelerators.xpu import XPUAccelerator

__all__ = [
    "Accelerator",
    "AcceleratorRegistry",
    "CPUAccelerator",
    "CUDAAccelerator",
    "MPSAccelerator",
    "XLAAccelerator",
    "XPUAccelerator",
    "available_here",
    "devices_for",
    "resolve_accelerator",
]
