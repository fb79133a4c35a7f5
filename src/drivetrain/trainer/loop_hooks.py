"""Hooks a :class:`~drivetrain.TrainingModule` overrides to change what the loops do, as in Lightning.

Each default below does what the Trainer does anyway, so overriding one and calling ``super()``
changes nothing. The Trainer looks once per entry point at which of them a module overrides:
when none is, the loops take their fast path and call none of these methods; an overridden
step hook (``backward``, ``optimizer_step``, ``optimizer_zero_grad``,
``configure_gradient_clipping``) routes the training step through the general path, which calls
them in Lightning's order (see :mod:`drivetrain.trainer.loops.optimization`)::

    optimizer_step(epoch, batch_idx, optimizer, closure)
        closure():  training_step → [on_before_zero_grad] optimizer_zero_grad (first batch of a window)
                    → [on_before_backward] backward [on_after_backward]
        optimizer.step(): closure → [on_before_optimizer_step] configure_gradient_clipping → the step
    lr_scheduler_step(scheduler, metric)   (per-step schedulers here; per-epoch ones after the epoch's last
                                           optimizer step, ReduceLROnPlateau ones after on_train_epoch_end)

Batches pass ``on_before_batch_transfer`` → ``transfer_batch_to_device`` →
``on_after_batch_transfer`` before ``on_*_batch_start``; evaluation starts with
``on_{validation,test,predict}_model_eval`` and ends with ``on_{validation,test}_model_train``
(by default: every submodule back in the mode it had).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor
from torch.optim import Optimizer

from drivetrain._utilities.apply import move_to_device

if TYPE_CHECKING:
    from drivetrain.trainer.callbacks.callback import Callback

#: Hooks of the training step; overriding any of them selects the general step path.
STEP_HOOKS = ("backward", "optimizer_step", "optimizer_zero_grad", "configure_gradient_clipping")
#: Hooks a batch passes on its way to the device.
TRANSFER_HOOKS = ("on_before_batch_transfer", "transfer_batch_to_device", "on_after_batch_transfer")


class LoopHooks:
    """The overridable loop hooks of :class:`~drivetrain.TrainingModule` (Lightning's names and signatures)."""

    trainer: Any

    # -- data -----------------------------------------------------------------------------------
    def prepare_data(self) -> None:
        """Download or write data to disk: called once per node (local rank 0) before ``setup``.

        Do not set state here (it runs in one process); assign in :meth:`setup`.
        """

    def configure_callbacks(self) -> Sequence[Callback] | Callback:
        """Callbacks this module needs, added to the Trainer's at the start of every entry point.

        A Trainer callback of the same type (or a base class of one returned here) is replaced;
        checkpoint callbacks still run last.
        """
        return []

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """Change a batch (still where the loader made it) before it moves to the device; return it."""
        return batch

    def transfer_batch_to_device(self, batch: Any, device: torch.device, dataloader_idx: int) -> Any:
        """Move ``batch`` to ``device`` (tensors in lists, tuples, dicts and dataclasses by default)."""
        return move_to_device(batch, device)

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """Change a batch on the device (augment on the GPU, say) before the step sees it; return it."""
        return batch

    # -- the training step ------------------------------------------------------------------------
    def backward(self, loss: Tensor, *args: Any, **kwargs: Any) -> None:
        """Compute gradients: ``loss.backward()``. The loss arrives scaled under float16 mixed precision."""
        loss.backward(*args, **kwargs)

    def optimizer_zero_grad(self, epoch: int, batch_idx: int, optimizer: Optimizer) -> None:
        """Reset the gradients at the start of an accumulation window (``optimizer.zero_grad()``)."""
        optimizer.zero_grad()

    def optimizer_step(
        self,
        epoch: int,
        batch_idx: int,
        optimizer: Optimizer,
        optimizer_closure: Callable[[], Any] | None = None,
    ) -> None:
        """Step ``optimizer`` at the end of an accumulation window: ``optimizer.step(closure=optimizer_closure)``.

        The closure runs ``training_step``, zeroes the gradients and runs ``backward``: it must be
        called exactly once per call of this hook (``optimizer.step(closure=...)`` calls it), or
        the Trainer stops with an error. Skipping ``optimizer.step`` skips the update.
        """
        optimizer.step(closure=optimizer_closure)

    def configure_gradient_clipping(
        self,
        optimizer: Optimizer,
        gradient_clip_val: float | None = None,
        gradient_clip_algorithm: str | None = None,
    ) -> None:
        """Clip before each optimizer step, with the Trainer's ``gradient_clip_val``/``_algorithm``."""
        self.clip_gradients(optimizer, gradient_clip_val, gradient_clip_algorithm or "norm")  # type: ignore[attr-defined]

    def lr_scheduler_step(self, scheduler: Any, metric: Any) -> None:
        """Step a learning-rate scheduler (``metric``: the monitored value for ``ReduceLROnPlateau``, else ``None``)."""
        if metric is None:
            scheduler.step()
        else:
            scheduler.step(metric)

    # -- evaluation mode --------------------------------------------------------------------------
    def on_validation_model_eval(self) -> None:
        """Before validation: ``trainer.model.eval()``."""
        self.trainer.model.eval()

    def on_validation_model_train(self) -> None:
        """After validation. Not overriding it puts every submodule back in the mode it had before."""
        self.trainer.model.train()

    def on_test_model_eval(self) -> None:
        """Before testing: ``trainer.model.eval()``."""
        self.trainer.model.eval()

    def on_test_model_train(self) -> None:
        """After testing. Not overriding it puts every submodule back in the mode it had before."""
        self.trainer.model.train()

    def on_predict_model_eval(self) -> None:
        """Before prediction: ``trainer.model.eval()`` (afterwards every submodule gets its mode back)."""
        self.trainer.model.eval()
