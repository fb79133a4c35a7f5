"""``SpikeDetection``: notice a training loss far above its recent values, and warn, skip the step or stop.

The loss is compared with the mean of the last ``window`` ordinary losses (a spike does not
enter the window, so one spike does not hide the next). A loss is a spike when it is worse than
that mean by more than ``atol`` and by more than ``rtol`` times the mean (each check only when
set), or when it is not finite (``finite_only``). The check runs before the backward pass, so
``"skip"`` can drop the optimizer step the spike would have made and ``"raise"`` stops before
the weights change. Under several processes the loss is averaged over them first, so every
process decides the same.
"""

from __future__ import annotations

import json
import math
import os
from collections import deque
from typing import TYPE_CHECKING, Any

from torch import Tensor
from torch.optim import Optimizer

from drivetrain._utilities.log import get_logger
from drivetrain.trainer.callbacks.callback import Callback

if TYPE_CHECKING:
    from drivetrain.trainer.module import TrainingModule
    from drivetrain.trainer.trainer import Trainer

_log = get_logger(__name__)
_ACTIONS = ("raise", "warn", "skip")


class TrainingSpikeException(RuntimeError):
    """A loss spike stopped training (``SpikeDetection(action="raise")``, Lightning's behaviour)."""

    def __init__(self, batch_idx: int, *, epoch: int | None = None, loss: float | None = None) -> None:
        self.batch_idx = batch_idx
        self.epoch = epoch
        self.loss = loss
        where = f"batch {batch_idx}" if epoch is None else f"batch {batch_idx} of epoch {epoch}"
        value = "" if loss is None else f" (loss {loss:.6g})"
        super().__init__(f"Training spike detected in {where}{value}.")


