"""What the Trainer is doing: the entry point running, its status, the stage, and loop progress."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields
from enum import Enum
from typing import Any

from drivetrain._utilities.snapshots import Restorable


class TrainerFn(str, Enum):
    """The user-facing entry point being run."""

    FITTING = "fit"
    VALIDATING = "validate"
    TESTING = "test"
    PREDICTING = "predict"


class TrainerStatus(str, Enum):
    """Where the current (or last) entry point stands."""

    INITIALIZING = "initializing"
    RUNNING = "running"
    FINISHED = "finished"
    INTERRUPTED = "interrupted"


class RunningStage(str, Enum):
    """The loop being run right now (fitting alternates between training and validating)."""

    TRAINING = "train"
    SANITY_CHECKING = "sanity_check"
    VALIDATING = "validate"
    TESTING = "test"
    PREDICTING = "predict"

    @property
    def evaluating(self) -> bool:
        """Whether the stage evaluates (validation, its sanity check, or test), as Lightning's does."""
        return self in (RunningStage.VALIDATING, RunningStage.SANITY_CHECKING, RunningStage.TESTING)

    @property
    def dataloader_prefix(self) -> str:
        """The ``<prefix>_dataloader`` method that feeds this stage."""
        return "val" if self in (RunningStage.VALIDATING, RunningStage.SANITY_CHECKING) else self.value


@dataclass
class TrainerState(Restorable):
    """``trainer.state``: the entry point (``fn``), its ``status`` and the running ``stage``."""

    fn: TrainerFn | None = None
    status: TrainerStatus = TrainerStatus.INITIALIZING
    stage: RunningStage | None = None

    @property
    def finished(self) -> bool:
        return self.status == TrainerStatus.FINISHED

    @property
    def interrupted(self) -> bool:
        return self.status == TrainerStatus.INTERRUPTED


@dataclass
class FitProgress(Restorable):
    """How far fitting has come: everything a checkpoint needs to continue from the next batch.

    ``batches_done`` counts the batches of ``epoch`` already trained on (a resumed run continues
    with the next one; the order is the training loader's, which depends only on the seed and the
    epoch); ``validation_pending`` says a validation was due after the last finished batch and has
    not run yet; ``validations_run`` counts the validations of this fit.

    ``epoch_completed`` says the epoch's data ran out (its last batch was trained on, or
    ``on_train_batch_start`` returned ``-1``), as opposed to a fit stopped inside it (``max_steps``,
    ``should_stop``): only then do its epoch-interval schedulers step.

    ``is_last_batch``, ``epoch_ending``, ``epoch_begun``/``epoch_started`` (set before and after
    ``on_train_epoch_start``), ``epoch_start_step`` (the optimizer steps taken before the epoch) and
    the ``previous_epoch_*`` counts describe the moment, not the position, and are not saved; the
    loop sets them once per batch or once per epoch. The Trainer owns this object; others read it through :class:`FitProgressView`
    (and Lightning's counters through :mod:`drivetrain.trainer.loop_views`).
    """

    epoch: int = 0
    global_step: int = 0
    batches_done: int = 0
    total_batches: int = 0
    validation_pending: bool = False
    epoch_finished: bool = False
    epoch_completed: bool = False
    validations_run: int = 0
    is_last_batch: bool = False
    epoch_ending: bool = False
    epoch_begun: bool = False
    epoch_started: bool = False
    epoch_start_step: int = 0
    previous_epoch_batches: int = 0
    previous_epoch_steps: int = 0

    def begin_epoch(self, hook_runs: bool) -> None:
        """The epoch is about to run: ``on_train_epoch_start`` runs next, unless a resumed epoch skips it."""
        self.epoch_begun = True
        self.epoch_started = not hook_runs
        self.epoch_start_step = self.global_step

    def end_epoch(self) -> None:
        """The epoch is done: the next one starts from its first batch."""
        self.previous_epoch_batches = self.batches_done
        self.previous_epoch_steps = self.global_step - self.epoch_start_step
        self.epoch += 1
        self.batches_done = 0
        self.epoch_finished = False
        self.epoch_completed = False
        self.epoch_ending = False
        self.epoch_begun = False
        self.epoch_started = False

    def state_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in _MOMENTARY}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name, value in state.items():
            if hasattr(self, name) and name not in _MOMENTARY:
                setattr(self, name, value)


