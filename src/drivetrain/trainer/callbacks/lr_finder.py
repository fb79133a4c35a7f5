"""``LearningRateFinder``: run the learning-rate range test when fit starts, and train with its suggestion."""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

from drivetrain.trainer.callbacks.callback import Callback
from drivetrain.trainer.tuner.lr_finder import check_lr_find_arguments, lr_find

if TYPE_CHECKING:
    from drivetrain.trainer.module import TrainingModule
    from drivetrain.trainer.trainer import Trainer
    from drivetrain.trainer.tuner.lr_finder import LRFinder


class LearningRateFinder(Callback):
    """Find a learning rate with a range test in ``on_fit_start``, before the first training step.

    The test trains ``num_training_steps`` optimizer steps with the rate rising from ``min_lr`` to
    ``max_lr``, then puts the weights, optimizer, schedulers and random generators back as they were
    (see :class:`~drivetrain.Tuner`). With ``update_attr`` the fit then trains with the suggestion: it
    is written to the module's ``lr``/``learning_rate`` (or ``attr_name``) attribute or hparams entry
    and to the optimizer. The result is :attr:`optimal_lr` (an ``LRFinder``: ``results``,
    ``suggestion()``, ``plot()``); with matplotlib installed the plot is saved as
    ``default_root_dir/lr_find.png``.

    Args:
        min_lr: the rate of the first step.
        max_lr: the rate of the last step.
        num_training_steps: optimizer steps of the test.
        mode: ``"exponential"`` (geometric steps) or ``"linear"``.
        early_stop_threshold: stop the test once the smoothed loss exceeds this many times the best
            one (``None``: run every step).
        update_attr: train with the suggestion.
        attr_name: the attribute to set (default: ``lr``, else ``learning_rate``).

    Example:
        >>> trainer = Trainer(callbacks=[LearningRateFinder(max_lr=0.5)])  # doctest: +SKIP
        >>> trainer.fit(model)  # doctest: +SKIP
    """

    def __init__(
        self,
        min_lr: float = 1e-8,
        max_lr: float = 1,
        num_training_steps: int = 100,
        mode: str = "exponential",
        early_stop_threshold: float | None = 4.0,
        update_attr: bool = True,
        attr_name: str = "",
    ) -> None:

        check_lr_find_arguments(
            min_lr, max_lr, num_training_steps, mode, early_stop_threshold, name="num_training_steps"
        )
        if not isinstance(update_attr, bool):
            raise TypeError(f"update_attr expects True or False, got {update_attr!r}.")
        if not isinstance(attr_name, str):
            raise TypeError(f"attr_name expects a str ('' to look for lr/learning_rate), got {attr_name!r}.")
        self._min_lr = min_lr
        self._max_lr = max_lr
        self._num_training_steps = num_training_steps
        self._mode = mode
        self._early_stop_threshold = early_stop_threshold
        self._update_attr = update_attr
        self._attr_name = attr_name
        self._early_exit = False  # set by Tuner.lr_find: the fit ends after the test
        self.optimal_lr: LRFinder | None = None

    def lr_find(self, trainer: Trainer, pl_module: TrainingModule) -> None:
        """Run the test now (inside a running fit) and keep its result in :attr:`optimal_lr`."""

        self.optimal_lr = lr_find(
            trainer,
            pl_module,
            min_lr=self._min_lr,
            max_lr=self._max_lr,
            num_training=self._num_training_steps,
            mode=self._mode,
            early_stop_threshold=self._early_stop_threshold,
            update_attr=self._update_attr,
            attr_name=self._attr_name,
            plot_dir=trainer.default_root_dir,
        )

    def on_fit_start(self, trainer: Trainer, pl_module: TrainingModule) -> None:
        if trainer.fast_dev_run:
            warnings.warn(
                "LearningRateFinder is skipped: fast_dev_run runs a few batches to check the code, not to tune.",
                UserWarning,
                stacklevel=2,
            )
        else:
            self.lr_find(trainer, pl_module)
        if self._early_exit:
            trainer.should_stop = True

    def __repr__(self) -> str:
        return (
            f"LearningRateFinder(min_lr={self._min_lr}, max_lr={self._max_lr}, "
            f"num_training_steps={self._num_training_steps}, mode={self._mode!r})"
        )
