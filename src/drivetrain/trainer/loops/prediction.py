"""The prediction loop: ``predict_step`` over every batch, outputs gathered from all ranks in order.

Each rank predicts its share of the batches (dealt round-robin by the data layer, no batch
twice); the per-batch outputs are gathered to every rank at the end and the loader puts them back
in the order of its batches (:meth:`~drivetrain.data.PreparedDataLoader.merge_process_results`),
which is dataset order for a loader that does not shuffle.

While it runs, ``trainer.predict_loop`` is this loop: a prediction writer reads which dataset
items each batch holds (:attr:`PredictionLoop.current_batch_indices`) and, at the end, this
process's predictions with their items (:attr:`PredictionLoop.predictions`,
:attr:`PredictionLoop.epoch_batch_indices`), as in Lightning.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from torch.utils.data import DataLoader

from drivetrain._utilities.apply import move_to_device
from drivetrain.trainer.callbacks.prediction_writer import BasePredictionWriter
from drivetrain.trainer.loop_views import evaluation_progress
from drivetrain.trainer.loops.evaluation import (
    check_dataloader_idx,
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
    from drivetrain.trainer.run_state import RunState
    from drivetrain.trainer.trainer import Trainer


class PredictionLoop:
    """Runs ``Trainer.predict`` in this process; returns the predictions (one list per loader when several)."""

    def __init__(self, trainer: Trainer, run: RunState, return_predictions: bool) -> None:
        self.trainer = trainer
        self.run_state = run
        self.return_predictions = return_predictions
        #: The dataset indices of the items in the batch being predicted (``None`` when the loader has
        #: no batch sampler to read them from, such as an iterable dataset).
        self.current_batch_indices: list[int] | None = None
        self._predictions: list[list[Any]] = []
        self._batch_indices: list[list[Any]] = []
        # Batches begun: of the earlier loaders, and of the current one (the loop's own position, also
        # what `trainer.predict_loop.batch_progress` shows).
        self._earlier_batches = 0
        self._loader_batches = 0

    @property
    def predictions(self) -> list[Any]:
        """This process's predictions so far: one per batch (a list per loader when there are several).

        Kept when ``return_predictions`` is on or a prediction writer writes per epoch.
        """
        return self._predictions[0] if len(self._predictions) == 1 else self._predictions

    @property
    def epoch_batch_indices(self) -> list[Any]:
        """The dataset indices of each batch this process predicted, shaped like :attr:`predictions`."""
        return self._batch_indices[0] if len(self._batch_indices) == 1 else self._batch_indices

    @property
    def batch_progress(self) -> Any:
        """Lightning's counters of the batches predicted, in this process (see :mod:`drivetrain.trainer.loop_views`)."""

        return evaluation_progress(self.run_state, "predict")

    @property
    def max_batches(self) -> list[int | float]:
        """Batches per loader this process predicts (``trainer.num_predict_batches``)."""
        return self.trainer.num_predict_batches

    @property
    def num_dataloaders(self) -> int:
        return len(self.max_batches)

    def run(self) -> Any:
        trainer, run = self.trainer, self.run_state
        hooks = run.hooks
        assert hooks is not None
        module = run.module
        loaders, lengths = run.data.eval_loaders(RunningStage.PREDICTING)
        padding = Padding(trainer, module, lengths, "predict")
        run.state.stage = RunningStage.PREDICTING
        module._results = ResultCollection(training=False)
        modes = enter_eval_mode(run, "predict")
        step = step_function(trainer, run, "predict_step")
        batch_start, batch_end = hooks.on_predict_batch_start, hooks.on_predict_batch_end
        several = len(loaders) > 1
        check_dataloader_idx(module, "predict", len(loaders))
        keep = self.return_predictions or _writes_per_epoch(trainer.callbacks)
        self._predictions = []
        self._batch_indices = []
        self._earlier_batches = self._loader_batches = 0
        run.evaluation_counts.begin("predict", lambda: self._earlier_batches + self._loader_batches)
        try:
            self._run_loaders(loaders, lengths, padding, step, batch_start, batch_end, keep)
        finally:
            run.evaluation_counts.end()
        leave_eval_mode(run, "predict", modes)
        self.current_batch_indices = None
        if not self.return_predictions:
            return None
        outputs = [self._gather(loader, collected) for loader, collected in zip(loaders, self._predictions)]
        return outputs if several else (outputs[0] if outputs else [])

    def _run_loaders(
        self,
        loaders: list[Any],
        lengths: list[float],
        padding: Padding,
        step: Any,
        batch_start: Any,
        batch_end: Any,
        keep: bool,
    ) -> None:
        hooks = self.run_state.hooks
        several = len(loaders) > 1
        hooks.call("on_predict_start")
        hooks.call("on_predict_epoch_start")
        with grad_context(self.trainer, self.run_state):
            for dataloader_idx, (loader, length) in enumerate(zip(loaders, lengths)):
                collected: list[Any] = []
                self._predictions.append(collected)
                extra = (dataloader_idx,) if several else ()
                batch = padding.shared_batch(dataloader_idx, loader)
                cut = limit_below_length(loader, length) if length else 0
                self._earlier_batches += self._loader_batches
                self._loader_batches = 0
                with _recording_indices(loader) as seen:
                    for batch_idx, batch in enumerate(loader if length else ()):
                        if batch_idx >= length:
                            break
                        self._loader_batches = batch_idx + 1
                        self.current_batch_indices = seen[batch_idx] if batch_idx < len(seen) else None
                        if batch_start is not None:
                            batch_start(batch, batch_idx, *extra)
                        output = step(batch, batch_idx, *extra)
                        if batch_end is not None:
                            batch_end(output, batch, batch_idx, *extra)
                        if keep:
                            collected.append(output)
                        if batch_idx + 1 == cut:
                            break  # without reading (and placing) a batch beyond the limit
                del seen[
                    self._loader_batches :
                ]  # read ahead (workers, the limit's look-ahead) but not predicted
                self._batch_indices.append(seen)
                padding.run(dataloader_idx, step, batch, extra)
        hooks.call("on_predict_epoch_end")
        hooks.call("on_predict_end")

    def _gather(self, loader: Any, collected: list[Any]) -> list[Any]:
        strategy = self.trainer.strategy
        if strategy.world_size == 1:
            return collected

        gathered = strategy.all_gather_object(move_to_device(collected, "cpu"))
        return loader.merge_process_results(gathered)


