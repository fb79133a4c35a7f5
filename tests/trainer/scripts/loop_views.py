"""A callback written for Lightning that reads its loops' progress, on Lightning or on drivetrain.

``python loop_views.py lightning OUT.pt`` (the peers' interpreter) saves what the callback read at
each hook of a fit (sanity check, validation twice per epoch, accumulation), a validate, a test and
a predict; the test runs the same program on drivetrain, in one and in two processes, and compares.
Only the imports differ. With ``devices`` processes the data is ``devices`` times larger, so each
process runs the batches a single process runs.
"""

from __future__ import annotations

import sys
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

HOOKS = (
    "on_sanity_check_start",
    "on_sanity_check_end",
    "on_train_start",
    "on_train_epoch_start",
    "on_train_batch_start",
    "on_train_batch_end",
    "on_validation_start",
    "on_validation_batch_end",
    "on_validation_end",
    "on_train_epoch_end",
    "on_train_end",
    "on_test_batch_end",
    "on_test_end",
    "on_predict_batch_end",
    "on_predict_end",
)


def _framework(name: str) -> Any:
    if name == "lightning":
        import lightning.pytorch as framework
        from lightning.pytorch import callbacks
    else:
        import drivetrain as framework
        from drivetrain.trainer import callbacks
    return framework, callbacks


def _counts(tracker: Any) -> tuple[int, ...]:
    return tuple(getattr(tracker, name) for name in ("ready", "started", "processed", "completed"))


def read_fit_loop(trainer: Any) -> dict[str, Any]:
    """What callbacks in the wild read from ``trainer.fit_loop`` (and the evaluation loops)."""
    loop = trainer.fit_loop
    epoch_loop = loop.epoch_loop
    batches = epoch_loop.batch_progress
    optimizer = epoch_loop.automatic_optimization.optim_progress
    return {
        "limits": (loop.max_epochs, loop.min_epochs, loop.max_steps, loop.min_steps, loop.max_batches),
        "epoch_current": _counts(loop.epoch_progress.current),
        "epoch_total": _counts(loop.epoch_progress.total),
        "current_epoch": trainer.current_epoch,
        "batch_current": _counts(batches.current),
        "batch_total": _counts(batches.total),
        "batch_idx": (loop.batch_idx, loop.total_batch_idx),
        "is_last_batch": batches.is_last_batch,
        "batches_that_stepped": epoch_loop._batches_that_stepped,
        "optimizer_steps": (optimizer.optimizer_steps, optimizer.optimizer.step.total.completed),
        "optimizer_steps_this_epoch": optimizer.optimizer.step.current.completed,
        "val_batches": (
            epoch_loop.val_loop.batch_progress.current.ready,
            epoch_loop.val_loop.batch_progress.total.ready,
        ),
        "validate_batches": (
            trainer.validate_loop.batch_progress.current.completed,
            trainer.validate_loop.batch_progress.total.completed,
        ),
        "test_batches": trainer.test_loop.batch_progress.total.completed,
    }


def run(name: str, devices: int = 1) -> dict[str, Any]:
    framework, callbacks = _framework(name)
    base = framework.LightningModule if name == "lightning" else framework.TrainingModule

    class Net(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.layer = nn.Linear(4, 1)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            return nn.functional.mse_loss(self.layer(x), y)

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            pass

        def test_step(self, batch: Any, batch_idx: int) -> None:
            pass

        def predict_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            return self.layer(batch[0])

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    class EpochCounter(callbacks.Callback):  # type: ignore[misc, name-defined]
        """The kind of callback the issue saw: it acts on the epochs completed so far."""

        def __init__(self) -> None:
            self.seen: list[tuple[str, dict[str, Any]]] = []
            self.completed_at_epoch_end: list[int] = []

        def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
            self.completed_at_epoch_end.append(trainer.fit_loop.epoch_progress.current.completed)
            self.seen.append(("on_train_epoch_end", read_fit_loop(trainer)))

        def on_predict_batch_end(self, trainer: Any, *args: Any) -> None:
            self.seen.append(
                ("on_predict_batch_end", {"predict": _counts(trainer.predict_loop.batch_progress.total)})
            )

        def on_predict_end(self, trainer: Any, pl_module: Any) -> None:
            self.seen.append(
                ("on_predict_end", {"predict": _counts(trainer.predict_loop.batch_progress.total)})
            )

    def recorder(hook: str) -> Any:
        def record(self: Any, trainer: Any, *args: Any) -> None:
            self.seen.append((hook, read_fit_loop(trainer)))

        return record

    for hook in HOOKS:
        if hook not in vars(EpochCounter):
            setattr(EpochCounter, hook, recorder(hook))

    def data(n: int, seed: int) -> DataLoader:
        generator = torch.Generator().manual_seed(seed)
        x = torch.randn(n * devices, 4, generator=generator)
        return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=2)

    torch.manual_seed(0)
    counter = EpochCounter()
    trainer = framework.Trainer(
        accelerator="cpu",
        devices=devices,
        strategy="ddp" if devices > 1 else "auto",
        max_epochs=2,
        min_epochs=1,
        min_steps=1,
        accumulate_grad_batches=2,
        val_check_interval=0.5,
        num_sanity_val_steps=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[counter],
    )
    model = Net()
    trainer.fit(model, data(10, 0), data(6, 1))
    after_fit = read_fit_loop(trainer)
    trainer.validate(model, data(4, 2), verbose=False)
    trainer.validate(model, data(4, 2), verbose=False)
    trainer.test(model, data(6, 3), verbose=False)
    trainer.predict(model, data(4, 4))
    return {
        "seen": counter.seen,
        "completed_at_epoch_end": counter.completed_at_epoch_end,
        "after_fit": after_fit,
        "at_end": read_fit_loop(trainer),
        "world_size": trainer.world_size,
    }


if __name__ == "__main__":
    torch.save(run(sys.argv[1]), sys.argv[2])
