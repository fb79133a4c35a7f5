"""``Timer``: how long each stage ran, and a time limit for training that survives a resume.

The clock is ``time.monotonic``. Training time is counted from ``on_train_start``; a checkpoint
keeps it, so a resumed fit continues with the time that was left. The limit is checked after
every training batch (``interval="step"``) or every epoch, and reached means
``trainer.should_stop``: fitting ends at the next batch boundary (after ``min_epochs``), as
for any stop request.
"""

from __future__ import annotations

import datetime
import time
from typing import TYPE_CHECKING, Any

from drivetrain._utilities.log import get_logger
from drivetrain.trainer.callbacks.callback import Callback
from drivetrain.trainer.config import parse_max_time
from drivetrain.trainer.state import RunningStage

if TYPE_CHECKING:
    from drivetrain.trainer.module import TrainingModule
    from drivetrain.trainer.trainer import Trainer

_log = get_logger(__name__)
_STAGES = tuple(stage.value for stage in RunningStage)


class Timer(Callback):
    """Measure the time of each stage and stop training after ``duration``.

    Args:
        duration: the time limit for training: ``"DD:HH:MM:SS"``, a ``datetime.timedelta``, or a dict of
            ``timedelta`` keywords (``{"hours": 2}``). ``None`` measures without a limit.
        interval: check the limit after every training batch (``"step"``) or every epoch (``"epoch"``).
        verbose: log a message when the limit stops training.

    Example:
        >>> from drivetrain.trainer.callbacks import Timer
        >>> timer = Timer(duration="00:12:00:00")  # stop after 12 hours of training
        >>> trainer = Trainer(callbacks=[timer])  # doctest: +SKIP
        >>> trainer.fit(model)  # doctest: +SKIP
        >>> timer.time_elapsed("train"), timer.time_elapsed("validate")  # doctest: +SKIP
    """

    def __init__(
        self,
        duration: str | datetime.timedelta | dict[str, int] | None = None,
        interval: str = "step",
        verbose: bool = True,
    ) -> None:
        if interval not in ("step", "epoch"):
            raise ValueError(f"Timer(interval={interval!r}); use 'step' or 'epoch'.")
        limit = parse_max_time(duration, "Timer(duration)")
        self._duration: float | None = limit.total_seconds() if limit is not None else None
        self._interval = interval
        self._verbose = verbose
        self._start_time: dict[str, float | None] = dict.fromkeys(_STAGES)
        self._end_time: dict[str, float | None] = dict.fromkeys(_STAGES)
        self._offset = 0.0

    @property
    def duration(self) -> float | None:
        """The time limit in seconds (``None``: no limit)."""
        return self._duration

    # -- what users ask -------------------------------------------------------------------------
    def start_time(self, stage: str | RunningStage = RunningStage.TRAINING) -> float | None:
        """When ``stage`` last started (``time.monotonic()``), or ``None`` if it has not run."""
        return self._start_time[_stage(stage)]

    def end_time(self, stage: str | RunningStage = RunningStage.TRAINING) -> float | None:
        """When ``stage`` last ended (``time.monotonic()``), or ``None`` if it has not ended."""
        return self._end_time[_stage(stage)]

    def time_elapsed(self, stage: str | RunningStage = RunningStage.TRAINING) -> float:
        """Seconds ``stage`` has run (its latest run; training includes the time before a resume)."""
        name = _stage(stage)
        start, end = self._start_time[name], self._end_time[name]
        offset = self._offset if name == RunningStage.TRAINING.value else 0.0
        if start is None:
            return offset
        return (time.monotonic() if end is None else end) - start + offset

    def time_remaining(self, stage: str | RunningStage = RunningStage.TRAINING) -> float | None:
        """Seconds left before the limit (negative once past it); ``None`` without a ``duration``."""
        if self._duration is None:
            return None
        return self._duration - self.time_elapsed(stage)

    # -- checkpoints ------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"time_elapsed": {name: self.time_elapsed(name) for name in _STAGES}}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._offset = float(state_dict.get("time_elapsed", {}).get(RunningStage.TRAINING.value, 0.0))

    # -- hooks -----------------------------------------------------------------------------
    def _begin(self, trainer: Trainer) -> None:
        stage = trainer.state.stage
        if stage is not None:
            self._start_time[stage.value] = time.monotonic()
            self._end_time[stage.value] = None

    def _finish(self, trainer: Trainer) -> None:
        stage = trainer.state.stage
        if stage is not None:
            self._end_time[stage.value] = time.monotonic()

    def on_train_start(self, trainer: Trainer, pl_module: TrainingModule) -> None:
        self._start_time["train"] = time.monotonic()
        self._end_time["train"] = None
        self._check(trainer)  # a resumed fit may have no time left

    def on_train_end(self, trainer: Trainer, pl_module: TrainingModule) -> None:
        self._end_time["train"] = time.monotonic()

    def on_validation_start(self, trainer: Trainer, pl_module: TrainingModule) -> None:
        self._begin(trainer)  # also the sanity check, under its own stage name

    def on_validation_end(self, trainer: Trainer, pl_module: TrainingModule) -> None:
        self._finish(trainer)

    def on_test_start(self, trainer: Trainer, pl_module: TrainingModule) -> None:
        self._begin(trainer)

    def on_test_end(self, trainer: Trainer, pl_module: TrainingModule) -> None:
        self._finish(trainer)

    def on_predict_start(self, trainer: Trainer, pl_module: TrainingModule) -> None:
        self._begin(trainer)

    def on_predict_end(self, trainer: Trainer, pl_module: TrainingModule) -> None:
        self._finish(trainer)

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: TrainingModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self._interval == "step":
            self._check(trainer)

    def on_train_epoch_end(self, trainer: Trainer, pl_module: TrainingModule) -> None:
        if self._interval == "epoch":
            self._check(trainer)

    def _check(self, trainer: Trainer) -> None:
        if self._duration is None:
            return
        # Rank 0's clock decides, so every process stops after the same batch.
        out_of_time = bool(trainer.strategy.broadcast(self.time_elapsed() >= self._duration))
        if not out_of_time:
            return
        if self._verbose and not trainer.should_stop:
            elapsed = datetime.timedelta(seconds=round(self.time_elapsed()))
            _log.info(f"Time limit reached: trained for {elapsed}. Stopping the fit.")
        trainer.should_stop = True


def _stage(stage: str | RunningStage) -> str:
    name = stage.value if isinstance(stage, RunningStage) else stage
    if name not in _STAGES:
        raise ValueError(f"Unknown stage {stage!r}; use one of {', '.join(_STAGES)} (or a RunningStage).")
    return name
