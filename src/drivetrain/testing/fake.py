"""``fake=True``: an accelerator whose hardware is absent runs on CPU tensors, behind its own name.

The accelerator's class is replaced (in the registries, under every name it holds) by a subclass
that the kit makes here: the plugin's own methods still run (``parse_devices``,
``get_parallel_devices``, ``setup_device``, the random-generator hooks, ``get_device_stats`` …),
against its device library or a stand-in for it (:mod:`drivetrain.testing.stand_ins`), but the
devices it hands the strategy are CPU devices: ``torch.device("xpu", 1)`` becomes
``torch.device("cpu", 1)``, which torch treats as the CPU while the index says which of the
plugin's devices it stands for. Methods that take a device get the plugin's own device back.
Parallel strategies therefore run gloo process groups, and models and batches are CPU tensors.

Without a stand-in for the device library, the fake also answers ``is_available()`` (True) and
``auto_device_count()`` (the devices asked for) in place of the plugin, which could not answer here.
"""

from __future__ import annotations

from typing import Any, cast

import torch

from drivetrain.accelerators.accelerator import Accelerator
from drivetrain.accelerators.registry import AcceleratorRegistry


def fake_accelerator(cls: type[Accelerator], *, forced_count: int | None = None) -> type[Accelerator]:
    """A subclass of ``cls`` whose devices are CPU devices standing in for ``cls``'s own.

    Args:
        cls: the accelerator under test.
        forced_count: answer ``is_available()`` with True and ``auto_device_count()`` with this
            count instead of asking ``cls`` (for a device library that is absent and has no stand-in).
    """
    originals: list[torch.device] = []

    def own(device: Any) -> Any:
        """The plugin's device for a translated CPU device (anything else unchanged)."""
        translated = torch.device(device) if isinstance(device, (str, torch.device)) else None
        if translated is not None and translated.type == "cpu" and translated.index is not None and originals:
            return originals[translated.index % len(originals)]
        return device

    def get_parallel_devices(devices: Any) -> list[torch.device]:
        found = cls.get_parallel_devices(devices)
        if not isinstance(found, (list, tuple)) or not all(isinstance(d, torch.device) for d in found):
            return cast("list[torch.device]", found)  # drivetrain's own check reports it, naming cls
        originals[:] = list(found)
        return [torch.device("cpu", index) for index in range(len(found))]

    namespace: dict[str, Any] = {
        "get_parallel_devices": staticmethod(get_parallel_devices),
        "setup_device": lambda self, device: cls.setup_device(self, own(device)),
        "get_device_stats": lambda self, device: cls.get_device_stats(self, own(device)),
        "synchronize": lambda self, device=None: cls.synchronize(self, own(device)),
        "training_memory": lambda self, device: cls.training_memory(self, own(device)),
        "kit_original_devices": staticmethod(lambda: list(originals)),
        "kit_fake_of": cls,
        "__module__": cls.__module__,
        "__qualname__": cls.__qualname__,
        "__doc__": cls.__doc__,
    }
    if forced_count is not None:
        namespace["is_available"] = staticmethod(lambda: True)
        namespace["auto_device_count"] = staticmethod(lambda: forced_count)
    return type(cls.__name__, (cls,), namespace)


def install_fake(cls: type[Accelerator], *, forced_count: int | None = None) -> type[Accelerator]:
    """Make :func:`fake_accelerator` of ``cls`` what every registry name of ``cls`` means; returns it.

    Raises:
        ValueError: ``cls`` holds no name in the accelerator registry (the fake replaces registered
            names only; pass an instance of the returned class otherwise).
    """
    fake = fake_accelerator(cls, forced_count=forced_count)
    for entry in AcceleratorRegistry.describe():
        if entry.cls is cls:
            AcceleratorRegistry.register(
                entry.name, fake, description=entry.description, override=True, **entry.init_kwargs
            )
    return fake


def original_class(accelerator: Accelerator | type[Accelerator]) -> type[Accelerator]:
    """The plugin's own class behind a fake (the class itself for anything else)."""
    cls = accelerator if isinstance(accelerator, type) else type(accelerator)
    return cast("type[Accelerator]", getattr(cls, "kit_fake_of", cls))