def _writes_per_epoch(callbacks: list[Any]) -> bool:
    return any(isinstance(cb, BasePredictionWriter) and cb.interval.on_epoch for cb in callbacks)


class _IndexRecorder:
    """A loader's batch sampler that also keeps the index lists it hands out, in order.

    Workers read ahead, so the loop takes batch ``i``'s indices from position ``i`` rather than
    from the latest list.
    """

    def __init__(self, batch_sampler: Any, seen: list[Any]) -> None:
        self.inner = batch_sampler
        self.seen = seen

    def __iter__(self) -> Any:
        for indices in self.inner:
            self.seen.append(list(indices))
            yield indices

    def __len__(self) -> int:
        return len(self.inner)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["inner"], name)


@contextlib.contextmanager
def _recording_indices(loader: Any) -> Iterator[list[Any]]:
    """The list that fills with each batch's dataset indices while ``loader`` is iterated (it stays
    empty when the loader has no batch sampler, as with an iterable dataset)."""
    seen: list[Any] = []
    batch_sampler = getattr(loader, "batch_sampler", None) if isinstance(loader, DataLoader) else None
    if batch_sampler is None:
        yield seen
        return
    # DataLoader refuses a new batch sampler once built; the swap lasts for this loop only.
    object.__setattr__(loader, "batch_sampler", _IndexRecorder(batch_sampler, seen))
    try:
        yield seen
    finally:
        object.__setattr__(loader, "batch_sampler", batch_sampler)
