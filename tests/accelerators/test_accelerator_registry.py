"""The accelerator registry: built-in names, user registration, the rules for taken names, entry points."""

from __future__ import annotations

import importlib.metadata
import sys
import types
from typing import Any

import pytest
import torch

from drivetrain.accelerators import (
    Accelerator,
    AcceleratorRegistry,
    CPUAccelerator,
    CUDAAccelerator,
    MPSAccelerator,
    XLAAccelerator,
    XPUAccelerator,
)

BUILTINS = {
    "cpu": CPUAccelerator,
    "cuda": CUDAAccelerator,
    "mps": MPSAccelerator,
    "tpu": XLAAccelerator,
    "xla": XLAAccelerator,
    "xpu": XPUAccelerator,
}


class _Unregistered(Accelerator):
    """A user accelerator that does not register itself (no register_accelerators in its body)."""

    def __init__(self, *, flavour: str = "plain") -> None:
        self.flavour = flavour

    @staticmethod
    def parse_devices(devices: Any) -> Any:
        return devices

    @staticmethod
    def get_parallel_devices(devices: Any) -> list[torch.device]:
        return [torch.device("cpu")] * devices

    @staticmethod
    def auto_device_count() -> int:
        return 1

    @staticmethod
    def is_available() -> bool:
        return True


class _Other(_Unregistered):
    pass


def test_builtins_are_registered_with_descriptions() -> None:
    assert set(AcceleratorRegistry.available_accelerators()) >= set(BUILTINS)
    for name, cls in BUILTINS.items():
        entry = AcceleratorRegistry.entry(name)
        assert entry.cls is cls
        assert entry.description, f"{name} has no description"


def test_get_builds_a_fresh_instance_of_the_registered_class() -> None:
    first, second = AcceleratorRegistry.get("cpu"), AcceleratorRegistry.get("cpu")
    assert type(first) is CPUAccelerator
    assert first is not second


def test_register_get_remove_with_init_kwargs() -> None:
    AcceleratorRegistry.register("npu", _Unregistered, description="a test NPU", flavour="spicy")
    assert "npu" in AcceleratorRegistry.available_accelerators()
    assert AcceleratorRegistry.entry("npu").description == "a test NPU"
    built = AcceleratorRegistry.get("npu")
    assert isinstance(built, _Unregistered)
    assert built.flavour == "spicy"
    assert AcceleratorRegistry.get("npu", flavour="mild").flavour == "mild"
    AcceleratorRegistry.remove("npu")
    assert "npu" not in AcceleratorRegistry


def test_register_as_decorator() -> None:
    @AcceleratorRegistry.register("decorated", description="via decorator")
    class Decorated(_Unregistered):
        pass

    assert Decorated.__name__ == "Decorated"  # the decorator hands the class back
    assert type(AcceleratorRegistry.get("decorated")) is Decorated


def test_defining_register_accelerators_is_enough() -> None:
    class SelfRegistering(_Unregistered):
        @classmethod
        def register_accelerators(cls, accelerator_registry: Any) -> None:
            accelerator_registry.register("selfreg", cls, description="registers itself")

    assert AcceleratorRegistry.entry("selfreg").cls is SelfRegistering


def test_subclass_without_its_own_hook_does_not_take_the_parent_name() -> None:
    class MyCUDA(CUDAAccelerator):
        pass

    assert AcceleratorRegistry.entry("cuda").cls is CUDAAccelerator
    assert MyCUDA not in [entry.cls for entry in AcceleratorRegistry.describe()]


def test_unknown_name_lists_the_available_ones() -> None:
    with pytest.raises(
        ValueError, match=r"Unknown accelerator 'nope'\. Available: cpu, cuda, hpu, mps, tpu, xla, xpu\."
    ):
        AcceleratorRegistry.get("nope")
    with pytest.raises(ValueError, match=r"Unknown accelerator 'nope'\. Available: cpu, cuda"):
        AcceleratorRegistry.remove("nope")


