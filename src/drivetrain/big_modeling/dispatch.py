"""Run a model whose weights are spread over devices, CPU RAM and disk: loading and forward hooks.

:func:`load_checkpoint_in_model` puts each checkpoint tensor where the device map says (writing
``"disk"`` entries to the offload folder). :func:`dispatch_model` then adds forward hooks:
every mapped module gets its inputs moved to its execution device; an offloaded module (on disk,
or in CPU RAM while it computes on another device) is empty (``meta``) between calls, and its
pre-hook brings its weights to the execution device for the call only. ``remove_hooks`` undoes
it. :func:`load_checkpoint_and_dispatch` does both, inferring the map with ``device_map="auto"``.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

from drivetrain.big_modeling.device_map import (
    DeviceMap,
    Place,
    as_device,
    as_dtype,
    check_device_map,
    infer_auto_device_map,
    place_of,
)
from drivetrain.big_modeling.files import OffloadFolder, iter_checkpoint

_HANDLES = "_drivetrain_dispatch_handles"
_OFFLOADED = "_drivetrain_offloaded"  # on the model: module name -> its offloaded entry
_META = torch.device("meta")


def set_module_tensor_to_device(
    module: nn.Module,
    name: str,
    device: torch.device | str,
    value: Tensor | None = None,
    dtype: torch.dtype | None = None,
) -> None:
    """Put the parameter or buffer ``name`` of ``module`` on ``device`` (with ``value``'s data, if given).

    Raises:
        ValueError: ``name`` is no tensor of the module, or ``value`` has another shape.
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
            f"{name!r} has shape {tuple(old.shape)} in the model but {tuple(value.shape)} in the checkpoint."
        )
    if data.device == _META and torch.device(device) != _META:
        raise ValueError(f"{name!r} has no data (it is on the meta device); load it from a checkpoint first.")
    target_dtype = data.dtype
    if data.is_floating_point():
        # A checkpoint's floating-point tensor takes the model's dtype unless dtype= says otherwise.
        target_dtype = dtype if dtype is not None else old.dtype if old.is_floating_point() else data.dtype
    moved = data.to(device=device, dtype=target_dtype)
    if leaf in owner._parameters:
        assert isinstance(old, nn.Parameter)
        owner._parameters[leaf] = nn.Parameter(moved, requires_grad=old.requires_grad)
    else:
        owner._buffers[leaf] = moved


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


def _share(model: nn.Module, alias: str, primary: str) -> None:
    owner_name, _, leaf = alias.rpartition(".")
    owner = model.get_submodule(owner_name) if owner_name else model
    owner._parameters[leaf] = model.get_parameter(primary)


def load_checkpoint_in_model(
    model: nn.Module,
    checkpoint: str | os.PathLike[str],
    device_map: DeviceMap | None = None,
    offload_folder: str | os.PathLike[str] | None = None,
    dtype: torch.dtype | str | None = None,
    strict: bool = False,
    offload_state_dict: bool = False,
) -> None:
    """Load ``checkpoint`` (a file, a folder, or a sharded checkpoint's index) into ``model``, shard by shard.

    Each tensor goes where ``device_map`` places it (everything on the CPU without one); tensors
    placed on ``"disk"`` are written to ``offload_folder`` and stay on ``meta`` in the model.
    Floating-point tensors are converted to ``dtype`` if given, else to the model's dtype.
    ``offload_state_dict=True`` writes the tensors placed on the CPU to a temporary folder while the
    shards are read and loads them at the end, so CPU RAM never holds them and a shard at once
    (Accelerate's option, for when the CPU's share and the largest shard do not fit together).

    Raises:
        ValueError: ``"disk"`` without an offload folder, a shape mismatch, or (``strict``) missing or
            unexpected tensors.
    """
    dtype = as_dtype(dtype)
    if device_map is not None:
        check_device_map(model, device_map)
    if device_map is not None and "disk" in device_map.values() and offload_folder is None:
        raise ValueError(
            "the device map sends modules to 'disk', which needs offload_folder= (a folder to write them to)."
        )
    offload = OffloadFolder(offload_folder) if offload_folder is not None else None
    with contextlib.ExitStack() as stack:
        parked = (
            OffloadFolder(stack.enter_context(tempfile.TemporaryDirectory(prefix="drivetrain-state-dict-")))
            if offload_state_dict
            else None
        )
        _load_shards(model, checkpoint, device_map, offload, parked, dtype, strict)


