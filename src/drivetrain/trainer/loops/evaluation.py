"""The evaluation loop: validation (inside fit or on its own), the sanity check, and test.

::

    [on_<stage>_start]  [on_<stage>_epoch_start]
    for each loader, for batch in this rank's share:
        [on_<stage>_batch_start]  <stage>_step  [on_<stage>_batch_end]
    epoch values reduced across ranks  [on_<stage>_epoch_end]  logged  [on_<stage>_end]

Steps run without gradients (``torch.inference_mode`` unless ``inference_mode=False``) on the
user's module directly, so ranks with unequal shares never wait on each other mid-loop.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from drivetrain.trainer.loops.optimization import redirected_call, with_precision
from drivetrain.trainer.results import ResultCollection
from drivetrain.trainer.state import RunningStage

if TYPE_CHECKING:
    from drivetrain.trainer.trainer import Trainer

_DATALOADER_SUFFIX = "/dataloader_idx_"


def grad_context(trainer: Trainer) -> Any:
    return torch.inference_mode() if trainer._settings.inference_mode else torch.no_grad()


def step_function(trainer: Trainer, name: str) -> Any:
    """``module.<name>`` as the evaluation loops call it: through the wrapper only where sharding needs it."""
    module, model, strategy = trainer._module, trainer._model, trainer.strategy
    method = getattr(module, name)
    if strategy.requires_joint_setup and model is not None:
        method = redirected_call(model, module, method)
    return with_precision(method, strategy.precision)


class EvaluationLoop:
    """Runs one validation, sanity check or test pass in this process."""

    def __init__(self, trainer: Trainer, stage: RunningStage) -> None:
        self.trainer = trainer
        self.stage = stage

    def run(self) -> list[dict[str, float]]:
        trainer, stage = self.trainer, self.stage
        hooks = trainer._hooks
        module = trainer._module
        prefix = "test" if stage == RunningStage.TESTING else "validation"
        loaders, lengths = trainer._data.eval_loaders(stage)
        strategy = trainer.strategy
        results = ResultCollection(
            training=False,
            all_reduce=strategy.all_reduce if strategy.world_size > 1 else None,
            all_gather_object=strategy.all_gather_object if strategy.world_size > 1 else None,
        )
        previous_stage = trainer.state.stage
        trainer.state.stage = stage
        sanity = stage == RunningStage.SANITY_CHECKING
        if sanity:
            hooks.call("on_sanity_check_start")
        module._results = results
        was_training = trainer._model.training
        trainer._model.eval()
        step = step_function(trainer, f"{prefix}_step")
        batch_start = getattr(hooks, f"on_{prefix}_batch_start")
        batch_end = getattr(hooks, f"on_{prefix}_batch_end")
        several = len(loaders) > 1
        if several:
            _check_takes_dataloader_idx(getattr(module, f"{prefix}_step"), f"{prefix}_step", len(loaders))
        try:
            hooks.call(f"on_{prefix}_start")
            hooks.call(f"on_{prefix}_epoch_start")
            with grad_context(trainer):
                results.batch_level = True
                for dataloader_idx, (loader, length) in enumerate(zip(loaders, lengths)):
                    results.suffix = f"{_DATALOADER_SUFFIX}{dataloader_idx}" if several else ""
                    extra = (dataloader_idx,) if several else ()
                    if length == 0:
                        continue
                    for batch_idx, batch in enumerate(loader):
                        if batch_idx >= length:
                            break
                        results.mark += 1
                        results.batch = batch
                        if batch_start is not None:
                            batch_start(batch, batch_idx, dataloader_idx)
                        output = step(batch, batch_idx, *extra)
                        if batch_end is not None:
                            batch_end(output, batch, batch_idx, dataloader_idx)
                results.batch_level = False
                results.suffix = ""
                results.reduce_epoch()
                hooks.call(f"on_{prefix}_epoch_end")
            if not sanity:
                trainer._metrics.persist(results)
                trainer._metrics.log(
                    results.epoch_metrics(logger_only=True), step=trainer._progress.global_step
                )
            hooks.call(f"on_{prefix}_end")
            if sanity:
                hooks.call("on_sanity_check_end")
        finally:
            trainer.state.stage = previous_stage
            if was_training:
                trainer._model.train()
        return per_loader_results(results.epoch_values, len(loaders))


def _check_takes_dataloader_idx(method: Any, name: str, count: int) -> None:
    import inspect

    try:
        inspect.signature(method).bind(None, 0, 0)
    except TypeError:
        raise TypeError(
            f"There are {count} {name.split('_')[0]} loaders, so {name} is called as {name}(batch, batch_idx, "
            f"dataloader_idx); give it a third parameter: def {name}(self, batch, batch_idx, dataloader_idx=0)."
        ) from None
    except ValueError:  # no signature (a builtin): let the call speak for itself
        return


def per_loader_results(values: dict[str, Any], num_loaders: int) -> list[dict[str, float]]:
    """One dict per loader: its own (suffixed) values plus the values logged outside the batch loops."""
    shared = {k: float(v) for k, v in values.items() if _DATALOADER_SUFFIX not in k}
    if num_loaders <= 1:
        return [shared] if num_loaders else []
    return [
        {**shared, **{k: float(v) for k, v in values.items() if k.endswith(f"{_DATALOADER_SUFFIX}{i}")}}
        for i in range(num_loaders)
    ]