_MOMENTARY = (
    "is_last_batch",
    "epoch_ending",
    "epoch_begun",
    "epoch_started",
    "epoch_start_step",
    "previous_epoch_batches",
    "previous_epoch_steps",
)


@dataclass
class EvaluationCounts(Restorable):
    """Batches each evaluation or prediction loop of a Trainer has run, in this process.

    What the Lightning-shaped loop views (``trainer.validate_loop.batch_progress`` …) show, keyed by
    loop: ``"fit_validation"`` (validation inside fit, its sanity check included), ``"validate"``,
    ``"test"``, ``"predict"``. Recorded when a run starts and ends, never per batch: while a loop
    runs, ``running_count`` reads the count the loop keeps anyway.
    """

    totals: dict[str, int] = field(default_factory=dict)
    latest: dict[str, int] = field(default_factory=dict)
    running: str | None = None
    running_count: Callable[[], int] | None = None

    def begin(self, loop: str, count: Callable[[], int]) -> None:
        self.running, self.running_count = loop, count

    def end(self) -> None:
        if self.running is not None and self.running_count is not None:
            done = self.running_count()
            self.latest[self.running] = done
            self.totals[self.running] = self.totals.get(self.running, 0) + done
        self.running = self.running_count = None

    def forget(self, loop: str, latest: bool = True) -> None:
        """Start ``loop``'s total again, and its latest run's count unless ``latest=False`` (Lightning
        starts fit's validation total again every epoch, and both after the sanity check)."""
        self.totals.pop(loop, None)
        if latest:
            self.latest.pop(loop, None)

    def current(self, loop: str) -> int:
        """Batches of ``loop``'s running (or latest) run."""
        if self.running == loop and self.running_count is not None:
            return self.running_count()
        return self.latest.get(loop, 0)

    def total(self, loop: str) -> int:
        """Batches of all of ``loop``'s runs (since its count last started again)."""
        running = self.running_count() if self.running == loop and self.running_count is not None else 0
        return self.totals.get(loop, 0) + running


class FitProgressView:
    """``trainer.fit_progress``: where the current (or last) fit stands, read-only.

    What the built-in callbacks read to decide when to act; a callback of your own reads the same.
    Every value refers to this process (the processes of a run agree on all of them).
    """

    __slots__ = ("_run",)

    def __init__(self, run: Any) -> None:
        self._run = run  # the Trainer's run state: each fit starts a new FitProgress

    @property
    def _progress(self) -> FitProgress:
        progress: FitProgress = self._run.progress
        return progress

    @property
    def epoch(self) -> int:
        """The epoch being trained (0-based; ``trainer.current_epoch``)."""
        return self._progress.epoch

    @property
    def global_step(self) -> int:
        """Optimizer steps taken so far (``trainer.global_step``)."""
        return self._progress.global_step

    @property
    def batches_done(self) -> int:
        """Training batches of the current epoch finished so far (inside ``on_train_batch_end``: including this one)."""
        return self._progress.batches_done

    @property
    def total_batches_done(self) -> int:
        """Training batches finished in this fit, over all epochs (counted once per process)."""
        return self._progress.total_batches

    @property
    def is_last_batch(self) -> bool:
        """Whether the batch being trained on is the epoch's last one (``trainer.is_last_batch``)."""
        return self._progress.is_last_batch

    @property
    def epoch_ending(self) -> bool:
        """Whether the epoch's batches are done: what runs now (its closing validation,
        ``on_train_epoch_end``) ends the epoch. ``False`` during a validation in the middle of an epoch."""
        return self._progress.epoch_ending or self._progress.epoch_finished

    @property
    def validations_run(self) -> int:
        """Validation runs of this fit so far, not counting the sanity check (the one running included)."""
        return self._progress.validations_run

    def __repr__(self) -> str:
        names = (
            "epoch",
            "global_step",
            "batches_done",
            "total_batches_done",
            "is_last_batch",
            "epoch_ending",
        )
        return f"FitProgressView({', '.join(f'{n}={getattr(self, n)!r}' for n in names)})"
