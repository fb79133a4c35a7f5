"""Per-Accelerator loop state: gradient accumulation and the data loaders being iterated.

Each ``Accelerator`` owns one :class:`GradientState` (no process-wide singleton), and hands it to
the optimizers, schedulers and data loaders it prepares.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from drivetrain.data.loader import ActiveLoaders
from drivetrain.strategies.step_policy import GradientAccumulation

if TYPE_CHECKING:
    from drivetrain.data.loader import PreparedDataLoader


class GradientState(GradientAccumulation):
    """Whether this step synchronises gradients and steps the optimizer, and where the data stands.

    The core's accumulation policy (:class:`~drivetrain.strategies.step_policy.GradientAccumulation`,
    which the Trainer follows too) with what Accelerate's ``GradientState`` adds: the prepared
    loaders being iterated, whose last batch ends a window early.

    Args:
        num_steps: batches per optimizer step (gradient accumulation).
        sync_with_dataloader: also step at the last batch of a prepared loader.
        sync_each_batch: all-reduce gradients at every batch even while accumulating.
    """

    def __init__(
        self, num_steps: int = 1, sync_with_dataloader: bool = True, sync_each_batch: bool = False
    ) -> None:
        super().__init__(
            num_steps, sync_with_dataloader=sync_with_dataloader, sync_each_batch=sync_each_batch
        )
        #: Whether ``Accelerator.accumulate`` has been used (for the misuse warning).
        self.accumulate_called = False

        self.loaders = ActiveLoaders()

    @classmethod
    def _reset_state(cls) -> None:
        """Accelerate resets its singleton here; drivetrain has none (each Accelerator owns its GradientState)."""

    @property
    def in_dataloader(self) -> bool:
        """Whether a prepared loader is being iterated."""
        return self.loaders.current is not None

    @property
    def active_dataloader(self) -> PreparedDataLoader | None:
        """The innermost prepared loader being iterated."""
        return self.loaders.current

    @property
    def end_of_dataloader(self) -> bool:
        """Whether the innermost loader is on its last batch of the epoch."""
        return self.loaders.end_of_dataloader

    @property
    def remainder(self) -> int:
        """Real items in the innermost loader's final step, once it is reached (else ``-1``)."""
        loader = self.loaders.current
        return loader.remainder if loader is not None else -1

    def __repr__(self) -> str:
        return (
            f"GradientState(sync_gradients={self.sync_gradients}, step={self.step}, num_steps={self.num_steps}, "
            f"end_of_dataloader={self.end_of_dataloader})"
        )
