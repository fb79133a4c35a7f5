"""``CLI``: a command line for a training script, built from the Trainer's, model's and data's signatures.

::

    # train.py
    from drivetrain.cli import CLI
    CLI(MyModel, MyData)

    python train.py fit --trainer.accelerator=xpu --trainer.devices=2 --model.lr=0.01
    python train.py fit --config run.yaml --print_config
    python train.py test --ckpt_path=best.ckpt

Subcommands ``fit``, ``validate``, ``test`` and ``predict`` take ``--trainer.*`` (every
``Trainer`` argument), ``--model.*`` and ``--data.*`` (the ``__init__`` arguments of the
classes given), the entry point's own options (``--ckpt_path`` …), ``--seed_everything`` and
``--config``. Accelerator and strategy names are resolved by the Trainer, so a name the script
registers (a custom accelerator's ``register_accelerators``) works like a built-in one, and an
unknown one is reported with the registry's list. Needs ``jsonargparse`` (``pip install
'drivetrain[cli]'``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Any

from drivetrain._utilities.imports import require
from drivetrain.cli.launcher_arguments import drop_launcher_arguments
from drivetrain.trainer.datamodule import DataModule
from drivetrain.trainer.module import TrainingModule
from drivetrain.trainer.trainer import Trainer

SUBCOMMANDS: dict[str, set[str]] = {
    "fit": {"model", "train_dataloaders", "val_dataloaders", "datamodule"},
    "validate": {"model", "dataloaders", "datamodule"},
    "test": {"model", "dataloaders", "datamodule"},
    "predict": {"model", "dataloaders", "datamodule"},
}


class CLI:
    """Parse the command line, build the Trainer, model and data, and run the chosen entry point.

    Args:
        model_class: the :class:`TrainingModule` to build from ``--model.*``; ``None`` lets the
            command line name one (``--model=package.Class``).
        datamodule_class: the :class:`DataModule` to build from ``--data.*`` (optional).
        args: the arguments to parse (default ``sys.argv[1:]``); a list or a dict.
        run: run a subcommand; with ``False`` there are no subcommands and the script calls
            ``cli.trainer.fit(cli.model)`` itself.
        trainer_class: the Trainer class (a subclass, to add arguments).
        trainer_defaults: defaults for ``--trainer.*`` arguments.
        seed_everything_default: the default of ``--seed_everything`` (``None``: no seeding).
        save_config: write the resolved configuration to ``<log_dir>/config.yaml`` when fitting.
        parser_kwargs: passed to ``jsonargparse.ArgumentParser``.

    After construction ``.trainer``, ``.model`` and ``.datamodule`` hold what was built, and
    ``.config`` what was parsed.
    """

    def __init__(
        self,
        model_class: type[TrainingModule] | None = None,
        datamodule_class: type[DataModule] | None = None,
        *,
        args: Sequence[str] | dict[str, Any] | None = None,
        run: bool = True,
        trainer_class: type[Trainer] = Trainer,
        trainer_defaults: dict[str, Any] | None = None,
        seed_everything_default: int | None = None,
        save_config: bool = True,
        parser_kwargs: dict[str, Any] | None = None,
    ) -> None:
        require("jsonargparse", extra="cli", feature="drivetrain.cli.CLI")
        for name, value, base in (
            ("model_class", model_class, TrainingModule),
            ("datamodule_class", datamodule_class, DataModule),
        ):
            if value is not None and not (isinstance(value, type) and issubclass(value, base)):
                raise TypeError(
                    f"CLI({name}=...) expects a subclass of drivetrain.{base.__name__}, got {value!r}."
                )
        self.model_class = model_class
        self.datamodule_class = datamodule_class
        self.trainer_class = trainer_class
        self.trainer_defaults = dict(trainer_defaults or {})
        self.seed_everything_default = seed_everything_default
        self.save_config = save_config
        self.parser = self._build_parser(run, parser_kwargs or {})
        if args is None:
            # DeepSpeed's launcher and torch.distributed.launch add --local_rank=N, which the
            # parser does not know (the rank also arrives as LOCAL_RANK, which drivetrain reads).
            args = drop_launcher_arguments(sys.argv[1:])
        self.config = (
            self.parser.parse_args(args) if not isinstance(args, dict) else self.parser.parse_object(args)
        )
        self.subcommand: str | None = self.config["subcommand"] if run else None
        self._section = self.config[self.subcommand] if self.subcommand else self.config
        self._parser_in_use = self._subparsers[self.subcommand] if self.subcommand else self.parser
        self._instantiate()
        if self.subcommand is not None:
            self._run()

    # -- the parser -----------------------------------------------------------------------------
    def _build_parser(self, run: bool, parser_kwargs: dict[str, Any]) -> Any:
        from jsonargparse import ArgumentParser

        description = parser_kwargs.pop("description", "Train, validate, test or predict with drivetrain.")
        root = ArgumentParser(description=description, **parser_kwargs)
        self._subparsers: dict[str, Any] = {}
        if not run:
            self._add_arguments(root, None)
            return root
        root.add_argument("--config", action="config", help="A YAML/JSON file with the arguments.")
        commands = root.add_subcommands(required=True, dest="subcommand")
        for name in SUBCOMMANDS:
            parser = ArgumentParser(description=f"Trainer.{name}: {_first_line(getattr(Trainer, name))}")
            self._add_arguments(parser, name)
            self._subparsers[name] = parser
            commands.add_subcommand(name, parser, help=f"Run Trainer.{name}.")
        return root

    def _add_arguments(self, parser: Any, subcommand: str | None) -> None:
        parser.add_argument("--config", action="config", help="A YAML/JSON file with the arguments.")
        parser.add_argument(
            "--seed_everything",
            type=int | None,
            default=self.seed_everything_default,
            help="Seed every random generator with this value first (drivetrain.seed_everything).",
        )
        parser.add_class_arguments(self.trainer_class, "trainer", instantiate=False, fail_untyped=False)
        if self.trainer_defaults:
            parser.set_defaults({f"trainer.{k}": v for k, v in self.trainer_defaults.items()})
        if self.model_class is not None:
            parser.add_class_arguments(self.model_class, "model", fail_untyped=False)
        else:
            parser.add_subclass_arguments(TrainingModule, "model", required=True)
        if self.datamodule_class is not None:
            parser.add_class_arguments(self.datamodule_class, "data", fail_untyped=False)
        if subcommand is not None:
            parser.add_method_arguments(
                self.trainer_class, subcommand, skip=SUBCOMMANDS[subcommand], fail_untyped=False
            )

    # -- building and running --------------------------------------------------------------------
    def _instantiate(self) -> None:
        parser, section = self._parser_in_use, self._section
        seed = section.get("seed_everything")
        if seed is not None:
            from drivetrain._utilities.seed import seed_everything

            seed_everything(seed)
        built = parser.instantiate(section)
        self.config_init = built
        self.model: TrainingModule = built["model"]
        self.datamodule: DataModule | None = built.get("data") if self.datamodule_class is not None else None
        trainer_args = {name: built["trainer"][name] for name in built["trainer"].keys() if "." not in name}  # noqa: SIM118
        try:
            self.trainer: Trainer = self.trainer_class(**trainer_args)
        except (ValueError, TypeError) as error:
            parser.error(str(error))

    def _run(self) -> None:
        assert self.subcommand is not None
        section = self._section
        options = {
            name: section[name]
            for name in _method_parameters(self.trainer_class, self.subcommand)
            if name not in SUBCOMMANDS[self.subcommand] and name in section
        }
        if self.subcommand == "fit" and self.save_config:
            self._write_config()
        method = getattr(self.trainer, self.subcommand)
        self.result = method(self.model, datamodule=self.datamodule, **options)

    def _write_config(self) -> None:
        trainer = self.trainer
        if not trainer.is_global_zero or not trainer.loggers:
            return
        log_dir = trainer.log_dir
        os.makedirs(log_dir, exist_ok=True)
        self._parser_in_use.save(
            self._section, os.path.join(log_dir, "config.yaml"), overwrite=True, skip_validation=True
        )


def _method_parameters(cls: type, name: str) -> list[str]:
    import inspect

    return [p for p in inspect.signature(getattr(cls, name)).parameters if p != "self"]


def _first_line(function: Any) -> str:
    return (function.__doc__ or "").strip().splitlines()[0] if function.__doc__ else ""