class SpikeDetection(Callback):
    """Detect loss spikes during training.

    Args:
        mode: ``"min"`` (the loss should go down: a spike is a rise) or ``"max"``.
        window: how many recent ordinary losses the mean is taken over.
        warmup: batches seen before checks begin (at least 1: a mean needs a value).
        atol: the least absolute distance from the mean that counts as a spike (``None``: no such check).
        rtol: the least distance from the mean, as a multiple of the mean's size, that counts as a spike
            (``None``: no such check).
        exclude_batches_path: a folder where ``skip_batches.json`` lists the spiking batches' indices (written
            by global rank 0 at each spike); ``None``: ``default_root_dir``.
        finite_only: a NaN or infinite loss is a spike whatever the mean.
        action: ``"raise"`` (:class:`TrainingSpikeException`, as Lightning), ``"warn"`` (log a warning and go on)
            or ``"skip"`` (drop the gradients of the accumulation window, so the optimizer step changes nothing;
            ``global_step`` still counts it).

    Example:
        >>> from drivetrain.trainer.callbacks import SpikeDetection
        >>> detector = SpikeDetection(window=20, rtol=2.0, action="skip")
    """

    def __init__(
        self,
        mode: str = "min",
        window: int = 10,
        warmup: int = 1,
        atol: float | None = None,
        rtol: float | None = 2.0,
        exclude_batches_path: str | os.PathLike[str] | None = None,
        finite_only: bool = True,
        *,
        action: str = "raise",
    ) -> None:
        if mode not in ("min", "max"):
            raise ValueError(f"SpikeDetection(mode={mode!r}); use 'min' (a loss) or 'max'.")
        for name, value, least in (("window", window, 1), ("warmup", warmup, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"SpikeDetection({name}={value!r}); use an int >= {least}.")
        for name, tolerance in (("atol", atol), ("rtol", rtol)):
            if tolerance is not None and (isinstance(tolerance, bool) or not tolerance >= 0):
                raise ValueError(
                    f"SpikeDetection({name}={tolerance!r}); use a number >= 0, or None for no check."
                )
        if action not in _ACTIONS:
            raise ValueError(f"SpikeDetection(action={action!r}); use one of {', '.join(_ACTIONS)}.")
        self.mode = mode
        self.window = window
        self.warmup = warmup
        self.atol = atol
        self.rtol = rtol
        self.exclude_batches_path = exclude_batches_path
        self.finite_only = finite_only
        self.action = action
        self._recent: deque[float] = deque(maxlen=window)
        self._seen = 0
        self._spiked = False
        #: The spikes found in this fit: ``{"epoch", "batch_idx", "global_step", "loss"}`` each.
        self.spikes: list[dict[str, Any]] = []

    def setup(self, trainer: Trainer, pl_module: TrainingModule, stage: str) -> None:
        if stage != "fit" or self.action != "skip":
            return
        if trainer.strategy.owns_accumulation or trainer.scaler is not None:
            what = (
                f"{type(trainer.strategy).__name__}'s engine"
                if trainer.scaler is None
                else f"precision={trainer.precision!r} (a loss scaler)"
            )
            raise ValueError(
                f"SpikeDetection(action='skip') drops a step by clearing the gradients before it, which {what} "
                f"does not allow (it owns the gradients and the step). Use action='warn' or 'raise', or another "
                f"strategy/precision."
            )

    def on_train_start(self, trainer: Trainer, pl_module: TrainingModule) -> None:
        self._recent.clear()
        self._seen = 0
        self._spiked = False
        self.spikes = []

    def is_spike(self, loss: float) -> bool:
        """Whether ``loss`` is a spike against the current window (without recording it)."""
        if not math.isfinite(loss):
            return self.finite_only
        if self._seen < self.warmup or not self._recent:
            return False
        mean = sum(self._recent) / len(self._recent)
        worse = loss - mean if self.mode == "min" else mean - loss
        if worse <= 0:
            return False
        if self.atol is not None and worse <= self.atol:
            return False
        return not (self.rtol is not None and worse <= self.rtol * abs(mean))

    def on_before_backward(self, trainer: Trainer, pl_module: TrainingModule, loss: Tensor) -> None:
        if not trainer.training:
            return
        # The Trainer divides the loss by the accumulation factor before the backward pass; undo it.
        value = loss.detach() * trainer.accumulate_grad_batches
        if trainer.world_size > 1:
            value = trainer.strategy.all_reduce(value.float(), reduce_op="mean")
        number = float(value)
        self._seen += 1
        if not self.is_spike(number):
            if math.isfinite(number):
                self._recent.append(number)
            return
        progress = trainer.fit_progress
        epoch, batch_idx = progress.epoch, progress.batches_done  # the batch being trained on
        self.spikes.append(
            {"epoch": epoch, "batch_idx": batch_idx, "global_step": progress.global_step, "loss": number}
        )
        self._write_excluded(trainer)
        if self.action == "raise":
            raise TrainingSpikeException(batch_idx, epoch=epoch, loss=number)
        if self.action == "warn":
            _log.warning(
                f"Loss spike in batch {batch_idx} of epoch {epoch}: {number:.6g} against a "
                f"recent mean of {sum(self._recent) / max(1, len(self._recent)):.6g}."
            )
            return
        self._spiked = True  # "skip": the window's gradients are dropped before its optimizer step

    def on_before_optimizer_step(
        self, trainer: Trainer, pl_module: TrainingModule, optimizer: Optimizer
    ) -> None:
        if not self._spiked:
            return
        self._spiked = False
        # No gradient: torch's optimizers leave such parameters (and their momentum) untouched.
        optimizer.zero_grad(set_to_none=True)
        _log.warning(
            f"Loss spike: skipped optimizer step {trainer.global_step + 1} (epoch {trainer.current_epoch})."
        )

    def _write_excluded(self, trainer: Trainer) -> None:
        if not trainer.is_global_zero:
            return
        folder = os.fspath(self.exclude_batches_path or trainer.default_root_dir)
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, "skip_batches.json"), "w") as file:
            json.dump([spike["batch_idx"] for spike in self.spikes], file, indent=4)
