"""Run a model whose weights are spread over devices, CPU RAM and disk: loading and forward hooks.

:func:`load_checkpoint_in_model` puts each checkpoint tensor where the device map says (writing
``"disk"`` entries to the offload folder). :func:`dispatch_model` then adds forward hooks:
every mapped module gets an :class:`~drivetrain.big_modeling.hooks.AlignDevicesHook` (at
``module._hf_hook``, where Accelerate puts it) that moves its inputs to its execution device; an
offloaded module (on disk, or in CPU RAM while it computes on another device) is empty (``meta``)
between calls, and its hook brings its weights to the execution device for the call only.
``remove_hooks`` undoes it. :func:`load_checkpoint_and_dispatch` does both, inferring the map with ``device_map="auto"``.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import warnings
from collections.abc import Mapping

import torch
from torch import Tensor, nn

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
from drivetrain.big_modeling.hooks import (
    HOOK,
    AlignDevicesHook,
    SequentialHook,
    add_hook_to_module,
    remove_hook_from_submodules,
)
from drivetrain.big_modeling.sizes import get_balanced_memory
from drivetrain.big_modeling.tensors import (
    META,
    OffloadedWeights,
    set_module_tensor_to_device,
    share_parameter,
    tensor_of,
    tied_parameters,
)

__all__ = [
    "cpu_offload",
    "disk_offload",
    "dispatch_model",
    "get_state_dict_offloaded_model",
    "is_offloaded",
    "load_checkpoint_and_dispatch",
    "load_checkpoint_in_model",
    "remove_hooks",
    "set_module_tensor_to_device",
]

_META = META


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
            share_parameter(model, alias, primary)  # tied weights stay tied (dispatch_model reads the tie)
    missing = sorted(expected - loaded)
    if missing or unexpected:
        message = (
            f"the checkpoint does not match the model: missing {missing[:10]}, unexpected {unexpected[:10]}"
        )
        if strict:
            raise ValueError(f"{message} (strict=False loads what matches).")
        # Tensors left out keep what the model had (on ``meta``: no data, which dispatching reports).
        warnings.warn(f"{message}; loaded what matches.", UserWarning, stacklevel=2)


def _attach(module: nn.Module, execution: torch.device | None, offloaded: list[OffloadedWeights]) -> None:
    """A hook on ``module``: inputs moved to ``execution`` (unless ``None``), ``offloaded`` held during its forward."""
    hook = AlignDevicesHook.holding(execution, offloaded, offload=bool(offloaded))
    add_hook_to_module(module, hook, append=True)


def _offloaded_entries(model: nn.Module) -> list[OffloadedWeights]:
    """The offloaded weights the hooks under ``model`` bring in (each once)."""
    found: dict[int, OffloadedWeights] = {}
    for module in model.modules():
        hook = getattr(module, HOOK, None)
        for part in hook.hooks if isinstance(hook, SequentialHook) else (hook,):
            if isinstance(part, AlignDevicesHook) and part.offload:
                found.update((id(entry), entry) for entry in part.entries)
    return list(found.values())


def is_offloaded(model: nn.Module) -> bool:
    """Whether some of ``model``'s weights are kept in CPU RAM or on disk between calls (dispatched or offloaded)."""
    return bool(_offloaded_entries(model))


