"""Places in a device map: a device index or name, ``"cpu"``, or ``"disk"``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeAlias

import torch

Place: TypeAlias = int | str
DeviceMap: TypeAlias = Mapping[str, Place]


def place_of(device_map: DeviceMap, name: str) -> Place:
    """Where the tensor or module ``name`` lives: the entry of its longest mapped prefix.

    Raises:
        ValueError: no entry covers ``name``.
    """
    parts = name.split(".")
    for depth in range(len(parts), -1, -1):
        prefix = ".".join(parts[:depth])
        if prefix in device_map:
            return device_map[prefix]
    raise ValueError(
        f"the device map places no module holding {name!r}; map it (or one of its parents) to a device, 'cpu' "
        f"or 'disk'."
    )


def as_device(place: Place, where: str = "device map") -> torch.device | str:
    """``torch.device`` for a device, or the string ``"disk"``.

    Raises:
        ValueError: not a device, ``"cpu"`` or ``"disk"``.
    """
    if place == "disk":
        return "disk"
    check_place(place, where)
    try:
        return torch.device(place)
    except (RuntimeError, TypeError):
        raise ValueError(
            f"{where} = {place!r} is device {place}, but this machine has no accelerator device {place}: map it to "
            f"'cpu' or 'disk', or run where the device is."
        ) from None


def check_place(place: Place, where: str = "device map") -> None:
    """That ``place`` names a place (a device index, a device name, ``"cpu"`` or ``"disk"``), without
    needing the device here: a device map can be planned on a machine without the GPUs.

    Raises:
        ValueError: not a place.
    """
    if isinstance(place, int) and not isinstance(place, bool) and place >= 0:
        return
    if isinstance(place, torch.device):
        return
    if isinstance(place, str):
        if place == "disk":
            return
        try:
            torch.device(place)
            return
        except (RuntimeError, TypeError):
            pass
    raise ValueError(
        f"{where} = {place!r} is not a place: use a device index (0), a device ('cuda:1', 'mps'), 'cpu' or 'disk'."
    )
