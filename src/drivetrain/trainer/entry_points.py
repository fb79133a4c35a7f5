"""What each Trainer entry point (fit, validate, test, predict) checks in the calling process
before any process starts: the model it was given, the checkpoint it names, and whether
``save_checkpoint`` can run where it was called."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from drivetrain._utilities import paths
from drivetrain.trainer import checkpointing, info_lines
from drivetrain.trainer.loops.evaluation import run_evaluation
from drivetrain.trainer.loops.fit import FitLoop
from drivetrain.trainer.loops.prediction import PredictionLoop
from drivetrain.trainer.module import TrainingModule
from drivetrain.trainer.state import RunningStage, TrainerFn

if TYPE_CHECKING:
    from drivetrain.trainer.module import TrainingModule
    from drivetrain.trainer.run_state import RunState
    from drivetrain.trainer.trainer import Trainer


def unwrap_compiled(model: Any) -> tuple[Any, Any]:
    """``(module, compiler)`` for ``torch.compile(module)`` (Lightning 2.x accepts a compiled module);
    ``(model, None)`` for anything else. ``compiler`` turns a function into its compiled form."""
    inner = getattr(model, "_orig_mod", None)
    compiler = getattr(model, "dynamo_ctx", None)
    if inner is None or compiler is None or not callable(compiler):
        return model, None
    return inner, compiler


def check_model(trainer: Trainer, run: RunState, fn: TrainerFn, model: Any) -> tuple[TrainingModule, Any]:
    """The module the entry point runs (the last one when ``model`` is None) and its compiler, if compiled."""

    if model is None:
        if run.module is None:
            raise ValueError(f"Trainer.{fn.value}() needs a model: pass it as the first argument.")
        return run.module, run.compiler
    module, compiler = unwrap_compiled(model)
    if not isinstance(module, TrainingModule):
        what = f"torch.compile({type(module).__name__})" if compiler is not None else type(model).__name__
        raise TypeError(
            f"Trainer.{fn.value}() expects a drivetrain.TrainingModule, got {what}. Subclass TrainingModule and "
            f"define training_step/configure_optimizers (and the steps you need); torch.compile(module) is accepted too."
        )
    start_method = getattr(trainer.strategy, "start_method", "popen")
    if compiler is not None and start_method in ("spawn", "forkserver"):
        raise ValueError(
            f"Trainer.{fn.value}() got a torch.compile'd module, but the {start_method!r} start method sends the "
            f"module to new processes by pickling, which a compiled function does not survive. Pass the module "
            f"itself and compile inside it (self.net = torch.compile(self.net) in configure_model), or use "
            f"strategy='ddp' (or 'ddp_fork')."
        )
    return module, compiler


def warn_current_weights(trainer: Trainer, fn: TrainerFn) -> None:
    # Called from Trainer._begin: predict() calls it directly, validate()/test() through _evaluate.
    """Say that ``validate``/``test``/``predict`` without a model run the current weights, where Lightning loads the best."""
    best = next((cb.best_model_path for cb in trainer.checkpoint_callbacks if cb.best_model_path), None)
    if best and trainer.is_global_zero:
        import warnings

        warnings.warn(
            f"Trainer.{fn.value}() without a model runs the module's current weights (where Lightning would load "
            f"the best checkpoint of the previous fit, {best}). Pass ckpt_path='best' for the best one, or "
            f"ckpt_path='last' for the newest.",
            UserWarning,
            stacklevel=4 if fn == TrainerFn.PREDICTING else 5,
        )


def check_ckpt_request(fn: TrainerFn, ckpt_path: str | Path | None, weights_only: Any) -> str | None:
    """``ckpt_path`` as the entry point will resolve it: ``"last"``/``"best"``/``"hpc"`` or an existing path."""
    if ckpt_path is not None and ckpt_path not in ("last", "best", "hpc"):
        from drivetrain.trainer import checkpointing

        ckpt_path = os.fspath(ckpt_path)
        if checkpointing.published(ckpt_path) is None:
            shown = ckpt_path if paths.is_remote(ckpt_path) else Path(ckpt_path).resolve()
            import difflib

            close = difflib.get_close_matches(ckpt_path, ["last", "best", "hpc"], n=1, cutoff=0.5)
            hint = f" Did you mean ckpt_path='{close[0]}'?" if close and os.sep not in ckpt_path else ""
            raise FileNotFoundError(
                f"ckpt_path='{ckpt_path}' does not exist (resolved to '{shown}').{hint} Pass a checkpoint file, or "
                f"'last' (the newest checkpoint in the ModelCheckpoint folder), 'best' (validate/test/predict) or 'hpc'."
            )
    if ckpt_path == "best" and fn == TrainerFn.FITTING:
        raise ValueError("fit(ckpt_path='best') is not supported; resume with 'last' or a path.")
    if weights_only is not None and not isinstance(weights_only, bool):
        raise TypeError(f"Trainer.{fn.value}(weights_only={weights_only!r}): use True, False or None (safe).")
    return None if ckpt_path is None else str(ckpt_path)


def check_can_save(trainer: Trainer, run: RunState, weights_only: bool) -> None:
    """Whether ``trainer.save_checkpoint`` has something to save in this process."""
    if run.module is None or run.state.fn is None:
        raise RuntimeError(
            "save_checkpoint() saves what fit/validate/test/predict set up, and none has run yet. Call it "
            "from a callback or module hook during a run, or after trainer.fit(...) returns."
        )
    if not run.strategy_ready and not run.ran_here and not weights_only:
        raise RuntimeError(
            f"trainer.save_checkpoint() runs in the process that launched the {trainer.world_size} "
            f"{type(trainer.strategy).__name__} processes: it holds the trained weights (copied back), but the "
            f"optimizer, scheduler and generator states stayed in the processes that have ended. Save the "
            f"training state during the run (ModelCheckpoint, or save_checkpoint in a callback's on_train_end), "
            f"or save the weights here with save_checkpoint(path, weights_only=True)."
        )


def run_entry_point(trainer: Trainer, run: RunState, fn: TrainerFn) -> Any:
    """Run ``fn``'s loop in this process, once the model and data are set up."""
    import torch

    if fn == TrainerFn.FITTING:
        run.optimization.setup(run.optimizers, run.scheduler_configs)
        if run.ckpt_path is not None:
            info_lines.restoring(run.ckpt_path)
            checkpointing.restore_training_state(trainer, run, run.ckpt_path)
            info_lines.restored(run.ckpt_path, fitting=True)
        run.metrics.log_hyperparams(_hyperparameters(run))
        run.state.stage = RunningStage.TRAINING
        if run.features.detect_anomaly:
            with torch.autograd.set_detect_anomaly(True):
                FitLoop(trainer, run).run()
        else:
            FitLoop(trainer, run).run()
        return None
    if run.ckpt_path is not None:
        info_lines.restoring(run.ckpt_path)
        checkpointing.restore_weights(trainer, run, run.ckpt_path)
        info_lines.restored(run.ckpt_path, fitting=False)
    if fn == TrainerFn.PREDICTING:
        run.predict_loop = PredictionLoop(trainer, run, run.return_predictions)
        return run.predict_loop.run()
    stage = RunningStage.VALIDATING if fn == TrainerFn.VALIDATING else RunningStage.TESTING
    return run_evaluation(trainer, run, stage)


def _hyperparameters(run: RunState) -> dict[str, Any]:
    params = dict(run.module.hparams) if run.module is not None else {}
    datamodule = run.data.datamodule
    if datamodule is not None:
        params.update(datamodule.hparams)
    return params
