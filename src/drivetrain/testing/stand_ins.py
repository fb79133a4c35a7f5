"""Stand-ins for device libraries this machine lacks: CUDA, XPU, MPS, XLA and HPU, on the CPU.

A stand-in makes a device library answer as if ``count`` devices were present (``torch.cuda``'s
functions patched, or a ``torch_xla`` / ``habana_frameworks`` package put into ``sys.modules``),
gives each device a random generator of its own (a CPU ``torch.Generator``, so that saving and
restoring it through an accelerator's ``get_rng_state``/``set_rng_state`` can be checked), and
counts the library calls that matter (``mark_step``, ``set_device`` …). Tensors stay on the CPU:
the kit translates the accelerator's devices to CPU devices (see :mod:`drivetrain.testing.fake`).

Only torch's and the device libraries' own functions are replaced, never drivetrain's: the
accelerator under test runs its real code against the stand-in.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import platform
import sys
import types
from collections import Counter
from collections.abc import Callable
from typing import Any

import torch

from drivetrain.testing.patching import Patches

#: The first seed of every stand-in device generator (device i starts at this plus i).
GENERATOR_SEED = 20240


class StandIn:
    """A device library stood in for on the CPU, for ``count`` devices.

    Use it as a context manager, or call :meth:`install` and :meth:`uninstall`. Subclasses name
    the device type they stand in for and patch what their library offers.

    Args:
        count: how many devices the library reports.
        patches: where the changes are recorded (a :class:`~drivetrain.testing.patching.Patches`,
            or pytest's ``monkeypatch``, which has the same ``setattr``/``setitem``); a private
            :class:`~drivetrain.testing.patching.Patches` when omitted.
    """

    #: The ``torch.device`` type of the devices the library drives.
    device_type: str = ""
    #: The library, for messages (``"torch.cuda"``, ``"habana_frameworks.torch"`` …).
    library: str = ""

    def __init__(self, count: int = 2, patches: Any = None) -> None:
        self.count = count
        self._patches = patches if patches is not None else Patches()
        self._own_patches = patches is None
        self.calls: Counter[str] = Counter()
        self.current = 0
        self.generators = [torch.Generator().manual_seed(GENERATOR_SEED + i) for i in range(max(count, 1))]

    # -- life cycle --------------------------------------------------------------------------
    def install(self) -> StandIn:
        """Put the stand-in in place; returns itself."""
        self._install()
        return self

    def uninstall(self) -> None:
        """Put the real library (or its absence) back; only when this stand-in owns its patches."""
        if self._own_patches:
            self._patches.undo()

    def __enter__(self) -> StandIn:
        return self.install()

    def __exit__(self, *exc: object) -> None:
        self.uninstall()

    def _install(self) -> None:
        raise NotImplementedError

    # -- the device generator of this process ----------------------------------------------------
    def generator_state(self) -> torch.Tensor:
        """The state of the current device's generator (what a checkpoint must bring back)."""
        return self.generators[self.current].get_state()

    def draw(self) -> torch.Tensor:
        """One number from the current device's generator, as dropout on the device would draw."""
        return torch.rand(1, generator=self.generators[self.current])

    def reseed(self) -> None:
        """Put every device generator back to its first state (as ``torch.manual_seed`` does on a real device)."""
        for index, generator in enumerate(self.generators):
            generator.manual_seed(GENERATOR_SEED + index)

    # -- helpers ---------------------------------------------------------------------------------
    def _counted(self, name: str, result: Callable[..., Any] = lambda *a, **k: None) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            return result(*args, **kwargs)

        return call

    def _select(self, device: Any = None) -> None:
        index = device.index if isinstance(device, torch.device) else device
        self.current = int(index or 0)
        self.calls["set_device"] += 1

    def _set_state(self, state: torch.Tensor, index: int | None = None) -> None:
        self.generators[self.current if index is None else int(index)].set_state(state)

    def _memory_stats(self, device: Any = None) -> dict[str, int]:
        return {
            "allocated_bytes.all.current": 0,
            "reserved_bytes.all.current": 0,
            "allocated_bytes.all.peak": 0,
        }

    def _modules(self, tree: dict[str, dict[str, Any]]) -> dict[str, types.ModuleType]:
        """Build and install a package tree: module name → its attributes."""
        built: dict[str, types.ModuleType] = {}
        for name, attributes in tree.items():
            module = types.ModuleType(name)
            module.__spec__ = importlib.machinery.ModuleSpec(name, loader=None, is_package=True)
            module.__path__ = []
            for attribute, value in attributes.items():
                setattr(module, attribute, value)
            built[name] = module
            self._patches.setitem(sys.modules, name, module)
            parent, _, child = name.rpartition(".")
            if parent in built:
                setattr(built[parent], child, module)  # a module built here: nothing to undo
        return built


class CUDAStandIn(StandIn):
    """``torch.cuda`` reporting ``count`` GPUs: counts, selection, generators and memory statistics."""

    device_type = "cuda"
    library = "torch.cuda"

    def _install(self) -> None:
        cuda, count = torch.cuda, self.count
        patch = self._patches.setattr
        patch(cuda, "device_count", lambda: count)
        patch(cuda, "is_available", lambda: count > 0)
        patch(cuda, "is_initialized", lambda: self.calls["set_device"] > 0)
        patch(cuda, "set_device", self._select)
        patch(cuda, "current_device", lambda: self.current)
        patch(cuda, "synchronize", self._counted("synchronize"))
        patch(cuda, "empty_cache", self._counted("empty_cache"))
        patch(cuda, "get_rng_state_all", lambda: [g.get_state() for g in self.generators])
        patch(cuda, "set_rng_state", self._set_state)
        patch(cuda, "memory_stats", self._memory_stats)
        patch(cuda, "mem_get_info", lambda device=None: (2**33, 2**34))
        properties = types.SimpleNamespace(name="stand-in GPU", total_memory=2**34, major=9, minor=0)
        patch(cuda, "get_device_properties", lambda device=None: properties)
        patch(cuda, "get_device_name", lambda device=None: properties.name)
        patch(cuda, "get_device_capability", lambda device=None: (properties.major, properties.minor))
        patch(cuda, "is_bf16_supported", lambda *args, **kwargs: True)


class XPUStandIn(StandIn):
    """``torch.xpu`` reporting ``count`` Intel GPUs."""

    device_type = "xpu"
    library = "torch.xpu"

    def _install(self) -> None:
        xpu, count = torch.xpu, self.count
        patch = self._patches.setattr
        # torch.xpu.is_available() asks torch.xpu.device_count(), so this fakes both.
        patch(xpu, "device_count", lambda: count)
        patch(xpu, "is_initialized", lambda: self.calls["set_device"] > 0)
        patch(xpu, "set_device", self._select)
        patch(xpu, "synchronize", self._counted("synchronize"))
        patch(xpu, "empty_cache", self._counted("empty_cache"))
        patch(xpu, "get_rng_state_all", lambda: [g.get_state() for g in self.generators])
        patch(xpu, "set_rng_state", self._set_state)
        patch(xpu, "memory_stats", self._memory_stats)


class MPSStandIn(StandIn):
    """An Apple silicon Mac with its one GPU (``torch.backends.mps`` and ``torch.mps``)."""

    device_type = "mps"
    library = "torch.mps"

    def __init__(self, count: int = 1, patches: Any = None, machine: str = "arm64") -> None:
        super().__init__(count, patches)
        self.machine = machine

    def _install(self) -> None:
        available = self.count > 0
        patch = self._patches.setattr
        patch(torch.backends.mps, "is_available", lambda: available)
        patch(platform, "system", lambda: "Darwin" if available else "Linux")
        patch(platform, "machine", lambda: self.machine if available else "x86_64")
        if not available:
            return
        patch(torch.mps, "empty_cache", self._counted("empty_cache"))
        patch(torch.mps, "synchronize", self._counted("synchronize"))
        patch(torch.mps, "get_rng_state", lambda: self.generators[0].get_state())
        patch(torch.mps, "set_rng_state", self._set_state)
        for name in ("current_allocated_memory", "driver_allocated_memory", "recommended_max_memory"):
            patch(torch.mps, name, lambda: 0)


class XLAStandIn(StandIn):
    """A ``torch_xla`` package reporting ``count`` devices of ``device_type`` (TPU by default).

    Args:
        device_type_name: what ``torch_xla.runtime.device_type()`` answers.
        error: raise this from the device count, as a ``torch_xla`` that cannot start does.
        memory_info: what ``get_memory_info`` reports.
    """

    device_type = "xla"
    library = "torch_xla"

    def __init__(
        self,
        count: int = 4,
        patches: Any = None,
        *,
        device_type_name: str = "TPU",
        error: type[Exception] | None = None,
        memory_info: dict[str, int] | None = None,
    ) -> None:
        super().__init__(count, patches)
        self.device_type_name = device_type_name
        self.error = error
        self.memory_info = dict(memory_info or {})
        self.seed = 101

    def generator_state(self) -> torch.Tensor:
        return torch.tensor(self.seed)  # XLA keeps a seed per device, not a state tensor

    def draw(self) -> torch.Tensor:
        self.seed = (self.seed * 1103515245 + 12345) % 2**31
        return torch.tensor([self.seed / 2**31])

    def reseed(self) -> None:
        self.seed = 101

    def _install(self) -> None:
        self._patches.setattr(importlib.util, "find_spec", _REAL_FIND_SPEC)

        def device_count() -> int:
            if self.error is not None:
                raise self.error("the XLA runtime could not start")
            return self.count

        def set_rng_state(seed: int, device: Any = None) -> None:
            self.seed = int(seed)

        self._modules(
            {
                "torch_xla": {},
                "torch_xla.runtime": {
                    "device_type": lambda: self.device_type_name,
                    "addressable_device_count": device_count,
                },
                "torch_xla._internal": {},
                "torch_xla._internal.tpu": {"num_available_devices": device_count},
                "torch_xla.core": {},
                "torch_xla.core.xla_model": {
                    "get_memory_info": lambda device=None: dict(self.memory_info),
                    "get_rng_state": lambda device=None: self.seed,
                    "set_rng_state": set_rng_state,
                    "wait_device_ops": self._counted("wait_device_ops"),
                    "mark_step": self._counted("mark_step"),
                },
            }
        )


class HPUStandIn(StandIn):
    """Intel Gaudi's ``habana_frameworks.torch`` reporting ``count`` cards, with HCCL over gloo.

    ``habana_frameworks.torch.distributed.hccl`` registers a ``torch.distributed`` backend named
    ``"hccl"`` whose process groups are gloo's, so a job on the stand-in runs real collectives.
    """

    device_type = "hpu"
    library = "habana_frameworks.torch"

    def _install(self) -> None:
        self._patches.setattr(importlib.util, "find_spec", _REAL_FIND_SPEC)
        register_gloo_backend("hccl")
        count = self.count
        self._modules(
            {
                "habana_frameworks": {},
                "habana_frameworks.torch": {},
                "habana_frameworks.torch.core": {"mark_step": self._counted("mark_step")},
                "habana_frameworks.torch.hpu": {
                    "is_available": lambda: count > 0,
                    "device_count": lambda: count,
                    "synchronize": self._counted("synchronize"),
                    "memory_stats": lambda device=None: {"InUse": 0, "MaxInUse": 0, "Limit": 2**35},
                },
                "habana_frameworks.torch.hpu.random": {
                    "get_rng_state": lambda device=None: self.generator_state(),
                    "set_rng_state": lambda state, device=None: self._set_state(state),
                    "manual_seed": lambda seed: self.generators[self.current].manual_seed(seed),
                },
                "habana_frameworks.torch.distributed": {},
                "habana_frameworks.torch.distributed.hccl": {},
            }
        )


def register_gloo_backend(name: str) -> None:
    """Register a ``torch.distributed`` backend called ``name`` whose process groups are gloo's (once)."""
    import torch.distributed as dist

    if getattr(dist.Backend, name.upper(), None) is not None:
        return

    def gloo(store: Any, rank: int, size: int, timeout: Any) -> Any:
        return dist.ProcessGroupGloo(store, rank, size, timeout)

    dist.Backend.register_backend(name, gloo, devices=["cpu"])


def hide_torch_xla(patches: Any) -> None:
    """Make ``torch_xla`` (and ``habana_frameworks``) look uninstalled, even where they are."""

    def find_spec(name: str, package: str | None = None) -> Any:
        if name.split(".")[0] in ("torch_xla", "habana_frameworks"):
            return None
        return _REAL_FIND_SPEC(name, package)

    patches.setattr(importlib.util, "find_spec", find_spec)


#: The stand-in for each built-in hardware accelerator's device type.
STAND_INS: dict[str, type[StandIn]] = {
    "cuda": CUDAStandIn,
    "xpu": XPUStandIn,
    "mps": MPSStandIn,
    "xla": XLAStandIn,
    "hpu": HPUStandIn,
}

_REAL_FIND_SPEC = importlib.util.find_spec
