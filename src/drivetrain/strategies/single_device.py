"""One process, one device: the strategy ``"auto"`` picks when there is nothing to distribute."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from drivetrain.strategies.strategy import Strategy

if TYPE_CHECKING:
    from drivetrain.accelerators.accelerator import Accelerator
    from drivetrain.plugins.io.checkpoint_io import CheckpointIO
    from drivetrain.plugins.precision.precision import Precision


class SingleDeviceStrategy(Strategy):
    """Train in this process on one device.

    Args:
        device: the device; defaults to the first device the accelerator offers.
    """

    def __init__(
        self,
        device: torch.device | str | int | None = None,
        accelerator: Accelerator | None = None,
        checkpoint_io: CheckpointIO | None = None,
        precision: Precision | None = None,
        *,
        precision_plugin: Precision | None = None,
    ) -> None:
        super().__init__(accelerator, checkpoint_io, precision, precision_plugin=precision_plugin)
        self._device = _as_device(device) if device is not None else None

    def given_devices(self) -> list[torch.device] | None:
        return [self._device] if self._device is not None else None

    def connect_plugins(self, *, parallel_devices: list[torch.device], **plugins: Any) -> None:
        super().connect_plugins(parallel_devices=parallel_devices, **plugins)
        if self._device is None:
            self._device = parallel_devices[0]

    @property
    def root_device(self) -> torch.device:
        if self._device is None:
            raise RuntimeError(
                "SingleDeviceStrategy has no device yet: pass device=... or build it through drivetrain.connect()."
            )
        return self._device

    @classmethod
    def register_strategies(cls, strategy_registry: Any) -> None:
        strategy_registry.register(
            "single_device", cls, description="One process on one device (what 'auto' picks for one device)."
        )


def _as_device(device: torch.device | str | int) -> torch.device:
    if isinstance(device, bool) or not isinstance(device, (torch.device, str, int)):
        raise TypeError(
            f"device= expects a torch.device, a string like 'cuda:0' or an index, got {device!r}."
        )
    try:
        return torch.device(device)
    except RuntimeError as error:
        raise ValueError(f"device={device!r} is not a device torch understands: {error}") from None
