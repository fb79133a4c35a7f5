"""Lightning-shaped, read-only views of the loops: ``trainer.fit_loop``, ``validate_loop``, ``test_loop``.

Lightning keeps a run's progress in counter objects that its loops update around every batch
(``fit_loop.epoch_progress``, ``fit_loop.epoch_loop.batch_progress`` …), and callbacks written for
Lightning read them. drivetrain keeps one record of a run, the run state
(:class:`~drivetrain.trainer.run_state.RunState`); these views compute Lightning's counters from it
when they are read, so they cost nothing while the loops run, and nothing can change the loop
through them. ``trainer.fit_progress`` (``docs/trainer-state.md``) says the same in drivetrain's words.

Each counter is a :class:`Counts` of Lightning's four moments: ``ready``, ``started``,
``processed`` and ``completed``. The epoch counts match Lightning's at every hook. A training
batch counts at all four moments once its step is done, since the loop records nothing more per
batch: inside ``on_train_batch_start`` Lightning already counts it as ready (``batch_idx``), and
inside ``on_train_batch_end`` (and a validation after it) Lightning does not yet count it as
completed, nor in its logging step ``_batches_that_stepped``. Evaluation and prediction batches
count from the moment they begin.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from drivetrain.trainer.logger_connector import batches_that_stepped
from drivetrain.trainer.state import RunningStage

if TYPE_CHECKING:
    from drivetrain.trainer.run_state import RunState


class _ReadOnly:
    """A view: every attribute is computed from the run state when read, and none can be set."""

    __slots__ = ()

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(
            f"{type(self).__name__}.{name} cannot be set: Lightning's loop objects are read-only views of the "
            f"Trainer's run here. Limits are Trainer arguments (Trainer(max_epochs=..., max_steps=...)); stop a fit "
            f"with trainer.should_stop = True."
        )


class Counts(_ReadOnly):
    """How many events are ready, started, processed and completed (Lightning's trackers)."""

    __slots__ = ("completed", "processed", "ready", "started")
    ready: int
    started: int
    processed: int
    completed: int

    def __init__(self, ready: int, started: int, processed: int, completed: int) -> None:
        for name, value in (
            ("ready", ready),
            ("started", started),
            ("processed", processed),
            ("completed", completed),
        ):
            object.__setattr__(self, name, value)

    @classmethod
    def all(cls, count: int) -> Counts:
        return cls(count, count, count, count)

    def state_dict(self) -> dict[str, int]:
        return {
            "ready": self.ready,
            "started": self.started,
            "processed": self.processed,
            "completed": self.completed,
        }

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Counts) and self.state_dict() == other.state_dict()

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Counts({', '.join(f'{k}={v}' for k, v in self.state_dict().items())})"


class Progress(_ReadOnly):
    """Counts over the whole run (``total``) and over the current epoch or run (``current``)."""

    __slots__ = ("current", "is_last_batch", "total")
    total: Counts
    current: Counts
    is_last_batch: bool

    def __init__(self, total: Counts, current: Counts, is_last_batch: bool = False) -> None:
        object.__setattr__(self, "total", total)
        object.__setattr__(self, "current", current)
        object.__setattr__(self, "is_last_batch", is_last_batch)

    def state_dict(self) -> dict[str, Any]:
        return {
            "total": self.total.state_dict(),
            "current": self.current.state_dict(),
            "is_last_batch": self.is_last_batch,
        }

    def __repr__(self) -> str:
        return f"Progress(total={self.total!r}, current={self.current!r}, is_last_batch={self.is_last_batch})"


class _View(_ReadOnly):
    __slots__ = ("_run",)
    _run: RunState

    def __init__(self, run: RunState) -> None:
        object.__setattr__(self, "_run", run)


class FitLoopView(_View):
    """``trainer.fit_loop``: Lightning's fit loop, read from the run state (read-only)."""

    __slots__ = ()

    @property
    def max_epochs(self) -> int:
        return self._run.settings.max_epochs

    @property
    def min_epochs(self) -> int:
        return self._run.settings.min_epochs

    @property
    def max_steps(self) -> int:
        return self._run.settings.max_steps

    @property
    def min_steps(self) -> int:
        return self._run.settings.min_steps

    @property
    def max_batches(self) -> int | float:
        """Training batches per epoch in this process (``trainer.num_training_batches``; ``inf`` when unsized)."""
        batches = self._run.data.num_training_batches
        return batches if math.isinf(batches) else int(batches)

    @property
    def epoch_progress(self) -> Progress:
        """Epochs: ``ready`` before ``on_train_epoch_start``, ``started`` after it, ``processed`` when the
        epoch's batches (and its closing validation) are done, ``completed`` after ``on_train_epoch_end``.
        ``current.completed`` is ``trainer.current_epoch``."""
        progress = self._run.progress
        done = progress.epoch
        begun = progress.epoch_begun
        counts = Counts(
            ready=done + begun,
            started=done + (begun and progress.epoch_started),
            processed=done + progress.epoch_finished,
            completed=done,
        )
        return Progress(total=counts, current=counts)

    @property
    def epoch_loop(self) -> TrainingEpochLoopView:
        return TrainingEpochLoopView(self._run)

    @property
    def total_batch_idx(self) -> int:
        """The index of the latest training batch over all epochs of this fit (-1 before the first)."""
        return self.epoch_loop.total_batch_idx

    @property
    def batch_idx(self) -> int:
        """The index of the latest training batch in its epoch (-1 before the first)."""
        return self.epoch_loop.batch_idx

    def __repr__(self) -> str:
        return f"FitLoopView(epoch_progress={self.epoch_progress!r})"


