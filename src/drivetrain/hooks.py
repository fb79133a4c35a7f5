"""Accelerate's ``accelerate.hooks``: ``from drivetrain.hooks import add_hook_to_module`` works like it.

Forward hooks that see keyword arguments (:class:`ModelHook`), and the device-aligning hook of
big-model inference (:class:`AlignDevicesHook`), which ``dispatch_model``, ``cpu_offload`` and
``disk_offload`` put on the modules they place. Defined in :mod:`drivetrain.big_modeling.hooks`.
"""

from drivetrain.big_modeling.hooks import (
    AlignDevicesHook,
    ModelHook,
    SequentialHook,
    add_hook_to_module,
    attach_align_device_hook,
    attach_execution_device_hook,
    remove_hook_from_module,
    remove_hook_from_submodules,
)

__all__ = [
    "AlignDevicesHook",
    "ModelHook",
    "SequentialHook",
    "add_hook_to_module",
    "attach_align_device_hook",
    "attach_execution_device_hook",
    "remove_hook_from_module",
    "remove_hook_from_submodules",
]
