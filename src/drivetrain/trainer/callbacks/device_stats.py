"""``DeviceStatsMonitor``: log what the hardware accelerator reports about the device (memory,
utilisation) around training, validation and test batches.

The figures come from the hardware plugin's ``get_device_stats(device)`` — the contract every
accelerator implements, a user's own included — so the same callback reports CUDA memory, XPU
memory or CPU usage. Keys follow Lightning's: ``DeviceStatsMonitor.on_train_batch_start/<stat>``.
"""

from __future__ import annotations

import numbers
from typing import TYPE_CHECKING, Any

import torch

from drivetrain.trainer.callbacks.callback import Callback

if TYPE_CHECKING:
    from drivetrain.trainer.module import TrainingModule
    from drivetrain.trainer.trainer import Trainer


class DeviceStatsMonitor(Callback):
    """Log the device's statistics every ``log_every_n_steps`` batches, through the Trainer's loggers.

    Args:
        cpu_stats: also log the process's CPU figures (``cpu_percent``, ``cpu_rss_bytes`` …) when training on
            another device (``True``); log nothing when training on the CPU (``False``); ``None`` (default):
            the device's own figures only, which on the CPU are the CPU figures.

    Example:
        >>> from drivetrain.trainer.callbacks import DeviceStatsMonitor
        >>> trainer = Trainer(accelerator="cuda", callbacks=[DeviceStatsMonitor(cpu_stats=True)])  # doctest: +SKIP
    """

    def __init__(self, cpu_stats: bool | None = None) -> None:
        if cpu_stats not in (None, True, False):
            raise ValueError(f"DeviceStatsMonitor(cpu_stats={cpu_stats!r}); use True, False or None.")
        self._cpu_stats = cpu_stats
        self._cpu: Any = None
        self._active = True

    def setup(self, trainer: Trainer, pl_module: TrainingModule, stage: str) -> None:
        if stage == "predict":
            return
        if not trainer.loggers:
            raise ValueError(
                "DeviceStatsMonitor logs through the Trainer's loggers, but the Trainer has none (logger=False or "
                "fast_dev_run). Pass logger=True or a Logger, or drop the callback."
            )
        on_cpu = trainer.strategy.root_device.type == "cpu"
        self._active = not (on_cpu and self._cpu_stats is False)
        if self._cpu_stats and not on_cpu:
            from drivetrain.accelerators.cpu import CPUAccelerator

            self._cpu = CPUAccelerator()  # its own baseline for the CPU share
        else:
            self._cpu = None

    def stats(self, trainer: Trainer) -> dict[str, float]:
        """The figures logged now: the accelerator's for this process's device (and the CPU's when asked)."""
        device = trainer.strategy.root_device
        figures = dict(trainer.accelerator.get_device_stats(device))
        if self._cpu is not None:
            figures.update(self._cpu.get_device_stats(torch.device("cpu")))
        return {
            name: float(value)
            for name, value in figures.items()
            if isinstance(value, numbers.Real) and not isinstance(value, bool)
        }

    def _log(self, trainer: Trainer, hook: str) -> None:
        prefix = f"{type(self).__qualname__}.{hook}/"
        trainer.log_metrics({prefix + name: value for name, value in self.stats(trainer).items()})

    def _train_due(self, trainer: Trainer, finished: int) -> bool:
        return self._active and finished % trainer.log_every_n_steps == 0

    def _eval_due(self, trainer: Trainer, batch_idx: int) -> bool:
        return (
            self._active and not trainer.sanity_checking and (batch_idx + 1) % trainer.log_every_n_steps == 0
        )

    def on_train_batch_start(
        self, trainer: Trainer, pl_module: TrainingModule, batch: Any, batch_idx: int
    ) -> None:
        if self._train_due(trainer, trainer.fit_progress.total_batches_done + 1):
            self._log(trainer, "on_train_batch_start")

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: TrainingModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self._train_due(trainer, trainer.fit_progress.total_batches_done):
            self._log(trainer, "on_train_batch_end")

    def on_validation_batch_start(
        self, trainer: Trainer, pl_module: TrainingModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        if self._eval_due(trainer, batch_idx):
            self._log(trainer, "on_validation_batch_start")

    def on_validation_batch_end(
        self,
        trainer: Trainer,
        pl_module: TrainingModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if self._eval_due(trainer, batch_idx):
            self._log(trainer, "on_validation_batch_end")

    def on_test_batch_start(
        self, trainer: Trainer, pl_module: TrainingModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        if self._eval_due(trainer, batch_idx):
            self._log(trainer, "on_test_batch_start")

    def on_test_batch_end(
        self,
        trainer: Trainer,
        pl_module: TrainingModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if self._eval_due(trainer, batch_idx):
            self._log(trainer, "on_test_batch_end")