def get_state_dict_offloaded_model(model: nn.Module) -> dict[str, Tensor]:
    r"""``model``'s state dict with the offloaded weights read in (on the CPU), one entry at a time.

    A dispatched, CPU- or disk-offloaded model (or one with offloading ``AlignDevicesHook``\ s of
    its own) holds ``meta`` tensors between calls; this reads each offloaded tensor from where it
    is kept (Accelerate's function of the same name).

    Raises:
        ValueError: a tensor has no data anywhere (a checkpoint did not hold it).
    """
    state = {name: tensor.detach() for name, tensor in model.state_dict(keep_vars=True).items()}
    for entry in _offloaded_entries(model):
        prefix = _prefix_in(model, entry.module)
        for local in entry.names:
            if prefix + local in state:  # non-persistent buffers are not part of a state dict
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
    """Remove every hook under ``model`` (:func:`dispatch_model`'s, :func:`cpu_offload`'s, any ``_hf_hook``).

    Weights offloaded to CPU RAM go back to where they were; weights that had no data before
    (loaded straight to disk) stay on ``meta``.
    """
    remove_hook_from_submodules(model)


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
    held: dict[str, OffloadedWeights] = {}  # module name -> its offloaded entry
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
                elif tensor_of(module, local).device == _META:
                    absent.append(full)
                # else: tied to a weight kept in memory elsewhere, which it keeps sharing
            if absent:
                raise ValueError(
                    f"{absent[:3]} are not in the offload folder {offload_dir}; load the checkpoint with it first."
                )
            offloaded = OffloadedWeights(
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
            back = {local: torch.device("cpu") for local in kept}  # where remove_hooks puts them
            offloaded = OffloadedWeights(module, list(kept), kept.__getitem__, main, back)
            for local in kept:
                set_module_tensor_to_device(module, local, _META)
            execution = main
        else:
            assert isinstance(device, torch.device)
            for local, full in _owned_tensors(module, name, device_map, entry):
                stored = aliases.get(full, full)
                if tensor_of(module, local).device == _META and disk is not None and stored in disk:
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
    model.hf_device_map = dict(device_map)  # type: ignore[assignment]
    return model


def _preload(model: nn.Module, held: dict[str, OffloadedWeights], classes: list[str] | None) -> None:
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
    remove_hooks(model)
    tensors = [*model.named_parameters(), *model.named_buffers()]
    kept = {
        name: (state_dict[name] if state_dict is not None and name in state_dict else tensor)
        .detach()
        .to("cpu")
        for name, tensor in tensors
    }
    back = {name: tensor.device for name, tensor in tensors if tensor.device != _META}
    names = list(kept)
    for name in names:
        set_module_tensor_to_device(model, name, _META)
    entry = OffloadedWeights(model, names, kept.__getitem__, device, back)
    _attach(model, device, [entry])
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
    remove_hooks(model)
    folder = OffloadFolder(offload_dir)
    back = {}
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        folder.save(name, tensor)
        back[name] = tensor.device
        set_module_tensor_to_device(model, name, _META)
    folder.flush()
    device = torch.device(execution_device) if execution_device is not None else torch.device("cpu")
    entry = OffloadedWeights(model, list(folder.index), folder.load, device, back)
    _attach(model, device, [entry])
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

    ``device_map="sequential"`` fills ``max_memory``'s places in order (see
    :func:`~drivetrain.big_modeling.infer_auto_device_map`); ``"auto"`` and ``"balanced"`` first
    spread the model evenly over the GPUs (:func:`~drivetrain.big_modeling.get_balanced_memory`),
    ``"balanced_low_0"`` keeps GPU 0 as empty as it can, as in Accelerate; ``None`` loads
    everything on the CPU.
    ``offload_state_dict`` (default: when the map offloads to disk, as Accelerate) and
    ``preload_module_classes`` are :func:`load_checkpoint_in_model`'s and :func:`dispatch_model`'s.

    Raises:
        ValueError: an unsupported ``device_map`` string, or what loading and dispatching raise.
    """
    if isinstance(device_map, str):
        if device_map not in ("auto", "balanced", "balanced_low_0", "sequential"):
            raise ValueError(
                f"device_map={device_map!r} is not supported; use 'auto' (= 'balanced': the model spread evenly "
                f"over the GPUs), 'balanced_low_0', 'sequential' (the places of max_memory filled in order), a dict "
                f"of module -> place, or None."
            )
        if device_map != "sequential":
            max_memory = get_balanced_memory(
                model, max_memory, no_split_module_classes, dtype, low_zero=device_map == "balanced_low_0"
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
