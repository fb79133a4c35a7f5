"""The Trainer's door to the core checkpoint (:mod:`drivetrain.strategies.checkpointing`).

The core writes and reads the entries both doors share (model, optimizers, schedulers,
precision, every process's generators and its training loader's state: the seeds its order
comes from). The Trainer adds ``"epoch"``, ``"global_step"``, ``"hyper_parameters"``,
``"loops"`` (the fit progress: the position in the epoch), ``"callbacks"``, ``"results"`` (partly
accumulated epoch metrics) and ``"datamodule"``, and lets ``on_save_checkpoint`` hooks add more. The
hooks see the checkpoint under Lightning's keys (:mod:`drivetrain.trainer.checkpoint_schema`).
It also decides which checkpoint ``ckpt_path="last"``/``"best"`` means.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from drivetrain._utilities import paths
from drivetrain._utilities.log import get_logger
from drivetrain.plugins.io.atomic import published_at, resolve
from drivetrain.strategies.checkpointing import (
    TrainingObjects,
    checkpoint_entries,
    optimizer_key,
    read_checkpoint,
    read_whole,
    restore_process_state,
    restore_window_gradients,
    scheduler_key,
    write_checkpoint,
)
from drivetrain.strategies.state_dicts import load_module_weights
from drivetrain.trainer import checkpoint_schema, lightning_checkpoint
from drivetrain.trainer.hooks import hook_runner
from drivetrain.trainer.hparams import hyperparameters_for_checkpoint
from drivetrain.trainer.state import TrainerFn

if TYPE_CHECKING:
    from drivetrain.trainer.run_state import RunState
    from drivetrain.trainer.trainer import Trainer

_log = get_logger(__name__)


def resolve_ckpt_path(trainer: Trainer, fn: TrainerFn, request: str | None) -> str | None:
    """A path as given, or the path ``"last"``/``"best"``/``"hpc"`` stands for (decided on rank 0, shared with all).

    A fit without ``ckpt_path`` resumes from the newest preemption checkpoint (``hpc_ckpt_<N>.ckpt``)
    in ``default_root_dir`` when there is one (see :mod:`drivetrain.trainer.preemption`).
    """
    if request is None and fn != TrainerFn.FITTING:
        return None
    if request is None or request == "hpc":
        from drivetrain.trainer.preemption import newest_checkpoint

        path = newest_checkpoint(trainer.default_root_dir) if trainer.is_global_zero else None
        if trainer.world_size > 1:
            path = trainer.strategy.broadcast(path)
        if path is None and request == "hpc":
            raise ValueError(
                f"ckpt_path='hpc' resumes from the newest hpc_ckpt_<N>.ckpt a preempted fit saved in default_root_dir "
                f"({trainer.default_root_dir}), but there is none. Pass a path, or leave ckpt_path unset."
            )
        if path is not None and request is None and trainer.is_global_zero:
            _log.warning(f"[drivetrain] Resuming the preempted fit from {path}.")
        return path
    if request not in ("last", "best"):
        found = published(request)
        return os.fspath(found) if found is not None else request
    path = _find_checkpoint(trainer, fn, request) if trainer.is_global_zero else None
    return trainer.strategy.broadcast(path) if trainer.world_size > 1 else path


def published(path: str | Path) -> Path | None:
    """Where the checkpoint published as ``path`` is (also while a crash left its replacement half done)."""
    return resolve(path)


def _find_checkpoint(trainer: Trainer, fn: TrainerFn, request: str) -> str | None:
    checkpoints = trainer.checkpoint_callbacks
    if request == "best":
        best = next((cb.best_model_path for cb in checkpoints if cb.best_model_path), None)
        if best is None:
            raise ValueError(
                "ckpt_path='best' needs a ModelCheckpoint that saved a checkpoint in a previous fit; there is none. "
                "Pass a path, or leave ckpt_path unset to use the current weights."
            )
        return best
    last = next((found for cb in checkpoints if (found := cb.find_last()) is not None), None)
    if last is None:
        import warnings

        what = "training starts from scratch" if fn == TrainerFn.FITTING else "the current weights are used"
        folders = ", ".join(f"'{cb.dirpath}'" for cb in checkpoints if cb.dirpath)
        if folders:
            message = f"ckpt_path='last' was given but there is no checkpoint in the checkpoint folder ({folders}) yet; {what}."
        else:
            message = (
                f"ckpt_path='last' was given but there is no ModelCheckpoint callback (checkpointing is off) to find "
                f"a checkpoint for; {what}. Pass the checkpoint's path instead."
            )
        earlier = _earlier_run(checkpoints)
        if earlier is not None:
            message += (
                f" Under a logger each Trainer writes to a new version folder, so 'last' does not see an earlier run's "
                f"checkpoints; the newest one is '{earlier}'. Pass ckpt_path='{earlier}' to continue that run, or give "
                f"ModelCheckpoint(dirpath=...) a fixed folder so that 'last' finds the previous run's checkpoints."
            )
        warnings.warn(message, UserWarning, stacklevel=6)
    return last


def _earlier_run(checkpoints: list[Any]) -> str | None:
    """The newest checkpoint in a sibling ``version_*/checkpoints`` folder of a callback's (logger-derived) folder."""
    found: list[str] = []
    for callback in checkpoints:
        folder = callback.dirpath
        if (
            not folder
            or paths.name(folder) != "checkpoints"
            or not paths.name(paths.parent(folder)).startswith("version_")
        ):
            continue
        runs = paths.parent(paths.parent(folder))
        for version in paths.listdir(runs) if paths.isdir(runs) else []:
            candidate = paths.join(runs, version, "checkpoints")
            if version.startswith("version_") and candidate != folder:
                newest = callback.find_last(candidate)
                if newest is not None:
                    found.append(newest)
    return max(found, key=published_at) if found else None


