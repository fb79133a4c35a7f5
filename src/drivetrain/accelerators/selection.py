"""Turning the user's ``accelerator`` and ``devices`` values into an accelerator and its devices.

``connect()`` calls :func:`resolve_accelerator` and :func:`devices_for`; ``drivetrain env`` shows
:func:`available_here`. Names are looked up in :data:`AcceleratorRegistry`, so a user's class
registered under a name (even a built-in's, such as ``"xpu"``) is what that name means.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, cast

import torch

from drivetrain.accelerators.accelerator import Accelerator
from drivetrain.accelerators.registry import AcceleratorRegistry

# "auto" prefers the fastest hardware that is usually present; "gpu" the GPU backends only.
AUTO_PREFERENCE = ("cuda", "mps", "xla", "hpu", "xpu")
GPU_PREFERENCE = ("cuda", "mps", "xpu")


def resolve_accelerator(accelerator: str | Accelerator) -> Accelerator:
    """The accelerator to use for an ``accelerator=`` value.

    Args:
        accelerator: an :class:`Accelerator` instance (used as is); ``"auto"`` (the best available
            of cuda, mps, xla, xpu, else cpu); ``"gpu"`` (whichever of cuda, mps, xpu is present);
            or any registered name.

    Raises:
        TypeError: for values that are neither a string nor an Accelerator instance.
        ValueError: for unknown names, ``"gpu"`` without a GPU, and accelerators not available here.
    """
    if isinstance(accelerator, Accelerator):
        chosen, label = accelerator, f"{type(accelerator).__name__}()"
    elif isinstance(accelerator, type) and issubclass(accelerator, Accelerator):
        raise TypeError(
            f"accelerator={accelerator.__name__} is a class; pass an instance, "
            f"accelerator={accelerator.__name__}(), or the name it is registered under."
        )
    elif isinstance(accelerator, str):
        name = accelerator.strip()
        label = repr(accelerator)
        if name.lower() == "auto":
            chosen = _first_available(AUTO_PREFERENCE) or AcceleratorRegistry.get("cpu")
        elif name.lower() == "gpu":
            found = _first_available(GPU_PREFERENCE)
            if found is None:
                raise ValueError(
                    f"accelerator='gpu' was requested but no GPU backend was found here (looked for "
                    f"{', '.join(GPU_PREFERENCE)}). Available here: {', '.join(available_here())}. "
                    f"{_suggestion()}"
                )
            chosen = found
        else:
            if name not in AcceleratorRegistry and name.lower() in AcceleratorRegistry:
                name = name.lower()
            chosen = AcceleratorRegistry.get(name)
    else:
        raise TypeError(
            f"accelerator={accelerator!r} is a {type(accelerator).__name__}; pass a name such as "
            f"'auto', 'cpu', 'cuda' or 'gpu', or an instance of drivetrain.accelerators.Accelerator. "
            f"Registered names: {', '.join(AcceleratorRegistry.available_accelerators())}."
        )
    if not chosen.is_available():
        raise ValueError(
            f"accelerator={label} was requested but is not available here ({_unavailable_reason(chosen)}). "
            f"Available here: {', '.join(available_here())}. {_suggestion()}"
        )
    return chosen


def available_here() -> list[str]:
    """The registered accelerator names whose class is available in this process, sorted.

    A class whose ``is_available()`` raises counts as unavailable: one broken plugin must not
    keep the others from being listed.
    """
    names = []
    for entry in AcceleratorRegistry.describe():
        try:
            available = _registered_class(entry.name).is_available()
        except Exception:
            available = False
        if available:
            names.append(entry.name)
    return names


def devices_for(accelerator: Accelerator, devices: Any) -> list[torch.device]:
    """The ``torch.device`` of each process for ``devices`` on ``accelerator``.

    ``"auto"`` becomes ``accelerator.auto_device_count()``; the value then goes through the
    accelerator's ``parse_devices`` and ``get_parallel_devices``. A custom accelerator whose
    ``parse_devices`` passes a count through unchanged while its ``get_parallel_devices`` iterates
    indices (as in the seeds' example) gets the indices ``0..n-1``.

    Raises:
        TypeError: if ``accelerator`` is not an Accelerator instance, or its answer is not a list
            of ``torch.device``.
        ValueError: for invalid ``devices`` (from ``parse_devices``) or an empty device list.
    """
    if not isinstance(accelerator, Accelerator):
        raise TypeError(
            f"devices_for() needs an Accelerator instance, got {accelerator!r}; "
            f"resolve a name first with resolve_accelerator({accelerator!r})."
        )
    cls_name = type(accelerator).__name__
    if isinstance(devices, str) and devices.strip().lower() == "auto":
        count = accelerator.auto_device_count()
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            raise ValueError(
                f"devices='auto' asks {cls_name}.auto_device_count() how many devices to use, and it "
                f"answered {count!r}. Pass devices=N explicitly, or fix auto_device_count() to return a "
                f"positive int."
            )
        devices = count
    parsed = accelerator.parse_devices(devices)
    try:
        parallel = accelerator.get_parallel_devices(parsed)
    except TypeError:
        if not isinstance(parsed, int) or isinstance(parsed, bool) or parsed < 1:
            raise
        parallel = accelerator.get_parallel_devices(list(range(parsed)))
    return _checked_devices(parallel, cls_name, devices)


def _checked_devices(parallel: Any, cls_name: str, devices: Any) -> list[torch.device]:
    if not isinstance(parallel, (list, tuple)) or not all(isinstance(d, torch.device) for d in parallel):
        raise TypeError(
            f"{cls_name}.get_parallel_devices() must return a list of torch.device, got {parallel!r} "
            f"for devices={devices!r}. Return e.g. [torch.device('xpu', i) for i in indices]."
        )
    if not parallel:
        raise ValueError(
            f"{cls_name}.get_parallel_devices() returned no device for devices={devices!r}. "
            f"Ask for at least one device, or fix the accelerator's parse_devices/get_parallel_devices."
        )
    return list(parallel)


def _first_available(names: Iterable[str]) -> Accelerator | None:
    for name in names:
        if name in AcceleratorRegistry and _registered_class(name).is_available():
            return AcceleratorRegistry.get(name)
    return None


def _registered_class(name: str) -> type[Accelerator]:
    return cast("type[Accelerator]", AcceleratorRegistry.entry(name).cls)


def _unavailable_reason(accelerator: Accelerator) -> str:
    try:
        return str(type(accelerator).unavailable_reason())
    except Exception as error:  # a broken explanation must not hide the real error
        return f"{type(accelerator).__name__}.is_available() returned False; unavailable_reason() raised {error!r}"


def _suggestion() -> str:
    options = [repr(name) for name in available_here()] + ["'auto'"]
    listed = ", ".join(options[:-1]) + f" or {options[-1]}" if len(options) > 1 else options[0]
    return f"Use accelerator={listed}."
