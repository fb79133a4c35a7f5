"""FSDP checkpoints through ``torch.distributed.checkpoint`` (DCP): sharded save/load and consolidation.

A sharded checkpoint is a directory::

    ckpt/
      .metadata                 DCP's index of every tensor shard
      __0_0.distcp, __1_0.distcp …   each rank's shards of the modules and optimizers
      drivetrain_state.pt       rank 0: which entries are sharded, and the plain values

Modules and optimizers go through DCP (each rank writes only its shards, so saving needs no
rank to hold the whole model); everything else (step counters, scheduler and RNG states …)
is written once by rank 0 through the strategy's CheckpointIO, atomically and loadable with
``torch.load(weights_only=True)``. DCP re-shards on load, so a checkpoint saved on N ranks
loads on M.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from torch import nn
from torch.optim import Optimizer

from drivetrain._utilities import paths
from drivetrain.plugins.io.dcp import storage_writer
from drivetrain.plugins.io.safe_loading import check_torch_file, load_torch_file, read_dcp_metadata
from drivetrain.plugins.io.torch_io import TorchCheckpointIO
from drivetrain.strategies.checkpoint_folders import staged_folder

if TYPE_CHECKING:
    from drivetrain.strategies.fsdp import FSDPStrategy

#: The file (inside a sharded checkpoint directory) that holds the non-sharded entries.
STATE_FILE = "drivetrain_state.pt"
FORMAT = "drivetrain-fsdp-sharded"


def is_sharded_checkpoint(path: str | Path) -> bool:
    """Whether ``path`` is a directory written by DCP (it has DCP's ``.metadata``); local or remote."""
    return paths.isfile(paths.join(path, ".metadata"))


def lost_its_index(path: str | Path) -> bool:
    """Whether the local folder ``path`` holds the parts of a sharded checkpoint but not DCP's ``.metadata``."""
    folder = Path(path)
    return folder.is_dir() and ((folder / STATE_FILE).is_file() or any(folder.glob("*.distcp")))


def save_sharded(strategy: FSDPStrategy, path: str | Path, state: dict[str, Any]) -> None:
    """Every rank writes its shards of the modules/optimizers in ``state``; rank 0 writes the rest.

    Into a hidden staging folder, published as ``path`` once complete and verified
    (:func:`~drivetrain.strategies.checkpoint_folders.staged_folder`).
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    sharded: dict[str, Any] = {}
    kinds: dict[str, str] = {}
    values: dict[str, Any] = {}
    for name, value in state.items():
        if isinstance(value, nn.Module):
            sharded[name], kinds[name] = get_model_state_dict(value), "module"
        elif isinstance(value, Optimizer):
            module = strategy.module_for_optimizer(value)
            sharded[name], kinds[name] = get_optimizer_state_dict(module, value), "optimizer"
        elif callable(getattr(value, "state_dict", None)):
            values[name] = value.state_dict()
        else:
            values[name] = value
    header = {"format": FORMAT, "version": 1, "sharded": kinds, "values": values}
    with staged_folder(strategy, path, verify=verify_sharded) as staging:
        dcp.save(sharded, storage_writer=storage_writer(staging))
        if strategy.is_global_zero:
            # Written here, synchronously (not through a background CheckpointIO): the folder is
            # verified and published right after.
            TorchCheckpointIO().save_checkpoint(header, paths.join(staging, STATE_FILE))


def verify_sharded(folder: str | Path) -> None:
    """Raise unless ``folder`` holds readable DCP metadata, every shard it names, and the header file."""

    read_dcp_metadata(folder)
    check_torch_file(paths.join(folder, STATE_FILE))


def load_sharded(
    strategy: FSDPStrategy, path: str | Path, state: dict[str, Any], strict: bool, weights_only: bool = True
) -> dict[str, Any]:
    """Restore the live objects in ``state`` from a sharded checkpoint; return its other plain entries.

    Safe by default: the metadata is read with an allow-list unpickler and checked against the
    data files on every rank before DCP reads anything; ``weights_only=False`` reads it with
    torch's plain unpickler (only for checkpoints from a trusted source).
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import DefaultLoadPlanner
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    from drivetrain.plugins.io.dcp import SafeLoadPlanner, first_rank_error, storage_reader
    from drivetrain.plugins.io.safe_loading import DamagedCheckpointError, read_dcp_metadata

    if weights_only:
        read_dcp_metadata(path)  # every rank: a planted pickle or a missing shard fails here, not inside DCP
    header_file = paths.join(path, STATE_FILE)
    if not paths.isfile(header_file):
        raise DamagedCheckpointError(path, f"its {STATE_FILE} (the entries not sharded) is missing")
    header = strategy.load_checkpoint(header_file, weights_only=weights_only)
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise ValueError(
            f"{path} is a DCP checkpoint, but not one drivetrain's FSDPStrategy wrote ({STATE_FILE})."
        )
    kinds: dict[str, str] = header["sharded"]
    values: dict[str, Any] = header["values"]
    missing = [name for name in state if name not in kinds and name not in values]
    if strict and missing:
        raise KeyError(
            f"The checkpoint has no entry for {', '.join(map(repr, missing))} (it has "
            f"{', '.join(map(repr, [*kinds, *values]))}). Pass strict=False to load the rest."
        )

    targets: dict[str, Any] = {}
    for name, live in state.items():
        if name not in kinds:
            continue
        expected = (
            "module" if isinstance(live, nn.Module) else "optimizer" if isinstance(live, Optimizer) else None
        )
        if expected != kinds[name]:
            raise TypeError(
                f"The checkpoint's {name!r} is a sharded {kinds[name]}, but state[{name!r}] is a "
                f"{type(live).__name__}. Pass the live {kinds[name]} under that name."
            )
        if expected == "module":
            targets[name] = get_model_state_dict(live)
        else:
            targets[name] = get_optimizer_state_dict(strategy.module_for_optimizer(live), live)
    if targets:
        reader = storage_reader(path, weights_only=weights_only)
        planner: Any = (
            SafeLoadPlanner(path, allow_partial_load=not strict)
            if weights_only
            else DefaultLoadPlanner(allow_partial_load=not strict)
        )
        with first_rank_error():
            dcp.load(targets, storage_reader=reader, planner=planner)
    options = StateDictOptions(strict=strict)
    for name, loaded in targets.items():
        live = state[name]
        if isinstance(live, nn.Module):
            set_model_state_dict(live, loaded, options=options)
        else:
            set_optimizer_state_dict(strategy.module_for_optimizer(live), live, loaded, options=options)

    for name, target in state.items():
        if name in values:
            if callable(getattr(target, "load_state_dict", None)) and not isinstance(
                target, (nn.Module, Optimizer)
            ):
                target.load_state_dict(values[name])
            else:
                state[name] = values[name]
    return {name: value for name, value in values.items() if name not in state}


def consolidate_fsdp_checkpoint(
    source: str | Path, destination: str | Path, weights_only: bool = True
) -> str | Path:
    """Gather a sharded FSDP checkpoint into one ``torch.save`` file (runs in one process, no GPU).

    The file holds the same entries :meth:`FSDPStrategy.save_state` was given, as full tensors:
    modules as ordinary ``state_dict()`` s, optimizers as
    ``{"state": {parameter name: ...}, "param_groups": [...]}`` (load those on one device with
    ``torch.distributed.checkpoint.state_dict.set_optimizer_state_dict``), plain values as saved.
    Read safely unless ``weights_only=False``. Either path may be remote.
    """
    from drivetrain.plugins.io.dcp import load_whole_dcp_folder

    header_file = paths.join(source, STATE_FILE)
    header = load_torch_file(header_file, weights_only=weights_only) if paths.isfile(header_file) else None
    checkpoint = load_whole_dcp_folder(source, weights_only=weights_only)
    if header is not None:
        checkpoint.update(header["values"])
    TorchCheckpointIO().save_checkpoint(checkpoint, destination)
    return destination
