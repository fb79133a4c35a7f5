"""``EarlyStopping``: stop fitting when a monitored metric stops improving.

Every rank takes the same decision: the monitored value is rank 0's, so a metric logged
without ``sync_dist`` cannot make the ranks disagree (and hang). Checks follow validation, as
in Lightning: when validation runs once per epoch at its end, in ``on_train_epoch_end`` (so
values the module logs there count); when it runs several times per epoch or every few
epochs, right after each validation. Without validation, every epoch end is checked.
"""

from __future__ import annotations

import math
import warnings
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from drivetrain._utilities.log import get_logger
from drivetrain.trainer.callbacks.callback import Callback

_log = get_logger(__name__)

if TYPE_CHECKING:
    from drivetrain.trainer.module import TrainingModule
    from drivetrain.trainer.trainer import Trainer


class EarlyStopping(Callback):
    """Stop when ``monitor`` has not improved by ``min_delta`` for ``patience`` checks.

    Args:
        monitor: the logged metric to watch.
        min_delta: the smallest change that counts as an improvement.
        patience: checks without improvement before stopping.
        verbose: report when the metric improves or training stops (an INFO message of the
            ``drivetrain`` logger, from rank 0).
        mode: ``"min"`` or ``"max"``.
        strict: a missing metric is an error (else a warning, and the check is skipped).
        check_finite: stop when the metric becomes NaN or infinite.
        stopping_threshold: stop as soon as the metric is better than this.
        divergence_threshold: stop as soon as the metric is worse than this.
        check_on_train_epoch_end: ``True``: check at every training epoch end; ``False``: after every
            validation; ``None`` (default): as described in the module docstring.
    """

    def __init__(
        self,
        monitor: str,
        min_delta: float = 0.0,
        patience: int = 3,
        verbose: bool = False,
        mode: str = "min",
        strict: bool = True,
        check_finite: bool = True,
        stopping_threshold: float | None = None,
        divergence_threshold: float | None = None,
        check_on_train_epoch_end: bool | None = None,
    ) -> None:
        if mode not in ("min", "max"):
            raise ValueError(f"EarlyStopping(mode={mode!r}); use 'min' or 'max'.")
        if isinstance(patience, bool) or not isinstance(patience, int) or patience < 0:
            raise ValueError(f"EarlyStopping(patience={patience!r}); use an int >= 0.")
        if min_delta < 0:
            raise ValueError(
                f"EarlyStopping(min_delta={min_delta}); use a value >= 0 (mode sets the direction)."
            )
        self.monitor = monitor
        self.min_delta = float(min_delta)
        self.patience = patience
        self.verbose = verbose
        self.mode = mode
        self.strict = strict
        self.check_finite = check_finite
        self.stopping_threshold = stopping_threshold
        self.divergence_threshold = divergence_threshold
        self.check_on_train_epoch_end = check_on_train_epoch_end
        self.wait_count = 0
        self.stopped_epoch = 0
        # A 0-d tensor, as in Lightning (``best_score.item()`` in ported scripts).
        self.best_score: Tensor = _tensor(math.inf if mode == "min" else -math.inf)
        self.stopping_reason = ""
        self._validated = False

    @property
    def state_key(self) -> str:
        return self.generate_state_key(monitor=self.monitor, mode=self.mode)

    # -- when to check ----------------------------------------------------------------------
    def on_validation_end(self, trainer: Trainer, pl_module: TrainingModule) -> None:
        if trainer.sanity_checking or trainer.state.fn is None or trainer.state.fn.value != "fit":
            return
        if self.check_on_train_epoch_end:
            return
        mid_epoch = not trainer.fit_progress.epoch_ending
        # Unset, Lightning's rule: wait for the epoch's end only when validation runs exactly once
        # per epoch, at its end. With several validations per epoch each one is checked when it
        # ends, the epoch's last too (deferring it left state a checkpoint taken right after this
        # validation recorded, and a run resumed from it had no metric to check at the epoch end).
        once_per_epoch = (
            isinstance(trainer.val_check_interval, float)
            and trainer.val_check_interval == 1.0
            and trainer.check_val_every_n_epoch == 1
        )
        if mid_epoch or self.check_on_train_epoch_end is False or not once_per_epoch:
            self._check(trainer)
        else:
            self._validated = True

    def on_train_epoch_end(self, trainer: Trainer, pl_module: TrainingModule) -> None:
        if self.check_on_train_epoch_end is False:
            return
        if self.check_on_train_epoch_end or not sum(trainer.num_val_batches) or self._validated:
            self._validated = False
            self._check(trainer)

    # -- the check --------------------------------------------------------------------------
    def _improved(self, current: float, reference: float) -> bool:
        if self.mode == "min":
            return current < reference - self.min_delta
        return current > reference + self.min_delta

    def _check(self, trainer: Trainer) -> None:
        if trainer.fast_dev_run:
            return
        metrics = trainer.callback_metrics
        value: Any = metrics.get(self.monitor)
        if value is None:
            message = (
                f"EarlyStopping(monitor={self.monitor!r}) found no logged metric {self.monitor!r} (logged: "
                f"{', '.join(sorted(metrics)) or 'nothing'}). Log it with self.log({self.monitor!r}, value), or fix the name."
            )
            if self.strict:
                raise ValueError(message)
            if trainer.is_global_zero:
                warnings.warn(message, UserWarning, stacklevel=2)
            return
        current = float(value)
        if trainer.world_size > 1:
            current = float(trainer.strategy.broadcast(current))
        stop, reason = self._decide(current)
        if stop:
            trainer.should_stop = True
            self.stopped_epoch = trainer.current_epoch
            self.stopping_reason = reason
        if self.verbose and reason:
            _log.info(reason)

    def _decide(self, current: float) -> tuple[bool, str]:
        name = self.monitor
        if self.check_finite and not math.isfinite(current):
            return (
                True,
                f"{name}={current} is not finite; stopping (best so far {float(self.best_score):.6g}).",
            )
        threshold = self.stopping_threshold
        if threshold is not None and (current < threshold if self.mode == "min" else current > threshold):
            return (
                True,
                f"{name}={current:.6g} passed stopping_threshold={self.stopping_threshold}; stopping.",
            )
        if self.divergence_threshold is not None and (
            current > self.divergence_threshold if self.mode == "min" else current < self.divergence_threshold
        ):
            return (
                True,
                f"{name}={current:.6g} is beyond divergence_threshold={self.divergence_threshold}; stopping.",
            )
        if self._improved(current, float(self.best_score)):
            previous = float(self.best_score)
            self.best_score = _tensor(current)
            self.wait_count = 0
            return False, f"{name} improved from {previous:.6g} to {current:.6g}."
        self.wait_count += 1
        if self.wait_count >= self.patience:
            return True, (
                f"{name} did not improve by more than {self.min_delta} in the last {self.wait_count} checks "
                f"(best {float(self.best_score):.6g}); stopping."
            )
        return False, ""

    # -- state -----------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "wait_count": self.wait_count,
            "stopped_epoch": self.stopped_epoch,
            "best_score": self.best_score,
            "patience": self.patience,
            "validated": self._validated,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.wait_count = state_dict["wait_count"]
        self.stopped_epoch = state_dict["stopped_epoch"]
        self.best_score = _tensor(state_dict["best_score"])
        self.patience = state_dict.get("patience", self.patience)
        self._validated = state_dict.get("validated", False)


def _tensor(value: float | Tensor) -> Tensor:
    """A score as Lightning keeps it: a 0-d tensor (float64 here, so no float32 rounding of a Python float)."""
    if isinstance(value, Tensor):
        return value.detach().cpu()
    return torch.tensor(float(value), dtype=torch.float64)
