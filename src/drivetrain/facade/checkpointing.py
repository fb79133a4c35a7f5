"""``save_state``/``load_state``, ``save`` and ``save_model`` for the Accelerator.

A training state is written through ``strategy.save_state`` (so sharded strategies can shard
it) into ``<dir>/state.ckpt``: models, optimizers, schedulers, the precision plugin (loss
scaler), registered objects, the accumulation counter, and per process the RNG states and the
position of every prepared data loader. Loading it restores all of that, and the next iteration
of each loader continues with the batch after the last one handed out.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from drivetrain.plugins.io.atomic import is_complete, remove, resolve
from drivetrain.strategies.rng import capture_rng_states, restore_rng_states, state_for_rank

if TYPE_CHECKING:
    from drivetrain.facade.persistence import Persistence as Accelerator

STATE_FILE = "state.ckpt"
_CHECKPOINT_DIR = re.compile(r"^checkpoint_(\d+)$")


def save_state(accelerator: Accelerator, output_dir: str | os.PathLike[str] | None = None) -> str:
    """Write the training state to ``output_dir`` (or the next automatic checkpoint); returns the directory."""
    config = accelerator.project_configuration
    automatic = output_dir is None
    if automatic:
        output_dir = _next_automatic_dir(accelerator)
    directory = Path(output_dir)  # type: ignore[arg-type]
    strategy = accelerator.strategy
    state = _live_state(accelerator)
    per_process = {
        "rng": capture_rng_states(strategy),
        "dataloaders": [loader.state_dict() for loader in accelerator._dataloaders],
    }
    state["processes"] = strategy.all_gather_object(per_process)
    state["accumulation_step"] = accelerator.gradient_state.step
    state["iteration"] = config.iteration
    strategy.save_state(directory / STATE_FILE, state)  # published only once complete
    strategy.barrier("drivetrain.Accelerator.save_state")
    if automatic:
        if accelerator.is_main_process:
            _prune_automatic(directory.parent, keep=config.total_limit, newest=directory)
        config.iteration += 1
    return str(directory)


def load_state(
    accelerator: Accelerator, input_dir: str | os.PathLike[str] | None = None, weights_only: bool = True
) -> str:
    """Restore what :func:`save_state` wrote into the live prepared objects; returns the directory."""
    config = accelerator.project_configuration
    if input_dir is None:
        input_dir = _latest_automatic_dir(accelerator)
    directory = Path(input_dir)
    path = resolve(directory / STATE_FILE) or directory / STATE_FILE
    if not path.exists():
        raise FileNotFoundError(
            f"No drivetrain training state in '{directory}' (expected '{path.name}' inside, written by "
            f"Accelerator.save_state). Pass the directory save_state wrote."
        )
    strategy = accelerator.strategy
    state = _live_state(accelerator)
    state.update({"processes": None, "accumulation_step": 0, "iteration": 0})
    from drivetrain.plugins.io.safe_loading import UnsafeCheckpointError

    try:
        if weights_only:  # passed only when it differs: a user strategy's load_state may predate it
            unused = strategy.load_state(path, state, strict=True)
        else:
            unused = strategy.load_state(path, state, strict=True, weights_only=False)
    except UnsafeCheckpointError as error:
        raise error.with_opt_out("Accelerator.load_state(..., load_kwargs={'weights_only': False})") from None
    _check_nothing_left_behind(directory, unused, state)
    processes: list[dict[str, Any]] = state["processes"]
    mine = state_for_rank(
        processes, accelerator.process_index, accelerator.num_processes, source=str(directory)
    )
    loaders = accelerator._dataloaders
    if len(mine["dataloaders"]) != len(loaders):
        raise ValueError(
            f"The state in '{directory}' holds the positions of {len(mine['dataloaders'])} data loader(s), but "
            f"{len(loaders)} are prepared now. Prepare the same loaders, in the same order, before load_state."
        )
    for loader, position in zip(loaders, mine["dataloaders"]):
        loader.load_state_dict(position)
    restore_rng_states(strategy, mine["rng"])
    accelerator.gradient_state.step = int(state["accumulation_step"])
    if config.automatic_checkpoint_naming:
        config.iteration = int(state["iteration"]) + 1
    return str(directory)


_PREPARED_KINDS = {
    "model": "models",
    "optimizer": "optimizers",
    "scheduler": "schedulers",
    "custom": "objects registered with register_for_checkpointing",
}


def _check_nothing_left_behind(directory: Path, unused: dict[str, Any], state: dict[str, Any]) -> None:
    """Refuse a checkpoint holding more models/optimizers/… than are prepared: a subset would load silently."""
    extra = sorted(key for key in unused if _kind(key) is not None)
    if not extra:
        return
    counts = []
    for kind, words in _PREPARED_KINDS.items():
        live = sum(1 for key in state if _kind(key) == kind)
        saved = live + sum(1 for key in extra if _kind(key) == kind)
        if saved != live:
            counts.append(f"{saved} {words} (prepared now: {live})")
    raise ValueError(
        f"The state in '{directory}' holds {', '.join(counts)}: loading it would leave "
        f"{', '.join(map(repr, extra))} unrestored. Prepare (or register) the same objects, in the same order, "
        f"before load_state."
    )


def _kind(key: str) -> str | None:
    """``"model"`` for ``"model_3"`` and so on; ``None`` for entries that are not prepared objects."""
    match = re.fullmatch(r"(model|optimizer|scheduler|custom)_\d+", key)
    return match.group(1) if match else None


def _live_state(accelerator: Accelerator) -> dict[str, Any]:
    state: dict[str, Any] = {}
    for index, model in enumerate(accelerator._models):
        state[f"model_{index}"] = model
    for index, optimizer in enumerate(accelerator._optimizers):
        state[f"optimizer_{index}"] = optimizer.optimizer
    for index, scheduler in enumerate(accelerator._schedulers):
        state[f"scheduler_{index}"] = scheduler
    for index, obj in enumerate(accelerator._custom_objects):
        state[f"custom_{index}"] = obj
    state["precision"] = accelerator.strategy.precision
    return state


def _checkpoints_root(accelerator: Accelerator) -> Path:
    project_dir = accelerator.project_configuration.project_dir
    if project_dir is None:
        raise ValueError(
            "Automatic checkpoint naming needs a project directory: Accelerator(project_dir=...) or "
            "ProjectConfiguration(project_dir=..., automatic_checkpoint_naming=True)."
        )
    return Path(project_dir) / "checkpoints"


def _existing(root: Path) -> list[tuple[int, Path]]:
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := _CHECKPOINT_DIR.match(p.name))]
    return sorted(found)


def _next_automatic_dir(accelerator: Accelerator) -> Path:
    config = accelerator.project_configuration
    if not config.automatic_checkpoint_naming:
        raise ValueError(
            "save_state() needs a directory: pass save_state(output_dir), or turn on "
            "ProjectConfiguration(automatic_checkpoint_naming=True) with a project_dir."
        )
    root = _checkpoints_root(accelerator)
    target = root / f"checkpoint_{config.iteration}"
    if target.exists():
        if _holds_complete_state(target):
            raise ValueError(
                f"The checkpoint directory '{target}' already exists; set ProjectConfiguration(iteration=...) "
                f"past the existing checkpoints, or remove it."
            )
        # Left by a save that crashed (a resumed run counts on from the newest complete one): reuse it.
        if accelerator.is_main_process:
            remove(target)
        accelerator.strategy.barrier("drivetrain.Accelerator.save_state.clear")
    return target


def _holds_complete_state(directory: Path) -> bool:
    path = resolve(directory / STATE_FILE)
    return path is not None and is_complete(path)


def _prune_automatic(root: Path, keep: int | None, newest: Path) -> None:
    """Remove what crashed saves left and, past ``keep``, the oldest checkpoints (after ``newest`` is published)."""
    existing = [path for _, path in _existing(root) if path != newest]
    complete = [path for path in existing if _holds_complete_state(path)]
    doomed = [path for path in existing if path not in complete]
    if keep is not None:
        doomed += complete[: max(0, len(complete) + 1 - keep)]
    for path in doomed:
        remove(path)


def _latest_automatic_dir(accelerator: Accelerator) -> Path:
    if not accelerator.project_configuration.automatic_checkpoint_naming:
        raise ValueError(
            "load_state() needs a directory: pass load_state(input_dir), or turn on "
            "ProjectConfiguration(automatic_checkpoint_naming=True) to load the latest automatic checkpoint."
        )
    root = _checkpoints_root(accelerator)
    existing = [path for _, path in reversed(_existing(root))]
    for index, path in enumerate(existing):
        if _holds_complete_state(path):
            if index and accelerator.is_main_process:
                skipped = ", ".join(f"'{p.name}'" for p in existing[:index])
                warnings.warn(
                    f"Skipping incomplete automatic checkpoint(s) {skipped} under '{root}' (a save was interrupted); "
                    f"loading '{path.name}'.",
                    UserWarning,
                    stacklevel=4,
                )
            return path
    raise FileNotFoundError(f"No complete automatic checkpoint under '{root}' to load.")


# -- saving objects and models ---------------------------------------------------------------
def save_object(obj: Any, f: str | os.PathLike[str], safe_serialization: bool = False) -> None:
    """Write ``obj`` to ``f`` atomically, with ``torch.save`` or as safetensors."""
    path = Path(f)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        if safe_serialization:
            _write_safetensors(obj, tmp)
        else:
            torch.save(obj, tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _write_safetensors(obj: Any, path: Path) -> None:
    try:
        from safetensors.torch import save_file
    except ImportError:
        raise ImportError(
            "safe_serialization=True needs the 'safetensors' package: pip install safetensors (or pass "
            "safe_serialization=False to write with torch.save)."
        ) from None
    if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise TypeError(
            "safe_serialization=True writes a dict of tensors (a state dict); got "
            f"{type(obj).__name__}. Pass safe_serialization=False to save other objects with torch.save."
        )
    save_file(_unshared(obj), str(path), metadata={"format": "pt"})


def _unshared(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Contiguous tensors, each with its own storage (safetensors refuses shared ones, e.g. tied weights)."""
    seen: set[tuple[Any, int]] = set()
    result = {}
    for name, tensor in state_dict.items():
        tensor = tensor.detach().contiguous()
        key = (tensor.device, tensor.untyped_storage().data_ptr()) if tensor.numel() else None
        if key is not None and key in seen:
            tensor = tensor.clone()
        elif key is not None:
            seen.add(key)
        result[name] = tensor
    return result