def test_register_rejects_instances_and_bad_names() -> None:
    with pytest.raises(TypeError, match="expects a class"):
        AcceleratorRegistry.register("inst", _Unregistered())
    with pytest.raises(TypeError, match="non-empty string"):
        AcceleratorRegistry.register("", _Unregistered)


def test_user_class_over_builtin_warns_and_replaces() -> None:
    with pytest.warns(
        UserWarning, match=r"_Unregistered replaces the built-in accelerator 'cuda' \(CUDAAccelerator\)"
    ):
        AcceleratorRegistry.register("cuda", _Unregistered)
    assert AcceleratorRegistry.entry("cuda").cls is _Unregistered


def test_user_class_over_user_class_needs_override() -> None:
    AcceleratorRegistry.register("npu", _Unregistered)
    with pytest.raises(ValueError, match=r"'npu' is already registered to .*_Unregistered.*override=True"):
        AcceleratorRegistry.register("npu", _Other)
    assert AcceleratorRegistry.entry("npu").cls is _Unregistered
    AcceleratorRegistry.register("npu", _Other, override=True)
    assert AcceleratorRegistry.entry("npu").cls is _Other


def test_same_class_again_replaces_silently() -> None:
    AcceleratorRegistry.register("npu", _Unregistered, description="first")
    AcceleratorRegistry.register("npu", _Unregistered, description="second")
    assert AcceleratorRegistry.entry("npu").description == "second"


def test_the_registry_fixture_restores_builtins() -> None:
    # Runs after tests that replaced "cuda" and removed names: every built-in is back.
    for name, cls in BUILTINS.items():
        assert AcceleratorRegistry.entry(name).cls is cls


# -- entry points -------------------------------------------------------------------------------
GROUP = "drivetrain.accelerators"


@pytest.fixture
def plugin_module(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """An importable third-party module holding an accelerator with a registration hook."""

    class PluginAccelerator(_Unregistered):
        @classmethod
        def register_accelerators(cls, accelerator_registry: Any) -> None:
            accelerator_registry.register("plugin_npu", cls, description="from an entry point")

    module = types.ModuleType("drivetrain_test_plugin")
    module.PluginAccelerator = PluginAccelerator  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "drivetrain_test_plugin", module)
    return module


def _fake_entry_points(monkeypatch: pytest.MonkeyPatch, *points: importlib.metadata.EntryPoint) -> list[str]:
    asked: list[str] = []

    def entry_points(*, group: str) -> list[importlib.metadata.EntryPoint]:
        asked.append(group)
        return [point for point in points if point.group == group]

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)
    return asked


def test_entry_points_register_plugins_lazily_once(
    monkeypatch: pytest.MonkeyPatch, plugin_module: types.ModuleType
) -> None:
    point = importlib.metadata.EntryPoint("npu", "drivetrain_test_plugin:PluginAccelerator", GROUP)
    asked = _fake_entry_points(monkeypatch, point)
    registry = type(AcceleratorRegistry)("accelerator", entry_point_group=GROUP)
    assert asked == []  # nothing is read when the registry is made

    built = registry.get("plugin_npu")

    assert type(built) is plugin_module.PluginAccelerator
    assert registry.entry("plugin_npu").description == "from an entry point"
    registry.available_accelerators()
    assert asked == [GROUP]  # read once, on the first lookup


def test_a_broken_entry_point_warns_and_the_others_still_load(
    monkeypatch: pytest.MonkeyPatch, plugin_module: types.ModuleType
) -> None:
    broken = importlib.metadata.EntryPoint("broken", "drivetrain_no_such_module:Nothing", GROUP)
    good = importlib.metadata.EntryPoint("npu", "drivetrain_test_plugin:PluginAccelerator", GROUP)
    _fake_entry_points(monkeypatch, broken, good)
    registry = type(AcceleratorRegistry)("accelerator", entry_point_group=GROUP)

    with pytest.warns(
        RuntimeWarning, match=r"Could not load the accelerator plugin 'broken'.*ModuleNotFoundError"
    ):
        names = registry.available_accelerators()

    assert names == ["plugin_npu"]