def checkpoint_state(trainer: Trainer, run: RunState, weights_only: bool = False) -> dict[str, Any]:
    """The live state to save (called on every rank: gathering the generators is a collective)."""
    progress = run.progress
    state = checkpoint_entries(trainer.strategy, _objects(run), door="trainer", weights_only=weights_only)
    state["epoch"] = progress.epoch
    state["global_step"] = progress.global_step
    state["hyper_parameters"] = hyperparameters_for_checkpoint(run.module.hparams)
    if not weights_only:
        state["loops"] = {"fit": progress.state_dict(), "should_stop": run.should_stop}
        state["callbacks"] = {cb.state_key: cb.state_dict() for cb in trainer.callbacks}
        state["results"] = run.train_results.state_dict() if run.train_results is not None else {}
        datamodule = trainer.datamodule
        if datamodule is not None:
            state["datamodule"] = datamodule.state_dict()
    if run.hooks is None:  # saving after an entry point ended in a process that never resolved hooks
        run.hooks = hook_runner(trainer, run)
    if run.hooks.on_save_checkpoint is not None:
        # The hooks see (and may change) Lightning's keys and plain states: see checkpoint_schema.
        checkpoint_schema.as_saved(trainer.strategy, state)
        run.hooks.on_save_checkpoint(checkpoint_schema.lightning_names(state))
        checkpoint_schema.core_names(state)
    return state


def save_checkpoint(
    trainer: Trainer,
    run: RunState,
    path: str | Path,
    weights_only: bool = False,
    storage_options: Any | None = None,
) -> None:
    write_checkpoint(trainer.strategy, path, checkpoint_state(trainer, run, weights_only), storage_options)