_UNITS = {
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KIB": 2**10,
    "MIB": 2**20,
    "GIB": 2**30,
}


def parse_size(size: int | str) -> int:
    """Bytes in ``size``: an int, or a string such as ``"10GB"`` or ``"500MiB"``."""
    if isinstance(size, int) and not isinstance(size, bool) and size > 0:
        return size
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?I?B)\s*", str(size).upper())
    if match is None or match.group(2) not in _UNITS:
        raise ValueError(
            f"max_shard_size={size!r} is not a size; use bytes (an int) or a string like '10GB' or '500MB'."
        )
    return int(float(match.group(1)) * _UNITS[match.group(2)])


def write_model(
    state_dict: dict[str, torch.Tensor], directory: Path, max_shard_size: int | str, safe_serialization: bool
) -> None:
    """Write a state dict as one file, or as shards with an index, in Hugging Face's layout."""
    limit = parse_size(max_shard_size)
    directory.mkdir(parents=True, exist_ok=True)
    stem, suffix = ("model", ".safetensors") if safe_serialization else ("pytorch_model", ".bin")
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, tensor in state_dict.items():
        nbytes = tensor.numel() * tensor.element_size()
        if shards[-1] and size + nbytes > limit:
            shards.append({})
            size = 0
        shards[-1][name] = tensor
        size += nbytes
    if len(shards) == 1:
        save_object(shards[0], directory / f"{stem}{suffix}", safe_serialization)
        return
    weight_map = {}
    for number, shard in enumerate(shards, start=1):
        filename = f"{stem}-{number:05d}-of-{len(shards):05d}{suffix}"
        save_object(shard, directory / filename, safe_serialization)
        weight_map.update(dict.fromkeys(shard, filename))
    total = sum(t.numel() * t.element_size() for t in state_dict.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (directory / f"{stem}{suffix}.index.json").write_text(json.dumps(index, indent=2, sort_keys=True))


def model_state_dict(accelerator: Accelerator, model: nn.Module) -> dict[str, torch.Tensor]:
    """The user's module's state dict, converted by the strategy (gathered for sharded strategies)."""
    return accelerator.strategy.get_module_state_dict(model)
