"""Hardware this machine lacks, faked at torch's boundary for tests.

CUDA, XPU and MPS are faked by patching ``torch.cuda.device_count`` and friends, XLA by a
stand-in ``torch_xla`` package in ``sys.modules``: never by patching drivetrain's own functions.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import platform
import sys
import types
from typing import Any

import pytest
import torch


class FakeHardware:
    """Switches the faked hardware of one test on and off."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self._monkeypatch = monkeypatch
        self.cuda(0)
        self.xpu(0)
        self.mps(False)
        self.hide_torch_xla()

    def cuda(self, count: int) -> None:
        self._monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
        self._monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)

    def xpu(self, count: int) -> None:
        # torch.xpu.is_available() asks torch.xpu.device_count(), so this fakes both.
        self._monkeypatch.setattr(torch.xpu, "device_count", lambda: count)

    def mps(self, available: bool, machine: str = "arm64") -> None:
        self._monkeypatch.setattr(torch.backends.mps, "is_available", lambda: available)
        self._monkeypatch.setattr(platform, "system", lambda: "Darwin" if available else "Linux")
        self._monkeypatch.setattr(platform, "machine", lambda: machine if available else "x86_64")

    def hide_torch_xla(self) -> None:
        """Make torch_xla look uninstalled even where it is."""
        real_find_spec = importlib.util.find_spec

        def find_spec(name: str, package: str | None = None) -> Any:
            if name == "torch_xla" or name.startswith("torch_xla."):
                return None
            return real_find_spec(name, package)

        self._monkeypatch.setattr(importlib.util, "find_spec", find_spec)

    def torch_xla(
        self,
        *,
        device_type: str = "TPU",
        count: int = 4,
        error: type[Exception] | None = None,
        memory_info: dict[str, int] | None = None,
    ) -> None:
        """Install a stand-in ``torch_xla`` package reporting ``count`` devices of ``device_type``."""
        self._monkeypatch.setattr(importlib.util, "find_spec", _real_find_spec)

        def device_count() -> int:
            if error is not None:
                raise error("the XLA runtime could not start")
            return count

        def get_memory_info(device: torch.device) -> dict[str, int]:
            return dict(memory_info or {})

        rng = {"seed": 101}
        self.xla_waits = 0

        def set_rng_state(seed: int, device: Any = None) -> None:
            rng["seed"] = seed

        def wait_device_ops(devices: Any = None) -> None:
            self.xla_waits += 1

        modules = {
            "torch_xla": {},
            "torch_xla.runtime": {
                "device_type": lambda: device_type,
                "addressable_device_count": device_count,
            },
            "torch_xla._internal": {},
            "torch_xla._internal.tpu": {"num_available_devices": device_count},
            "torch_xla.core": {},
            "torch_xla.core.xla_model": {
                "get_memory_info": get_memory_info,
                "get_rng_state": lambda device=None: rng["seed"],
                "set_rng_state": set_rng_state,
                "wait_device_ops": wait_device_ops,
            },
        }
        built: dict[str, types.ModuleType] = {}
        for name, attributes in modules.items():
            module = types.ModuleType(name)
            module.__spec__ = importlib.machinery.ModuleSpec(name, loader=None, is_package=True)
            module.__path__ = []
            for attribute, value in attributes.items():
                setattr(module, attribute, value)
            built[name] = module
            self._monkeypatch.setitem(sys.modules, name, module)
            parent, _, child = name.rpartition(".")
            if parent:
                setattr(built[parent], child, module)


_real_find_spec = importlib.util.find_spec
