"""``BasePredictionWriter``: write predictions to storage from every process, per batch or per epoch.

``trainer.predict`` gathers every process's predictions into the return value, which needs them
all in memory. A writer instead lets each process write its own share as it goes (or at the end
of its loop), with the dataset indices of the items, so the files together hold every item once.
"""

from __future__ import annotations

from enum import Enum
from typing import TYPE_CHECKING, Any

from drivetrain.trainer.callbacks.callback import Callback
from drivetrain.trainer.hooks import overrides

if TYPE_CHECKING:
    from drivetrain.trainer.module import TrainingModule
    from drivetrain.trainer.trainer import Trainer


class WriteInterval(str, Enum):
    """When a :class:`BasePredictionWriter` writes."""

    BATCH = "batch"
    EPOCH = "epoch"
    BATCH_AND_EPOCH = "batch_and_epoch"

    @property
    def on_batch(self) -> bool:
        return self in (WriteInterval.BATCH, WriteInterval.BATCH_AND_EPOCH)

    @property
    def on_epoch(self) -> bool:
        return self in (WriteInterval.EPOCH, WriteInterval.BATCH_AND_EPOCH)


class BasePredictionWriter(Callback):
    """Subclass it and implement :meth:`write_on_batch_end` and/or :meth:`write_on_epoch_end`.

    Both run on every process with that process's predictions. ``batch_indices`` are the
    dataset indices of the items (from the loader's batch sampler; empty for an iterable dataset).

    Args:
        write_interval: ``"batch"`` (after each batch), ``"epoch"`` (once, when the loop ends) or
            ``"batch_and_epoch"``.

    Example:
        >>> import os, torch
        >>> from drivetrain.trainer.callbacks import BasePredictionWriter
        >>> class Writer(BasePredictionWriter):
        ...     def __init__(self, folder):
        ...         super().__init__(write_interval="epoch")
        ...         self.folder = folder
        ...     def write_on_epoch_end(self, trainer, pl_module, predictions, batch_indices):
        ...         path = os.path.join(self.folder, f"predictions_{trainer.global_rank}.pt")
        ...         torch.save({"predictions": predictions, "indices": batch_indices}, path)
        >>> trainer = Trainer(strategy="ddp", devices=2, callbacks=[Writer("out")])  # doctest: +SKIP
        >>> trainer.predict(model, loader, return_predictions=False)  # doctest: +SKIP
    """

    def __init__(self, write_interval: str | WriteInterval = "batch") -> None:
        try:
            self.interval = WriteInterval(write_interval)
        except ValueError:
            raise ValueError(
                f"{type(self).__name__}(write_interval={write_interval!r}); use 'batch', 'epoch' or "
                f"'batch_and_epoch'."
            ) from None

    def write_on_batch_end(
        self,
        trainer: Trainer,
        pl_module: TrainingModule,
        prediction: Any,
        batch_indices: list[int] | None,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int,
    ) -> None:
        """Write one batch's ``prediction`` (``batch_indices``: its items' dataset indices)."""
        raise NotImplementedError

    def write_on_epoch_end(
        self, trainer: Trainer, pl_module: TrainingModule, predictions: list[Any], batch_indices: list[Any]
    ) -> None:
        """Write this process's ``predictions`` (one per batch; a list per loader when there are several)
        and ``batch_indices`` (each batch's dataset indices, shaped the same way)."""
        raise NotImplementedError

    def setup(self, trainer: Trainer, pl_module: TrainingModule, stage: str) -> None:
        if stage != "predict":
            return

        for needed, method in (
            (self.interval.on_batch, "write_on_batch_end"),
            (self.interval.on_epoch, "write_on_epoch_end"),
        ):
            if needed and not overrides(self, BasePredictionWriter, method):
                raise NotImplementedError(
                    f"{type(self).__name__}(write_interval={self.interval.value!r}) writes with {method}, which it "
                    f"does not implement. Implement {method}, or choose the write_interval of the method you wrote."
                )

    def on_predict_batch_end(
        self,
        trainer: Trainer,
        pl_module: TrainingModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if not self.interval.on_batch:
            return
        loop = trainer.predict_loop
        indices = loop.current_batch_indices if loop is not None else None
        self.write_on_batch_end(trainer, pl_module, outputs, indices, batch, batch_idx, dataloader_idx)

    def on_predict_epoch_end(self, trainer: Trainer, pl_module: TrainingModule) -> None:
        if not self.interval.on_epoch:
            return
        loop = trainer.predict_loop
        assert loop is not None  # the Trainer sets it before the loop's hooks run
        self.write_on_epoch_end(trainer, pl_module, loop.predictions, loop.epoch_batch_indices)
