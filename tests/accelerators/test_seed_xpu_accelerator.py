"""The seeds' custom XPUAccelerator, exactly as the user documentation writes it, must just work.

The class body below is the seed's example verbatim (its two code blocks joined), so it keeps the
seed's ``Dict``/``Union`` annotations and its placeholder-free f-string.
"""
# ruff: noqa: UP006, UP035, F541

from __future__ import annotations

import sys
import types
import warnings
from typing import Any, Dict, Union

import pytest
import torch

from drivetrain.accelerators import (
    Accelerator,
    AcceleratorRegistry,
    devices_for,
    resolve_accelerator,
)
from drivetrain.accelerators import XPUAccelerator as BuiltinXPUAccelerator


@pytest.fixture
def xpulib(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """The seed's fictional ``xpulib``: reports four available devices unless a test says otherwise."""
    module = types.ModuleType("xpulib")
    module.is_available = lambda: True  # type: ignore[attr-defined]
    module.available_devices = lambda: 4  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "xpulib", module)
    return module


def define_seed_accelerator() -> type[Accelerator]:
    """Run the seed's class definition, as a user's script would at import."""
    import xpulib

    class XPUAccelerator(Accelerator):
        """Support for a hypothetical XPU, optimized for large-scale machine learning."""

        @staticmethod
        def parse_devices(devices: Any) -> Any:
            # Put parsing logic here how devices can be passed into the Trainer
            # via the `devices` argument
            return devices

        @staticmethod
        def get_parallel_devices(devices: Any) -> Any:
            # Here, convert the device indices to actual device objects
            return [torch.device("xpu", idx) for idx in devices]

        @staticmethod
        def auto_device_count() -> int:
            # Return a value for auto-device selection when `Trainer(devices="auto")`
            return xpulib.available_devices()

        @staticmethod
        def is_available() -> bool:
            return xpulib.is_available()

        def get_device_stats(self, device: Union[str, torch.device]) -> Dict[str, Any]:
            # Return optional device statistics for loggers
            return {}

        @classmethod
        def register_accelerators(cls, accelerator_registry):
            accelerator_registry.register(
                "xpu",
                cls,
                description=f"XPU Accelerator - optimized for large-scale machine learning.",
            )

    return XPUAccelerator


@pytest.fixture
def seed_accelerator(xpulib: types.ModuleType) -> type[Accelerator]:
    with pytest.warns(
        UserWarning,
        match=r"XPUAccelerator replaces the built-in accelerator 'xpu' \(XPUAccelerator\)\. "
        r"Register under another name to keep both\.",
    ):
        return define_seed_accelerator()


def test_defining_the_class_replaces_the_builtin_xpu(seed_accelerator: type[Accelerator]) -> None:
    entry = AcceleratorRegistry.entry("xpu")
    assert entry.cls is seed_accelerator
    assert entry.cls is not BuiltinXPUAccelerator
    assert entry.description == "XPU Accelerator - optimized for large-scale machine learning."


def test_selected_by_name_with_two_devices(seed_accelerator: type[Accelerator]) -> None:
    accelerator = resolve_accelerator("xpu")
    assert type(accelerator) is seed_accelerator
    assert devices_for(accelerator, 2) == [torch.device("xpu", 0), torch.device("xpu", 1)]
    assert devices_for(accelerator, [0, 1]) == [torch.device("xpu", 0), torch.device("xpu", 1)]
    assert devices_for(accelerator, "auto") == [torch.device("xpu", i) for i in range(4)]
    assert accelerator.get_device_stats(torch.device("xpu", 0)) == {}


def test_an_instance_is_used_as_given(seed_accelerator: type[Accelerator]) -> None:
    accelerator = seed_accelerator()
    assert resolve_accelerator(accelerator) is accelerator
    assert devices_for(accelerator, 2) == [torch.device("xpu", 0), torch.device("xpu", 1)]


def test_unavailable_xpulib_is_reported(
    seed_accelerator: type[Accelerator], xpulib: types.ModuleType, hardware: Any
) -> None:
    xpulib.is_available = lambda: False  # type: ignore[attr-defined]
    with pytest.raises(
        ValueError,
        match=r"^accelerator='xpu' was requested but is not available here "
        r"\(XPUAccelerator\.is_available\(\) returned False\)\. "
        r"Available here: cpu\. Use accelerator='cpu' or 'auto'\.$",
    ):
        resolve_accelerator("xpu")


def test_defining_it_again_is_silent(seed_accelerator: type[Accelerator]) -> None:
    # A spawned worker re-imports the user's script and so defines the same class again.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = define_seed_accelerator()
    assert AcceleratorRegistry.entry("xpu").cls is again


def test_another_user_class_cannot_take_xpu_without_override(seed_accelerator: type[Accelerator]) -> None:
    class OtherXPU(seed_accelerator):  # type: ignore[misc, valid-type]
        pass

    with pytest.raises(ValueError, match=r"'xpu' is already registered to .*XPUAccelerator.*override=True"):
        AcceleratorRegistry.register("xpu", OtherXPU)
    AcceleratorRegistry.register("xpu", OtherXPU, override=True)
    assert AcceleratorRegistry.entry("xpu").cls is OtherXPU