def _load_shards(
    model: nn.Module,
    checkpoint: str | os.PathLike[str],
    device_map: DeviceMap | None,
    offload: OffloadFolder | None,
    parked: OffloadFolder | None,
    dtype: torch.dtype | None,
    strict: bool,
) -> None:
    aliases = tied_parameters(model)
    expected = {name for name, _ in [*model.named_parameters(), *model.named_buffers()]}
    loaded: set[str] = set()
    unexpected: list[str] = []
    for name, tensor in iter_checkpoint(checkpoint):
        name = aliases.get(name, name)
        if name in loaded:  # the other name of a tied weight, saved twice
            continue
        if name not in expected:
            unexpected.append(name)
            continue
        place = place_of(device_map, name) if device_map is not None else "cpu"
        if place == "disk":
            assert offload is not None
            if dtype is not None and tensor.is_floating_point():
                tensor = tensor.to(dtype)
            offload.save(name, tensor)
            set_module_tensor_to_device(model, name, _META)
        elif parked is not None and as_device(place) == torch.device("cpu"):
            parked.save(name, tensor)  # read back once every shard is read
        else:
            set_module_tensor_to_device(model, name, as_device(place), tensor, dtype)
        loaded.add(name)
    if offload is not None:
        offload.flush()
    if parked is not None:
        for name in parked.index:
            set_module_tensor_to_device(model, name, torch.device("cpu"), parked.load(name), dtype)
    for alias, primary in aliases.items():
        if primary in loaded:
            _share(model, alias, primary)  # tied weights stay tied (dispatch_model reads the tie)
    missing = sorted(expected - loaded)
    if missing or unexpected:
        message = (
            f"the checkpoint does not match the model: missing {missing[:10]}, unexpected {unexpected[:10]}"
        )
        if strict:
            raise ValueError(f"{message} (strict=False loads what matches).")
        # Tensors left out keep what the model had (on ``meta``: no data, which dispatching reports).
        warnings.warn(f"{message}; loaded what matches.", UserWarning, stacklevel=2)


class _Offloaded:
    """An offloaded entry's tensors: brought to the execution device while held, ``meta`` otherwise.

    Held by the entry's module during its forward, and by a module of ``preload_module_classes``
    above it during that module's whole forward; the tensors leave when the last holder lets go.
    """

    def __init__(
        self, module: nn.Module, names: list[str], read: Callable[[str], Tensor], execution: torch.device
    ) -> None:
        self.module = module
        self.names = names
        self.read = read
        self.execution = execution
        self.holders = 0

    def acquire(self) -> None:
        if self.holders == 0:
            for name in self.names:
                set_module_tensor_to_device(self.module, name, self.execution, self.read(name))
        self.holders += 1

    def release(self) -> None:
        self.holders -= 1
        if self.holders == 0:
            for name in self.names:
                set_module_tensor_to_device(self.module, name, _META)


def _move(data: Any, device: torch.device) -> Any:
    if isinstance(data, Tensor):
        return data.to(device)
    if isinstance(data, Mapping):
        return type(data)({key: _move(value, device) for key, value in data.items()})  # type: ignore[call-arg]
    if isinstance(data, tuple) and hasattr(data, "_fields"):
        return type(data)(*(_move(value, device) for value in data))
    if isinstance(data, (list, tuple)):
        return type(data)(_move(value, device) for value in data)
    return data


