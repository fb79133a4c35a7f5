"""``ThroughputMonitor``: batches and samples per second and, given FLOPs, model FLOPs utilisation.

Times are taken once per batch (a clock read); the rates over the last ``window_size`` batches
are computed and logged every ``log_every_n_steps``, after waiting for the device so the time
covers the work actually done.
"""

from __future__ import annotations

import time
import warnings
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from drivetrain.trainer.callbacks.callback import Callback
from drivetrain.trainer.results import infer_batch_size

if TYPE_CHECKING:
    from drivetrain.trainer.module import TrainingModule
    from drivetrain.trainer.trainer import Trainer


class ThroughputMonitor(Callback):
    """Log training throughput under ``throughput/…``.

    Logged: ``batches_per_sec`` and ``samples_per_sec`` (all processes), ``device/samples_per_sec``
    (this process) and, when the module has a ``flops_per_batch`` attribute (FLOPs of one
    training step on one device), ``device/flops_per_sec`` and, with ``available_flops``,
    ``device/mfu``.

    Args:
        batch_size_fn: the number of samples in a batch (default: the length of its first tensor).
        window_size: how many recent batches the rates average over.
        available_flops: peak FLOP/s of one device for this precision, for MFU.
    """

    def __init__(
        self,
        batch_size_fn: Callable[[Any], int] | None = None,
        window_size: int = 100,
        available_flops: float | None = None,
    ) -> None:
        if isinstance(window_size, bool) or not isinstance(window_size, int) or window_size < 2:
            raise ValueError(f"ThroughputMonitor(window_size={window_size!r}); use an int >= 2.")
        self.batch_size_fn = batch_size_fn or infer_batch_size
        self.window_size = window_size
        self.available_flops = available_flops
        self._times: deque[float] = deque(maxlen=window_size)
        self._samples: deque[int] = deque(maxlen=window_size)
        self._warned = False
        self.last: dict[str, float] = {}

    def on_train_start(self, trainer: Trainer, pl_module: TrainingModule) -> None:
        self._times.clear()
        self._samples.clear()
        self._times.append(time.perf_counter())
        self._samples.append(0)

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: TrainingModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._samples.append(self.batch_size_fn(batch))
        if trainer.fit_progress.total_batches_done % trainer.log_every_n_steps:
            self._times.append(time.perf_counter())
            return
        strategy = trainer.strategy
        strategy.accelerator.synchronize(strategy.root_device)
        self._times.append(time.perf_counter())
        metrics = self.compute(trainer.world_size, getattr(pl_module, "flops_per_batch", None))
        self.last = metrics
        if metrics and trainer.is_global_zero:
            trainer.log_metrics(metrics)

    def compute(self, world_size: int, flops_per_batch: float | None) -> dict[str, float]:
        """The rates over the current window."""
        if len(self._times) < 2:
            return {}
        elapsed = self._times[-1] - self._times[0]
        if elapsed <= 0:
            return {}
        batches = len(self._times) - 1
        samples = sum(list(self._samples)[1:])
        metrics = {
            "throughput/batches_per_sec": batches / elapsed,
            "throughput/samples_per_sec": samples * world_size / elapsed,
            "throughput/device/samples_per_sec": samples / elapsed,
        }
        if flops_per_batch:
            flops = flops_per_batch * batches / elapsed
            metrics["throughput/device/flops_per_sec"] = flops
            if self.available_flops:
                metrics["throughput/device/mfu"] = flops / self.available_flops
            elif not self._warned:
                self._warned = True
                warnings.warn(
                    "ThroughputMonitor: the module reports flops_per_batch, but MFU needs the device's peak FLOP/s; "
                    "pass ThroughputMonitor(available_flops=...).",
                    UserWarning,
                    stacklevel=2,
                )
        return metrics
