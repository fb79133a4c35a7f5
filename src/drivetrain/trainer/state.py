"""What the Trainer is doing: the entry point running, its status, the stage, and loop progress."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from enum import Enum
from typing import Any


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
class TrainerState:
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
class FitProgress:
    """How far fitting has come: everything a checkpoint needs to continue from the next batch.

    ``batches_done`` counts the batches of ``epoch`` already trained on; ``epoch_rng`` holds the
    random generators as they were when the epoch's data iterator was created, so a resumed run
    recreates the same shuffled order; ``validation_pending`` says a validation was due after the
    last finished batch and has not run yet.
    """

    epoch: int = 0
    global_step: int = 0
    batches_done: int = 0
    total_batches: int = 0
    epoch_rng: dict[str, Any] | None = None
    validation_pending: bool = False
    epoch_finished: bool = False

    def state_dict(self) -> dict[str, Any]:
        return asdict(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name, value in state.items():
            if hasattr(self, name):
                setattr(self, name, value)