def _attach(module: nn.Module, execution: torch.device | None, offloaded: list[_Offloaded]) -> None:
    """Hooks on ``module``: inputs moved to ``execution`` (unless ``None``), ``offloaded`` held during its forward."""
    handles: list[RemovableHandle] = getattr(module, _HANDLES, [])

    def before(_: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        for entry in offloaded:
            entry.acquire()
        if execution is None:
            return args, kwargs
        return _move(args, execution), _move(kwargs, execution)

    handles.append(module.register_forward_pre_hook(before, with_kwargs=True))
    if offloaded:

        def after(_: nn.Module, args: Any, output: Any) -> Any:
            for entry in offloaded:
                entry.release()
            return output

        handles.append(module.register_forward_hook(after))
    setattr(module, _HANDLES, handles)


def is_offloaded(model: nn.Module) -> bool:
    """Whether some of ``model``'s weights are kept in CPU RAM or on disk between calls (dispatched or offloaded)."""
    return any(getattr(module, _OFFLOADED, None) for module in model.modules())


def get_state_dict_offloaded_model(model: nn.Module) -> dict[str, Tensor]:
    """``model``'s state dict with the offloaded weights read in (on the CPU), one entry at a time.

    A dispatched, CPU- or disk-offloaded model holds ``meta`` tensors between calls; this reads each
    offloaded entry's weights from where they are kept (Accelerate's function of the same name).

    Raises:
        ValueError: a tensor has no data anywhere (a checkpoint did not hold it).
    """
    state = {name: tensor.detach() for name, tensor in model.state_dict(keep_vars=True).items()}
    for root_name, root in model.named_modules():
        for entry_name, entry in (getattr(root, _OFFLOADED, None) or {}).items():
            module_name = ".".join(part for part in (root_name, entry_name) if part)
            module = model.get_submodule(module_name) if module_name else model
            prefix = _prefix_in(model, module)
            for local in entry.names:
                state[prefix + local] = entry.read(local).detach().to("cpu")
    aliases = tied_parameters(model)
    for alias, primary in aliases.items():
        if alias in state and state[alias].device == _META and primary in state:
            state[alias] = state[primary]
    empty = [name for name, tensor in state.items() if tensor.device == _META]
    if empty:
        raise ValueError(
            f"{empty[:3]} hold no data (meta tensors that are not offloaded): load the checkpoint into the model "
            f"before saving it."
        )
    return state


def _prefix_in(model: nn.Module, module: nn.Module) -> str:
    for name, candidate in model.named_modules():
        if candidate is module:
            return f"{name}." if name else ""
    raise ValueError("the module is not part of the model")


def remove_hooks(model: nn.Module) -> None:
    """Remove every hook :func:`dispatch_model` (or :func:`cpu_offload`) added under ``model``."""
    for module in model.modules():
        for handle in getattr(module, _HANDLES, []):
            handle.remove()
        if hasattr(module, _HANDLES):
            delattr(module, _HANDLES)
        if hasattr(module, _OFFLOADED):
            delattr(module, _OFFLOADED)


def _owned_tensors(
    module: nn.Module, prefix: str, device_map: DeviceMap, entry: str
) -> list[tuple[str, str]]:
    """(name in the module, name in the model) of the tensors under ``module`` that ``entry`` places.

    Tensors of submodules with an entry of their own belong to that entry.
    """
    join = (lambda name: f"{prefix}.{name}") if prefix else (lambda name: name)
    owned = []
    for local, _ in [*module.named_parameters(), *module.named_buffers()]:
        full = join(local)
        parts = full.split(".")
        owner = next(
            ".".join(parts[:depth])
            for depth in range(len(parts), -1, -1)
            if ".".join(parts[:depth]) in device_map
        )
        if owner == entry:
            owned.append((local, full))
    return owned


def dispatch_model(
    model: nn.Module,
    device_map: DeviceMap,
    main_device: torch.device | str | None = None,
    offload_dir: str | os.PathLike[str] | None = None,
    state_dict: Mapping[str, Tensor] | None = None,
    preload_module_classes: list[str] | None = None,
) -> nn.Module:
    """Make ``model`` run with its weights where ``device_map`` put them; returns the model.

    Modules on a device run there; ``"disk"`` modules (written by :func:`load_checkpoint_in_model`
    to ``offload_dir``) and, when the main device is not the CPU, ``"cpu"`` modules run on the main
    device with their weights brought in for each call. ``model.hf_device_map`` records the map.

    An offloaded entry's weights (its submodules' included) come in when the entry's module is
    called. A module that uses a submodule's weights without calling it (``self.dense.weight``)
    belongs in ``preload_module_classes``: the weights of every entry under it come in for its
    whole forward.

    Args:
        main_device: where offloaded modules compute; default the first device of the map that is
            neither ``"cpu"`` nor ``"disk"``, else the CPU.
        state_dict: the weights of ``"cpu"``-offloaded modules (default: the model's own).
        preload_module_classes: class names of modules that hold the weights beneath them for their
            whole forward.

    Raises:
        ValueError: an invalid map, or ``"disk"`` without ``offload_dir``.
    """
    check_device_map(model, device_map)
    places = [as_device(place) for place in device_map.values()]
    if main_device is None:
        devices = [p for p in places if isinstance(p, torch.device) and p.type != "cpu"]
        main_device = devices[0] if devices else torch.device("cpu")
    main = torch.device(main_device)
    if "disk" in places and offload_dir is None:
        raise ValueError(
            "the device map sends modules to 'disk', which needs offload_dir= (where they were offloaded)."
        )
    disk = OffloadFolder(offload_dir) if offload_dir is not None else None
    remove_hooks(model)
    aliases = tied_parameters(model)
    held: dict[str, _Offloaded] = {}  # module name -> its offloaded entry
    tensors_of_model = {n for n, _ in [*model.named_parameters(), *model.named_buffers()]}
    for entry, place in device_map.items():
        # An entry naming a tensor is run by the module holding it.
        name = entry.rpartition(".")[0] if entry in tensors_of_model else entry
        module = model.get_submodule(name) if name else model
        device = as_device(place)
        offloaded = None
        if device == "disk":
            assert disk is not None
            names: dict[str, str] = {}  # local name -> name in the offload folder
            absent = []
            for local, full in _owned_tensors(module, name, device_map, entry):
                stored = aliases.get(full, full)
                if stored in disk:
                    names[local] = stored
                elif _tensor(module, local).device == _META:
                    absent.append(full)
                # else: tied to a weight kept in memory elsewhere, which it keeps sharing
            if absent:
                raise ValueError(
                    f"{absent[:3]} are not in the offload folder {offload_dir}; load the checkpoint with it first."
                )
            offloaded = _Offloaded(
                module,
                list(names),
                lambda local, names=names: disk.load(names[local]),  # type: ignore[misc]
                main,
            )
            execution = main
        elif isinstance(device, torch.device) and device.type == "cpu" and main.type != "cpu":
            # CPU offload: the weights stay in RAM, the module computes on the main device.
            tensors = _owned_tensors(module, name, device_map, entry)
            own = dict([*module.named_parameters(), *module.named_buffers()])
            kept = {
                local: (state_dict[full] if state_dict is not None else own[local]).detach().to("cpu")
                for local, full in tensors
            }
            offloaded = _Offloaded(module, list(kept), kept.__getitem__, main)
            for local in kept:
                set_module_tensor_to_device(module, local, _META)
            execution = main
        else:
            assert isinstance(device, torch.device)
            for local, full in _owned_tensors(module, name, device_map, entry):
                stored = aliases.get(full, full)
                if _tensor(module, local).device == _META and disk is not None and stored in disk:
                    # Tied to a weight offloaded to disk: this module keeps a copy in memory.
                    set_module_tensor_to_device(module, local, device, disk.load(stored))
                else:
                    set_module_tensor_to_device(module, local, device)
            execution = device
        _attach(module, execution, [offloaded] if offloaded is not None else [])
        if offloaded is not None:
            held[name] = offloaded
    if "" not in device_map:
        _attach(model, main, [])  # inputs given to the whole model start on the main device
    _preload(model, held, preload_module_classes)
    setattr(model, _OFFLOADED, held)
    model.hf_device_map = dict(device_map)  # type: ignore[assignment]
    return model


def _preload(model: nn.Module, held: dict[str, _Offloaded], classes: list[str] | None) -> None:
    """Hold the offloaded entries under each module of ``classes`` for that module's whole forward."""
    if not classes:
        return
    wanted = set(classes)
    for name, module in model.named_modules():
        if type(module).__name__ not in wanted:
            continue
        prefix = f"{name}." if name else ""
        beneath = [entry for key, entry in held.items() if key.startswith(prefix) and key != name]
        if beneath:
            _attach(module, None, beneath)


def _tensor(module: nn.Module, name: str) -> Tensor:
    owner_name, _, leaf = name.rpartition(".")
    owner = module.get_submodule(owner_name) if owner_name else module
    found = owner._parameters.get(leaf, owner._buffers.get(leaf))
    assert found is not None  # names come from named_parameters()/named_buffers()
    return found


def cpu_offload(
    model: nn.Module,
    execution_device: torch.device | str | None = None,
    offload_buffers: bool = False,
    state_dict: Mapping[str, Tensor] | None = None,
    preload_module_classes: list[str] | None = None,
) -> nn.Module:
    """Keep ``model``'s weights in CPU RAM and bring them to ``execution_device`` for each forward.

    Between calls the model holds no weights (``meta``); the default execution device is the CPU.
    All of them come in when the model is called, so ``preload_module_classes`` (Accelerate's, for
    per-module offloading) changes nothing here; buffers are offloaded with the weights (as with
    ``offload_buffers=True``). ``state_dict``: the weights to keep (default: the model's own).
    """
    device = torch.device(execution_device) if execution_device is not None else torch.device("cpu")
    kept = {
        name: (state_dict[name] if state_dict is not None and name in state_dict else tensor)
        .detach()
        .to("cpu")
        for name, tensor in [*model.named_parameters(), *model.named_buffers()]
    }
    names = list(kept)
    remove_hooks(model)
    for name in names:
        set_module_tensor_to_device(model, name, _META)
    entry = _Offloaded(model, names, kept.__getitem__, device)
    _attach(model, device, [entry])
    setattr(model, _OFFLOADED, {"": entry})
    return model


def disk_offload(
    model: nn.Module,
    offload_dir: str | os.PathLike[str],
    execution_device: torch.device | str | None = None,
    offload_buffers: bool = False,
    preload_module_classes: list[str] | None = None,
) -> nn.Module:
    """Write ``model``'s weights to ``offload_dir`` and read them in to ``execution_device`` for each forward.

    All of them come in when the model is called (``preload_module_classes`` changes nothing here;
    buffers are offloaded with the weights).
    """
    folder = OffloadFolder(offload_dir)
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        folder.save(name, tensor)
        set_module_tensor_to_device(model, name, _META)
    folder.flush()
    device = torch.device(execution_device) if execution_device is not None else torch.device("cpu")
    remove_hooks(model)
    entry = _Offloaded(model, list(folder.index), folder.load, device)
    _attach(model, device, [entry])
    setattr(model, _OFFLOADED, {"": entry})
    return model


def load_checkpoint_and_dispatch(
    model: nn.Module,
    checkpoint: str | os.PathLike[str],
    device_map: DeviceMap | str | None = None,
    max_memory: Mapping[Place, int | str] | None = None,
    no_split_module_classes: list[str] | None = None,
    offload_folder: str | os.PathLike[str] | None = None,
    dtype: torch.dtype | str | None = None,
    strict: bool = False,
    offload_state_dict: bool | None = None,
    preload_module_classes: list[str] | None = None,
) -> nn.Module:
    """Load ``checkpoint`` into ``model`` (built with ``init_empty_weights``) and dispatch it.

    ``device_map="auto"`` (or ``"sequential"``) fills ``max_memory``'s places in order (see
    :func:`~drivetrain.big_modeling.infer_auto_device_map`); ``None`` loads everything on the CPU.
    ``offload_state_dict`` (default: when the map offloads to disk, as Accelerate) and
    ``preload_module_classes`` are :func:`load_checkpoint_in_model`'s and :func:`dispatch_model`'s.

    Raises:
        ValueError: an unsupported ``device_map`` string, or what loading and dispatching raise.
    """
    if isinstance(device_map, str):
        if device_map not in ("auto", "sequential"):
            raise ValueError(
                f"device_map={device_map!r} is not supported; use 'auto' (= 'sequential': fill the devices of "
                f"max_memory in order), a dict of module -> place, or None."
            )
        device_map = infer_auto_device_map(model, max_memory, no_split_module_classes, dtype)
    if offload_state_dict is None:
        offload_state_dict = device_map is not None and "disk" in device_map.values()
    load_checkpoint_in_model(
        model, checkpoint, device_map, offload_folder, dtype, strict, offload_state_dict=offload_state_dict
    )
    if device_map is None:
        return model
    return dispatch_model(
        model, device_map, offload_dir=offload_folder, preload_module_classes=preload_module_classes
    )
