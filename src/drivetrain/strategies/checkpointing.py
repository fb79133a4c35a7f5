"""One checkpoint for both front doors: its entries, and the one writer and reader they call.

A Trainer checkpoint (``ModelCheckpoint``, ``Trainer.save_checkpoint``) and an
``Accelerator.save_state`` are the same dict and go through the same two functions,
:func:`write_checkpoint` and :func:`read_checkpoint`; they differ only in the entries each door
adds. The user's guide is ``docs/checkpoints.md``.

The entries this module owns:

``"drivetrain"``
    ``{"format": 1, "version": ..., "door": "trainer" | "accelerator", "world_size": N,
    "counts": {"models": m, "optimizers": o, "schedulers": s}}``: what wrote the checkpoint.
``"state_dict"`` (``"state_dict_1"``, …)
    each model's weights (the strategy gathers or shards them).
``"optimizer_<i>"``, ``"scheduler_<i>"``
    each optimizer's and LR scheduler's state.
``"precision"``
    the precision plugin's state (the fp16 loss scaler).
``"processes"``
    one record per process, by global rank: ``{"rng": ..., "dataloaders": [...]}``, the random
    generators (:mod:`drivetrain.strategies.rng`) and each prepared loader's position. A run
    resumed on another number of processes follows :func:`~drivetrain.strategies.rng.state_for_rank`.
    A checkpoint taken inside a gradient accumulation window (between two optimizer steps) adds
    ``"gradients"``: each model's gradients so far in this process, one per parameter (``None``
    for none), which the window's step still needs; the doors put them back on resume.

What the doors add: the Trainer ``"epoch"``, ``"global_step"``, ``"hyper_parameters"``,
``"loops"``, ``"callbacks"``, ``"results"``, ``"datamodule"`` and whatever ``on_save_checkpoint``
hooks put in; the Accelerator ``"custom_<i>"`` (objects given to ``register_for_checkpointing``),
``"accumulation_step"`` and ``"iteration"``.

Each process may name its own place (``save_state(f"ckpt-{rank}")``, a temporary directory per
process): the shared entries are then written once, where global rank 0 asked, and every
process also writes its own record next to its own path (``<path>.process<rank>``); reading from
the same per-process places restores every process from its own record.

Writing is crash-safe because each strategy's ``save_state`` is (write under a temporary name,
verify, publish atomically); callers prune older checkpoints only after :func:`write_checkpoint`
returns. Reading is safe by default (``weights_only``); see :mod:`drivetrain.plugins.io.safe_loading`.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from drivetrain._utilities import paths
from drivetrain.plugins.io.atomic import resolve, write_file
from drivetrain.plugins.io.safe_loading import UnsafeCheckpointError, load_torch_file
from drivetrain.strategies import rng
from drivetrain.strategies.rng import state_for_rank

if TYPE_CHECKING:
    from torch import nn
    from torch.optim import Optimizer

    from drivetrain.strategies.strategy import Strategy

FORMAT = 1
META = "drivetrain"
PRECISION = "precision"
PROCESSES = "processes"
GRADIENTS = "gradients"
_KINDS = ("models", "optimizers", "schedulers")


def model_key(index: int) -> str:
    """``"state_dict"`` for the first model (Lightning's name), ``"state_dict_<i>"`` for the others."""
    return "state_dict" if index == 0 else f"state_dict_{index}"


def optimizer_key(index: int) -> str:
    return f"optimizer_{index}"


def scheduler_key(index: int) -> str:
    return f"scheduler_{index}"


@dataclass
class TrainingObjects:
    """The live objects a front door checkpoints, by role (each list in the door's own order)."""

    models: Sequence[nn.Module]
    optimizers: Sequence[Optimizer] = ()
    #: LR schedulers (objects with ``state_dict``/``load_state_dict``).
    schedulers: Sequence[Any] = ()
    #: Prepared data loaders whose ``state_dict`` is their position.
    dataloaders: Sequence[Any] = ()
    #: Whether an accumulation window is open (batches since the last optimizer step): the
    #: models' gradients are then saved with each process's record.
    mid_window: bool = False


@dataclass
class LoadedCheckpoint:
    """What :func:`read_checkpoint` found besides what it restored in place."""

    #: Where the checkpoint was read from (the published path, or what a crash left in its place);
    #: a URL string for remote storage.
    path: Path | str
    #: This process's record (generators, loader positions), chosen by the resume policy.
    process: dict[str, Any] | None
    #: The door's entries as loaded (plain values; live objects were restored in place).
    entries: dict[str, Any] = field(default_factory=dict)
    #: Entries of the checkpoint nobody asked for (hook additions, for ``on_load_checkpoint``).
    rest: dict[str, Any] = field(default_factory=dict)


# -- per-process records: the one place that decides what a process contributes ------------------
def capture_process_state(
    strategy: Strategy, dataloaders: Sequence[Any] = (), window_models: Sequence[nn.Module] = ()
) -> dict[str, Any]:
    """This process's record: its random generators, the position of each prepared loader and, for
    ``window_models`` (given inside an accumulation window), their gradients so far."""
    record: dict[str, Any] = {
        "rng": rng.capture(strategy),
        "dataloaders": [loader.state_dict() for loader in dataloaders],
    }
    if window_models:
        record[GRADIENTS] = [_window_gradients(model) for model in window_models]
    return record


def restore_window_gradients(record: dict[str, Any], models: Sequence[nn.Module]) -> None:
    """Put back the gradients a checkpoint taken inside an accumulation window holds (else nothing)."""
    for model, saved in zip(models, record.get(GRADIENTS) or ()):
        if saved is None:
            continue
        parameters = list(model.parameters())
        if len(saved) != len(parameters):
            raise ValueError(
                f"The checkpoint holds the gradients of {len(saved)} parameters for a model that has "
                f"{len(parameters)} now; resume with the model it was saved from."
            )
        for parameter, grad in zip(parameters, saved):
            parameter.grad = None if grad is None else grad.to(parameter.device)


def _window_gradients(model: nn.Module) -> list[Any] | None:
    import torch

    grads: list[Any] = []
    for parameter in model.parameters():
        grad = parameter.grad
        if grad is not None and type(grad) is not torch.Tensor:
            # Sharded gradients (a DTensor) are kept by the strategy's own state, not here.
            warnings.warn(
                "This checkpoint is taken inside a gradient accumulation window, and the gradients so far are "
                f"sharded ({type(grad).__name__}), so they are not saved: a run resumed from it starts the "
                "window's remaining batches without them. Save at an optimizer step to resume exactly.",
                UserWarning,
                stacklevel=4,
            )
            return None
        grads.append(None if grad is None else grad.detach().to("cpu", copy=True))
    return grads


def restore_process_state(
    strategy: Strategy, record: dict[str, Any], dataloaders: Sequence[Any] = (), *, source: str = "checkpoint"
) -> None:
    """Put a process's generators back and move each prepared loader to its saved position."""
    positions = record.get("dataloaders", [])
    if dataloaders and len(positions) != len(dataloaders):
        raise ValueError(
            f"'{source}' holds the positions of {len(positions)} data loader(s), but {len(dataloaders)} are prepared "
            f"now. Prepare the same loaders, in the same order, before loading."
        )
    for loader, position in zip(dataloaders, positions):
        loader.load_state_dict(position)
    rng.restore(strategy, record["rng"])


# -- writing ---------------------------------------------------------------------------------------
def checkpoint_entries(
    strategy: Strategy, objects: TrainingObjects, *, door: str, weights_only: bool = False
) -> dict[str, Any]:
    """The core entries as live objects, ready for the door to add its own (every rank calls it).

    With ``weights_only`` only the metadata and the models. Gathering the per-process records is
    a collective, so every process must call this.
    """
    counts = {
        "models": len(objects.models),
        "optimizers": 0 if weights_only else len(objects.optimizers),
        "schedulers": 0 if weights_only else len(objects.schedulers),
    }
    entries: dict[str, Any] = {
        META: {
            "format": FORMAT,
            "version": _version(),
            "door": door,
            "world_size": strategy.world_size,
            "counts": counts,
        }
    }
    for index, model in enumerate(objects.models):
        entries[model_key(index)] = model
    if weights_only:
        return entries
    for index, optimizer in enumerate(objects.optimizers):
        entries[optimizer_key(index)] = optimizer
    for index, scheduler in enumerate(objects.schedulers):
        entries[scheduler_key(index)] = scheduler
    entries[PRECISION] = strategy.precision
    window_models = objects.models if objects.mid_window else ()
    entries[PROCESSES] = strategy.all_gather_object(
        capture_process_state(strategy, objects.dataloaders, window_models)
    )
    return entries


@dataclass(frozen=True)
class RankPaths:
    """Where the processes asked to write or read one checkpoint (see :func:`rank_paths`)."""

    #: Where the shared entries are: the path global rank 0 gave.
    shared: str
    #: The path this process gave.
    own: str
    #: Whether the processes gave different paths (each then has its own record beside its path).
    per_process: bool


def rank_paths(strategy: Strategy, path: str | os.PathLike[str]) -> RankPaths:
    """Compare the checkpoint path every process gave (a collective when there are several processes)."""
    own = paths.normalize(path)
    if strategy.world_size == 1:
        return RankPaths(own, own, False)
    given = strategy.all_gather_object(own if paths.is_remote(own) else os.path.abspath(own))
    per_process = len(set(given)) > 1
    return RankPaths(given[0] if per_process else own, own, per_process)


def process_record_path(path: str | os.PathLike[str], rank: int) -> str:
    """Where a process that gave its own checkpoint path keeps its record: beside that path."""
    return paths.join(paths.parent(path), f"{paths.name(path)}.process{rank}")


def write_checkpoint(
    strategy: Strategy,
    path: str | os.PathLike[str],
    entries: dict[str, Any],
    storage_options: Any | None = None,
) -> None:
    """Write ``entries`` to ``path`` on every process's behalf; every process calls it.

    The strategy writes it its way (one file, or a folder every rank contributes to) under a
    temporary name, verifies it and publishes it atomically; when this returns on any process
    the checkpoint is complete under ``path``, and callers may prune older ones. When the
    processes give different paths, the shared entries go to global rank 0's and each process's
    own record (generators, loader positions) beside its own path as well. ``storage_options``
    (for a remote ``path``) go to the strategy's ``save_state``.
    """
    where = rank_paths(strategy, path)
    if storage_options is None:  # a user strategy's save_state may predate the argument
        strategy.save_state(where.shared, entries)
    else:
        strategy.save_state(where.shared, entries, storage_options=storage_options)
    if where.per_process and PROCESSES in entries:
        _write_process_record(where.own, strategy.global_rank, entries[PROCESSES][strategy.global_rank])
    strategy.barrier("drivetrain.write_checkpoint")


def _write_process_record(path: str, rank: int, record: dict[str, Any]) -> None:
    import torch

    write_file(process_record_path(path, rank), lambda target: torch.save({PROCESSES: record}, target))


# -- reading ---------------------------------------------------------------------------------------
def read_whole(
    strategy: Strategy,
    path: str | os.PathLike[str],
    *,
    weights_only: bool = True,
    opt_out: str = "weights_only=False",
) -> dict[str, Any] | None:
    """The checkpoint at ``path`` read as one dict, before anything is restored from it; every process calls it.

    A door shows it to its hooks (which may change it) and passes it to :func:`read_checkpoint`
    as ``loaded``. ``None`` when the strategy does not read this checkpoint whole (a sharded
    folder, read straight into the live shards): :func:`read_checkpoint` then reads it itself.
    """
    where = rank_paths(strategy, path)
    located = resolve(where.shared)
    if located is None:
        shown = where.shared if paths.is_remote(where.shared) else Path(where.shared).resolve()
        raise FileNotFoundError(f"No checkpoint at '{where.shared}' (resolved to '{shown}').")
    if not strategy.reads_checkpoint_whole(located):
        return None
    try:
        return strategy.load_checkpoint(located, None, weights_only=weights_only)
    except UnsafeCheckpointError as error:
        raise error.with_opt_out(opt_out) from None


def read_checkpoint(
    strategy: Strategy,
    path: str | os.PathLike[str] | RankPaths,
    objects: TrainingObjects,
    door_entries: dict[str, Any] | None = None,
    *,
    weights_only: bool = True,
    opt_out: str = "weights_only=False",
    models_only: bool = False,
    strict: bool = True,
    translate: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    map_location: Any | None = None,
    loaded: dict[str, Any] | None = None,
    models_restored: bool = False,
) -> LoadedCheckpoint:
    """Restore ``objects`` (and the door's live entries) from ``path``; every process calls it.

    Modules, optimizers, schedulers, the precision plugin and objects with ``load_state_dict`` in
    ``door_entries`` are restored in place; plain values in ``door_entries`` are replaced by the
    saved ones (see :attr:`LoadedCheckpoint.entries`).

    Args:
        weights_only: read safely (the default); ``False`` unpickles anything (trusted files only).
        opt_out: how the caller's user turns safe loading off, named in a refusal.
        models_only: restore the models only (evaluation from a training checkpoint).
        strict: with ``models_only``, ``False`` loads weights whose keys differ from the model's
            (``load_state_dict(strict=False)``; the Trainer passes the module's ``strict_loading``).
        translate: turns a single-file checkpoint of another schema (Lightning's) into this one
            before anything is restored; such a checkpoint may lack the per-process records.
        map_location: where the strategy reads the saved tensors to before restoring them.
        loaded: the checkpoint as :func:`read_whole` returned it (and hooks left it): restored
            from instead of reading ``path`` again (``translate`` still applies).
        models_restored: the door has loaded the models' weights from ``loaded`` already.

    ``path`` may differ between processes, as it may for :func:`write_checkpoint`: the shared
    entries are then read from global rank 0's path and each process's record from beside its own.

    Raises:
        FileNotFoundError: nothing was published at ``path``.
        KeyError: an entry asked for is missing (a weights-only checkpoint cannot resume training).
        ValueError: the checkpoint holds more models, optimizers or schedulers than ``objects``.
        DamagedCheckpointError, UnsafeCheckpointError: see :mod:`drivetrain.plugins.io.safe_loading`.
    """
    where = path if isinstance(path, RankPaths) else rank_paths(strategy, path)
    located = resolve(where.shared)
    if located is None:
        shown = where.shared if paths.is_remote(where.shared) else Path(where.shared).resolve()
        raise FileNotFoundError(f"No checkpoint at '{where.shared}' (resolved to '{shown}').")
    door_entries = dict(door_entries or {})
    # The door's entries are restored first: an object there may prepare the live objects for their
    # states (a Trainer callback re-creates the parameter groups it had added to an optimizer).
    live: dict[str, Any] = dict(door_entries)
    if not models_restored:
        live.update({model_key(index): model for index, model in enumerate(objects.models)})
    if not models_only:
        live.update({optimizer_key(index): opt for index, opt in enumerate(objects.optimizers)})
        live.update({scheduler_key(index): sched for index, sched in enumerate(objects.schedulers)})
        live.update({PRECISION: strategy.precision, META: None, PROCESSES: None})
    try:
        # weights_only and map_location are passed only when they differ from the defaults: a
        # user strategy's load_state may predate the arguments.
        strict = strict or not models_only  # resuming needs every entry; only the weights may differ
        if translate is not None or loaded is not None:
            if loaded is None:
                loaded = strategy.load_checkpoint(located, map_location, weights_only=weights_only)
            checkpoint = translate(loaded) if translate is not None else loaded
            if PROCESSES not in checkpoint:
                live.pop(PROCESSES, None)
            rest = strategy._checkpoint_into_state(checkpoint, live, strict)
        else:
            options: dict[str, Any] = {}
            if not weights_only:
                options["weights_only"] = False
            if map_location is not None:
                options["map_location"] = map_location
            rest = strategy.load_state(located, live, strict=strict, **options)
    except UnsafeCheckpointError as error:
        raise error.with_opt_out(opt_out) from None
    except KeyError:
        if not models_only:
            _explain_missing(strategy, located, objects, weights_only)
        raise
    process = None
    if not models_only:
        _check_counts(located, live[META], objects)
        own_record = process_record_path(where.own, strategy.global_rank)
        if where.per_process and paths.isfile(own_record):
            process = _read_process_record(own_record, weights_only)
        elif PROCESSES in live:
            process = state_for_rank(
                live[PROCESSES], strategy.global_rank, strategy.world_size, source=str(where.shared)
            )
    return LoadedCheckpoint(
        path=located, process=process, entries={name: live[name] for name in door_entries}, rest=rest
    )


def _read_process_record(path: str, weights_only: bool) -> dict[str, Any]:

    record: dict[str, Any] = load_torch_file(path, weights_only=weights_only)[PROCESSES]
    return record


def _explain_missing(
    strategy: Strategy, path: Path | str, objects: TrainingObjects, weights_only: bool
) -> None:
    """Turn "no entry 'scheduler_1'" into "saved with 1 scheduler, 2 now" when the counts say so."""
    absent = object()
    probe: dict[str, Any] = {META: None, PROCESSES: absent}
    try:
        if weights_only:
            strategy.load_state(path, probe, strict=False)
        else:
            strategy.load_state(path, probe, strict=False, weights_only=False)
    except Exception:
        return  # the original error says enough (some strategies load nothing without their engine)
    meta = probe[META]
    if probe[PROCESSES] is absent:
        return  # a weights-only checkpoint: the caller explains that it holds no training state
    if isinstance(meta, dict) and meta.get("format") == FORMAT:
        saved, live = meta.get("counts", {}), _counts(objects)
        differ = [
            f"{saved.get(kind, 0)} {kind} (now: {live[kind]})"
            for kind in _KINDS
            if saved.get(kind) != live[kind]
        ]
        if differ:
            raise ValueError(
                f"The checkpoint '{path}' was saved with {', '.join(differ)}. Set up the same models, optimizers "
                f"and schedulers, in the same order, to resume from it."
            )


def _counts(objects: TrainingObjects) -> dict[str, int]:
    return {
        "models": len(objects.models),
        "optimizers": len(objects.optimizers),
        "schedulers": len(objects.schedulers),
    }


def _check_counts(path: Path | str, meta: Any, objects: TrainingObjects) -> None:
    """Refuse a checkpoint with more models/optimizers/schedulers than are live: a subset would load silently."""
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ValueError(
            f"'{path}' was not written by this version of drivetrain (checkpoint format {FORMAT}); it cannot be "
            f"resumed. Load its weights alone, or resume with the drivetrain version that wrote it."
        )
    saved = meta.get("counts", {})
    live = _counts(objects)
    keys = {"models": model_key, "optimizers": optimizer_key, "schedulers": scheduler_key}
    extra = [kind for kind in _KINDS if saved.get(kind, 0) > live[kind]]
    if extra:
        counts = ", ".join(f"{saved[kind]} {kind} (now: {live[kind]})" for kind in extra)
        left = [keys[kind](index) for kind in extra for index in range(live[kind], saved[kind])]
        raise ValueError(
            f"The checkpoint '{path}' holds {counts}: loading it would leave {', '.join(map(repr, left))} "
            f"unrestored. Set up the same models, optimizers and schedulers, in the same order, before loading."
        )


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("drivetrain")
    except PackageNotFoundError:  # a source tree that is not installed
        return "unknown"
