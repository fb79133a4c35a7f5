"""``Tuner``: find a learning rate and a batch size before training, as Lightning's ``Tuner`` does.

Each search runs one short ``trainer.fit`` that ends after ``on_fit_start``, where the
:class:`~drivetrain.trainer.callbacks.LearningRateFinder` or
:class:`~drivetrain.trainer.callbacks.BatchSizeFinder` runs its trials on the fit's set-up model,
optimizer and loaders. During that fit the Trainer's own callbacks and loggers stay out (no
checkpoint, no progress bar, no logged rows); the model's weights and optimizer state are as
before when the search returns, with the found value written to the module's attribute, so the
next ``trainer.fit`` trains with it::

    tuner = Tuner(trainer)
    tuner.scale_batch_size(model, mode="binsearch", max_memory="4GB")   # CPU: fit in 4 GB
    finder = tuner.lr_find(model)
    finder.plot(suggest=True, path="lr.png")
    trainer.fit(model)
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from drivetrain.strategies import rng
from drivetrain.trainer.callbacks.batch_size_finder import BatchSizeFinder
from drivetrain.trainer.callbacks.lr_finder import LearningRateFinder
from drivetrain.trainer.trainer import Trainer
from drivetrain.trainer.tuner.batch_size import check_one_process
from drivetrain.trainer.tuner.lr_finder import check_lr_find_arguments

if TYPE_CHECKING:
    from drivetrain.trainer.callbacks.batch_size_finder import BatchSizeFinder
    from drivetrain.trainer.callbacks.lr_finder import LearningRateFinder
    from drivetrain.trainer.datamodule import DataModule
    from drivetrain.trainer.module import TrainingModule
    from drivetrain.trainer.trainer import Trainer
    from drivetrain.trainer.tuner.lr_finder import LRFinder


class Tuner:
    """Tune a Trainer's hyperparameters: :meth:`lr_find` and :meth:`scale_batch_size`.

    Args:
        trainer: the Trainer that will train the module (its strategy, precision and settings are
            used for the trials).
    """

    def __init__(self, trainer: Trainer) -> None:

        if not isinstance(trainer, Trainer):
            raise TypeError(f"Tuner(trainer) expects a drivetrain.Trainer, got {type(trainer).__name__}.")
        self._trainer = trainer

    def scale_batch_size(
        self,
        model: TrainingModule,
        train_dataloaders: Any = None,
        val_dataloaders: Any = None,
        dataloaders: Any = None,
        datamodule: DataModule | None = None,
        method: str = "fit",
        mode: str = "power",
        steps_per_trial: int = 3,
        init_val: int = 2,
        max_trials: int = 25,
        batch_arg_name: str = "batch_size",
        max_memory: int | str | None = None,
        margin: float = 0.05,
        max_val: int = 8192,
    ) -> int | None:
        """The largest batch size that fits; also written to ``model.<batch_arg_name>`` (or the DataModule's).

        Args:
            model: the module; its (or the DataModule's) ``train_dataloader()`` reads ``batch_arg_name``.
            train_dataloaders: not supported (a given loader's batch size cannot change): pass a DataModule.
            val_dataloaders: validation loaders for the fit (the trials do not validate).
            dataloaders: for ``method`` other than ``"fit"``, which are not supported.
            datamodule: provides the loaders.
            method: ``"fit"`` (the only stage scaled here).
            mode: ``"power"`` (double while it fits) or ``"binsearch"`` (then bisect to the largest).
            steps_per_trial: optimizer steps per trial.
            init_val: the first batch size tried.
            max_trials: the most trials while growing and bisecting.
            batch_arg_name: the attribute or hparams entry holding the batch size.
            max_memory: on the CPU, the memory a trial may use (bytes or ``"2GB"``, ``"512MiB"`` …).
            margin: in binsearch mode, keep this fraction below the largest size that fitted.
            max_val: never try a larger batch size.
        """

        _check_method(method, dataloaders)
        check_one_process(self._trainer.world_size)
        finder = BatchSizeFinder(
            mode=mode,
            steps_per_trial=steps_per_trial,
            init_val=init_val,
            max_trials=max_trials,
            batch_arg_name=batch_arg_name,
            max_memory=max_memory,
            margin=margin,
            max_val=max_val,
        )
        self._run(finder, model, train_dataloaders, val_dataloaders, datamodule)
        return finder.optimal_batch_size

    def lr_find(
        self,
        model: TrainingModule,
        train_dataloaders: Any = None,
        val_dataloaders: Any = None,
        dataloaders: Any = None,
        datamodule: DataModule | None = None,
        method: str = "fit",
        min_lr: float = 1e-8,
        max_lr: float = 1,
        num_training: int = 100,
        mode: str = "exponential",
        early_stop_threshold: float | None = 4.0,
        update_attr: bool = True,
        attr_name: str = "",
    ) -> LRFinder | None:
        """Run the learning-rate range test; returns the ``LRFinder`` (``results``, ``suggestion()``, ``plot()``).

        The weights, optimizer state and the Trainer's state are as before afterwards. With
        ``update_attr`` the suggestion is written to ``model.lr``/``model.learning_rate`` (or
        ``attr_name``; also an hparams entry). With matplotlib installed, the plot is saved as
        ``default_root_dir/lr_find.png`` (``finder.plot_path``).

        Args:
            model: the module to tune.
            train_dataloaders: the training loader (or a DataModule).
            val_dataloaders: validation loaders for the fit (the test does not validate).
            dataloaders: for ``method`` other than ``"fit"``, which are not supported.
            datamodule: provides the loaders instead.
            method: ``"fit"``.
            min_lr: the rate of the first step.
            max_lr: the rate of the last step.
            num_training: optimizer steps of the test.
            mode: ``"exponential"`` (geometric steps) or ``"linear"``.
            early_stop_threshold: stop once the smoothed loss exceeds this many times the best (``None``: never).
            update_attr: write the suggestion to the module's attribute.
            attr_name: that attribute (default: ``lr``, else ``learning_rate``).
        """

        _check_method(method, dataloaders)
        check_lr_find_arguments(
            min_lr, max_lr, num_training, mode, early_stop_threshold
        )  # in this call's names
        finder = LearningRateFinder(
            min_lr=min_lr,
            max_lr=max_lr,
            num_training_steps=num_training,
            mode=mode,
            early_stop_threshold=early_stop_threshold,
            update_attr=update_attr,
            attr_name=attr_name,
        )
        # As Lightning's, the search leaves the random generators as they were (the loaders it builds draw from
        # them), so the same call gives the same result again.

        generators = rng.capture(self._trainer.strategy)
        try:
            self._run(finder, model, train_dataloaders, val_dataloaders, datamodule)
        finally:
            rng.restore(self._trainer.strategy, generators)
        return finder.optimal_lr

    def _run(
        self,
        finder: LearningRateFinder | BatchSizeFinder,
        model: TrainingModule,
        train_dataloaders: Any,
        val_dataloaders: Any,
        datamodule: DataModule | None,
    ) -> None:
        """One fit that ends after ``on_fit_start`` (where ``finder`` searches), with only ``finder`` as callback."""
        trainer = self._trainer
        launcher = trainer.strategy.launcher
        if launcher is not None and launcher.runs_in_spawned_processes:
            raise ValueError(
                f"The Tuner runs its search in the processes that {type(trainer.strategy).__name__} starts with "
                f"torch.multiprocessing, so its result could not come back to this one. Tune with strategy='ddp' "
                f"(each process runs the script) or devices=1, or add the finder callback to the Trainer."
            )
        finder._early_exit = True
        run = trainer.run_state
        saved = (run.callbacks, run.settings, run.metrics.loggers)
        run.callbacks = [finder]
        # Nothing but the search: no sanity check, and the stop it requests is honoured at once.
        run.settings = dataclasses.replace(run.settings, num_sanity_val_steps=0, min_epochs=0, min_steps=0)
        run.metrics.loggers = []
        try:
            trainer.fit(model, train_dataloaders, val_dataloaders, datamodule)
        finally:
            run.callbacks, run.settings, run.metrics.loggers = saved
            run.should_stop = False


def _check_method(method: str, dataloaders: Any) -> None:
    if method != "fit":
        raise ValueError(
            f"method={method!r}: the Tuner tunes for 'fit' only. Tune with method='fit' and use the values for "
            f"{method} as well."
        )
    if dataloaders is not None:
        raise ValueError(
            "dataloaders= is for method='validate'/'test'/'predict'; with method='fit' pass train_dataloaders= "
            "(and val_dataloaders=) or datamodule=."
        )
