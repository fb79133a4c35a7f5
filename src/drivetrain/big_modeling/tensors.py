"""A module's tensors by name: placing one on a device, listing them, tied parameters, and offloaded weights.

The pieces the big-model helpers share (loading, dispatching, the forward hooks), also public as
Accelerate's ``accelerate.utils`` functions of the same names.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import Tensor, nn

META = torch.device("meta")


def set_module_tensor_to_device(
    module: nn.Module,
    name: str,
    device: torch.device | str | int,
    value: Tensor | None = None,
    dtype: torch.dtype | None = None,
) -> None:
    """Put the parameter or buffer ``name`` of ``module`` on ``device`` (with ``value``'s data, if given).

    A floating-point ``value`` takes the model tensor's dtype unless ``dtype`` says otherwise.

    Raises:
        ValueError: ``name`` is no tensor of the module, ``value`` has another shape, or the tensor
            is on ``meta`` (no data) and no ``value`` is given.
    """
    owner_name, _, leaf = name.rpartition(".")
    owner = module.get_submodule(owner_name) if owner_name else module
    if leaf in owner._parameters:
        old: Tensor | None = owner._parameters[leaf]
    elif leaf in owner._buffers:
        old = owner._buffers[leaf]
    else:
        raise ValueError(f"{type(module).__name__} has no parameter or buffer {name!r}.")
    if old is None:
        raise ValueError(f"{name!r} is None in the model; nothing to place.")
    data = old if value is None else value
    if value is not None and tuple(value.shape) != tuple(old.shape):
        raise ValueError(
            f"{name!r} has shape {tuple(old.shape)} in the model but {tuple(value.shape)} in the value given."
        )
    if data.device == META and torch.device(device) != META:
        raise ValueError(f"{name!r} has no data (it is on the meta device); give its value (load it first).")
    target_dtype = data.dtype
    if data.is_floating_point():
        target_dtype = dtype if dtype is not None else old.dtype if old.is_floating_point() else data.dtype
    moved = data.to(device=device, dtype=target_dtype)
    if leaf in owner._parameters:
        assert isinstance(old, nn.Parameter)
        owner._parameters[leaf] = nn.Parameter(moved, requires_grad=old.requires_grad)
    else:
        owner._buffers[leaf] = moved


def tensor_of(module: nn.Module, name: str) -> Tensor:
    """The parameter or buffer ``name`` (dotted) of ``module``."""
    owner_name, _, leaf = name.rpartition(".")
    owner = module.get_submodule(owner_name) if owner_name else module
    found = owner._parameters.get(leaf, owner._buffers.get(leaf))
    if found is None:
        raise ValueError(f"{type(module).__name__} has no parameter or buffer {name!r}.")
    return found


def get_non_persistent_buffers(module: nn.Module, recurse: bool = False, fqns: bool = False) -> set[str]:
    """Names of the buffers ``state_dict`` leaves out (registered with ``persistent=False``).

    Args:
        recurse: the submodules' too.
        fqns: submodules' buffers by their full name (``"block.mask"``); otherwise by their own.
    """
    found: set[str] = set()
    modules = module.named_modules() if recurse else [("", module)]
    for prefix, owner in modules:
        for name in owner._non_persistent_buffers_set:
            found.add(f"{prefix}.{name}" if fqns and prefix else name)
    return found


def named_module_tensors(
    module: nn.Module,
    include_buffers: bool = True,
    recurse: bool = False,
    remove_non_persistent: bool = False,
) -> Iterator[tuple[str, Tensor]]:
    """``(name, tensor)`` for the parameters, then the buffers, of ``module`` (Accelerate's function).

    Args:
        include_buffers: list buffers after the parameters.
        recurse: the submodules' tensors too (full names); otherwise the module's own.
        remove_non_persistent: leave out buffers ``state_dict`` does not hold.
    """
    yield from module.named_parameters(recurse=recurse)
    if include_buffers:
        skipped = (
            get_non_persistent_buffers(module, recurse=recurse, fqns=True) if remove_non_persistent else set()
        )
        for name, buffer in module.named_buffers(recurse=recurse):
            if name not in skipped:
                yield name, buffer


def find_tied_parameters(model: nn.Module, **_: Any) -> list[list[str]]:
    """The groups of names sharing one parameter, each sorted (``[["linear1.weight", "linear2.weight"]]``)."""
    groups: dict[int, list[str]] = {}
    for name, parameter in model.named_parameters(remove_duplicate=False):
        groups.setdefault(id(parameter), []).append(name)
    return [sorted(names) for names in groups.values() if len(names) > 1]


def retie_parameters(model: nn.Module, tied_params: list[list[str]]) -> None:
    """Make every group of names in ``tied_params`` one parameter again (the first that holds data).

    Moving a model between devices or loading it onto ``meta`` can break ties; this restores them.
    """
    for group in tied_params:
        shared = next((p for p in (model.get_parameter(name) for name in group) if p.device != META), None)
        if shared is None:
            continue
        for name in group:
            owner_name, _, leaf = name.rpartition(".")
            owner = model.get_submodule(owner_name) if owner_name else model
            owner._parameters[leaf] = shared


def tied_parameters(model: nn.Module) -> dict[str, str]:
    """Tied weights: every other name of a shared parameter -> the name ``named_parameters()`` gives it.

    Checkpoints hold a shared tensor once (under either name); the other names follow it.
    """
    primary = {id(parameter): name for name, parameter in model.named_parameters()}
    return {
        name: primary[id(parameter)]
        for name, parameter in model.named_parameters(remove_duplicate=False)
        if primary[id(parameter)] != name
    }


def share_parameter(model: nn.Module, alias: str, primary: str) -> None:
    """Make the parameter ``alias`` the same object as ``primary``."""
    owner_name, _, leaf = alias.rpartition(".")
    owner = model.get_submodule(owner_name) if owner_name else model
    owner._parameters[leaf] = model.get_parameter(primary)


class OffloadedWeights:
    """Tensors of a module kept elsewhere (CPU RAM, disk): on ``execution`` while held, on ``meta`` otherwise.

    Held by a forward hook during its module's forward (and by a module of ``preload_module_classes``
    above it during that module's whole forward); the tensors leave when the last holder lets go.

    Args:
        module: the module whose tensors they are.
        names: their names in ``module``.
        read: gives a tensor's value by name (from RAM or from the offload folder).
        execution: where they are brought for a call.
        restore_to: where each tensor goes back to, with its value, when the hook is removed
            (tensors not named stay on ``meta``).
    """

    def __init__(
        self,
        module: nn.Module,
        names: list[str],
        read: Callable[[str], Tensor],
        execution: torch.device | str | int,
        restore_to: dict[str, torch.device] | None = None,
    ) -> None:
        self.module = module
        self.names = names
        self.read = read
        self.execution = execution
        self.restore_to = dict(restore_to or {})
        self.holders = 0

    def offload(self) -> None:
        """Empty the tensors (``meta``) until they are held."""
        for name in self.names:
            set_module_tensor_to_device(self.module, name, META)

    def acquire(self) -> None:
        if self.holders == 0:
            for name in self.names:
                set_module_tensor_to_device(self.module, name, self.execution, self.read(name))
        self.holders += 1

    def release(self) -> None:
        self.holders -= 1
        if self.holders == 0:
            self.offload()

    def restore(self) -> None:
        """Put the tensors back where they were before they were offloaded, with their values."""
        for name, device in self.restore_to.items():
            set_module_tensor_to_device(self.module, name, device, self.read(name))
