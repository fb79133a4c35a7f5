"""``CLI``: a command line for a training script, built from the Trainer's, model's and data's signatures.

::

    # train.py
    from drivetrain.cli import CLI
    CLI(MyModel, MyData)

    python train.py fit --trainer.accelerator=xpu --trainer.devices=2 --model.lr=0.01
    python train.py fit --optimizer=AdamW --optimizer.lr=3e-4 --lr_scheduler=StepLR --lr_scheduler.step_size=5
    python train.py fit --config run.yaml --print_config
    python train.py test --ckpt_path=best.ckpt

Subcommands ``fit``, ``validate``, ``test`` and ``predict`` take ``--trainer.*`` (every
``Trainer`` argument), ``--model.*`` and ``--data.*`` (the ``__init__`` arguments of the
classes given), ``--optimizer``/``--lr_scheduler``, the entry point's own options
(``--ckpt_path`` …), ``--seed_everything`` and ``--config``. The surface is LightningCLI's: the
same constructor arguments, hooks (``add_arguments_to_parser``, ``before_instantiate_classes``,
``before_fit`` …) and seeding default. Accelerator and strategy names are resolved by the Trainer,
so a name the script registers works like a built-in one. Needs ``jsonargparse``
(``pip install 'drivetrain[cli]'``).
"""

from __future__ import annotations

import importlib
import sys
import warnings
from collections.abc import Sequence
from functools import partial
from types import MethodType
from typing import Any

from drivetrain._utilities.imports import require
from drivetrain._utilities.seed import seed_everything
from drivetrain.cli.launcher_arguments import drop_launcher_arguments
from drivetrain.trainer.datamodule import DataModule
from drivetrain.trainer.hooks import overrides
from drivetrain.trainer.module import TrainingModule
from drivetrain.trainer.trainer import Trainer

require("jsonargparse", extra="cli", feature="drivetrain.cli.CLI")

from drivetrain.cli.training_parser import (  # noqa: E402 - after the check that names the extra
    AUTOMATIC,
    OPTIMIZER_CLASSES,
    SCHEDULER_CLASSES,
    CLIArgumentParser,
    ReduceLROnPlateau,
    SaveConfigCallback,
    SeedType,
)

#: Modules whose classes ``--trainer.callbacks`` / ``--trainer.logger`` list and accept by short name.
_KNOWN_CLASS_MODULES = (
    "drivetrain.trainer.callbacks",
    "drivetrain.loggers",
)


