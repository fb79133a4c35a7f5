"""Forward hooks that see keyword arguments and can wrap the call (Accelerate's ``accelerate.hooks``).

A :class:`ModelHook` runs around a module's ``forward``: ``pre_forward`` may change the inputs,
``post_forward`` the output, ``no_grad`` runs the forward without autograd. :func:`add_hook_to_module`
replaces the module's ``forward`` by one that calls the hook (the original stays at
``module._old_forward``, the hook at ``module._hf_hook``, where Accelerate keeps them and code
written for it looks); :func:`remove_hook_from_module` puts the original back.

:class:`AlignDevicesHook` is the hook of big-model inference: it brings a module's inputs to its
execution device and, when its weights are offloaded, brings them in for the call only.
:func:`~drivetrain.big_modeling.dispatch_model`, ``cpu_offload`` and ``disk_offload`` run on it.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import torch
from torch import Tensor, nn

from drivetrain._utilities.apply import move_to_device
from drivetrain.big_modeling.tensors import (
    META,
    OffloadedWeights,
    get_non_persistent_buffers,
    named_module_tensors,
    set_module_tensor_to_device,
)

HOOK = "_hf_hook"
OLD_FORWARD = "_old_forward"


class ModelHook:
    """Callbacks around a module's ``forward`` (unlike torch's hooks, they get the keyword arguments too).

    Subclasses override what they need; every method has a neutral default.

    Attributes:
        no_grad: run the module's forward under ``torch.no_grad()``.
    """

    no_grad = False

    def init_hook(self, module: nn.Module) -> nn.Module:
        """Called when the hook is added to ``module``; returns the module."""
        return module

    def pre_forward(
        self, module: nn.Module, *args: Any, **kwargs: Any
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """Called before the forward with its inputs; returns the ``(args, kwargs)`` the forward gets."""
        return args, kwargs

    def post_forward(self, module: nn.Module, output: Any) -> Any:
        """Called after the forward with its output; returns what the call returns."""
        return output

    def detach_hook(self, module: nn.Module) -> nn.Module:
        """Called when the hook is removed from ``module``; returns the module."""
        return module


class SequentialHook(ModelHook):
    """Several hooks in a row: each event goes through ``hooks`` in order."""

    def __init__(self, *hooks: ModelHook) -> None:
        self.hooks = hooks

    def init_hook(self, module: nn.Module) -> nn.Module:
        for hook in self.hooks:
            module = hook.init_hook(module)
        return module

    def pre_forward(
        self, module: nn.Module, *args: Any, **kwargs: Any
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        for hook in self.hooks:
            args, kwargs = hook.pre_forward(module, *args, **kwargs)
        return args, kwargs

    def post_forward(self, module: nn.Module, output: Any) -> Any:
        for hook in self.hooks:
            output = hook.post_forward(module, output)
        return output

    def detach_hook(self, module: nn.Module) -> nn.Module:
        for hook in self.hooks:
            module = hook.detach_hook(module)
        return module


def _hooked_forward(module: nn.Module, *args: Any, **kwargs: Any) -> Any:
    hook: ModelHook = getattr(module, HOOK)
    args, kwargs = hook.pre_forward(module, *args, **kwargs)
    with torch.no_grad() if hook.no_grad else contextlib.nullcontext():
        output = getattr(module, OLD_FORWARD)(*args, **kwargs)
    return hook.post_forward(module, output)


def add_hook_to_module(module: nn.Module, hook: ModelHook, append: bool = False) -> nn.Module:
    """Run ``hook`` around ``module``'s forward; returns the module (changed in place).

    The forward keeps its name and signature. A hook already there is replaced (its
    ``detach_hook`` runs), unless ``append=True`` chains the new one after it in a
    :class:`SequentialHook`.

    Raises:
        TypeError: ``module`` is not a ``torch.nn.Module`` or ``hook`` not a :class:`ModelHook`.
    """
    if not isinstance(module, nn.Module):
        raise TypeError(f"add_hook_to_module expects a torch.nn.Module, got {type(module).__name__}.")
    if not isinstance(hook, ModelHook):
        raise TypeError(
            f"add_hook_to_module expects a ModelHook (drivetrain.hooks.ModelHook subclass), got {type(hook).__name__}."
        )
    current: ModelHook | None = getattr(module, HOOK, None)
    if current is not None and not append:
        current.detach_hook(module)
    if OLD_FORWARD not in vars(module):
        setattr(module, OLD_FORWARD, module.forward)
    module = hook.init_hook(module)
    setattr(module, HOOK, SequentialHook(current, hook) if append and current is not None else hook)
    old = getattr(module, OLD_FORWARD)
    # A partial of a module-level function (not a closure): copying the module copies the binding.
    module.forward = functools.update_wrapper(functools.partial(_hooked_forward, module), old)
    return module


def remove_hook_from_module(module: nn.Module, recurse: bool = False) -> nn.Module:
    """Take the hook off ``module`` (its ``detach_hook`` runs) and give it back its own forward.

    Args:
        recurse: the submodules' hooks too.
    """
    hook: ModelHook | None = getattr(module, HOOK, None)
    if hook is not None:
        hook.detach_hook(module)
        delattr(module, HOOK)
    if OLD_FORWARD in vars(module):
        old = vars(module).pop(OLD_FORWARD)
        if getattr(old, "__self__", None) is module and getattr(old, "__func__", None) is getattr(
            type(module), "forward", None
        ):
            # The class's forward: drop the instance attribute, so a later change of the class
            # (an fx GraphModule's recompile) is seen again.
            vars(module).pop("forward", None)
        else:
            module.forward = old
    if recurse:
        for child in module.children():
            remove_hook_from_module(child, recurse=True)
    return module


def remove_hook_from_submodules(module: nn.Module) -> None:
    """Take the hooks off ``module`` and every module under it."""
    remove_hook_from_module(module, recurse=True)


def find_device(data: Any) -> torch.device | None:
    """The device of the first tensor in ``data`` (nested lists, tuples and dicts), if any."""
    if isinstance(data, Tensor):
        return data.device
    values: Iterable[Any] = (
        data.values() if isinstance(data, Mapping) else data if isinstance(data, (list, tuple)) else ()
    )
    for value in values:
        found = find_device(value)
        if found is not None:
            return found
    return None


def send_to_device(
    data: Any, device: torch.device | str | int, skip_keys: str | Iterable[str] | None = None
) -> Any:
    """``data`` with its tensors on ``device``; mapping entries named in ``skip_keys`` stay where they are."""
    if skip_keys is None:
        return move_to_device(
            data, torch.device(device) if isinstance(device, int) else device, non_blocking=False
        )
    skip = {skip_keys} if isinstance(skip_keys, str) else set(skip_keys)
    if isinstance(data, Mapping):
        return type(data)({k: v if k in skip else send_to_device(v, device, skip) for k, v in data.items()})  # type: ignore[call-arg]
    if isinstance(data, (list, tuple)) and not hasattr(data, "_fields"):
        return type(data)(send_to_device(v, device, skip) for v in data)
    return send_to_device(data, device)


class AlignDevicesHook(ModelHook):
    """Inputs and weights on one device for the forward; optionally weights offloaded between calls.

    Args:
        execution_device: where the module runs: its inputs are moved there, and (without
            ``offload``) its own tensors when the hook is added.
        offload: keep the module's weights out of it (``meta``) between calls, brought in from
            ``weights_map`` to ``execution_device`` for each call.
        io_same_device: return the output on the device the (first) input came on.
        weights_map: name -> tensor of the offloaded weights (any mapping, e.g. lazy from disk);
            default: the module's own, copied to the CPU.
        offload_buffers: offload the buffers too (otherwise they move to ``execution_device``).
        place_submodules: the submodules' tensors too, not only the module's own.
        skip_keys: keyword inputs (and output entries) not to move.
        tied_params_map: must be ``None``: tied weights are handled by ``dispatch_model``.

    Raises:
        ValueError: ``offload`` without an ``execution_device``, or a ``tied_params_map``.
    """

    def __init__(
        self,
        execution_device: int | str | torch.device | None = None,
        offload: bool = False,
        io_same_device: bool = False,
        weights_map: Mapping[str, Tensor] | None = None,
        offload_buffers: bool = False,
        place_submodules: bool = False,
        skip_keys: str | list[str] | None = None,
        tied_params_map: dict[int, dict[torch.device, Tensor]] | None = None,
    ) -> None:
        if offload and execution_device is None:
            raise ValueError(
                "AlignDevicesHook(offload=True) needs an execution_device to bring the weights to."
            )
        if tied_params_map is not None:
            raise ValueError(
                "AlignDevicesHook(tied_params_map=...) is not supported: dispatch_model keeps tied weights shared. "
                "Leave tied_params_map out."
            )
        self.execution_device = execution_device
        self.offload = offload
        self.io_same_device = io_same_device
        self.weights_map = weights_map
        self.offload_buffers = offload_buffers
        self.place_submodules = place_submodules
        self.skip_keys = skip_keys
        self.tied_params_map = None
        self.input_device: torch.device | None = None
        self.entries: list[OffloadedWeights] = []  # the weights this hook brings in for a call
        self.moved_buffers: dict[str, torch.device] = {}  # buffers sent to the execution device on init
        self._prepared = False

    @classmethod
    def holding(
        cls, execution_device: torch.device | None, entries: list[OffloadedWeights], *, offload: bool
    ) -> AlignDevicesHook:
        """A hook for weights offloaded already (by ``dispatch_model``): adding it changes nothing in the module."""
        hook = cls(execution_device)
        hook.offload = offload
        hook.entries = list(entries)
        hook._prepared = True
        return hook

    def __repr__(self) -> str:
        return (
            f"AlignDevicesHook(execution_device={self.execution_device}, offload={self.offload}, "
            f"io_same_device={self.io_same_device}, offload_buffers={self.offload_buffers}, "
            f"place_submodules={self.place_submodules}, skip_keys={self.skip_keys!r})"
        )

    def init_hook(self, module: nn.Module) -> nn.Module:
        if self._prepared:
            return module
        self._prepared = True
        recurse = self.place_submodules
        if not self.offload:
            if self.execution_device is not None:
                for name, _ in list(named_module_tensors(module, recurse=recurse)):
                    set_module_tensor_to_device(module, name, self.execution_device)
            return module
        assert self.execution_device is not None
        devices = {name: tensor.device for name, tensor in named_module_tensors(module, recurse=recurse)}
        if self.weights_map is None:
            self.weights_map = {
                name: tensor.detach().to("cpu")
                for name, tensor in named_module_tensors(
                    module, include_buffers=self.offload_buffers, recurse=recurse
                )
            }
        weights = self.weights_map
        names = [
            name
            for name, _ in named_module_tensors(
                module, include_buffers=self.offload_buffers, recurse=recurse, remove_non_persistent=True
            )
        ]
        restore = {name: devices[name] for name in names if devices[name] != META}
        entry = OffloadedWeights(module, names, weights.__getitem__, self.execution_device, restore)
        entry.offload()
        self.entries = [entry]
        # Buffers that stay: on the execution device for the calls (all of them, or the
        # non-persistent ones a state dict cannot bring in).
        staying = (
            get_non_persistent_buffers(module, recurse=recurse, fqns=True)
            if self.offload_buffers
            else {name for name, _ in module.named_buffers(recurse=recurse)}
        )
        for name in sorted(staying):
            if devices.get(name, META) != META:
                self.moved_buffers[name] = devices[name]
                set_module_tensor_to_device(module, name, self.execution_device)
        return module

    def pre_forward(
        self, module: nn.Module, *args: Any, **kwargs: Any
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        if self.io_same_device:
            self.input_device = find_device([args, kwargs])
        for entry in self.entries:
            entry.acquire()
        if self.execution_device is None:
            return args, kwargs
        return send_to_device(args, self.execution_device), send_to_device(
            kwargs, self.execution_device, self.skip_keys
        )

    def post_forward(self, module: nn.Module, output: Any) -> Any:
        for entry in self.entries:
            entry.release()
        if self.io_same_device and self.input_device is not None:
            output = send_to_device(output, self.input_device, self.skip_keys)
        return output

    def detach_hook(self, module: nn.Module) -> nn.Module:
        """Offloaded weights go back where they were (with their values); weights that had none stay on ``meta``."""
        for entry in self.entries:
            entry.restore()
        for name, device in self.moved_buffers.items():
            set_module_tensor_to_device(module, name, device)
        self.moved_buffers = {}
        return module


class PrefixedDataset(Mapping[str, Tensor]):
    """The entries of ``dataset`` whose names start with ``prefix``, by the rest of their name."""

    def __init__(self, dataset: Mapping[str, Tensor], prefix: str) -> None:
        self.dataset = dataset
        self.prefix = prefix

    def __getitem__(self, key: str) -> Tensor:
        return self.dataset[f"{self.prefix}{key}"]

    def __iter__(self) -> Iterator[str]:
        return (key[len(self.prefix) :] for key in self.dataset if key.startswith(self.prefix))

    def __len__(self) -> int:
        return sum(1 for _ in self)


def attach_execution_device_hook(
    module: nn.Module,
    execution_device: int | str | torch.device,
    skip_keys: str | list[str] | None = None,
    preload_module_classes: list[str] | None = None,
    tied_params_map: dict[int, dict[torch.device, Tensor]] | None = None,
) -> None:
    """An :class:`AlignDevicesHook` moving the inputs to ``execution_device`` on every module with tensors of its own."""
    if not hasattr(module, HOOK) and next(named_module_tensors(module), None) is not None:
        add_hook_to_module(
            module, AlignDevicesHook(execution_device, skip_keys=skip_keys, tied_params_map=tied_params_map)
        )
    if preload_module_classes is not None and type(module).__name__ in preload_module_classes:
        return
    for child in module.children():
        attach_execution_device_hook(
            child, execution_device, skip_keys, preload_module_classes, tied_params_map
        )


def attach_align_device_hook(
    module: nn.Module,
    execution_device: int | str | torch.device | None = None,
    offload: bool = False,
    weights_map: Mapping[str, Tensor] | None = None,
    offload_buffers: bool = False,
    module_name: str = "",
    skip_keys: str | list[str] | None = None,
    preload_module_classes: list[str] | None = None,
    tied_params_map: dict[int, dict[torch.device, Tensor]] | None = None,
) -> None:
    """An :class:`AlignDevicesHook` on ``module`` and every module under it that has tensors of its own.

    Args:
        weights_map: the offloaded weights by their name in the module ``module_name`` names.
        module_name: ``module``'s name in ``weights_map``.
        preload_module_classes: class names of modules whose hook brings in the weights of every
            module under them for their whole forward (for modules that read a submodule's
            weights without calling it).

    The other arguments are :class:`AlignDevicesHook`'s.
    """
    whole = offload and preload_module_classes is not None and type(module).__name__ in preload_module_classes
    if whole or next(named_module_tensors(module), None) is not None:
        prefix = f"{module_name}." if module_name else ""
        hook = AlignDevicesHook(
            execution_device,
            offload=offload,
            weights_map=PrefixedDataset(weights_map, prefix) if weights_map is not None else None,
            offload_buffers=offload_buffers,
            place_submodules=whole,
            skip_keys=skip_keys,
            tied_params_map=tied_params_map,
        )
        add_hook_to_module(module, hook, append=True)
    if whole:
        return
    for child_name, child in module.named_children():
        attach_align_device_hook(
            child,
            execution_device,
            offload,
            weights_map,
            offload_buffers,
            f"{module_name}.{child_name}" if module_name else child_name,
            skip_keys,
            preload_module_classes,
            tied_params_map,
        )


def has_offloaded_params(module: nn.Module) -> bool:
    """Whether ``module``'s hook keeps its weights offloaded between calls."""
    hook = getattr(module, HOOK, None)
    hooks = hook.hooks if isinstance(hook, SequentialHook) else (hook,)
    return any(isinstance(h, AlignDevicesHook) and h.offload and h.entries for h in hooks)


