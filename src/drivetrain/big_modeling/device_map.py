"""Device maps: which module's weights live where (a device, ``"cpu"``, or ``"disk"``).

A device map is a mapping of module names (``""`` for the whole model; a parameter or buffer name
also works) to a place: a device
index or name (``0``, ``"cuda:1"``, ``"mps"``), ``"cpu"``, or ``"disk"`` (offloaded to files, read
in at each forward). :func:`infer_auto_device_map` fills the places as Accelerate does: GPUs in
order, then the CPU, then disk, each until it is full, splitting modules that do not fit into
their children (never those of ``no_split_module_classes``), and keeping room for the largest
layer on the main device (the first GPU, and the CPU) so that an offloaded layer can be brought
in to run there. :func:`get_max_memory` and :func:`clean_device_map` are Accelerate's helpers
of the same names.
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


def as_dtype(dtype: torch.dtype | str | None) -> torch.dtype | None:
    if isinstance(dtype, str):
        found = getattr(torch, dtype.removeprefix("torch."), None)
        if not isinstance(found, torch.dtype):
            raise ValueError(f"dtype {dtype!r} is not a torch dtype (e.g. 'float16', 'bfloat16').")
        return found
    return dtype


def compute_module_sizes(
    model: nn.Module,
    dtype: torch.dtype | str | None = None,
    special_dtypes: Mapping[str, torch.dtype | str] | None = None,
) -> dict[str, int]:
    """Bytes of parameters and buffers under every module name (``""`` is the whole model).

    ``dtype`` counts floating-point tensors at that dtype (the one they will be loaded in);
    ``special_dtypes`` gives single tensors (by name) a dtype of their own.
    """
    default = as_dtype(dtype)
    special = {name: as_dtype(value) for name, value in (special_dtypes or {}).items()}
    sizes: dict[str, int] = {}
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        size = tensor.numel() * special[name].itemsize if name in special else _bytes(tensor, default)  # type: ignore[union-attr]
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
        check_place(place, f"device_map[{name!r}]")
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


def get_max_memory(max_memory: Mapping[Place, int | str] | None = None) -> dict[Place, int]:
    """The memory to plan with, per place, in the order places are filled (as Accelerate's).

    Without ``max_memory``: what is free here, each GPU and the CPU's available RAM. With it: its
    sizes in bytes (``"10GB"`` read as such), ordered GPUs by index, then other devices as given
    (``"cuda:1"``, ``"xpu:0"``), then ``"mps"``, ``"cpu"``, ``"disk"``. GPU indexes need not exist
    here (a map can be planned for another machine).

    Raises:
        ValueError: a key that is not a place, or a size that is not one.
    """
    if max_memory is None:
        free = available_memory()
        del free["disk"]
        return free
    if not isinstance(max_memory, Mapping):
        raise TypeError(
            f"max_memory must map places to sizes ({{0: '10GiB', 'cpu': '30GiB'}}), got {max_memory!r}."
        )
    for place in max_memory:
        check_place(place, f"max_memory[{place!r}]")
    sizes = {place: parse_size(size, f"max_memory[{place!r}]") for place, size in max_memory.items()}
    indexes = sorted(place for place in sizes if isinstance(place, int))
    named = [place for place in sizes if not isinstance(place, int) and place not in ("mps", "cpu", "disk")]
    tail = [place for place in ("mps", "cpu", "disk") if place in sizes]
    return {place: sizes[place] for place in [*indexes, *named, *tail]}


def clean_device_map(device_map: dict[str, Place], module_name: str = "") -> dict[str, Place]:
    """Merge, in place, the entries under each module that all share one place into one entry for it.

    Works on the map alone (Accelerate's helper); :func:`infer_auto_device_map` returns maps merged
    already. Returns ``device_map``.
    """
    prefix = f"{module_name}." if module_name else ""
    inside = [key for key in device_map if key == module_name or key.startswith(prefix)]
    places = {device_map[key] for key in inside}
    if len(inside) > 1 and len(places) == 1:
        place = places.pop()
        for key in inside:
            del device_map[key]
        device_map[module_name] = place
        return device_map
    depth = len(module_name.split(".")) + 1 if module_name else 1
    children = dict.fromkeys(
        ".".join(key.split(".")[:depth])
        for key in inside
        if key != module_name and len(key.split(".")) >= depth
    )
    for child in children:
        clean_device_map(device_map, child)
    return device_map


def infer_auto_device_map(
    model: nn.Module,
    max_memory: Mapping[Place, int | str] | None = None,
    no_split_module_classes: list[str] | None = None,
    dtype: torch.dtype | str | None = None,
    special_dtypes: Mapping[str, torch.dtype | str] | None = None,
    clean_result: bool = True,
    fallback_allocation: bool = False,
) -> OrderedDict[str, Place]:
    """Place ``model``'s modules on the places of ``max_memory``, in order, as Accelerate does.

    GPUs first, then the CPU, then disk (always there as the last resort); each place is filled
    until it is full, a module that does not fit is split into its parameters and children
    (never modules of ``no_split_module_classes``), and the main places (the first GPU, and the CPU)
    keep room for the largest layer still to place, so that an offloaded layer can be brought in
    to run.

    Args:
        model: typically built under :func:`~drivetrain.big_modeling.init_empty_weights`.
        max_memory: place -> the most bytes to put there (``"10MB"`` works); GPU indexes need not
            exist here. Default: what is free here (:func:`get_max_memory`).
        no_split_module_classes: class names whose modules stay whole (blocks with residual
            connections, say).
        dtype: count floating-point weights at this dtype (what they will be loaded as).
        special_dtypes: tensor name -> its own dtype.
        clean_result: merge the entries of a module whose parts all share one place.
        fallback_allocation: when nothing fits on a main place that is still empty, put there the
            first module (searched breadth-first, splitting as needed) that fits, instead of
            leaving it empty.

    Returns:
        module name -> place.

    Raises:
        ValueError: a bad size or place.
    """
    memory = get_max_memory(max_memory)
    places: list[Place] = [*memory, *([] if "disk" in memory else ["disk"])]
    devices = [place for place in places if place not in ("cpu", "disk")]
    main = {devices[0], "cpu"} if devices else {"cpu"}
    keep_whole = set(no_split_module_classes or ())
    sizes = compute_module_sizes(model, dtype, special_dtypes)
    queue: list[tuple[str, nn.Module | None]] = _entries("", model)
    used: dict[Place, int] = dict.fromkeys(places, 0)
    result: OrderedDict[str, Place] = OrderedDict()
    current = 0
    while queue:
        name, module = queue.pop(0)
        size = sizes.get(name, 0)
        place = places[current]
        # Room for the largest layer still to place after this one (it may be offloaded and brought in).
        largest = _largest_layer(queue, sizes, keep_whole)
        reserve = largest if place in main else 0
        limit = None if place == "disk" else memory[place] - reserve
        if limit is None or used[place] + size <= limit:
            used[place] += size
            result[name] = place
            continue
        if _splittable(module, keep_whole):
            queue[:0] = _entries(name, module)
            continue
        if fallback_allocation and used[place] == 0:
            room = memory[place] - max(largest, size)
            found = _first_fitting([(name, module), *queue], sizes, keep_whole, room)
            if found is not None:
                queue = _split_out([(name, module), *queue], found, keep_whole)
                used[place] += sizes.get(found, 0)
                result[found] = place
                continue
        queue.insert(0, (name, module))
        current += 1  # nothing more fits here: the next place (disk takes everything)
    return _merge(result, model) if clean_result else result


def _splittable(module: nn.Module | None, keep_whole: set[str]) -> bool:
    return (
        module is not None
        and type(module).__name__ not in keep_whole
        and any(True for _ in module.children())
    )


def _largest_layer(
    entries: list[tuple[str, nn.Module | None]], sizes: dict[str, int], keep_whole: set[str]
) -> int:
    """The size of the largest unit still to place that cannot be split (a leaf module, a tensor, a no-split block)."""
    largest = 0
    pending = list(entries)
    while pending:
        name, module = pending.pop()
        if _splittable(module, keep_whole):
            pending += [(f"{name}.{child}" if name else child, sub) for child, sub in module.named_children()]  # type: ignore[union-attr]
        else:
            largest = max(largest, sizes.get(name, 0))
    return largest


def _first_fitting(
    entries: list[tuple[str, nn.Module | None]], sizes: dict[str, int], keep_whole: set[str], room: int
) -> str | None:
    """The first entry, breadth-first through splittable modules, whose size is at most ``room``."""
    level = list(entries)
    while level:
        deeper: list[tuple[str, nn.Module | None]] = []
        for name, module in level:
            if sizes.get(name, 0) <= room:
                return name
            if _splittable(module, keep_whole):
                deeper += _entries(name, module)
        level = deeper
    return None


def _split_out(
    entries: list[tuple[str, nn.Module | None]], target: str, keep_whole: set[str]
) -> list[tuple[str, nn.Module | None]]:
    """``entries`` without ``target``: the modules holding it are replaced by their other parts."""
    rebuilt: list[tuple[str, nn.Module | None]] = []
    for name, module in entries:
        if name == target:
            continue
        if target.startswith(f"{name}." if name else ""):
            rebuilt += _split_out(_entries(name, module), target, keep_whole)
        else:
            rebuilt.append((name, module))
    return rebuilt


def _entries(prefix: str, module: nn.Module | None) -> list[tuple[str, nn.Module | None]]:
    """A module's direct parameters, children and direct buffers, as placeable entries (Accelerate's order)."""
    if module is None:
        return []
    join = (lambda name: f"{prefix}.{name}") if prefix else (lambda name: name)
    parameters: list[tuple[str, nn.Module | None]] = [
        (join(name), None) for name, _ in module.named_parameters(recurse=False)
    ]
    children: list[tuple[str, nn.Module | None]] = [
        (join(name), child) for name, child in module.named_children()
    ]
    buffers: list[tuple[str, nn.Module | None]] = [
        (join(name), None) for name, _ in module.named_buffers(recurse=False)
    ]
    return parameters + children + buffers


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
