"""``GradientAccumulationScheduler``: change how many batches make one optimizer step, by epoch."""

from __future__ import annotations

from typing import TYPE_CHECKING

from drivetrain.trainer.callbacks.callback import Callback

if TYPE_CHECKING:
    from drivetrain.trainer.module import TrainingModule
    from drivetrain.trainer.trainer import Trainer


class GradientAccumulationScheduler(Callback):
    """Accumulate gradients over a number of batches that depends on the epoch.

    At the start of each epoch ``trainer.accumulate_grad_batches`` becomes the factor of the
    latest scheduled epoch reached; before the first scheduled epoch it is 1.

    Args:
        scheduling: epoch (0-based) to accumulation factor, e.g. ``{0: 8, 4: 4, 8: 1}``: 8 batches per
            step in epochs 0-3, 4 in epochs 4-7, then 1.

    Raises:
        ValueError: a key that is not an int >= 0 or a factor that is not an int >= 1; at fit start,
            a Trainer that sets ``accumulate_grad_batches`` itself, a module in manual optimisation,
            or a DeepSpeed strategy (its engine owns accumulation).

    Example:
        >>> from drivetrain.trainer.callbacks import GradientAccumulationScheduler
        >>> scheduler = GradientAccumulationScheduler(scheduling={0: 8, 4: 4, 8: 1})
        >>> scheduler.get_accumulate_grad_batches(5)
        4
    """

    def __init__(self, scheduling: dict[int, int]) -> None:
        if not isinstance(scheduling, dict) or not scheduling:
            raise ValueError(
                f"GradientAccumulationScheduler(scheduling={scheduling!r}); give a non-empty dict of epoch to "
                f"factor, e.g. {{0: 8, 4: 1}}."
            )
        for epoch, factor in scheduling.items():
            if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
                raise ValueError(
                    f"GradientAccumulationScheduler: epoch {epoch!r} in scheduling is not an int >= 0 (epochs count "
                    f"from 0)."
                )
            if isinstance(factor, bool) or not isinstance(factor, int) or factor < 1:
                raise ValueError(
                    f"GradientAccumulationScheduler: the factor {factor!r} for epoch {epoch} is not an int >= 1 "
                    f"(batches per optimizer step)."
                )
        schedule = dict(sorted(scheduling.items()))
        if 0 not in schedule:
            schedule = {0: 1, **schedule}
        self.scheduling = schedule
        self._restore: int | None = None

    def going_to_accumulate_grad_batches(self) -> bool:
        """Whether some epoch accumulates (a factor above 1)."""
        return any(factor > 1 for factor in self.scheduling.values())

    def get_accumulate_grad_batches(self, epoch: int) -> int:
        """The factor in force in ``epoch``."""
        factor = 1
        for start, scheduled in self.scheduling.items():
            if epoch < start:
                break
            factor = scheduled
        return factor

    def setup(self, trainer: Trainer, pl_module: TrainingModule, stage: str) -> None:
        if stage != "fit":
            return
        # Checked before the model is set up, so a wrong combination fails in seconds.
        if trainer.strategy.owns_accumulation:
            raise ValueError(
                f"GradientAccumulationScheduler cannot be used with {type(trainer.strategy).__name__}: its engine "
                f"fixes the accumulation for the whole run (DeepSpeed: gradient_accumulation_steps in its config). "
                f"Set it there, or use another strategy (ddp, fsdp) to schedule accumulation."
            )
        if not pl_module.automatic_optimization and self.going_to_accumulate_grad_batches():
            raise ValueError(
                f"GradientAccumulationScheduler needs automatic optimisation, but "
                f"{type(pl_module).__name__}.automatic_optimization is False. Step the optimizer every N batches "
                f"in training_step instead."
            )
        if trainer.accumulate_grad_batches != 1:
            raise ValueError(
                f"Trainer(accumulate_grad_batches={trainer.accumulate_grad_batches}) and a "
                f"GradientAccumulationScheduler both set the accumulation. Remove one (put the constant factor in "
                f"the scheduling as {{0: {trainer.accumulate_grad_batches}}})."
            )

    def on_train_start(self, trainer: Trainer, pl_module: TrainingModule) -> None:
        self._restore = trainer.accumulate_grad_batches
        # A fit resumed in the middle of an epoch does not start that epoch again: set its factor here.
        trainer.accumulate_grad_batches = self.get_accumulate_grad_batches(trainer.current_epoch)

    def on_train_epoch_start(self, trainer: Trainer, pl_module: TrainingModule) -> None:
        trainer.accumulate_grad_batches = self.get_accumulate_grad_batches(trainer.current_epoch)

    def on_train_end(self, trainer: Trainer, pl_module: TrainingModule) -> None:
        self._put_back(trainer)

    def on_exception(self, trainer: Trainer, pl_module: TrainingModule, exception: BaseException) -> None:
        self._put_back(trainer)

    def _put_back(self, trainer: Trainer) -> None:
        """The Trainer's own setting again, so a later fit with this Trainer starts as configured."""
        if self._restore is not None:
            trainer.accumulate_grad_batches = self._restore
            self._restore = None

    def __repr__(self) -> str:
        return f"GradientAccumulationScheduler(scheduling={self.scheduling})"
