"""``BatchSizeFinder``: find the largest batch size that fits when fit starts, and train with it."""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

from drivetrain.trainer.callbacks.callback import Callback
from drivetrain.trainer.tuner.batch_size import check_scale_arguments, scale_batch_size

if TYPE_CHECKING:
    from drivetrain.trainer.module import TrainingModule
    from drivetrain.trainer.trainer import Trainer
    from drivetrain.trainer.tuner.batch_size import BatchSizeTrial


class BatchSizeFinder(Callback):
    """Scale the batch size in ``on_fit_start`` to the largest that fits, then train with it.

    Each trial sets the module's (or DataModule's) ``batch_arg_name`` attribute or hparams entry,
    builds the loaders again from ``train_dataloader()`` and trains ``steps_per_trial`` steps; the
    training state is put back afterwards (see :class:`~drivetrain.Tuner`). On a GPU a size fits when it
    does not run out of memory; on the CPU, when its measured footprint stays within ``max_memory``
    (without a limit the search grows up to the data set's size). The result is
    :attr:`optimal_batch_size`; :attr:`trials` lists every trial.

    Args:
        mode: ``"power"`` (double while it fits) or ``"binsearch"`` (then bisect to the largest size).
        steps_per_trial: optimizer steps per trial.
        init_val: the first batch size tried.
        max_trials: the most trials while growing and bisecting.
        batch_arg_name: the attribute holding the batch size.
        max_memory: on the CPU, the memory a trial may use: bytes, or a size such as ``"2GB"``/``"512MiB"``.
        margin: in binsearch mode, keep this fraction below the largest size that fitted (a safety buffer).
        max_val: never try a larger batch size.

    Example:
        >>> trainer = Trainer(callbacks=[BatchSizeFinder(mode="binsearch", max_memory="4GB")])  # doctest: +SKIP
        >>> trainer.fit(model)  # doctest: +SKIP
    """

    def __init__(
        self,
        mode: str = "power",
        steps_per_trial: int = 3,
        init_val: int = 2,
        max_trials: int = 25,
        batch_arg_name: str = "batch_size",
        max_memory: int | str | None = None,
        margin: float = 0.05,
        max_val: int = 8192,
    ) -> None:

        check_scale_arguments(
            mode, steps_per_trial, init_val, max_trials, batch_arg_name, max_memory, margin, max_val
        )
        self._margin = margin
        self._max_val = max_val
        self._mode = mode
        self._steps_per_trial = steps_per_trial
        self._init_val = init_val
        self._max_trials = max_trials
        self._batch_arg_name = batch_arg_name
        self._max_memory = max_memory
        self._early_exit = False  # set by Tuner.scale_batch_size: the fit ends after the search
        self.optimal_batch_size: int | None = init_val
        self.trials: list[BatchSizeTrial] = []

    def scale_batch_size(self, trainer: Trainer, pl_module: TrainingModule) -> None:
        """Run the search now (inside a running fit) and keep the result in :attr:`optimal_batch_size`."""

        self.trials = []
        self.optimal_batch_size = scale_batch_size(
            trainer,
            pl_module,
            mode=self._mode,
            steps_per_trial=self._steps_per_trial,
            init_val=self._init_val,
            max_trials=self._max_trials,
            batch_arg_name=self._batch_arg_name,
            max_memory=self._max_memory,
            margin=self._margin,
            max_val=self._max_val,
            trials=self.trials,
        )

    def on_fit_start(self, trainer: Trainer, pl_module: TrainingModule) -> None:
        if trainer.fast_dev_run:
            warnings.warn(
                "BatchSizeFinder is skipped: fast_dev_run runs a few batches to check the code, not to tune.",
                UserWarning,
                stacklevel=2,
            )
        else:
            self.scale_batch_size(trainer, pl_module)
        if self._early_exit:
            trainer.should_stop = True

    def __repr__(self) -> str:
        return f"BatchSizeFinder(mode={self._mode!r}, init_val={self._init_val}, max_memory={self._max_memory!r})"
