"""The evaluation loop: validation (inside fit or on its own), the sanity check, and test.

::

    [on_<stage>_start]  [on_<stage>_epoch_start]
    for each loader, for batch in this rank's share:
        [on_<stage>_batch_start]  <stage>_step  [on_<stage>_batch_end]
    epoch values reduced across ranks  [on_<stage>_epoch_end]  logged  [on_<stage>_end]

Steps run without gradients on the user's module directly, so ranks with unequal shares never
wait on each other mid-loop; where the forward itself is a collective (FSDP, ZeRO-3) the ranks
with fewer batches run discarded extra forwards (:mod:`drivetrain.trainer.loops.uneven`). See
:func:`grad_context` for when that is ``torch.inference_mode``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from drivetrain.trainer.hooks import overrides, takes_batch_idx, without_batch_idx
from drivetrain.trainer.logger_connector import batches_that_stepped
from drivetrain.trainer.loops.optimization import redirected_call, with_precision
from drivetrain.trainer.loops.uneven import Padding
from drivetrain.trainer.module import TrainingModule
from drivetrain.trainer.profiling import timed
from drivetrain.trainer.results import new_results
from drivetrain.trainer.state import RunningStage, TrainerFn

if TYPE_CHECKING:
    from drivetrain.trainer.run_state import RunState
    from drivetrain.trainer.trainer import Trainer

_DATALOADER_SUFFIX = "/dataloader_idx_"


def grad_context(trainer: Trainer, run: RunState) -> Any:
    """``torch.inference_mode`` for ``validate``/``test``/``predict`` (unless ``inference_mode=False`` or the
    strategy cannot run under it), else ``torch.no_grad``.

    Validation inside ``fit`` (and its sanity check) always runs under ``no_grad``, as in
    Lightning: a tensor a module creates there and keeps (a cache, a sharded model's buffers)
    would otherwise be an inference tensor that the training steps after it cannot update.
    """
    if (
        run.settings.inference_mode
        and run.state.fn != TrainerFn.FITTING
        and trainer.strategy.supports_inference_mode
    ):
        return torch.inference_mode()
    return torch.no_grad()


def step_function(trainer: Trainer, run: RunState, name: str) -> Any:
    """``module.<name>`` as the evaluation loops call it: through the wrapper only where sharding needs it."""
    module, model, strategy = run.module, run.model, trainer.strategy
    method = getattr(module, name)
    if not takes_batch_idx(method):  # validation_step(self, batch): decided once per loop, not per batch
        method = without_batch_idx(method)
    if strategy.requires_joint_setup and model is not None:
        method = redirected_call(model, module, method)
    step = with_precision(method, strategy.precision)
    return timed(run.features.profiler, f"[TrainingModule]{type(module).__name__}.{name}", step)


class EvaluationLoop:
    """Runs one validation, sanity check or test pass in this process."""

    def __init__(self, trainer: Trainer, run: RunState, stage: RunningStage) -> None:
        self.trainer = trainer
        self.run_state = run
        self.stage = stage

    def run(self) -> list[dict[str, float]]:
        trainer, run, stage = self.trainer, self.run_state, self.stage
        hooks = run.hooks
        assert hooks is not None
        module = run.module
        prefix = "test" if stage == RunningStage.TESTING else "validation"
        loaders, lengths = run.data.eval_loaders(stage)
        padding = Padding(trainer, module, lengths, "test" if stage == RunningStage.TESTING else "validation")
        results = new_results(run.features, trainer.strategy, False)
        previous_stage = run.state.stage
        run.state.stage = stage
        sanity = stage == RunningStage.SANITY_CHECKING
        if sanity:
            hooks.call("on_sanity_check_start")
        module._results = results
        modes = enter_eval_mode(run, prefix)
        step = step_function(trainer, run, f"{prefix}_step")
        batch_start = getattr(hooks, f"on_{prefix}_batch_start")
        batch_end = getattr(hooks, f"on_{prefix}_batch_end")
        several = len(loaders) > 1
        check_dataloader_idx(module, prefix, len(loaders))
        counts = run.evaluation_counts
        counts.begin(_loop_name(run, stage), lambda: results.mark)  # mark: this run's batches so far
        try:
            hooks.call(f"on_{prefix}_start")
            hooks.call(f"on_{prefix}_epoch_start")
            with grad_context(trainer, run):
                results.batch_level = True
                for dataloader_idx, (loader, length) in enumerate(zip(loaders, lengths)):
                    results.suffix = f"{_DATALOADER_SUFFIX}{dataloader_idx}" if several else ""
                    extra = (dataloader_idx,) if several else ()
                    batch = padding.shared_batch(dataloader_idx, loader)
                    cut = limit_below_length(loader, length) if length else 0
                    for batch_idx, batch in enumerate(loader if length else ()):
                        if batch_idx >= length:
                            break
                        results.mark += 1
                        results.batch = batch
                        if batch_start is not None:
                            batch_start(batch, batch_idx, *extra)
                        output = step(batch, batch_idx, *extra)
                        if batch_end is not None:
                            batch_end(output, batch, batch_idx, *extra)
                        if batch_idx + 1 == cut:
                            break  # without reading (and placing) a batch beyond the limit
                    padding.run(dataloader_idx, step, batch, extra)
                results.batch_level = False
                results.suffix = ""
                results.reduce_epoch()
                hooks.call(f"on_{prefix}_epoch_end")
            if not sanity:
                run.metrics.persist(results)
                progress = run.progress
                stepped = batches_that_stepped(
                    progress.global_step, progress.total_batches, not run.module.automatic_optimization
                )
                step = run.metrics.evaluation_step(run.state.fn == TrainerFn.FITTING, stepped)
                run.metrics.log(results.epoch_metrics(logger_only=True), step=step)
            hooks.call(f"on_{prefix}_end")
        finally:
            counts.end()
            run.state.stage = previous_stage
            leave_eval_mode(run, prefix, modes)
        if sanity:
            hooks.call("on_sanity_check_end")
            counts.forget("fit_validation")  # as Lightning, whose counts start after the sanity check
        return per_loader_results(results.epoch_values, len(loaders))


def _loop_name(run: RunState, stage: RunningStage) -> str:
    """Which loop's batches these are, in :class:`~drivetrain.trainer.state.EvaluationCounts`."""
    if stage == RunningStage.TESTING:
        return "test"
    return "fit_validation" if run.state.fn == TrainerFn.FITTING else "validate"


def run_evaluation(trainer: Trainer, run: RunState, stage: RunningStage) -> list[dict[str, float]]:
    """One validation, sanity check or test pass in this process; one dict of epoch metrics per loader."""
    return EvaluationLoop(trainer, run, stage).run()


def limit_below_length(loader: Any, limit: float) -> float | None:
    """``limit`` when it stops a loop before the loader's end (the loop then breaks right after that
    batch); ``None`` when the loader ends first, so it finishes its epoch normally."""
    try:
        length = len(loader)
    except TypeError:
        return limit
    return limit if limit < length else None


def enter_eval_mode(run: RunState, prefix: str) -> list[tuple[nn.Module, bool]]:
    """``on_<prefix>_model_eval`` (by default ``trainer.model.eval()``); returns every submodule's mode before it."""

    model, module = run.model, run.module
    modes = [(submodule, submodule.training) for submodule in model.modules()]
    hook = f"on_{prefix}_model_eval"
    if overrides(module, TrainingModule, hook):
        getattr(module, hook)()
    else:
        model.eval()
    return modes


def leave_eval_mode(run: RunState, prefix: str, modes: list[tuple[nn.Module, bool]]) -> None:
    """``on_<prefix>_model_train`` where overridden; otherwise every submodule gets the mode it had."""

    module = run.module
    hook = f"on_{prefix}_model_train"
    if prefix != "predict" and overrides(module, TrainingModule, hook):
        getattr(module, hook)()
        return
    for submodule, training in modes:
        submodule.training = training


def check_dataloader_idx(module: Any, prefix: str, count: int) -> None:
    """Refuse a step or batch hook that cannot be called the way the loop will call it (once per loop).

    As in Lightning, ``dataloader_idx`` is passed to ``<prefix>_step`` and to the module's and the
    callbacks' ``on_<prefix>_batch_start``/``_end`` only when there are several loaders.
    """
    import inspect

    what = prefix.split("_")[0]
    step = f"{prefix}_step"
    for name in (step, f"on_{prefix}_batch_start", f"on_{prefix}_batch_end"):
        if name != step and not overrides(module, TrainingModule, name):
            continue
        method = getattr(module, name)
        try:
            signature = inspect.signature(getattr(method, "__wrapped__", method))
        except (TypeError, ValueError):  # no signature (a builtin): let the call speak for itself
            continue
        parameters = signature.parameters
        named = parameters.get("dataloader_idx")
        if count > 1:
            arguments = 3 if name == step else 4 if name.endswith("_end") else 3
            if name == step and not takes_batch_idx(method):
                arguments -= 1
            try:
                inspect.signature(method).bind(*range(arguments))
            except TypeError:
                shape = "(batch, batch_idx, dataloader_idx)" if name == step else "(..., dataloader_idx)"
                raise TypeError(
                    f"There are {count} {what} loaders, so {name} is called as {name}{shape}; give it a third "
                    f"parameter: def {name}(self, batch, batch_idx, dataloader_idx=0)."
                    if name == step
                    else f"There are {count} {what} loaders, so {name} is called as {name}{shape}; give "
                    f"{type(module).__name__}.{name} a last parameter dataloader_idx=0."
                ) from None
        elif named is not None and named.default is inspect.Parameter.empty:
            raise TypeError(
                f"There is one {what} loader, so {name} is called without dataloader_idx (as in Lightning), but "
                f"{type(module).__name__}.{name} requires it. Give it a default: dataloader_idx=0."
            )


def per_loader_results(values: dict[str, Any], num_loaders: int) -> list[dict[str, float]]:
    """One dict per loader: its own (suffixed) values plus the values logged outside the batch loops."""
    shared = {k: float(v) for k, v in values.items() if _DATALOADER_SUFFIX not in k}
    if num_loaders <= 1:
        return [shared] if num_loaders else []
    return [
        {**shared, **{k: float(v) for k, v in values.items() if k.endswith(f"{_DATALOADER_SUFFIX}{i}")}}
        for i in range(num_loaders)
    ]