class CLI:
    """Parse the command line, build the Trainer, model and data, and run the chosen entry point.

    The constructor does everything; subclass it and override a hook to change one step. In
    order: :meth:`init_parser`, :meth:`add_default_arguments_to_parser`,
    :meth:`add_core_arguments_to_parser`, :meth:`add_arguments_to_parser` (yours: extra
    arguments, ``parser.link_arguments(...)``), :meth:`parse_arguments`, seeding,
    :meth:`before_instantiate_classes`, :meth:`instantiate_classes` (which calls
    :meth:`instantiate_trainer`), :meth:`after_instantiate_classes`, then ``before_<subcommand>``,
    the Trainer's method (or a method of this class named after the subcommand) and
    ``after_<subcommand>``.

    Args:
        model_class: the ``TrainingModule`` to build from ``--model.*``; ``None`` lets the
            command line name one (``--model=package.Class``).
        datamodule_class: the ``DataModule`` to build from ``--data.*``; ``None`` lets the
            command line name one (``--data=package.Class``), or use none.
        save_config_callback: the callback class that writes the parsed configuration to
            ``<log_dir>/config.yaml`` (:class:`SaveConfigCallback`); ``None`` writes nothing.
        save_config_kwargs: keyword arguments for it, e.g. ``{"overwrite": True}``.
        trainer_class: the Trainer class (a subclass, to add arguments).
        trainer_defaults: defaults for ``--trainer.*`` arguments. ``"callbacks"`` here are
            callback instances added to every run, after those of the command line.
        seed_everything_default: the default of ``--seed_everything``: ``True`` seeds with
            ``DRIVETRAIN_GLOBAL_SEED`` or 0 (as LightningCLI), an int seeds with it, ``False`` or
            ``None`` does not seed. The seed used is written into the saved configuration.
        parser_kwargs: keyword arguments for the parsers; a key named after a subcommand
            (``{"fit": {"default_config_files": [...]}}``) applies to that subcommand's parser.
        parser_class: the parser class (a :class:`CLIArgumentParser` subclass).
        subclass_mode_model: let the command line choose any subclass of ``model_class``.
        subclass_mode_data: let the command line choose any subclass of ``datamodule_class``.
        args: the arguments to parse (default ``sys.argv[1:]``); a list or a dict.
        run: run a subcommand; with ``False`` there are no subcommands and the script calls
            ``cli.trainer.fit(cli.model)`` itself.
        auto_configure_optimizers: add ``--optimizer`` and ``--lr_scheduler``; when an optimizer
            is given there, the model's ``configure_optimizers`` returns it (and the scheduler).

    Raises:
        TypeError: a class argument is not a subclass of what it should be.

    After construction ``.trainer``, ``.model`` and ``.datamodule`` hold what was built,
    ``.config`` what was parsed, ``.config_init`` the built objects and ``.subcommand`` the
    subcommand run (``None`` with ``run=False``).
    """

    def __init__(
        self,
        model_class: type[TrainingModule] | None = None,
        datamodule_class: type[DataModule] | None = None,
        *,
        save_config_callback: type[SaveConfigCallback] | None = SaveConfigCallback,
        save_config_kwargs: dict[str, Any] | None = None,
        trainer_class: type[Trainer] = Trainer,
        trainer_defaults: dict[str, Any] | None = None,
        seed_everything_default: bool | int | None = True,
        parser_kwargs: dict[str, Any] | None = None,
        parser_class: type[CLIArgumentParser] = CLIArgumentParser,
        subclass_mode_model: bool = False,
        subclass_mode_data: bool = False,
        args: Sequence[str] | dict[str, Any] | None = None,
        run: bool = True,
        auto_configure_optimizers: bool = True,
    ) -> None:
        _check_class("model_class", model_class, TrainingModule, "drivetrain.TrainingModule", optional=True)
        _check_class("datamodule_class", datamodule_class, DataModule, "drivetrain.DataModule", optional=True)
        _check_class("trainer_class", trainer_class, Trainer, "drivetrain.Trainer")
        _check_class(
            "save_config_callback",
            save_config_callback,
            SaveConfigCallback,
            "drivetrain.cli.SaveConfigCallback (or None)",
            optional=True,
        )
        _check_class("parser_class", parser_class, CLIArgumentParser, "drivetrain.cli.CLIArgumentParser")
        if not isinstance(seed_everything_default, (bool, int, type(None))):
            raise TypeError(
                f"CLI(seed_everything_default=...) takes True (seed with 0 or DRIVETRAIN_GLOBAL_SEED), an int, "
                f"or False/None (no seeding); got {seed_everything_default!r}."
            )
        _import_known_classes()
        self.model_class = model_class
        self.datamodule_class = datamodule_class
        self.save_config_callback = save_config_callback
        self.save_config_kwargs = dict(save_config_kwargs or {})
        self.trainer_class = trainer_class
        self.trainer_defaults = dict(trainer_defaults or {})
        self.seed_everything_default = seed_everything_default
        self.parser_class = parser_class
        self.subclass_mode_model = model_class is None or subclass_mode_model
        self.subclass_mode_data = datamodule_class is None or subclass_mode_data
        self.auto_configure_optimizers = auto_configure_optimizers

        kwargs = dict(parser_kwargs or {})
        subcommand_kwargs = {name: kwargs.pop(name) for name in self.subcommands() if name in kwargs}
        self.setup_parser(run, kwargs, subcommand_kwargs)
        if args is None:
            # DeepSpeed's launcher and torch.distributed.launch add --local_rank=N, which the
            # parser does not know (the rank also arrives as LOCAL_RANK, which drivetrain reads).
            args = drop_launcher_arguments(sys.argv[1:])
        self.parse_arguments(self.parser, args)
        self.subcommand: str | None = self.config["subcommand"] if run else None
        self._set_seed()
        self.before_instantiate_classes()
        self.instantiate_classes()
        self.after_instantiate_classes()
        if self.subcommand is not None:
            self._run_subcommand(self.subcommand)

    # -- the parser -----------------------------------------------------------------------------
    def init_parser(self, **kwargs: Any) -> CLIArgumentParser:
        """A new parser (of ``parser_class``) with ``--config``."""
        parser = self.parser_class(**kwargs)
        parser.add_argument("-c", "--config", action="config", help="A YAML/JSON file with the arguments.")
        return parser

    def setup_parser(
        self, add_subcommands: bool, main_kwargs: dict[str, Any], subparser_kwargs: dict[str, Any]
    ) -> None:
        """Build ``self.parser``: with one sub-parser per subcommand, or the arguments alone."""
        self.parser = self.init_parser(**main_kwargs)
        self._subcommand_parsers: dict[str, CLIArgumentParser] = {}
        self._subcommand_method_arguments: dict[str, list[str]] = {}
        if not add_subcommands:
            self._add_arguments(self.parser)
            return
        commands = self.parser.add_subcommands(required=True, dest="subcommand")
        for name, skip in self.subcommands().items():
            description = _first_line(getattr(self.trainer_class, name))
            kwargs = {"description": description, **subparser_kwargs.get(name, {})}
            parser = self.init_parser(**kwargs)
            self._add_arguments(parser)
            added = parser.add_method_arguments(self.trainer_class, name, skip=set(skip), fail_untyped=False)
            self._subcommand_method_arguments[name] = list(added or [])
            self._subcommand_parsers[name] = parser
            commands.add_subcommand(name, parser, help=description)

    def _add_arguments(self, parser: CLIArgumentParser) -> None:
        self.add_default_arguments_to_parser(parser)
        self.add_core_arguments_to_parser(parser)
        self.add_arguments_to_parser(parser)
        if self.auto_configure_optimizers:
            if not parser.optimizers:  # add_arguments_to_parser may have added its own
                parser.add_optimizer_args(OPTIMIZER_CLASSES)
            if not parser.lr_schedulers:
                parser.add_lr_scheduler_args(SCHEDULER_CLASSES)
        self.link_optimizers_and_lr_schedulers(parser)

    def add_default_arguments_to_parser(self, parser: CLIArgumentParser) -> None:
        """Add ``--seed_everything``."""
        parser.add_argument(
            "--seed_everything",
            type=SeedType,
            default=self.seed_everything_default,
            help=(
                "Seed every random generator before the classes are built (drivetrain.seed_everything): an int "
                "seeds with it, true with DRIVETRAIN_GLOBAL_SEED or 0, false does not seed."
            ),
        )

    def add_core_arguments_to_parser(self, parser: CLIArgumentParser) -> None:
        """Add ``--trainer.*``, ``--model.*`` and ``--data.*``."""
        parser.add_class_args(self.trainer_class, "trainer")
        defaults = {f"trainer.{k}": v for k, v in self.trainer_defaults.items() if k != "callbacks"}
        if defaults:
            parser.set_defaults(defaults)
        parser.add_class_args(
            self.model_class or TrainingModule, "model", subclass_mode=self.subclass_mode_model
        )
        parser.add_class_args(
            self.datamodule_class or DataModule,
            "data",
            subclass_mode=self.subclass_mode_data,
            required=self.datamodule_class is not None,
        )

    def add_arguments_to_parser(self, parser: CLIArgumentParser) -> None:
        """Override to add arguments or link them (``parser.link_arguments("data.classes", "model.classes")``).

        Args:
            parser: the parser being built (called once per subcommand's parser).
        """

    @staticmethod
    def subcommands() -> dict[str, set[str]]:
        """The subcommands, each with the Trainer-method arguments the command line does not take."""
        return {
            "fit": {"model", "train_dataloaders", "val_dataloaders", "datamodule"},
            "validate": {"model", "dataloaders", "datamodule"},
            "test": {"model", "dataloaders", "datamodule"},
            "predict": {"model", "dataloaders", "datamodule"},
        }

    @staticmethod
    def link_optimizers_and_lr_schedulers(parser: CLIArgumentParser) -> None:
        """Link each optimizer or scheduler group added with a ``link_to`` target to that argument."""
        for key, (classes, link_to) in {**parser.optimizers, **parser.lr_schedulers}.items():
            if link_to == AUTOMATIC:
                continue
            if isinstance(classes, tuple):
                parser.link_arguments(key, link_to)
            else:
                parser.link_arguments(key, link_to, compute_fn=partial(_with_class_path, classes))

    def parse_arguments(self, parser: CLIArgumentParser, args: Sequence[str] | dict[str, Any]) -> None:
        """Parse ``args`` into ``self.config``."""
        if isinstance(args, dict):
            self.config = parser.parse_object(args)
        else:
            self.config = parser.parse_args(list(args))

    # -- building ---------------------------------------------------------------------------------
    def _get(self, config: Any, key: str, default: Any = None) -> Any:
        """``key`` of the subcommand's section of ``config`` (of ``config`` itself without subcommands)."""
        section = config.get(self.subcommand, config) if self.subcommand else config
        return section.get(key, default)

    def _parser(self, subcommand: str | None) -> CLIArgumentParser:
        return self.parser if subcommand is None else self._subcommand_parsers[subcommand]

    def _set_seed(self) -> None:
        seed = self._get(self.config, "seed_everything")
        if seed is None or seed is False:
            return

        used = seed_everything(None if seed is True else seed, workers=True)
        section = self.config[self.subcommand] if self.subcommand else self.config
        section["seed_everything"] = used

    def before_instantiate_classes(self) -> None:
        """Override to run code after parsing, before the model, data and Trainer are built."""

    def instantiate_classes(self) -> None:
        """Build the model, data and Trainer (``.model``, ``.datamodule``, ``.trainer``)."""
        self.config_init = self.parser.instantiate(self.config)
        self.model: TrainingModule = self._get(self.config_init, "model")
        self.datamodule: DataModule | None = self._get(self.config_init, "data")
        self._add_configure_optimizers_method_to_model(self.subcommand)
        self.trainer: Trainer = self.instantiate_trainer()

    def after_instantiate_classes(self) -> None:
        """Override to run code after the model, data and Trainer are built, before the subcommand runs."""

    def instantiate_trainer(self, **kwargs: Any) -> Trainer:
        """Build the Trainer from ``--trainer.*``, the extra callback groups and ``kwargs`` (which win)."""
        parser = self._parser(self.subcommand)
        built = self._get(self.config_init, "trainer")
        config = {name: built[name] for name in built.keys() if "." not in name}  # noqa: SIM118
        config.update(kwargs)
        callbacks = config.get("callbacks")
        callbacks = (
            [] if callbacks is None else list(callbacks) if isinstance(callbacks, list) else [callbacks]
        )
        callbacks += [self._get(self.config_init, key) for key in parser.callback_keys]
        defaults = self.trainer_defaults.get("callbacks")
        if defaults is not None:
            callbacks += defaults if isinstance(defaults, list) else [defaults]
        if self.save_config_callback is not None and not config.get("fast_dev_run"):
            section = self.config[self.subcommand] if self.subcommand else self.config
            callbacks.append(self.save_config_callback(parser, section, **self.save_config_kwargs))
        config["callbacks"] = callbacks
        try:
            return self.trainer_class(**config)
        except (ValueError, TypeError) as error:
            parser.error(str(error))
            raise  # parser.error exits; this keeps type checkers informed

    @staticmethod
    def configure_optimizers(module: TrainingModule, optimizer: Any, lr_scheduler: Any = None) -> Any:
        """What the model's ``configure_optimizers`` returns for ``--optimizer``/``--lr_scheduler``.

        Override to return something else.

        Args:
            module: the model.
            optimizer: the optimizer built from ``--optimizer``.
            lr_scheduler: the scheduler built from ``--lr_scheduler`` (``None`` without one).
        """
        if lr_scheduler is None:
            return optimizer
        if isinstance(lr_scheduler, ReduceLROnPlateau):
            return {
                "optimizer": optimizer,
                "lr_scheduler": {"scheduler": lr_scheduler, "monitor": lr_scheduler.monitor},
            }
        return [optimizer], [lr_scheduler]

    def _add_configure_optimizers_method_to_model(self, subcommand: str | None) -> None:
        if not self.auto_configure_optimizers:
            return
        parser = self._parser(subcommand)
        optimizers = [k for k, (_, link) in parser.optimizers.items() if link == AUTOMATIC]
        schedulers = [k for k, (_, link) in parser.lr_schedulers.items() if link == AUTOMATIC]
        if not optimizers:
            return
        if len(optimizers) > 1 or len(schedulers) > 1:
            raise ValueError(
                f"{type(self).__name__}: at most one optimizer and one learning-rate scheduler group can be "
                f"'AUTOMATIC', found {optimizers + schedulers}. Give the others a link_to target and build them in "
                f"the model's configure_optimizers."
            )
        optimizer_init = _class_config(
            parser.optimizers[optimizers[0]][0], self._get(self.config_init, optimizers[0])
        )
        if not optimizer_init:
            return  # no --optimizer given: the model's own configure_optimizers applies
        scheduler_init = None
        if schedulers:
            scheduler_init = _class_config(
                parser.lr_schedulers[schedulers[0]][0], self._get(self.config_init, schedulers[0])
            )

        if overrides(self.model, TrainingModule, "configure_optimizers"):
            warnings.warn(
                f"{type(self.model).__name__}.configure_optimizers is replaced by the optimizer given with "
                f"--{optimizers[0]} ({type(self).__name__}.configure_optimizers).",
                UserWarning,
                stacklevel=2,
            )
        optimizer = _build(optimizer_init, self.model.parameters())
        scheduler = _build(scheduler_init, optimizer) if scheduler_init else None
        configure = partial(self.configure_optimizers, optimizer=optimizer, lr_scheduler=scheduler)
        self.model.configure_optimizers = MethodType(lambda module: configure(module), self.model)  # type: ignore[method-assign]

    # -- running ----------------------------------------------------------------------------------
    def _run_subcommand(self, subcommand: str) -> None:
        before = getattr(self, f"before_{subcommand}", None)
        if callable(before):
            before()
        method = getattr(self, subcommand, None) or getattr(self.trainer, subcommand)
        section = self.config_init[subcommand]
        kwargs = {k: section[k] for k in self._subcommand_method_arguments[subcommand] if k in section}
        kwargs["model"] = self.model
        if self.datamodule is not None:
            kwargs["datamodule"] = self.datamodule
        self.result = method(**kwargs)
        after = getattr(self, f"after_{subcommand}", None)
        if callable(after):
            after()


