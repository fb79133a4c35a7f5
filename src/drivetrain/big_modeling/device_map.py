"""Device maps: which module's weights live where (a device, ``"cpu"``, or ``"disk"``).

A device map is a mapping of module names (``""`` for the whole model; a parameter or buffer name
also works) to a place: a device
index or name (``0``, ``"cuda:1"``, ``"mps"``), ``"cpu"``, or ``"disk"`` (offloaded to files, read
in at each forward). :func:`infer_auto_device_map` fills the places in order until each is full,
splitting modules that do not fit into their children (never those of ``no_split_module_classes``).
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Mapping
from typing import TypeAlias

import torch
from torch import nn

from drivetrain._utilities.sizes import parse_size

Place: TypeAlias = int | str
DeviceMap: TypeAlias = Mapping[str, Place]


def _bytes(tensor: torch.Tensor, dtype: torch.dtype | None) -> int:
    if dtype is not None and tensor.is_floating_point():
        return tensor.numel() * torch.empty((), dtype=dtype).element_size()
    return tensor.numel() * tensor.element_size()


def compute_module_sizes(model: nn.Module, dtype: torch.dtype | str | None = None) -> dict[str, int]:
    """Bytes of parameters and buffers under every module name (``""`` is the whole model).

    ``dtype`` counts floating-point tensors at that dtype (the one they will be loaded in).
    """
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype.removeprefix("torch."))
    sizes: dict[str, int] = {}
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        size = _bytes(tensor, dtype)  # type: ignore[arg-type]
        parts = name.split(".")
        for depth in range(len(parts) + 1):
            prefix = ".".join(parts[:depth])
            sizes[prefix] = sizes.get(prefix, 0) + size
    return sizes


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


def check_device_map(model: nn.Module, device_map: DeviceMap) -> None:
    """Every tensor of ``model`` is placed, every entry names a module, every place is valid.

    Raises:
        ValueError: with what is wrong and how to fix it.
    """
    known = set(dict(model.named_modules())) | {
        name for name, _ in [*model.named_parameters(), *model.named_buffers()]
    }
    unknown = [name for name in device_map if name not in known]
    if unknown:
        raise ValueError(f"the device map names modules the model does not have: {unknown}.")
    for name, place in device_map.items():
        as_device(place, f"device_map[{name!r}]")
    unplaced = []
    for tensor_name, _ in [*model.named_parameters(), *model.named_buffers()]:
        try:
            place_of(device_map, tensor_name)
        except ValueError:
            unplaced.append(tensor_name)
    if unplaced:
        raise ValueError(
            f"the device map leaves {len(unplaced)} tensors without a place, e.g. {unplaced[:3]}; map their modules "
            f"(or '' for everything else)."
        )


def as_device(place: Place, where: str = "device map") -> torch.device | str:
    """``torch.device`` for a device, or the string ``"disk"``.

    Raises:
        ValueError: not a device, ``"cpu"`` or ``"disk"``.
    """
    if place == "disk":
        return "disk"
    try:
        return torch.device(place)
    except (RuntimeError, TypeError):
        raise ValueError(
            f"{where} = {place!r} is not a place: use a device index (0), a device ('cuda:1', 'mps'), 'cpu' or 'disk'."
        ) from None


def available_memory() -> dict[Place, int]:
    """Free memory per device here: each GPU, then the CPU's available RAM, then unlimited disk."""
    found: dict[Place, int] = {}
    if torch.cuda.is_available():
        for index in range(torch.cuda.device_count()):
            found[index] = torch.cuda.mem_get_info(index)[0]
    try:
        found["cpu"] = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not POSIX
        found["cpu"] = 2**63
    found["disk"] = 2**63
    return found


def infer_auto_device_map(
    model: nn.Module,
    max_memory: Mapping[Place, int | str] | None = None,
    no_split_module_classes: list[str] | None = None,
    dtype: torch.dtype | str | None = None,
) -> OrderedDict[str, Place]:
    """Place ``model``'s modules on the devices of ``max_memory`` in order, each until it is full.

    Args:
        model: typically built under :func:`~drivetrain.big_modeling.init_empty_weights`.
        max_memory: place -> the most bytes to put there (``"10MB"`` works), in the order to fill;
            default: what is free here (GPUs, then CPU RAM, then disk).
        no_split_module_classes: class names whose modules stay whole (blocks with residual
            connections, say).
        dtype: count floating-point weights at this dtype (what they will be loaded as).

    Returns:
        module name -> place; modules whose children all share one place are merged into one entry.

    Raises:
        ValueError: a bad size or place, or a module that fits nowhere.
    """
    memory = available_memory() if max_memory is None else dict(max_memory)
    places = list(memory)
    budget = {place: parse_size(memory[place]) for place in places}
    for place in places:
        as_device(place, f"max_memory[{place!r}]")
    keep_whole = set(no_split_module_classes or ())
    sizes = compute_module_sizes(model, dtype)
    queue: list[tuple[str, nn.Module | None]] = _entries("", model)
    result: OrderedDict[str, Place] = OrderedDict()
    current = 0
    while queue:
        name, module = queue.pop(0)
        size = sizes.get(name, 0)
        while current < len(places) and size > budget[places[current]]:
            if module is not None and type(module).__name__ not in keep_whole and _entries(name, module):
                break
            current += 1
        if current == len(places):
            raise ValueError(
                f"{name or 'the model'} ({size} bytes) fits on none of {places} with max_memory={dict(memory)}; "
                f"give more memory, or add 'disk'."
            )
        place = places[current]
        if size > budget[place]:
            queue[:0] = _entries(name, module)  # split into its parts and try again
            continue
        budget[place] -= size
        result[name] = place
    return _merge(result, model)


def _entries(prefix: str, module: nn.Module | None) -> list[tuple[str, nn.Module | None]]:
    """A module's direct tensors and children, as placeable entries."""
    if module is None:
        return []
    join = (lambda name: f"{prefix}.{name}") if prefix else (lambda name: name)
    direct: list[tuple[str, nn.Module | None]] = [
        (join(name), None)
        for name, _ in [*module.named_parameters(recurse=False), *module.named_buffers(recurse=False)]
    ]
    children: list[tuple[str, nn.Module | None]] = [
        (join(name), child) for name, child in module.named_children()
    ]
    return direct + children


def _merge(device_map: OrderedDict[str, Place], model: nn.Module) -> OrderedDict[str, Place]:
    """Replace entries whose module's tensors all share one place by one entry for the module."""
    tensors = [name for name, _ in [*model.named_parameters(), *model.named_buffers()]]
    placed = {name: place_of(device_map, name) for name in tensors}
    merged: OrderedDict[str, Place] = OrderedDict()
    for name in device_map:
        parent = _widest_uniform_prefix(name, placed)
        if not any(parent == kept or parent.startswith(kept + ".") or kept == "" for kept in merged):
            merged[parent] = device_map[name]
    return merged


def _widest_uniform_prefix(name: str, placed: dict[str, Place]) -> str:
    parts = name.split(".") if name else []
    best = name
    for depth in range(len(parts) - 1, -1, -1):
        prefix = ".".join(parts[:depth])
        inside = [
            place for tensor, place in placed.items() if prefix == "" or tensor.startswith(prefix + ".")
        ]
        if inside and all(place == inside[0] for place in inside):
            best = prefix
        else:
            break
    return best