def restore_module_and_callbacks(trainer: Trainer, run: RunState, model: Any) -> None:
    """The first part of loading ``ckpt_path``, in Lightning's order: the checkpoint read whole, the module's
    ``on_load_checkpoint``, the weights into ``model``, the callbacks' ``on_load_checkpoint``.

    Every hook sees the whole checkpoint (``state_dict``, ``optimizer_states``, ``lr_schedulers``,
    ``callbacks``, ``loops`` ...) and may change it: the module's before anything is loaded (it
    may migrate the weights' keys), the callbacks' after the weights (as in Lightning) and before
    everything else. The rest is restored later (:func:`restore_training_state`) from what they
    left. The Trainer calls this before ``configure_optimizers`` (``model`` is the module), or,
    on strategies that set up modules and optimizers together, after the set-up (Lightning's
    ``restore_checkpoint_after_setup``). A checkpoint PyTorch Lightning wrote is shown as it is.
    A sharded folder (FSDP, DeepSpeed) is never one dict: nothing happens here, and the hooks see
    what is left once it is restored (``docs/migrating-from-lightning.md``).
    """
    run.loaded_checkpoint = None
    if run.ckpt_path is None:
        return
    checkpoint = read_whole(
        trainer.strategy, run.ckpt_path, weights_only=run.ckpt_weights_only, opt_out=_opt_out(trainer)
    )
    if checkpoint is None:
        return
    fitting = run.state.fn == TrainerFn.FITTING
    translate = _translator(trainer, run.ckpt_path, training=fitting)
    from_lightning = translate is not None
    view = checkpoint if from_lightning else checkpoint_schema.lightning_names(checkpoint)
    run.hooks.call_module("on_load_checkpoint", view)
    weights = view.get("state_dict")
    if weights is None:
        raise ValueError(
            f"The checkpoint '{run.ckpt_path}' has no 'state_dict' entry (the weights) after on_load_checkpoint; "
            f"keep the weights under checkpoint['state_dict']."
        )
    if translate is not None and not fitting:
        translate(view)  # only its report (what was loaded, what not): evaluation needs the weights alone
    if fitting and not run.module.strict_loading:
        raise ValueError(_NOT_STRICT.format(module=type(run.module).__name__, path=run.ckpt_path))
    load_module_weights(trainer.strategy, model, weights, strict=fitting or run.module.strict_loading)
    run.hooks.call_callbacks("on_load_checkpoint", view)
    run.loaded_checkpoint = view if from_lightning else checkpoint_schema.core_names(view)


_NOT_STRICT = (
    "{module}.strict_loading is False, but resuming fit(ckpt_path='{path}') needs the checkpoint's weights to "
    "match the model exactly (with the optimizer states that belong to them). Load differing weights with "
    "load_from_checkpoint(..., strict=False) and start a new fit, or set strict_loading = True."
)


def restore_training_state(trainer: Trainer, run: RunState, path: str | Path) -> None:
    """Load everything a resumed fit needs; the generators are restored later, when the loop starts
    (:func:`restore_generators`)."""
    if not run.module.strict_loading:
        raise ValueError(_NOT_STRICT.format(module=type(run.module).__name__, path=path))
    if run.loaded_checkpoint is None:  # strategies that set up modules and optimizers together: now
        restore_module_and_callbacks(trainer, run, run.model)
    callbacks = _CallbackStates(trainer)
    shown, run.loaded_checkpoint = run.loaded_checkpoint, None
    try:
        loaded = read_checkpoint(
            trainer.strategy,
            path,
            _objects(run),
            # Callbacks first (door entries are restored before the optimizers): BaseFinetuning re-creates
            # the parameter groups it had added, which the optimizers' saved states include.
            {"callbacks": callbacks, "loops": None},
            weights_only=run.ckpt_weights_only,
            opt_out=_opt_out(trainer),
            translate=_translator(trainer, path, training=True),
            loaded=shown,
            models_restored=shown is not None,
        )
    except KeyError as error:
        raise ValueError(
            f"Cannot resume training from '{path}': {error.args[0]} A checkpoint saved with weights_only=True (or by "
            f"another program) holds no training state; load its weights with "
            f"{type(run.module).__name__}.load_from_checkpoint, or start a new fit."
        ) from None
    loops, rest = loaded.entries["loops"], loaded.rest
    run.progress.load_state_dict(loops.get("fit", {}))
    run.should_stop = bool(loops.get("should_stop", False))
    if run.train_results is not None and rest.get("results"):
        run.train_results.load_state_dict(rest["results"])
    datamodule = trainer.datamodule
    if datamodule is not None and "datamodule" in rest:
        datamodule.load_state_dict(rest["datamodule"])
    run.pending_process = loaded.process
    if loaded.process is not None:
        _restore_training_position(run, loaded.process)
    run.restored = True
    if shown is None:  # a sharded folder: the hooks see what is left once it is restored
        run.hooks.call(
            "on_load_checkpoint",
            _loaded_view(trainer, run, {**rest, **loaded.entries, "callbacks": callbacks.saved}),
        )


def restore_generators(trainer: Trainer, run: RunState) -> None:
    """Put back the random generators of a resumed fit (once the loop starts: the sanity check draws none of them)."""
    if run.pending_process is not None:
        restore_process_state(trainer.strategy, run.pending_process)
        run.pending_process = None