class TrainingEpochLoopView(_View):
    """``trainer.fit_loop.epoch_loop``: one epoch's batches, optimizer steps and validation (read-only)."""

    __slots__ = ()

    @property
    def batch_progress(self) -> Progress:
        """Training batches: ``current`` in this epoch, ``total`` in this fit (see the module docstring)."""
        run = self._run
        progress = run.progress
        if progress.epoch_started:
            current, finished = progress.batches_done, progress.epoch_ending or progress.epoch_finished
        else:  # as in Lightning, the previous epoch's count until the next epoch's batches start
            current, finished = progress.previous_epoch_batches, progress.previous_epoch_batches > 0
        batches = run.data.num_training_batches
        last = progress.is_last_batch or (finished and (math.isinf(batches) or current >= batches))
        return Progress(
            total=Counts.all(progress.total_batches), current=Counts.all(current), is_last_batch=last
        )

    @property
    def _batches_that_stepped(self) -> int:
        """Lightning's logging step: training batches that stepped the optimizers (each counts once)."""
        progress = self._run.progress
        return batches_that_stepped(progress.global_step, progress.total_batches, self._manual)

    @property
    def _manual(self) -> bool:
        module = self._run.module
        return module is not None and not module.automatic_optimization

    @property
    def global_step(self) -> int:
        return self._run.progress.global_step

    @property
    def max_steps(self) -> int:
        return self._run.settings.max_steps

    @property
    def min_steps(self) -> int:
        return self._run.settings.min_steps

    @property
    def total_batch_idx(self) -> int:
        return self.batch_progress.total.ready - 1

    @property
    def batch_idx(self) -> int:
        return self.batch_progress.current.ready - 1

    @property
    def automatic_optimization(self) -> OptimizationView:
        """``optim_progress``: the optimizer steps of automatic optimisation (zero with manual optimisation)."""
        return OptimizationView(self._run, automatic=True)

    @property
    def manual_optimization(self) -> OptimizationView:
        """``optim_step_progress``: the optimizer steps of manual optimisation (zero with automatic optimisation)."""
        return OptimizationView(self._run, automatic=False)

    @property
    def val_loop(self) -> EvaluationLoopView:
        """The validation inside fit (its counts start again every epoch, as in Lightning)."""
        return EvaluationLoopView(self._run, "fit_validation")

    def __repr__(self) -> str:
        return f"TrainingEpochLoopView(batch_progress={self.batch_progress!r})"


class OptimizationView(_View):
    """The optimizer steps of one kind of optimisation; Lightning's ``optim_progress``/``optim_step_progress``."""

    __slots__ = ("_automatic",)
    _automatic: bool

    def __init__(self, run: RunState, automatic: bool) -> None:
        super().__init__(run)
        object.__setattr__(self, "_automatic", automatic)

    def _steps(self) -> Progress:
        run = self._run
        module = run.module
        mine = module is None or module.automatic_optimization == self._automatic
        progress = run.progress
        if not mine:
            return Progress(total=Counts.all(0), current=Counts.all(0))
        if progress.epoch_started:
            current = progress.global_step - progress.epoch_start_step
        else:  # the previous epoch's, as for the batches
            current = progress.previous_epoch_steps
        return Progress(total=Counts.all(progress.global_step), current=Counts.all(current))

    @property
    def optim_progress(self) -> OptimizationView:
        return self

    @property
    def optim_step_progress(self) -> Progress:
        return self._steps()

    @property
    def optimizer(self) -> OptimizationView:
        return self

    @property
    def step(self) -> Progress:
        return self._steps()

    @property
    def zero_grad(self) -> Progress:
        """Gradient resets: one per optimizer step."""
        return self._steps()

    @property
    def optimizer_steps(self) -> int:
        return self._steps().total.completed


class EvaluationLoopView(_View):
    """``trainer.validate_loop``, ``trainer.test_loop`` and ``fit_loop.epoch_loop.val_loop`` (read-only)."""

    __slots__ = ("_loop",)
    _loop: str

    def __init__(self, run: RunState, loop: str) -> None:
        super().__init__(run)
        object.__setattr__(self, "_loop", loop)

    @property
    def batch_progress(self) -> Progress:
        """Batches over every loader: ``current`` in the running (or latest) run, ``total`` over the runs."""
        return evaluation_progress(self._run, self._loop)

    @property
    def max_batches(self) -> list[int | float]:
        """Batches per loader this process runs, after the ``limit_*`` setting."""
        stage = RunningStage.TESTING if self._loop == "test" else RunningStage.VALIDATING
        lengths = self._run.data.eval_loaders(stage)[1]
        return [length if math.isinf(length) else int(length) for length in lengths]

    @property
    def num_dataloaders(self) -> int:
        return len(self.max_batches)

    @property
    def _has_run(self) -> bool:
        return self._loop in self._run.evaluation_counts.latest

    def __repr__(self) -> str:
        return f"EvaluationLoopView({self._loop!r}, batch_progress={self.batch_progress!r})"


def evaluation_progress(run: RunState, loop: str) -> Progress:
    """An evaluation or prediction loop's batch counters (see :class:`~drivetrain.trainer.state.EvaluationCounts`)."""
    counts = run.evaluation_counts
    running = counts.running == loop
    return Progress(
        total=Counts.all(counts.total(loop)),
        current=Counts.all(counts.current(loop)),
        is_last_batch=not running and loop in counts.latest,
    )
