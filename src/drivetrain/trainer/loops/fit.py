"""The fit loop: epochs of training batches, with validation, logging and stopping in between.

As pseudocode (hooks in brackets; ``*`` marks where a checkpoint may be taken)::

    [on_fit_start]  sanity check  [on_train_start]
    while not done:
        [on_train_epoch_start]
        for batch in this rank's share (resuming after the last finished batch):
            [on_train_batch_start]  training_step → backward → clip → optimizer step
            (the epoch's last batch: epoch-interval schedulers step)
            [on_train_batch_end]*   log every log_every_n_steps   validation if due*
        epoch values reduced   validation if due at epoch end*
        [on_train_epoch_end]*   epoch values logged   epoch ReduceLROnPlateau schedulers step
    [on_train_end]  [on_fit_end]

As in Lightning, an epoch's schedulers step only when its data ran out, not when ``max_steps``
or a stop request ends the fit inside it.
"""

from __future__ import annotations

import datetime
import math
import time
from collections.abc import Iterator
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any

from drivetrain.strategies import rng
from drivetrain.strategies.preemption import PreemptionWatch
from drivetrain.trainer import info_lines, preemption
from drivetrain.trainer.checkpointing import restore_generators
from drivetrain.trainer.logger_connector import batches_that_stepped
from drivetrain.trainer.loops.evaluation import limit_below_length, run_evaluation
from drivetrain.trainer.optimizers import step_schedulers
from drivetrain.trainer.profiling import timed, timed_batches
from drivetrain.trainer.state import RunningStage

if TYPE_CHECKING:
    from drivetrain.trainer.run_state import RunState
    from drivetrain.trainer.trainer import Trainer


