"""The callback base class: every Trainer hook, as a no-op.

A callback overrides the hooks it needs; the Trainer calls only those (see
:mod:`drivetrain.trainer.hooks`). Each hook receives the Trainer and the module first.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torch import Tensor
from torch.optim import Optimizer

from drivetrain._utilities.renamed import sync_renamed_hooks

if TYPE_CHECKING:
    from drivetrain.trainer.module import TrainingModule
    from drivetrain.trainer.trainer import Trainer


# Lightning's private name for generate_state_key, kept for callbacks written against it.
_RENAMED_HOOKS = {"_generate_state_key": "generate_state_key"}


class Callback:
    """Base class for callbacks: self-contained additions to a training run."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        sync_renamed_hooks(cls, _RENAMED_HOOKS)

    @property
    def state_key(self) -> str:
        """The key of this callback's state in checkpoints; unique per callback type and settings.

        Override it with :meth:`generate_state_key` when one run may hold several instances of the
        callback (``ModelCheckpoint`` for two metrics): each then saves and restores its own state.
        """
        return type(self).__qualname__

    def generate_state_key(self, **settings: Any) -> str:
        """A :attr:`state_key` made of the class name and the settings that tell instances apart.

        Example:
            >>> class Watch(Callback):
            ...     def __init__(self, monitor: str) -> None:
            ...         self.monitor = monitor
            ...     @property
            ...     def state_key(self) -> str:
            ...         return self.generate_state_key(monitor=self.monitor)
            >>> Watch("val_loss").state_key
            "Watch{'monitor': 'val_loss'}"
        """
        return f"{type(self).__qualname__}{dict(sorted(settings.items()))!r}"

    _generate_state_key = generate_state_key  # deprecated: Lightning's private name

    def state_dict(self) -> dict[str, Any]:
        """State to save in checkpoints."""
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""

    def setup(self, trainer: Trainer, pl_module: TrainingModule, stage: str) -> None: ...
    def teardown(self, trainer: Trainer, pl_module: TrainingModule, stage: str) -> None: ...
    def on_fit_start(self, trainer: Trainer, pl_module: TrainingModule) -> None: ...
    def on_fit_end(self, trainer: Trainer, pl_module: TrainingModule) -> None: ...
    def on_sanity_check_start(self, trainer: Trainer, pl_module: TrainingModule) -> None: ...
    def on_sanity_check_end(self, trainer: Trainer, pl_module: TrainingModule) -> None: ...
    def on_train_start(self, trainer: Trainer, pl_module: TrainingModule) -> None: ...
    def on_train_end(self, trainer: Trainer, pl_module: TrainingModule) -> None: ...
    def on_train_epoch_start(self, trainer: Trainer, pl_module: TrainingModule) -> None: ...
    def on_train_epoch_end(self, trainer: Trainer, pl_module: TrainingModule) -> None: ...
    def on_train_batch_start(
        self, trainer: Trainer, pl_module: TrainingModule, batch: Any, batch_idx: int
    ) -> None: ...

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: TrainingModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None: ...

    def on_validation_start(self, trainer: Trainer, pl_module: TrainingModule) -> None: ...
    def on_validation_end(self, trainer: Trainer, pl_module: TrainingModule) -> None: ...
    def on_validation_epoch_start(self, trainer: Trainer, pl_module: TrainingModule) -> None: ...
    def on_validation_epoch_end(self, trainer: Trainer, pl_module: TrainingModule) -> None: ...

    def on_validation_batch_start(
        self, trainer: Trainer, pl_module: TrainingModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None: ...

    def on_validation_batch_end(
        self,
        trainer: Trainer,
        pl_module: TrainingModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None: ...

    def on_test_start(self, trainer: Trainer, pl_module: TrainingModule) -> None: ...
    def on_test_end(self, trainer: Trainer, pl_module: TrainingModule) -> None: ...
    def on_test_epoch_start(self, trainer: Trainer, pl_module: TrainingModule) -> None: ...
    def on_test_epoch_end(self, trainer: Trainer, pl_module: TrainingModule) -> None: ...

    def on_test_batch_start(
        self, trainer: Trainer, pl_module: TrainingModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None: ...

    def on_test_batch_end(
        self,
        trainer: Trainer,
        pl_module: TrainingModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None: ...

    def on_predict_start(self, trainer: Trainer, pl_module: TrainingModule) -> None: ...
    def on_predict_end(self, trainer: Trainer, pl_module: TrainingModule) -> None: ...
    def on_predict_epoch_start(self, trainer: Trainer, pl_module: TrainingModule) -> None: ...
    def on_predict_epoch_end(self, trainer: Trainer, pl_module: TrainingModule) -> None: ...

    def on_predict_batch_start(
        self, trainer: Trainer, pl_module: TrainingModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None: ...

    def on_predict_batch_end(
        self,
        trainer: Trainer,
        pl_module: TrainingModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None: ...

    def on_before_backward(self, trainer: Trainer, pl_module: TrainingModule, loss: Tensor) -> None: ...
    def on_after_backward(self, trainer: Trainer, pl_module: TrainingModule) -> None: ...

    def on_before_optimizer_step(
        self, trainer: Trainer, pl_module: TrainingModule, optimizer: Optimizer
    ) -> None: ...

    def on_before_zero_grad(
        self, trainer: Trainer, pl_module: TrainingModule, optimizer: Optimizer
    ) -> None: ...

    def on_save_checkpoint(
        self, trainer: Trainer, pl_module: TrainingModule, checkpoint: dict[str, Any]
    ) -> None:
        """Add to (or inspect) a checkpoint before it is written."""

    def on_load_checkpoint(
        self, trainer: Trainer, pl_module: TrainingModule, checkpoint: dict[str, Any]
    ) -> None:
        """Inspect a checkpoint being loaded (this callback's own state arrives through load_state_dict)."""

    def on_exception(self, trainer: Trainer, pl_module: TrainingModule, exception: BaseException) -> None:
        """Called when the run fails with ``exception`` (before it propagates)."""
