"""How big a model's parts are and how much memory each place has, as Accelerate counts them.

``compute_module_sizes`` (bytes under every module name), ``dtype_byte_size``,
``convert_file_size_to_int``, ``get_max_memory`` (the budget per place, in the order places are
filled) and ``get_balanced_memory`` (a budget that spreads a model evenly over the GPUs): the
inputs of :func:`~drivetrain.big_modeling.infer_auto_device_map`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import TypeAlias

import torch
from torch import nn

from drivetrain._utilities.sizes import parse_size
from drivetrain.big_modeling.places import Place, check_place
from drivetrain.big_modeling.tensors import named_module_tensors

Size: TypeAlias = int | float  # a bool tensor counts 1/8 byte per element, as in Accelerate


def as_dtype(dtype: torch.dtype | str | None) -> torch.dtype | None:
    """``dtype`` as a ``torch.dtype`` (``"float16"`` and ``"torch.float16"`` work)."""
    if isinstance(dtype, str):
        found = getattr(torch, dtype.removeprefix("torch."), None)
        if not isinstance(found, torch.dtype):
            raise ValueError(f"dtype {dtype!r} is not a torch dtype (e.g. 'float16', 'bfloat16').")
        return found
    return dtype


def dtype_byte_size(dtype: torch.dtype) -> Size:
    """Bytes per element of ``dtype``; ``torch.bool`` counts one bit (1/8), as Accelerate estimates it."""
    if dtype == torch.bool:
        return 1 / 8
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype_byte_size expects a torch.dtype, got {dtype!r}.")
    return torch.empty((), dtype=dtype).element_size()


def convert_file_size_to_int(size: int | str) -> int:
    """Bytes in ``size``: an int, or a number with a unit (``"5GB"``, ``"2GiB"``; ``"5Gb"`` with a small b is bits).

    Raises:
        ValueError: not a size.
    """
    if isinstance(size, str):
        bits = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMG])b\s*", size)
        if bits is not None:
            return parse_size(f"{bits.group(1)}{bits.group(2)}B") // 8
    try:
        return parse_size(size)
    except ValueError:
        raise ValueError(
            f"{size!r} is not a size: give bytes (an int >= 0) or a number with a unit, such as '5GB' or '2GiB'."
        ) from None


def _tensor_size(tensor: torch.Tensor, dtype: torch.dtype | None, special: torch.dtype | None) -> Size:
    if special is not None:
        return tensor.numel() * dtype_byte_size(special)
    own = dtype_byte_size(tensor.dtype)
    if dtype is None or not tensor.is_floating_point():
        return tensor.numel() * own  # loading converts floating-point tensors only
    return tensor.numel() * min(dtype_byte_size(dtype), own)


def compute_module_sizes(
    model: nn.Module,
    dtype: torch.dtype | str | None = None,
    special_dtypes: Mapping[str, torch.dtype | str] | None = None,
    buffers_only: bool = False,
) -> dict[str, Size]:
    """Bytes of parameters and buffers under every module name (``""`` is the whole model).

    A tied parameter counts once. Args:
        dtype: the dtype floating-point tensors will be loaded in (a tensor already smaller keeps
            its size).
        special_dtypes: tensor name -> its own dtype.
        buffers_only: count the buffers only.
    """
    default = as_dtype(dtype)
    special = {name: as_dtype(value) for name, value in (special_dtypes or {}).items()}
    tensors = model.named_buffers() if buffers_only else named_module_tensors(model, recurse=True)
    sizes: dict[str, Size] = {}
    for name, tensor in tensors:
        size = _tensor_size(tensor, default, special.get(name))
        parts = name.split(".")
        for depth in range(len(parts) + 1):
            prefix = ".".join(parts[:depth])
            sizes[prefix] = sizes.get(prefix, 0) + size
    return sizes


def compute_module_total_buffer_size(
    model: nn.Module,
    dtype: torch.dtype | str | None = None,
    special_dtypes: Mapping[str, torch.dtype | str] | None = None,
) -> Size:
    """Bytes of all of ``model``'s buffers (counted as :func:`compute_module_sizes` counts them)."""
    return compute_module_sizes(model, dtype, special_dtypes, buffers_only=True).get("", 0)


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
    sizes = {}
    for place, size in max_memory.items():
        try:
            sizes[place] = convert_file_size_to_int(size)
        except ValueError:
            raise ValueError(
                f"max_memory[{place!r}]={size!r} is not a size; give bytes (an int) or a string such as '10MB' or "
                f"'2GiB'."
            ) from None
    indexes = sorted(place for place in sizes if isinstance(place, int))
    named = [place for place in sizes if not isinstance(place, int) and place not in ("mps", "cpu", "disk")]
    tail = [place for place in ("mps", "cpu", "disk") if place in sizes]
    return {place: sizes[place] for place in [*indexes, *named, *tail]}


def _leaves(names: list[str]) -> list[str]:
    """The names (but ``""``) that are no other name's parent."""
    parents = {name.rpartition(".")[0] for name in names if "." in name}
    return [name for name in names if name and name not in parents]


def get_balanced_memory(
    model: nn.Module,
    max_memory: Mapping[Place, int | str] | None = None,
    no_split_module_classes: list[str] | str | None = None,
    dtype: torch.dtype | str | None = None,
    special_dtypes: Mapping[str, torch.dtype | str] | None = None,
    low_zero: bool = False,
) -> dict[Place, int]:
    """A ``max_memory`` for :func:`~drivetrain.big_modeling.infer_auto_device_map` that spreads ``model`` over the GPUs.

    Each GPU but the last gets an equal share of the model plus room for a layer (the largest
    no-split block, or 1.25 times the mean layer); the last keeps all it has, so nothing spills to the
    CPU by rounding. GPUs given 0 bytes take no part; without two GPUs the budget is returned as
    it is (90 % of the one GPU when nobody gave a budget).

    Args:
        low_zero: put as little as possible on GPU 0 (when it is busy with other work, such as generation).
    """
    given = max_memory is not None
    memory: dict[Place, int] = dict(get_max_memory(max_memory))
    gpus = sorted(place for place, size in memory.items() if isinstance(place, int) and size > 0)
    if not gpus:
        return memory
    if len(gpus) == 1:
        low_zero = False
        if not given:
            memory[gpus[0]] = int(memory[gpus[0]] * 0.9)  # room for activations, as Accelerate leaves it
    sizes = compute_module_sizes(model, dtype, special_dtypes)
    share = int(sizes[""] // (len(gpus) - 1 if low_zero else len(gpus)))
    keep_whole = (
        [no_split_module_classes]
        if isinstance(no_split_module_classes, str)
        else list(no_split_module_classes or [])
    )
    block: Size = 0
    if keep_whole:
        modules = dict(model.named_modules())
        blocks = {
            type(modules[name]).__name__: size
            for name, size in reversed(list(sizes.items()))
            if name in modules and type(modules[name]).__name__ in keep_whole
        }
        block = max(blocks.values(), default=0)
    # The layers: leaves once the tensors (the first leaves) are left out.
    modules_only = [name for name in sizes if name not in set(_leaves(list(sizes)))]
    layers = _leaves(modules_only)
    mean_layer = int(sum(sizes[name] for name in layers) / max(len(layers), 1))
    share += int(1.25 * max(block, mean_layer))
    for index in gpus[:-1]:
        memory[index] = min(memory[0] if low_zero and index == 0 else share, memory[index])
    if low_zero:
        rest = sum(memory[index] for index in gpus[1:])
        memory[0] = min(max(0, int(sizes[""]) - rest), memory[0])
    return memory
