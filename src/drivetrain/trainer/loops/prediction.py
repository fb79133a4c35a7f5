"""The prediction loop: ``predict_step`` over every batch, outputs gathered from all ranks in order.

Each rank predicts its share of the batches (dealt round-robin by the data layer, no batch
twice); the per-batch outputs are gathered to every rank at the end and the loader puts them back
in the order of its batches (:meth:`~drivetrain.data.PreparedDataLoader.merge_process_results`),
which is dataset order for a loader that does not shuffle.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from drivetrain.trainer.loops.evaluation import (
    enter_eval_mode,
    grad_context,
    leave_eval_mode,
    limit_below_length,
    step_function,
)
from drivetrain.trainer.loops.uneven import Padding
from drivetrain.trainer.results import ResultCollection
from drivetrain.trainer.state import RunningStage

if TYPE_CHECKING:
    from drivetrain.trainer.trainer import Trainer


class PredictionLoop:
    """Runs ``Trainer.predict`` in this process; returns the predictions (one list per loader when several)."""

    def __init__(self, trainer: Trainer, return_predictions: bool) -> None:
        self.trainer = trainer
        self.return_predictions = return_predictions

    def run(self) -> Any:
        trainer = self.trainer
        hooks = trainer._hooks
        module = trainer._module
        loaders, lengths = trainer._data.eval_loaders(RunningStage.PREDICTING)
        padding = Padding(trainer, lengths, "predict")
        trainer.state.stage = RunningStage.PREDICTING
        module._results = ResultCollection(training=False)
        modes = enter_eval_mode(trainer, "predict")
        step = step_function(trainer, "predict_step")
        batch_start, batch_end = hooks.on_predict_batch_start, hooks.on_predict_batch_end
        several = len(loaders) > 1
        outputs: list[list[Any]] = []
        hooks.call("on_predict_start")
        hooks.call("on_predict_epoch_start")
        with grad_context(trainer):
            for dataloader_idx, (loader, length) in enumerate(zip(loaders, lengths)):
                collected: list[Any] = []
                extra = (dataloader_idx,) if several else ()
                batch = padding.shared_batch(dataloader_idx, loader)
                cut = limit_below_length(loader, length) if length else 0
                for batch_idx, batch in enumerate(loader if length else ()):
                    if batch_idx >= length:
                        break
                    if batch_start is not None:
                        batch_start(batch, batch_idx, dataloader_idx)
                    output = step(batch, batch_idx, *extra)
                    if batch_end is not None:
                        batch_end(output, batch, batch_idx, dataloader_idx)
                    if self.return_predictions:
                        collected.append(output)
                    if batch_idx + 1 == cut:
                        break  # without reading (and placing) a batch beyond the limit
                padding.run(dataloader_idx, step, batch, extra)
                outputs.append(collected)
        hooks.call("on_predict_epoch_end")
        hooks.call("on_predict_end")
        leave_eval_mode(trainer, "predict", modes)
        if not self.return_predictions:
            return None
        outputs = [self._gather(loader, collected) for loader, collected in zip(loaders, outputs)]
        return outputs if several else (outputs[0] if outputs else [])

    def _gather(self, loader: Any, collected: list[Any]) -> list[Any]:
        strategy = self.trainer.strategy
        if strategy.world_size == 1:
            return collected
        from drivetrain._utilities.apply import move_to_device

        gathered = strategy.all_gather_object(move_to_device(collected, "cpu"))
        return loader.merge_process_results(gathered)
