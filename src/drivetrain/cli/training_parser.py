"""The pieces a training ``CLI`` is built from: its argument parser, the config-saving callback, a scheduler.

``CLIArgumentParser`` is jsonargparse's parser plus what a training command line needs: argument
groups for a Trainer, module, data module or callback class (:meth:`CLIArgumentParser.add_class_args`),
and for an optimizer and a learning-rate scheduler chosen on the command line
(``--optimizer=Adam --optimizer.lr=0.01 --lr_scheduler=StepLR --lr_scheduler.step_size=10``).
Everything else jsonargparse offers (``link_arguments``, ``add_argument`` …) works as documented
there. ``SaveConfigCallback`` writes the parsed configuration next to the run's logs, so that
``--config <log_dir>/config.yaml`` repeats the run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Union

import torch
from jsonargparse import ArgumentParser, Namespace

from drivetrain._utilities import paths
from drivetrain.trainer.callbacks.callback import Callback
from drivetrain.trainer.datamodule import DataModule
from drivetrain.trainer.module import TrainingModule
from drivetrain.trainer.trainer import Trainer

if TYPE_CHECKING:
    from drivetrain.trainer.trainer import Trainer as TrainerType

#: Means "build it and return it from the model's ``configure_optimizers``" (the CLI does this).
AUTOMATIC = "AUTOMATIC"
OPTIMIZER_CLASSES: tuple[type, ...] = (torch.optim.Optimizer,)
SCHEDULER_CLASSES: tuple[type, ...] = (
    torch.optim.lr_scheduler.LRScheduler,
    torch.optim.lr_scheduler.ReduceLROnPlateau,
)


class ReduceLROnPlateau(torch.optim.lr_scheduler.ReduceLROnPlateau):
    """torch's ``ReduceLROnPlateau`` that also names the logged value it watches.

    With ``--lr_scheduler=ReduceLROnPlateau --lr_scheduler.monitor=val_loss`` the CLI hands the
    Trainer ``{"scheduler": ..., "monitor": "val_loss"}``, which a plateau scheduler needs.

    Args:
        optimizer: the optimizer whose learning rate is reduced.
        monitor: the logged value to watch (``self.log(monitor, ...)`` in the module).
        *args: torch's ``ReduceLROnPlateau`` arguments after ``optimizer``.
        **kwargs: torch's ``ReduceLROnPlateau`` keyword arguments (``mode``, ``factor``, ``patience`` …).
    """

    def __init__(self, optimizer: torch.optim.Optimizer, monitor: str, *args: Any, **kwargs: Any) -> None:
        super().__init__(optimizer, *args, **kwargs)
        self.monitor = monitor


class CLIArgumentParser(ArgumentParser):
    """jsonargparse's ``ArgumentParser`` with argument groups for the classes of a training run.

    Args:
        *args: passed to jsonargparse's ``ArgumentParser``.
        description: shown by ``--help``.
        env_prefix: prefix of the environment variables read with ``default_env=True``
            (``DRIVETRAIN_TRAINER__MAX_EPOCHS=3``).
        default_env: also read arguments from environment variables.
        **kwargs: passed to jsonargparse's ``ArgumentParser``.

    Attributes:
        callback_keys: the groups added for callback classes; the CLI adds the callbacks built
            from them to the Trainer's.
    """

    def __init__(
        self,
        *args: Any,
        description: str = "Train, validate, test or predict with drivetrain.",
        env_prefix: str = "DRIVETRAIN",
        default_env: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            *args, description=description, env_prefix=env_prefix, default_env=default_env, **kwargs
        )
        self.callback_keys: list[str] = []
        self.optimizers: dict[str, tuple[type | tuple[type, ...], str]] = {}
        self.lr_schedulers: dict[str, tuple[type | tuple[type, ...], str]] = {}

    def add_class_args(
        self, cls: type, nested_key: str, subclass_mode: bool = False, required: bool = True
    ) -> list[str]:
        """Add the ``__init__`` arguments of a Trainer, TrainingModule, DataModule or Callback class.

        Args:
            cls: a subclass of ``Trainer``, ``TrainingModule``, ``DataModule`` or ``Callback``.
            nested_key: the group's name (``--<nested_key>.<argument>``).
            subclass_mode: accept any subclass, chosen on the command line
                (``--<nested_key>=package.Class``).
            required: whether the group must be given (subclass mode only).

        Returns:
            The names of the arguments added.

        Raises:
            TypeError: ``cls`` is none of those classes.
        """
        bases = (Trainer, TrainingModule, DataModule, Callback)
        if not (isinstance(cls, type) and issubclass(cls, bases)):
            raise TypeError(
                f"add_class_args({cls!r}, {nested_key!r}): expected a subclass of Trainer, TrainingModule, "
                f"DataModule or Callback. For other classes use jsonargparse's add_class_arguments."
            )
        if issubclass(cls, Callback):
            self.callback_keys.append(nested_key)
        if subclass_mode:
            added = self.add_subclass_arguments(cls, nested_key, fail_untyped=False, required=required)
        else:
            added = self.add_class_arguments(
                cls,
                nested_key,
                fail_untyped=False,
                instantiate=not issubclass(cls, Trainer),
                sub_configs=True,
            )
        return list(added or [])

    #: The name Lightning programs call (``parser.add_lightning_class_args(EarlyStopping, "early_stopping")``).
    add_lightning_class_args = add_class_args

    def add_optimizer_args(
        self,
        optimizer_class: type | tuple[type, ...] = OPTIMIZER_CLASSES,
        nested_key: str = "optimizer",
        link_to: str = AUTOMATIC,
    ) -> None:
        """Add an optimizer chosen on the command line (``--optimizer=Adam --optimizer.lr=0.01``).

        Args:
            optimizer_class: an optimizer class, or a tuple of base classes to choose a subclass of.
            nested_key: the group's name.
            link_to: ``"AUTOMATIC"``: the CLI builds the optimizer and returns it from the model's
                ``configure_optimizers``; or the dotted name of an argument (``"model.optimizer"``) that
                receives the choice, for a model that builds its optimizers itself.
        """
        _check_classes(optimizer_class, OPTIMIZER_CLASSES, "add_optimizer_args", "torch.optim.Optimizer")
        options: dict[str, Any] = {"instantiate": False, "fail_untyped": False, "skip": {"params"}}
        if isinstance(optimizer_class, tuple):
            self.add_subclass_arguments(optimizer_class, nested_key, **options)
        else:
            self.add_class_arguments(optimizer_class, nested_key, sub_configs=True, **options)
        self.optimizers[nested_key] = (optimizer_class, link_to)

    def add_lr_scheduler_args(
        self,
        lr_scheduler_class: type | tuple[type, ...] = SCHEDULER_CLASSES,
        nested_key: str = "lr_scheduler",
        link_to: str = AUTOMATIC,
    ) -> None:
        """Add a learning-rate scheduler chosen on the command line (``--lr_scheduler=StepLR``).

        Args:
            lr_scheduler_class: a scheduler class (``LRScheduler`` or ``ReduceLROnPlateau``), or a
                tuple of base classes to choose a subclass of.
            nested_key: the group's name.
            link_to: ``"AUTOMATIC"`` (see :meth:`add_optimizer_args`) or an argument's dotted name.
        """
        _check_classes(
            lr_scheduler_class,
            SCHEDULER_CLASSES,
            "add_lr_scheduler_args",
            "torch.optim.lr_scheduler.LRScheduler or ReduceLROnPlateau",
        )
        options: dict[str, Any] = {"instantiate": False, "fail_untyped": False, "skip": {"optimizer"}}
        if isinstance(lr_scheduler_class, tuple):
            self.add_subclass_arguments(lr_scheduler_class, nested_key, **options)
        else:
            self.add_class_arguments(lr_scheduler_class, nested_key, sub_configs=True, **options)
        self.lr_schedulers[nested_key] = (lr_scheduler_class, link_to)


def _check_classes(given: type | tuple[type, ...], allowed: tuple[type, ...], method: str, what: str) -> None:
    classes = given if isinstance(given, tuple) else (given,)
    wrong = [c for c in classes if not (isinstance(c, type) and issubclass(c, allowed))]
    if wrong:
        raise TypeError(f"{method}: {wrong[0]!r} is not a subclass of {what}.")


class SaveConfigCallback(Callback):
    """Write the parsed configuration to ``<trainer.log_dir>/config.yaml`` when the run is set up.

    The CLI adds one to the Trainer's callbacks (``CLI(save_config_callback=None)`` leaves it
    out; ``save_config_kwargs`` are passed to it). ``python train.py fit --config <that file>``
    repeats the run. Global rank 0 writes; the folder may be remote (``s3://…``).

    Args:
        parser: the parser that read the configuration.
        config: the parsed configuration.
        config_filename: the file's name inside the log folder.
        overwrite: replace a file of that name; otherwise an existing one is an error (it
            belongs to an earlier run).
        multifile: keep the structure of several config files given on the command line.
        save_to_log_dir: write into the log folder; ``False`` only makes sense in a subclass whose
            :meth:`save_config` stores the configuration elsewhere.

    Raises:
        ValueError: ``save_to_log_dir=False`` without an overridden :meth:`save_config`.
    """

    def __init__(
        self,
        parser: ArgumentParser,
        config: Namespace,
        config_filename: str = "config.yaml",
        overwrite: bool = False,
        multifile: bool = False,
        save_to_log_dir: bool = True,
    ) -> None:
        if not save_to_log_dir and type(self).save_config is SaveConfigCallback.save_config:
            raise ValueError(
                "SaveConfigCallback(save_to_log_dir=False) would save nothing: subclass it and override "
                "save_config(trainer, pl_module, stage) to store the configuration elsewhere, or pass "
                "CLI(save_config_callback=None) to save no configuration."
            )
        self.parser = parser
        self.config = config
        self.config_filename = config_filename
        self.overwrite = overwrite
        self.multifile = multifile
        self.save_to_log_dir = save_to_log_dir
        self.already_saved = False

    def setup(self, trainer: TrainerType, pl_module: TrainingModule, stage: str) -> None:
        if self.already_saved:
            return
        if self.save_to_log_dir:
            self._write(trainer)
        if trainer.is_global_zero:
            self.save_config(trainer, pl_module, stage)
            self.already_saved = True
        self.already_saved = trainer.strategy.broadcast(self.already_saved)

    def _write(self, trainer: TrainerType) -> None:

        log_dir = trainer.log_dir
        path = paths.join(log_dir, self.config_filename)
        exists = paths.isfile(path) if trainer.is_global_zero and not self.overwrite else False
        if trainer.strategy.broadcast(exists):
            raise RuntimeError(
                f"SaveConfigCallback: {path} exists (an earlier run's configuration); refusing to overwrite it. "
                f"Use a new log folder, delete the file, pass CLI(save_config_kwargs={{'overwrite': True}}) to "
                f"replace it, or CLI(save_config_callback=None) to save no configuration."
            )
        if not trainer.is_global_zero:
            return
        paths.makedirs(log_dir)
        if self.multifile and not paths.is_remote(path):
            self.parser.save(
                self.config, path, skip_unset=False, skip_validation=True, overwrite=True, multifile=True
            )
            return
        with paths.open_file(path, "w") as file:
            file.write(self.parser.dump(self.config, skip_unset=False, skip_validation=True))

    def save_config(self, trainer: TrainerType, pl_module: TrainingModule, stage: str) -> None:
        """Override to store the configuration somewhere else too (runs on global rank 0 only).

        Example:
            ```python
            class LogConfig(SaveConfigCallback):
                def save_config(self, trainer, pl_module, stage):
                    text = self.parser.dump(self.config, skip_unset=False)
                    trainer.logger.log_hyperparams({"config": text})
            ```

        Runs on global rank 0 only, so it must not call collectives (the other ranks would wait
        for ever); override :meth:`setup` for that.
        """


# A type alias jsonargparse can read for ``--seed_everything``.
SeedType = Union[bool, int, None]