@contextlib.contextmanager
def align_module_device(
    module: nn.Module, execution_device: torch.device | str | int | None = None
) -> Iterator[None]:
    """Within the block, ``module``'s own weights hold data on one device (Accelerate's context manager).

    An offloaded module's weights are brought in (to ``execution_device`` if given, else to its
    hook's) and leave again afterwards; a module that is not offloaded has its parameters moved to
    ``execution_device`` for the block (nothing happens without one).
    """
    hook = getattr(module, HOOK, None)
    hooks = hook.hooks if isinstance(hook, SequentialHook) else (hook,)
    entries = [e for h in hooks if isinstance(h, AlignDevicesHook) and h.offload for e in h.entries]
    if entries:
        places = [entry.execution for entry in entries]
        if execution_device is not None:
            for entry in entries:
                entry.execution = execution_device
        for entry in entries:
            entry.acquire()
        try:
            yield
        finally:
            for entry, place in zip(entries, places, strict=True):
                entry.release()
                entry.execution = place
        return
    if execution_device is None:
        yield
        return
    devices = {name: parameter.device for name, parameter in module.named_parameters(recurse=False)}
    for name in devices:
        set_module_tensor_to_device(module, name, execution_device)
    try:
        yield
    finally:
        for name, device in devices.items():
            set_module_tensor_to_device(module, name, device)
