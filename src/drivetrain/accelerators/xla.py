"""The XLA accelerator: TPUs (and other PJRT devices) through ``torch_xla``.

``torch_xla`` is optional and heavy: this module never imports it at import time; it is found
with ``importlib.util.find_spec`` and imported inside the methods that need it.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import torch

from drivetrain.accelerators.accelerator import Accelerator
from drivetrain.accelerators.devices import normalize_devices

_ALLOWED = (
    "1 (one device), the number of XLA devices on this host (often 8), -1 or 'auto' (all of them), or [i]"
)
# Without torch_xla the host's device count is unknown; accept the classic TPU host's count so a
# configuration can be checked on a machine without XLA.
_DEFAULT_HOST_DEVICES = 8


class XLAAccelerator(Accelerator):
    """Runs on XLA devices (TPU cores, or GPUs and CPUs through PJRT).

    XLA runs either on one device or on all of a host's devices, one process each; a single
    other device is picked with a one-element list such as ``[3]``.
    """

    @staticmethod
    def parse_devices(devices: Any) -> int | list[int]:
        """A device count (1 or all of the host's) or a one-element index list."""
        request = normalize_devices(devices, accelerator="xla", allowed=_ALLOWED)
        host_count = XLAAccelerator.auto_device_count() if _torch_xla_installed() else _DEFAULT_HOST_DEVICES
        if host_count <= 0 and request != 1:
            raise ValueError(
                f"devices={devices!r} asks for XLA devices, but torch_xla reports none on this host. "
                f"Use another accelerator (accelerator='cpu' or 'auto'), or check the PJRT_DEVICE setting."
            )
        if isinstance(request, list):
            if len(request) != 1:
                raise ValueError(
                    f"devices={devices!r} is not valid for accelerator='xla': XLA runs on one device or on "
                    f"all of them, so an index list must name exactly one device. Allowed: {_ALLOWED}. "
                    f"Pass devices=[{request[0]}] for one device or devices=-1 for all."
                )
            if request[0] >= host_count:
                raise ValueError(
                    f"devices={devices!r} asks for XLA device {request[0]}, but this host has {host_count} "
                    f"(indices 0..{host_count - 1}). Pick an index below {host_count}."
                )
            return request
        if request == "auto" or request == -1:
            request = host_count
        if request in (1, host_count):
            return request
        raise ValueError(
            f"devices={devices!r} is not valid for accelerator='xla': XLA runs on 1 device or on all "
            f"{host_count} devices of this host. Allowed: {_ALLOWED}. Pass devices=1 or devices={host_count}."
        )

    @staticmethod
    def get_parallel_devices(devices: Any) -> list[torch.device]:
        """``torch.device("xla", i)`` for each index (an int ``n`` means indices ``0..n-1``)."""
        indices = range(devices) if isinstance(devices, int) else devices
        return [torch.device("xla", index) for index in indices]

    @staticmethod
    def auto_device_count() -> int:
        """The number of XLA devices on this host (0 without ``torch_xla``)."""
        if not _torch_xla_installed():
            return 0
        import torch_xla.runtime as xr

        if xr.device_type() == "TPU":
            try:
                # Counts the host's TPU chips without starting the XLA runtime: a runtime started
                # in the launching process would hold the chips its worker processes need.
                from torch_xla._internal import tpu

                return int(tpu.num_available_devices())
            except (ImportError, AttributeError):
                pass
        return int(xr.addressable_device_count())

    @staticmethod
    def is_available() -> bool:
        """Whether ``torch_xla`` is installed and reports at least one device."""
        if not _torch_xla_installed():
            return False
        try:
            return XLAAccelerator.auto_device_count() > 0
        except (ImportError, RuntimeError, ValueError, OSError):
            # torch_xla is installed but cannot start (no device, wrong torch version): not available.
            return False

    def setup_device(self, device: torch.device) -> None:
        """Check that ``device`` is an XLA device; ``torch_xla`` selects it per process itself."""
        _xla_device(device, "setup_device")

    def synchronize(self, device: torch.device | None = None) -> None:
        """Wait until the operations traced so far have run (``torch_xla``'s ``wait_device_ops``)."""
        import torch_xla.core.xla_model as xm

        xm.wait_device_ops()

    def get_rng_state(self) -> int:
        """The seed of this process's XLA device generator (XLA keeps a seed, not a state tensor)."""
        import torch_xla.core.xla_model as xm

        return int(xm.get_rng_state())

    def set_rng_state(self, state: int | None) -> None:
        """Restore :meth:`get_rng_state`'s seed on this process's XLA device."""
        if state is None:
            return
        import torch_xla.core.xla_model as xm

        xm.set_rng_state(int(state))

    def get_device_stats(self, device: torch.device | str) -> dict[str, Any]:
        """The memory figures ``torch_xla.core.xla_model.get_memory_info`` reports, prefixed ``xla_``."""
        device = _xla_device(device, "get_device_stats")
        import torch_xla.core.xla_model as xm

        return {f"xla_{key}": value for key, value in xm.get_memory_info(device).items()}

    def auto_strategy(self, num_processes: int) -> str:
        """``"xla"`` for several devices, ``"single_xla"`` for one."""
        return "xla" if num_processes > 1 else "single_xla"

    @classmethod
    def register_accelerators(cls, accelerator_registry: Any) -> None:
        """Register as ``"xla"`` and, for TPU users, ``"tpu"``."""
        accelerator_registry.register("xla", cls, description="TPUs and other XLA devices through torch_xla.")
        accelerator_registry.register("tpu", cls, description="Alias of 'xla': TPUs through torch_xla.")

    @classmethod
    def unavailable_reason(cls) -> str:
        if not _torch_xla_installed():
            return "torch_xla is not installed; install the torch_xla release that matches your torch"
        return "torch_xla is installed but reports no XLA device"


def _torch_xla_installed() -> bool:
    try:
        return importlib.util.find_spec("torch_xla") is not None
    except (ImportError, ValueError):
        return False


def _xla_device(device: torch.device | str | int, method: str) -> torch.device:
    device = torch.device("xla", device) if isinstance(device, int) else torch.device(device)
    if device.type != "xla":
        raise ValueError(
            f"XLAAccelerator.{method} got device={device!r}, which is not an XLA device. "
            f"Pass torch.device('xla', index), or use the accelerator that matches the device."
        )
    return device
