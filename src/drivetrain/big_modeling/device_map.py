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

import warnings
from collections import OrderedDict
from collections.abc import Mapping

import torch
from torch import nn

from drivetrain.big_modeling.places import DeviceMap, Place, as_device, check_place, place_of
from drivetrain.big_modeling.sizes import (
    Size,
    as_dtype,
    compute_module_sizes,
    compute_module_total_buffer_size,
    get_max_memory,
)
from drivetrain.big_modeling.tensors import find_tied_parameters

__all__ = [
    "DeviceMap",
    "Place",
    "as_device",
    "as_dtype",
    "check_device_map",
    "check_place",
    "clean_device_map",
    "compute_module_sizes",
    "get_max_memory",
    "infer_auto_device_map",
    "place_of",
]


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
    no_split_module_classes: list[str] | str | None = None,
    dtype: torch.dtype | str | None = None,
    special_dtypes: Mapping[str, torch.dtype | str] | None = None,
    verbose: bool = False,
    clean_result: bool = True,
    offload_buffers: bool = False,
    fallback_allocation: bool = False,
) -> OrderedDict[str, Place]:
    """Place ``model``'s modules on the places of ``max_memory``, in order, as Accelerate does.

    GPUs first, then the CPU, then disk (always there as the last resort); each place is filled
    until it is full, a module that does not fit is split into its parameters and children
    (never modules of ``no_split_module_classes``), and the main places (the first GPU, and the CPU;
    ``"mps"`` alone when it is there) keep room for the largest layer still to place, so that an
    offloaded layer can be brought in to run. Modules whose parameters are tied go to the same place
    (splitting the other module when only the part holding the tie fits).

    Args:
        model: typically built under :func:`~drivetrain.big_modeling.init_empty_weights`.
        max_memory: place -> the most bytes to put there (``"10MB"`` works); GPU indexes need not
            exist here. Default: what is free here (:func:`get_max_memory`).
        no_split_module_classes: class names whose modules stay whole (blocks with residual
            connections, say).
        dtype: count floating-point weights at this dtype (what they will be loaded as).
        special_dtypes: tensor name -> its own dtype.
        verbose: print each decision.
        clean_result: merge the entries of a module whose parts all share one place.
        offload_buffers: the buffers of modules placed on the CPU or disk will be offloaded with
            them; otherwise a warning says when they may not fit on any GPU, where they run.
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
    main = {"mps"} if "mps" in devices else {devices[0], "cpu"} if devices else {"cpu"}
    keep_whole = (
        {no_split_module_classes}
        if isinstance(no_split_module_classes, str)
        else set(no_split_module_classes or ())
    )
    sizes = compute_module_sizes(model, dtype, special_dtypes)
    tied = find_tied_parameters(model)
    say = print if verbose else (lambda *_: None)
    queue: list[tuple[str, nn.Module | None]] = _entries("", model)
    used: dict[Place, Size] = dict.fromkeys(places, 0)
    buffers: dict[Place, Size] = {}
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
        outside = _tied_outside(name, tied)
        with_ties, partners = _size_with_ties(outside, size, sizes, queue)
        if limit is None or used[place] + with_ties <= limit:
            say(
                f"Putting {name} {'and ' + str(partners) + ' ' if partners else ''}(size {with_ties}) on {place}."
            )
            used[place] += with_ties
            result[name] = place
            for tied_name in partners:
                queue = [entry for entry in queue if entry[0] != tied_name]
                result[tied_name] = place
            if not offload_buffers and isinstance(module, nn.Module):
                buffers[place] = buffers.get(place, 0) + compute_module_total_buffer_size(
                    module, dtype, special_dtypes
                )
            continue
        if partners and used[place] + size <= limit:
            # The module fits alone: split one of the modules it is tied to, so that the part holding the tie comes along.
            partner = next((p for p in partners if _splittable(dict(queue)[p], keep_whole)), None)
            if partner is not None:
                say(f"Splitting {partner}, tied to {name}, to fit them on {place} together.")
                index = next(i for i, (n, _) in enumerate(queue) if n == partner)
                queue = [
                    (name, module),
                    *queue[:index],
                    *_entries(partner, queue[index][1]),
                    *queue[index + 1 :],
                ]
                continue
        if used[place] + size >= limit and _splittable(module, keep_whole):
            say(f"Splitting {name} (size {size}): {limit - used[place]} left on {place}.")
            queue[:0] = _entries(name, module)
            continue
        if fallback_allocation and used[place] == 0:
            room = memory[place] - max(largest, with_ties)
            found = _first_fitting([(name, module), *queue], sizes, keep_whole, room)
            if found is not None:
                say(f"Nothing else fits on {place}: {found} goes there (fallback_allocation).")
                queue = _split_out([(name, module), *queue], found, keep_whole)
                used[place] += sizes.get(found, 0)
                result[found] = place
                continue
        say(f"{name} (size {with_ties}) does not fit on {place} ({limit - used[place]} left): next place.")
        used[place] += reserve
        queue.insert(0, (name, module))
        current += 1  # nothing more fits here: the next place (disk takes everything)
    _warn_about_buffers(buffers, used, memory, devices, offload_buffers)
    return _merge(result, model) if clean_result else result


def _tied_outside(name: str, tied: list[list[str]]) -> list[str]:
    """The parameters tied to one inside ``name`` that are outside it."""
    inside = (lambda p: True) if name == "" else (lambda p: p == name or p.startswith(f"{name}."))
    return [p for group in tied if any(map(inside, group)) for p in group if not inside(p)]


def _size_with_ties(
    outside: list[str], size: Size, sizes: dict[str, Size], queue: list[tuple[str, nn.Module | None]]
) -> tuple[Size, list[str]]:
    """The size of an entry with the entries still to place that hold the parameters tied to it, and their names."""
    partners: list[str] = []
    total = size
    for parameter in outside:
        holder = next((n for n, _ in queue if parameter == n or parameter.startswith(f"{n}.")), None)
        if holder is None or holder in partners:
            continue
        partners.append(holder)
        total += sizes.get(holder, 0) - sizes.get(parameter, 0)  # the shared tensor counts once
    return total, partners


def _warn_about_buffers(
    buffers: dict[Place, Size],
    used: dict[Place, Size],
    memory: dict[Place, int],
    devices: list[Place],
    offload_buffers: bool,
) -> None:
    """Buffers of modules off the GPUs stay in memory and run on a GPU: warn when no GPU has room for them."""
    elsewhere = buffers.get("cpu", 0) + buffers.get("disk", 0)
    if offload_buffers or elsewhere == 0 or not devices:
        return
    if any(memory[device] >= elsewhere + used.get(device, 0) for device in devices):
        return
    warnings.warn(
        f"The modules placed on the CPU or disk hold {elsewhere} bytes of buffers, which are not offloaded and do "
        f"not fit in what any GPU has left. If the model runs out of memory, plan with "
        f"infer_auto_device_map(..., offload_buffers=True).",
        UserWarning,
        stacklevel=3,
    )


def _splittable(module: nn.Module | None, keep_whole: set[str]) -> bool:
    return (
        module is not None
        and type(module).__name__ not in keep_whole
        and any(True for _ in module.children())
    )


def _largest_layer(
    entries: list[tuple[str, nn.Module | None]], sizes: dict[str, Size], keep_whole: set[str]
) -> Size:
    """The size of the largest unit still to place that cannot be split (a leaf module, a tensor, a no-split block)."""
    largest: Size = 0
    pending = list(entries)
    while pending:
        name, module = pending.pop()
        if _splittable(module, keep_whole):
            pending += [(f"{name}.{child}" if name else child, sub) for child, sub in module.named_children()]  # type: ignore[union-attr]
        else:
            largest = max(largest, sizes.get(name, 0))
    return largest


def _first_fitting(
    entries: list[tuple[str, nn.Module | None]], sizes: dict[str, Size], keep_whole: set[str], room: Size
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
