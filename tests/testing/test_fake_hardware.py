"""``fake=True``'s parts on their own: the stand-ins switch on and off without pytest, and the fake translates devices."""

from __future__ import annotations

from typing import Any

import torch

import drivetrain as dt
from drivetrain.accelerators import (
    Accelerator,
    AcceleratorRegistry,
    CUDAAccelerator,
    HPUAccelerator,
    devices_for,
)
from drivetrain.testing import FakeHardware, fake_accelerator
from drivetrain.testing.fake import install_fake, original_class


def test_fake_hardware_undoes_itself_outside_pytest() -> None:
    real = (torch.cuda.device_count(), HPUAccelerator.is_available())
    with FakeHardware() as hardware:
        hardware.cuda(4)
        hardware.hpu(2)
        assert CUDAAccelerator.auto_device_count() == 4 and HPUAccelerator.auto_device_count() == 2
    assert (torch.cuda.device_count(), HPUAccelerator.is_available()) == real


def _pocket() -> type[Accelerator]:
    """A plugin registering itself as "pocket" (defined in the test: the registration lasts for the test only)."""

    class _Pocket(Accelerator):
        """Devices of their own type, with a record of the devices its hooks were given."""

        seen: list[torch.device] = []

        @staticmethod
        def parse_devices(devices: Any) -> Any:
            return devices

        @staticmethod
        def get_parallel_devices(devices: Any) -> list[torch.device]:
            return [torch.device("xpu", index) for index in devices]

        @staticmethod
        def auto_device_count() -> int:
            return 2

        @staticmethod
        def is_available() -> bool:
            return False  # the library is absent here

        def setup_device(self, device: torch.device) -> None:
            type(self).seen.append(device)

        @classmethod
        def register_accelerators(cls, accelerator_registry: Any) -> None:
            accelerator_registry.register("pocket", cls)

    return _Pocket


def test_the_fake_hands_out_cpu_devices_and_gives_the_hooks_their_own() -> None:
    _Pocket: Any = _pocket()
    fake = install_fake(_Pocket, forced_count=2)
    assert AcceleratorRegistry.entry("pocket").cls is fake and original_class(fake) is _Pocket
    assert fake.__name__ == "_Pocket" and fake.is_available()
    assert devices_for(fake(), 2) == [torch.device("cpu", 0), torch.device("cpu", 1)]
    strategy = dt.connect(accelerator="pocket", devices=1)
    strategy.setup_environment()
    assert strategy.root_device == torch.device("cpu", 0)
    assert _Pocket.seen[-1] == torch.device("xpu", 0)  # the plugin's own device, not the CPU stand-in
    # Without forcing, availability is the plugin's own answer.
    assert fake_accelerator(_Pocket).is_available() is False
