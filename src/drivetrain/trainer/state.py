"""What the Trainer is doing: the entry point running, its status, the stage, and loop progress."""

from __future__ import annotations

from dataclasses import dataclass, fields
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

    ``is_last_batch`` and ``epoch_ending`` describe the moment, not the position, and are not saved.
    The Trainer owns this object; others read it through :class:`FitProgressView`.
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

    def state_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in _MOMENTARY}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name, value in state.items():
            if hasattr(self, name) and name not in _MOMENTARY:
                setattr(self, name, value)


_MOMENTARY = ("is_last_batch", "epoch_ending")


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