def restore_weights(trainer: Trainer, run: RunState, path: str | Path) -> None:
    """Load only the module's weights (for validate/test/predict with ``ckpt_path``)."""
    if run.loaded_checkpoint is None:  # strategies that set up modules and optimizers together: now
        restore_module_and_callbacks(trainer, run, run.model)
    if run.loaded_checkpoint is not None:  # loaded, hooks called
        run.loaded_checkpoint = None
        return
    loaded = read_checkpoint(
        trainer.strategy,
        path,
        TrainingObjects(models=[run.model]),
        weights_only=run.ckpt_weights_only,
        opt_out=_opt_out(trainer),
        models_only=True,
        strict=run.module.strict_loading,
        translate=_translator(trainer, path, training=False),
    )
    run.hooks.call("on_load_checkpoint", _loaded_view(trainer, run, loaded.rest, models_only=True))


def _loaded_view(
    trainer: Trainer, run: RunState, entries: dict[str, Any], models_only: bool = False
) -> dict[str, Any]:
    """What ``on_load_checkpoint`` hooks get: the checkpoint's entries under Lightning's keys, with the states
    restored into the live objects (``"state_dict"``, ``"optimizer_states"``, ``"lr_schedulers"``) as loaded."""
    if run.hooks is None or run.hooks.on_load_checkpoint is None:
        return entries
    objects = _objects(run)
    view = dict(entries)
    view["state_dict"] = objects.models[0]
    if not models_only:
        view.update({optimizer_key(i): optimizer for i, optimizer in enumerate(objects.optimizers)})
        view.update({scheduler_key(i): scheduler for i, scheduler in enumerate(objects.schedulers)})
    checkpoint_schema.as_saved(trainer.strategy, view)
    return checkpoint_schema.lightning_names(view)


class _CallbackStates:
    """The checkpoint's ``"callbacks"`` entry as a live object: restoring it restores every callback's state."""

    def __init__(self, trainer: Trainer) -> None:
        self.callbacks = trainer.callbacks
        self.saved: dict[str, Any] = {}

    def state_dict(self) -> dict[str, Any]:
        return self.saved

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        self.saved = saved
        for callback in self.callbacks:
            if callback.state_key in saved:
                callback.load_state_dict(saved[callback.state_key])


def _restore_training_position(run: RunState, process: dict[str, Any]) -> None:
    """Make the training loader continue the epoch where the loop left it, in the same order.

    The loader takes its seeds and generator states from this process's record; the position is
    the loop's count, which the loader converts when the number of processes changed (see
    ``docs/resuming.md``). The generators are restored later, when the fit loop starts.
    """
    progress = run.progress
    loader = run.data.train_loader
    saved = (process.get("dataloaders") or [{}])[0]
    mid_epoch = not progress.epoch_finished and progress.batches_done > 0
    loader.load_state_dict(
        {**saved, "epoch": progress.epoch, "in_epoch": mid_epoch, "batches_yielded": progress.batches_done}
    )
    if mid_epoch:
        progress.batches_done = loader.next_epoch_start
    # Saved inside an accumulation window: the window's step still needs the gradients so far.
    restore_window_gradients(process, [run.model])


def _translator(trainer: Trainer, path: str | Path, training: bool) -> Any:
    """Lightning's schema -> ours, for a checkpoint PyTorch Lightning wrote; ``None`` for our own."""

    located = resolve(path)
    if located is None or not lightning_checkpoint.is_lightning_checkpoint(located):
        return None
    keys = {callback.state_key for callback in trainer.callbacks}

    def translate(checkpoint: dict[str, Any]) -> dict[str, Any]:
        converted = lightning_checkpoint.translate(
            checkpoint, training=training, source=str(path), callback_keys=keys
        )
        if training:
            converted.setdefault("callbacks", {})  # a resume restores them; Lightning may have saved none
        return converted

    return translate


def _objects(run: RunState) -> TrainingObjects:
    # No set-up model in a process that launched the ranks (ddp_spawn): its module holds their weights.
    model = run.model if run.model is not None else run.module
    loader = run.data.train_loader
    accumulation = getattr(run.optimization, "accumulation", None)
    return TrainingObjects(
        models=[model],
        optimizers=run.optimizers,
        schedulers=[config.scheduler for config in run.scheduler_configs],
        dataloaders=[loader] if loader is not None else [],
        mid_window=accumulation is not None and accumulation.mid_window,
    )


def _opt_out(trainer: Trainer) -> str:
    fn = trainer.state.fn.value if trainer.state.fn is not None else "fit"
    return f"Trainer.{fn}(..., ckpt_path=..., weights_only=False)"