class FitLoop:
    """Runs ``Trainer.fit`` inside one process, after the model and data are set up."""

    def __init__(self, trainer: Trainer, run: RunState) -> None:
        self.trainer = trainer
        self.run_state = run
        self.settings = run.settings
        self.num_batches: float = run.data.num_training_batches
        self.val_check_batch = self._val_check_batch()
        self._deadline: float | None = None
        interval = self.settings.val_check_interval
        #: A time-based val_check_interval in seconds; validation is then due by the clock, not a batch count.
        self._val_seconds = interval.total_seconds() if isinstance(interval, datetime.timedelta) else None
        self._last_validation = time.monotonic()
        if self._val_seconds is not None:
            self._val_due = self._val_due_by_time  # type: ignore[method-assign]  # decided once, not per batch
        self._last_flag = False
        self._preemption = PreemptionWatch((), int)  # inert; the run's own once run() starts

    # -- schedule -------------------------------------------------------------------------
    def _val_check_batch(self) -> float | None:
        settings = self.settings
        if not self.run_state.data.validation_enabled:
            return None
        interval = settings.val_check_interval
        if isinstance(interval, datetime.timedelta):
            return math.inf  # by the clock (_val_due_by_time), not at a batch of the epoch
        if isinstance(interval, float):
            if math.isinf(self.num_batches):
                if interval != 1.0:
                    raise ValueError(
                        f"val_check_interval={interval} is a fraction of an epoch, but the training loader has no "
                        f"length. Pass an int number of batches instead."
                    )
                return math.inf
            return float(max(1, int(self.num_batches * interval)))
        if settings.check_val_every_n_epoch is not None and interval > self.num_batches:
            raise ValueError(
                f"val_check_interval={interval} is more than the {int(self.num_batches)} training batches of an epoch, "
                f"so validation would never run. Use a smaller value, or check_val_every_n_epoch=None to count "
                f"batches across epochs."
            )
        return float(interval)

    def _val_due_by_time(self, batches_done: int) -> bool:
        """A time-based interval: due once that much wall time passed since the last validation (or the fit's
        start), in an epoch ``check_val_every_n_epoch`` allows; the processes agree (any one's clock decides)."""
        every_n = self.settings.check_val_every_n_epoch
        if every_n is not None and (self.run_state.progress.epoch + 1) % every_n:
            return False
        assert self._val_seconds is not None
        due = time.monotonic() - self._last_validation >= self._val_seconds
        strategy = self.trainer.strategy
        return strategy.reduce_boolean_decision(due, all=False) if strategy.world_size > 1 else due

    def _val_due(self, batches_done: int) -> bool:
        every_n = self.settings.check_val_every_n_epoch
        progress = self.run_state.progress
        if every_n is None:
            return progress.total_batches % self.settings.val_check_interval == 0  # type: ignore[operator]
        if (progress.epoch + 1) % every_n:
            return False
        return batches_done % self.val_check_batch == 0  # type: ignore[operator]

    # -- stopping ---------------------------------------------------------------------------
    def _stop_requested(self) -> bool:
        run, settings = self.run_state, self.settings
        progress = run.progress
        return (
            run.should_stop
            and progress.epoch >= settings.min_epochs
            and progress.global_step >= settings.min_steps
        )

    def _out_of_time(self) -> bool:
        return self._deadline is not None and time.monotonic() >= self._deadline

    def done(self) -> bool:
        progress, settings = self.run_state.progress, self.settings
        if settings.max_steps != -1 and progress.global_step >= settings.max_steps:
            return True
        if settings.max_epochs != -1 and progress.epoch >= settings.max_epochs:
            return True
        return self._stop_requested() or self._out_of_time()

    # -- the loop ---------------------------------------------------------------------------
    def run(self) -> None:
        trainer, run = self.trainer, self.run_state
        hooks = run.hooks
        assert hooks is not None
        if self.settings.max_time is not None:
            self._deadline = time.monotonic() + self.settings.max_time.total_seconds()
        info_lines.fit_started(run.features.barebones)
        hooks.call("on_fit_start")
        # A callback may have rebuilt the loaders in on_fit_start (BatchSizeFinder): measure them again.
        self.num_batches = run.data.num_training_batches
        self.val_check_batch = self._val_check_batch()
        if self._sanity_steps():  # a resumed fit too, as in Lightning
            # As Lightning's, the sanity check leaves the random generators as it found them.
            generators = rng.capture(trainer.strategy)
            run_evaluation(trainer, run, RunningStage.SANITY_CHECKING)
            rng.restore(trainer.strategy, generators)
        restore_generators(trainer, run)
        self._last_validation = time.monotonic()
        hooks.call("on_train_start")
        with preemption.watching(trainer, run.progress) as self._preemption:
            while not self.done():
                self.run_epoch()
        info_lines.fit_stopped(self.settings, run.progress.epoch, run.progress.global_step)
        hooks.call("on_train_end")
        hooks.call("on_fit_end")

    def _sanity_steps(self) -> int:
        if self.val_check_batch is None:
            return 0
        return self.settings.num_sanity_val_steps

    def run_epoch(self) -> None:
        run = self.run_state
        progress = run.progress
        hooks = run.hooks
        results = run.train_results
        assert hooks is not None and results is not None
        # The modules stay in the modes the user chose (a frozen submodule in eval mode stays there), as
        # in Lightning; evaluation puts every submodule back in its mode when it ends.
        run.module._results = results
        resuming = progress.batches_done > 0 or progress.validation_pending or progress.epoch_finished
        if resuming:
            progress.begin_epoch(hook_runs=False)
        if not progress.epoch_finished:
            if not resuming:
                if progress.epoch and run.data.reload_if_due(RunningStage.TRAINING, progress.epoch):
                    self.num_batches = run.data.num_training_batches
                    self.val_check_batch = self._val_check_batch()
                results.reset()
                results.batch_level = False
                progress.begin_epoch(hook_runs=True)
                hooks.call("on_train_epoch_start")
                progress.epoch_started = True
                # Lightning's total of validation batches inside fit starts again with each epoch's batches.
                run.evaluation_counts.forget("fit_validation", latest=False)
            results.batch_level = True
            profiler = run.features.profiler
            with profiler.profile("run_training_epoch") if profiler is not None else nullcontext():
                self._run_batches(self._epoch_iterator())
            results.batch_level = False
            progress.is_last_batch = False
            progress.epoch_ending = True
            if not resuming and progress.batches_done == 0 and _yields_nothing(run.data.train_loader):
                # An unsized loader that yields nothing: every epoch would be empty, forever.
                raise ValueError(
                    f"The training loader produced no batch in epoch {progress.epoch}, so fit() cannot make "
                    f"progress. Check the dataset (an iterable dataset may be exhausted, or shard to nothing "
                    f"on this process)."
                )
            if (
                math.isinf(self.num_batches)
                and self.val_check_batch == math.inf
                and self._val_seconds is None
            ):
                every_n = self.settings.check_val_every_n_epoch or 1
                progress.validation_pending = (progress.epoch + 1) % every_n == 0
            results.reduce_epoch()
            if progress.validation_pending:
                self._validate()
            progress.epoch_finished = True
            hooks.call("on_train_epoch_end")
            # Lightning logs the epoch's row one below the steps taken (at the last batch's x-axis).
            stepped = batches_that_stepped(
                progress.global_step, progress.total_batches, run.optimization.manual
            )
            run.metrics.log(results.epoch_metrics(logger_only=True), step=max(stepped - 1, 0))
        # A checkpoint taken in on_train_epoch_end resumes here: the epoch's work is done, but for the
        # schedulers that step on a logged value (they step after on_train_epoch_end, as in Lightning).
        if progress.epoch_completed:
            self._step_epoch_schedulers(plateau=True)
        run.metrics.persist(results)
        results.end_epoch()
        progress.end_epoch()

    def _step_epoch_schedulers(self, plateau: bool) -> None:
        """The epoch-interval schedulers (those on a logged value, or the others), in automatic optimisation."""
        run = self.run_state
        if not run.module.automatic_optimization:  # manual optimisation steps its schedulers itself
            return
        configs = [
            c for c in run.scheduler_configs if c.interval == "epoch" and c.reduce_on_plateau == plateau
        ]
        if configs:
            step_schedulers(
                configs,
                "epoch",
                run.progress.epoch + 1,
                self.trainer.callback_metrics,
                run.optimization.scheduler_step,
            )

    def _end_of_data(self) -> None:
        """The epoch's data ran out: its schedulers step now, right after the last optimizer step (Lightning's place)."""
        self.run_state.progress.epoch_completed = True
        self._step_epoch_schedulers(plateau=False)

    def _epoch_iterator(self) -> Iterator[Any]:
        loader = self.run_state.data.train_loader
        # The order depends only on (seed, epoch); a resumed epoch starts where the checkpoint's
        # position put the loader (restored with the checkpoint), without loading the batches before.
        loader.set_epoch(self.run_state.progress.epoch)
        iterator = iter(loader)
        if math.isinf(self.num_batches):
            return self._flag_last(iterator)
        return iterator

    def _flag_last(self, iterator: Iterator[Any]) -> Iterator[Any]:
        """Look one batch ahead so an unsized loader's last batch is known as such while it is trained on.

        It closes its accumulation window and is ``trainer.is_last_batch`` (sized loaders need no look-ahead).
        """
        self._last_flag = False
        try:
            current = next(iterator)
        except StopIteration:
            return
        for upcoming in iterator:
            yield current
            current = upcoming
        self._last_flag = True
        yield current

    def _run_batches(self, iterator: Iterator[Any]) -> None:
        trainer, run = self.trainer, self.run_state
        settings = self.settings
        progress = run.progress
        hooks = run.hooks
        results = run.train_results
        assert hooks is not None and results is not None
        metrics = run.metrics
        optimization = run.optimization
        profiler = run.features.profiler
        step = timed(profiler, "run_training_batch", optimization.step)
        limit = self.num_batches
        max_steps = settings.max_steps if settings.max_steps != -1 else math.inf
        log_every = settings.log_every_n_steps
        logging = bool(metrics.loggers) and metrics.is_global_zero
        val_check = self.val_check_batch
        time_limited = self._deadline is not None
        watch = self._preemption
        batch_idx = progress.batches_done
        cut = limit_below_length(run.data.train_loader, limit)
        optimization.start_epoch(batch_idx)
        manual = optimization.manual
        metrics.batch_step = None
        for batch in timed_batches(profiler, "train_dataloader_next", iterator):
            if batch_idx >= limit:
                break
            results.mark += 1
            results.batch = batch
            # The data's last batch closes an accumulation window early (the step policy's rule).
            last = progress.is_last_batch = batch_idx + 1 == limit or self._last_flag
            if hooks.on_train_batch_start is not None and hooks.on_train_batch_start(batch, batch_idx) == -1:
                self._end_of_data()  # the module ended the epoch here: it counts as the epoch's end
                break
            steps_before = progress.global_step
            if logging:
                metrics.batch_step = batches_that_stepped(steps_before, progress.total_batches, manual)
            try:  # free unless it raises (Python 3.11+)
                outputs = step(batch, batch_idx, last)
            except (TypeError, AttributeError) as error:
                if batch is not None:
                    raise
                raise TypeError(
                    f"The training batch {batch_idx} is None, and training_step failed on it ({type(error).__name__}: "
                    f"{error}). The DataLoader's collate_fn returned None: make it return the batch (a function "
                    f"without `return` returns None), or return None from training_step for a None batch to skip it."
                ) from error
            if last:
                self._end_of_data()
            batch_idx += 1
            progress.batches_done = batch_idx
            progress.total_batches += 1
            val_due = val_check is not None and self._val_due(batch_idx)
            if val_due:
                progress.validation_pending = True
            if hooks.on_train_batch_end is not None:
                hooks.on_train_batch_end(optimization.batch_outputs(outputs), batch, batch_idx - 1)
            stepped = manual or progress.global_step != steps_before
            if logging and (at := metrics.step_row_at(stepped, log_every, trainer.should_stop)) is not None:
                step_metrics = results.step_metrics()
                if step_metrics:
                    step_metrics["epoch"] = progress.epoch
                    metrics.log(step_metrics, step=at)
            if watch.pending and watch.stop_here():  # a stop signal reached some rank
                preemption.stop(trainer, watch)
            if val_due and batch_idx < limit:
                self._validate()
                results.batch_level = True
                run.module._results = results
            if progress.global_step >= max_steps or (run.should_stop and self._stop_requested()):
                break
            if time_limited and self._out_of_time():
                break
            if batch_idx == cut:
                break  # without reading (and placing) a batch beyond the limit

    def _validate(self) -> None:
        """Validation inside fit, when it is due."""
        run = self.run_state
        progress = run.progress
        progress.validation_pending = False
        progress.validations_run += 1
        run.data.reload_if_due(RunningStage.VALIDATING, progress.epoch)
        run_evaluation(self.trainer, run, RunningStage.VALIDATING)
        self._last_validation = time.monotonic()
        run.module._results = run.train_results
        run.state.stage = RunningStage.TRAINING


def _yields_nothing(loader: Any) -> bool:
    """Whether a fresh pass over ``loader`` ends at once (asked only after an epoch with no batch)."""
    end = object()
    return next(iter(loader), end) is end
