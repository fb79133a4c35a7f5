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
    """Log training throughput under Lightning's names: ``train/<metric>`` (``/``: the ``separator``).

    Logged: ``time``, ``batches``, ``samples`` (and ``lengths``) since the fit started,
    ``device/batches_per_sec``, ``device/samples_per_sec`` (and ``device/items_per_sec``) of this
    process over the last ``window_size`` batches, the same without ``device/`` for all processes
    when there are several, and, when the module has a ``flops_per_batch`` attribute (FLOPs of one
    training step on one device), ``device/flops_per_sec`` (``flops_per_sec`` for all processes) and,
    with ``available_flops``, ``device/mfu``.

    Args:
        batch_size_fn: the number of samples in a batch (default: the length of its first tensor).
        length_fn: the number of items (tokens …) in a batch, for ``items_per_sec``.
        window_size: how many recent batches the rates average over.
        available_flops: peak FLOP/s of one device for this precision, for MFU.
        separator: joins the parts of the metric names.
    """

    def __init__(
        self,
        batch_size_fn: Callable[[Any], int] | None = None,
        length_fn: Callable[[Any], int] | None = None,
        *,
        window_size: int = 100,
        available_flops: float | None = None,
        separator: str = "/",
    ) -> None:
        if isinstance(window_size, bool) or not isinstance(window_size, int) or window_size < 2:
            raise ValueError(f"ThroughputMonitor(window_size={window_size!r}); use an int >= 2.")
        if not isinstance(separator, str):
            raise TypeError(f"ThroughputMonitor(separator={separator!r}); use a string such as '/' or '|'.")
        self.batch_size_fn = batch_size_fn or infer_batch_size
        self.length_fn = length_fn
        self.window_size = window_size
        self.available_flops = available_flops
        self.separator = separator
        # Readings at the end of the recent batches: (time, batches, samples, items), cumulative.
        self._readings: deque[tuple[float, int, int, int]] = deque(maxlen=window_size)
        self._started = 0.0
        self._warned = False
        self.last: dict[str, float] = {}

    def on_train_start(self, trainer: Trainer, pl_module: TrainingModule) -> None:
        self._readings.clear()
        self._started = time.perf_counter()
        self._readings.append((self._started, 0, 0, 0))

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: TrainingModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        _, batches, samples, items = self._readings[-1]
        samples += self.batch_size_fn(batch)
        items += self.length_fn(batch) if self.length_fn is not None else 0
        if trainer.fit_progress.total_batches_done % trainer.log_every_n_steps:
            self._readings.append((time.perf_counter(), batches + 1, samples, items))
            return
        strategy = trainer.strategy
        strategy.accelerator.synchronize(strategy.root_device)
        self._readings.append((time.perf_counter(), batches + 1, samples, items))
        metrics = self.compute(trainer.world_size, getattr(pl_module, "flops_per_batch", None))
        self.last = metrics
        if metrics and trainer.is_global_zero:
            trainer.log_metrics(metrics)

    def compute(self, world_size: int, flops_per_batch: float | None) -> dict[str, float]:
        """The totals since the fit started and the rates over the current window, by metric name."""
        if len(self._readings) < 2:
            return {}
        start, first_batches, first_samples, first_items = self._readings[0]
        end, batches, samples, items = self._readings[-1]
        elapsed = end - start
        if elapsed <= 0:
            return {}
        name = self._name
        metrics: dict[str, float] = {
            name("time"): end - self._started,
            name("batches"): batches,
            name("samples"): samples,
        }
        if self.length_fn is not None:
            metrics[name("lengths")] = items
        rates = {
            "batches_per_sec": (batches - first_batches) / elapsed,
            "samples_per_sec": (samples - first_samples) / elapsed,
        }
        if self.length_fn is not None:
            rates["items_per_sec"] = (items - first_items) / elapsed
        for rate, value in rates.items():
            metrics[name("device", rate)] = value
            if world_size > 1:
                metrics[name(rate)] = value * world_size
        if flops_per_batch:
            flops = flops_per_batch * (batches - first_batches) / elapsed
            metrics[name("device", "flops_per_sec")] = flops
            if world_size > 1:
                metrics[name("flops_per_sec")] = flops * world_size
            if self.available_flops:
                metrics[name("device", "mfu")] = flops / self.available_flops
            elif not self._warned:
                self._warned = True
                warnings.warn(
                    "ThroughputMonitor: the module reports flops_per_batch, but MFU needs the device's peak FLOP/s; "
                    "pass ThroughputMonitor(available_flops=...).",
                    UserWarning,
                    stacklevel=2,
                )
        return metrics

    def _name(self, *parts: str) -> str:
        return self.separator.join(("train", *parts))
