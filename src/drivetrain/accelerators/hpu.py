"""The HPU accelerator: Intel Gaudi cards through Intel Gaudi's PyTorch bridge, ``habana_frameworks.torch``.

``habana_frameworks`` is optional and comes with the Intel Gaudi software stack (it cannot be
installed from PyPI next to every torch): this module never imports it at import time; it is
found with ``importlib.util.find_spec`` and imported inside the methods that need it. Each process
drives one card, which the Gaudi runtime picks (``HABANA_VISIBLE_MODULES``), so every process's
device is ``torch.device("hpu")`` and ``devices=`` is a count, not a list of indices.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import torch

from drivetrain.accelerators.accelerator import Accelerator
from drivetrain.accelerators.devices import normalize_devices

_ALLOWED = "'auto' or -1 (every card of this host) or a positive int N (N cards, one process each)"


class HPUAccelerator(Accelerator):
    """Runs on Intel Gaudi cards (HPUs).

    Needs the Intel Gaudi software stack (``habana_frameworks.torch``); without it a request for
    ``accelerator="hpu"`` is an error naming it. ``strategy="auto"`` picks ``"hpu_single"`` for one
    card and ``"hpu_parallel"`` (DDP over HCCL) for several.
    """

    @staticmethod
    def parse_devices(devices: Any) -> int:
        """The number of cards (one process each); indices are refused, the runtime picks the cards."""
        request = normalize_devices(devices, accelerator="hpu", allowed=_ALLOWED, by_index=False)
        if isinstance(request, list):
            raise ValueError(
                f"devices={devices!r} is not valid for accelerator='hpu': the Gaudi runtime chooses which card each "
                f"process drives, so cards cannot be picked by index here. Allowed: {_ALLOWED}. Pass "
                f"devices={len(request)}, and set HABANA_VISIBLE_MODULES to choose the cards."
            )
        visible = HPUAccelerator.auto_device_count() if HPUAccelerator.is_available() else 0
        if request in ("auto", -1):
            if visible < 1:
                raise ValueError(
                    f"devices={devices!r} asks for every HPU of this host, but none is visible. Use another "
                    f"accelerator (accelerator='cpu' or 'auto')."
                )
            return visible
        assert isinstance(request, int)
        if request > visible:
            raise ValueError(
                f"devices={devices!r} asks for {request} HPUs, but {visible} are visible here. Use devices={visible} "
                f"or fewer, or devices=-1 for all of them."
            )
        return request

    @staticmethod
    def get_parallel_devices(devices: Any) -> list[torch.device]:
        """``torch.device("hpu")`` once per process (``devices`` is a count, or a list whose length counts)."""
        count = devices if isinstance(devices, int) else len(devices)
        return [torch.device("hpu") for _ in range(count)]

    @staticmethod
    def auto_device_count() -> int:
        """The number of Gaudi cards this host shows (0 without ``habana_frameworks``)."""
        if not _habana_installed():
            return 0
        import habana_frameworks.torch.hpu as hthpu

        return int(hthpu.device_count())

    @staticmethod
    def is_available() -> bool:
        """Whether ``habana_frameworks.torch`` is installed and reports a card."""
        if not _habana_installed():
            return False
        try:
            import habana_frameworks.torch.hpu as hthpu

            return bool(hthpu.is_available())
        except (ImportError, RuntimeError, OSError):
            return False  # installed but cannot start (no driver, another torch): not available

    def setup_device(self, device: torch.device) -> None:
        """Check that ``device`` is an HPU and load the bridge (``habana_frameworks.torch.core``)."""
        _hpu_device(device, "setup_device")
        import habana_frameworks.torch.core  # noqa: F401 - registers the hpu device with torch

    def synchronize(self, device: torch.device | None = None) -> None:
        """Wait for the operations queued on this process's card."""
        import habana_frameworks.torch.hpu as hthpu

        hthpu.synchronize()

    def get_rng_state(self) -> torch.Tensor:
        """The state of this process's card generator (``habana_frameworks.torch.hpu.random``)."""
        import habana_frameworks.torch.hpu.random as hrandom

        return hrandom.get_rng_state()

    def set_rng_state(self, state: torch.Tensor | None) -> None:
        """Restore :meth:`get_rng_state`'s state on this process's card."""
        if state is None:
            return
        import habana_frameworks.torch.hpu.random as hrandom

        hrandom.set_rng_state(state)

    def get_device_stats(self, device: torch.device | str) -> dict[str, Any]:
        """The memory figures ``habana_frameworks.torch.hpu.memory_stats`` reports for ``device``."""
        device = _hpu_device(device, "get_device_stats")
        import habana_frameworks.torch.hpu as hthpu

        return dict(hthpu.memory_stats(device))

    def auto_strategy(self, num_processes: int) -> str:
        """``"hpu_parallel"`` for several processes, ``"hpu_single"`` for one."""
        return "hpu_parallel" if num_processes > 1 else "hpu_single"

    @classmethod
    def register_accelerators(cls, accelerator_registry: Any) -> None:
        accelerator_registry.register(
            "hpu", cls, description="Intel Gaudi cards through habana_frameworks.torch."
        )

    @classmethod
    def unavailable_reason(cls) -> str:
        if not _habana_installed():
            return (
                "habana_frameworks.torch (Intel Gaudi's PyTorch bridge) is not installed; it comes with the Intel "
                "Gaudi software stack, on a host with Gaudi cards"
            )
        return "habana_frameworks.torch is installed but reports no HPU (check the driver and HABANA_VISIBLE_MODULES)"


def _habana_installed() -> bool:
    try:
        return importlib.util.find_spec("habana_frameworks") is not None
    except (ImportError, ValueError):
        return False


def _hpu_device(device: torch.device | str | int, method: str) -> torch.device:
    device = torch.device("hpu", device) if isinstance(device, int) else torch.device(device)
    if device.type != "hpu":
        raise ValueError(
            f"HPUAccelerator.{method} got device={device!r}, which is not an HPU. Pass torch.device('hpu'), or use "
            f"the accelerator that matches the device."
        )
    return device
