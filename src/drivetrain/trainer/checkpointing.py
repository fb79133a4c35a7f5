"""Saving and restoring the whole training state through the strategy.

A Trainer checkpoint holds the module (``"state_dict"``), each optimizer (``"optimizer_<i>"``),
the LR schedulers, the precision plugin's state (the fp16 loss scale), the loop progress
(including the random generators at the start of the epoch, which fix the data order), every
rank's random generators, the callbacks', the DataModule's and the partly accumulated epoch
metrics, and the hyperparameters. Modules and optimizers are handed to ``strategy.save_state``
as live objects, so sharded strategies write them their way.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from drivetrain.strategies.rng import capture_rng_states, state_for_rank
from drivetrain.trainer.hparams import hyperparameters_for_checkpoint
from drivetrain.trainer.state import TrainerFn

if TYPE_CHECKING:
    from drivetrain.trainer.trainer import Trainer


def resolve_ckpt_path(trainer: Trainer, fn: TrainerFn, request: str | None) -> str | None:
    """A path as given, or the path ``"last"``/``"best"`` stands for (decided on rank 0, shared with all)."""
    if request is None:
        return None
    if request not in ("last", "best"):
        found = published(request)
        return os.fspath(found) if found is not None else request
    path = _find_checkpoint(trainer, fn, request) if trainer.is_global_zero else None
    return trainer.strategy.broadcast(path) if trainer.world_size > 1 else path


def published(path: str | Path) -> Path | None:
    """Where the checkpoint published as ``path`` is (also while a crash left its replacement half done)."""
    from drivetrain.plugins.io.atomic import resolve

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
        warnings.warn(
            f"ckpt_path='last' was given but no checkpoint callback has a checkpoint in its folder yet; {what}.",
            UserWarning,
            stacklevel=6,
        )
    return last


def checkpoint_state(trainer: Trainer, weights_only: bool = False) -> dict[str, Any]:
    """The live state to save (called on every rank: gathering the generators is a collective)."""
    module = trainer._module
    progress = trainer._progress
    state: dict[str, Any] = {
        "state_dict": trainer._model,
        "epoch": progress.epoch,
        "global_step": progress.global_step,
        "drivetrain_version": _version(),
        "hyper_parameters": hyperparameters_for_checkpoint(module.hparams),
    }
    if not weights_only:
        for index, optimizer in enumerate(trainer._optimizers):
            state[f"optimizer_{index}"] = optimizer
        state["lr_schedulers"] = [config.scheduler.state_dict() for config in trainer._scheduler_configs]
        state["precision"] = trainer.strategy.precision
        state["loops"] = {"fit": progress.state_dict(), "should_stop": trainer.should_stop}
        state["rng_states"] = trainer.strategy.all_gather_object(capture_rng_states(trainer.strategy))
        state["callbacks"] = {cb.state_key: cb.state_dict() for cb in trainer.callbacks}
        state["results"] = trainer._train_results.state_dict() if trainer._train_results is not None else {}
        datamodule = trainer.datamodule
        if datamodule is not None:
            state["datamodule"] = datamodule.state_dict()
    trainer._hooks.call("on_save_checkpoint", state)
    return state


def save_checkpoint(trainer: Trainer, path: str | Path, weights_only: bool = False) -> None:
    state = checkpoint_state(trainer, weights_only)
    trainer.strategy.save_state(path, state)
    trainer.strategy.barrier("Trainer.save_checkpoint")


def restore_training_state(trainer: Trainer, path: str | Path) -> None:
    """Load everything a resumed fit needs; the generators are restored later, when the loop starts."""
    live: dict[str, Any] = {"state_dict": trainer._model, "precision": trainer.strategy.precision}
    for index, optimizer in enumerate(trainer._optimizers):
        live[f"optimizer_{index}"] = optimizer
    try:
        rest = _load(trainer, path, live)
    except KeyError as error:
        raise ValueError(
            f"Cannot resume training from '{path}': {error.args[0]} A checkpoint saved with weights_only=True (or by "
            f"another program) holds no training state; load its weights with "
            f"{type(trainer._module).__name__}.load_from_checkpoint, or start a new fit."
        ) from None
    schedulers = rest.get("lr_schedulers", [])
    if len(schedulers) != len(trainer._scheduler_configs):
        raise ValueError(
            f"The checkpoint '{path}' has {len(schedulers)} LR scheduler(s) but configure_optimizers() made "
            f"{len(trainer._scheduler_configs)}; resume with the configuration that wrote it."
        )
    for config, scheduler_state in zip(trainer._scheduler_configs, schedulers):
        config.scheduler.load_state_dict(scheduler_state)
    loops = rest.get("loops", {})
    trainer._progress.load_state_dict(loops.get("fit", {}))
    trainer.should_stop = bool(loops.get("should_stop", False))
    callback_states = rest.get("callbacks", {})
    for callback in trainer.callbacks:
        if callback.state_key in callback_states:
            callback.load_state_dict(callback_states[callback.state_key])
    if trainer._train_results is not None and rest.get("results"):
        trainer._train_results.load_state_dict(rest["results"])
    datamodule = trainer.datamodule
    if datamodule is not None and "datamodule" in rest:
        datamodule.load_state_dict(rest["datamodule"])
    states = rest.get("rng_states")
    if states:
        strategy = trainer.strategy
        trainer._pending_rng = state_for_rank(
            states, strategy.global_rank, strategy.world_size, source=str(path)
        )
    trainer._restored = True
    trainer._hooks.call("on_load_checkpoint", rest)


def restore_weights(trainer: Trainer, path: str | Path) -> None:
    """Load only the module's weights (for validate/test/predict with ``ckpt_path``)."""
    rest = _load(trainer, path, {"state_dict": trainer._model})
    trainer._hooks.call("on_load_checkpoint", rest)


def _load(trainer: Trainer, path: str | Path, live: dict[str, Any]) -> dict[str, Any]:
    from drivetrain.plugins.io.safe_loading import UnsafeCheckpointError

    fn = trainer.state.fn.value if trainer.state.fn is not None else "fit"
    safe = trainer._ckpt_weights_only
    try:
        # Passed only when it differs from the default: a user strategy's load_state may predate it.
        if safe:
            return trainer.strategy.load_state(path, live, strict=True)
        return trainer.strategy.load_state(path, live, strict=True, weights_only=False)
    except UnsafeCheckpointError as error:
        raise error.with_opt_out(f"Trainer.{fn}(..., ckpt_path=..., weights_only=False)") from None


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("drivetrain")
    except PackageNotFoundError:  # running from a source tree that is not installed
        return "unknown"