def _check_class(name: str, value: Any, base: type, public_name: str, optional: bool = False) -> None:
    if value is None and optional:
        return
    if not (isinstance(value, type) and issubclass(value, base)):
        raise TypeError(f"CLI({name}=...) expects a subclass of {public_name}, got {value!r}.")


def _import_known_classes() -> None:
    """Import the built-in callbacks and loggers, so the parser lists them and takes their short names."""
    for package_name in _KNOWN_CLASS_MODULES:
        package = importlib.import_module(package_name)
        for name in getattr(package, "__all__", ()):
            try:
                getattr(package, name)
            except ImportError:  # an optional extra (rich …) that is not installed
                continue


def _class_config(classes: Any, init: Any) -> dict[str, Any] | None:
    """``{"class_path", "init_args"}`` for a parsed optimizer/scheduler group (``None`` when not given)."""
    if init is None:
        return None
    if hasattr(init, "as_dict"):
        init = init.as_dict()
    if isinstance(classes, tuple):
        return init or None
    return _with_class_path(classes, init)


def _with_class_path(cls: type, init_args: Any) -> dict[str, Any]:
    if hasattr(init_args, "as_dict"):
        init_args = init_args.as_dict()
    return {"class_path": f"{cls.__module__}.{cls.__name__}", "init_args": dict(init_args or {})}


def _build(config: dict[str, Any], first: Any) -> Any:
    """``Class(first, **init_args)`` from a ``{"class_path", "init_args"}`` dict."""
    module_name, _, class_name = config["class_path"].rpartition(".")
    cls = getattr(importlib.import_module(module_name), class_name)
    return cls(first, **config.get("init_args", {}))


def _first_line(function: Any) -> str:
    return (function.__doc__ or "").strip().splitlines()[0] if function.__doc__ else ""
