"""drivetrain.cli.CLI's LightningCLI surface: the seeding default, --optimizer/--lr_scheduler, the
config-saving callback, linked arguments, the hooks, callback classes in --help, trainer_defaults."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import drivetrain as dt
from drivetrain.cli import CLI, CLIArgumentParser, ReduceLROnPlateau, SaveConfigCallback
from drivetrain.lightning_names import LightningCLI, LightningDataModule, LightningModule
from drivetrain.trainer.callbacks import EarlyStopping, LearningRateMonitor

QUIET = ["--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]


@pytest.fixture(autouse=True)
def _in_tmp_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # the default_root_dir of runs without one
    # seed_everything() without a seed reads the seed an earlier CLI run left in the environment.
    for name in ("DRIVETRAIN_GLOBAL_SEED", "DRIVETRAIN_SEED_WORKERS"):
        monkeypatch.setenv(name, "0")
        monkeypatch.delenv(name)


class Net(dt.TrainingModule):
    """A model without configure_optimizers: the command line chooses the optimizer."""

    def __init__(self, width: int = 4, classes: int = 1) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, width), nn.Tanh(), nn.Linear(width, classes))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = nn.functional.mse_loss(self.net(batch[0]).sum(1, keepdim=True), batch[1])
        self.log("loss", loss)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.log("val_loss", nn.functional.mse_loss(self.net(batch[0]).sum(1, keepdim=True), batch[1]))


class Data(dt.DataModule):
    def __init__(self, batch_size: int = 8, classes: int = 3) -> None:
        super().__init__()
        self.batch_size = batch_size
        self.classes = classes

    def train_dataloader(self) -> DataLoader:
        x = torch.randn(32, 4, generator=torch.Generator().manual_seed(0))
        return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=self.batch_size)

    val_dataloader = train_dataloader


def _fit(*args: str, cli_class: type[CLI] = CLI, **kwargs: Any) -> CLI:
    return cli_class(Net, Data, args=["fit", *QUIET, "--trainer.max_epochs=1", *args], **kwargs)


def test_the_lightning_names_are_the_drivetrain_classes() -> None:
    assert (
        LightningModule is dt.TrainingModule and LightningDataModule is dt.DataModule and LightningCLI is CLI
    )
    from drivetrain.lightning_names import LightningArgumentParser

    assert LightningArgumentParser is CLIArgumentParser


def test_runs_are_seeded_by_default_as_lightningcli(tmp_path: Path) -> None:
    built = ["--trainer.logger=false", "--optimizer=SGD"]
    first = CLI(Net, Data, args=built, run=False, save_config_callback=None)
    second = CLI(Net, Data, args=built, run=False, save_config_callback=None)
    assert first.config["seed_everything"] == 0  # the seed used, kept in the configuration
    for a, b in zip(first.model.parameters(), second.model.parameters()):
        assert torch.equal(a, b)
    other = CLI(Net, Data, args=[*built, "--seed_everything=7"], run=False, save_config_callback=None)
    assert not torch.equal(next(other.model.parameters()), next(first.model.parameters()))
    torch.manual_seed(123)
    unseeded = CLI(Net, Data, args=[*built, "--seed_everything=false"], run=False, save_config_callback=None)
    assert unseeded.config["seed_everything"] is False
    # Not seeded: the generator went on from where torch.manual_seed(123) left it, so the weights differ.
    assert not torch.equal(next(unseeded.model.parameters()), next(first.model.parameters()))
    with pytest.raises(TypeError, match=r"seed_everything_default=\.\.\.\) takes True"):
        CLI(Net, Data, args=["fit"], seed_everything_default="0")  # type: ignore[arg-type]


def test_the_seed_used_is_saved_in_the_config_file(tmp_path: Path) -> None:
    cli = _fit(
        f"--trainer.default_root_dir={tmp_path}",
        "--trainer.logger=csv",
        "--optimizer=SGD",
        "--optimizer.lr=0.1",
    )
    saved = yaml.safe_load(Path(cli.trainer.log_dir, "config.yaml").read_text())
    assert saved["seed_everything"] == 0 and saved["optimizer"]["class_path"] == "torch.optim.SGD"


def test_optimizer_and_scheduler_from_the_command_line(tmp_path: Path) -> None:
    cli = _fit(
        "--trainer.logger=false",
        "--trainer.max_epochs=2",
        "--optimizer=SGD",
        "--optimizer.lr=0.5",
        "--lr_scheduler=StepLR",
        "--lr_scheduler.step_size=1",
        "--lr_scheduler.gamma=0.1",
    )
    (optimizer,) = cli.trainer.optimizers
    assert isinstance(optimizer, torch.optim.SGD)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.5 * 0.1**2)  # stepped after each epoch
    assert cli.trainer.global_step == 8


def test_a_plateau_scheduler_gets_its_monitor(tmp_path: Path) -> None:
    cli = _fit(
        "--trainer.logger=false",
        "--optimizer=Adam",
        "--lr_scheduler=drivetrain.cli.ReduceLROnPlateau",
        "--lr_scheduler.monitor=val_loss",
        "--lr_scheduler.patience=0",
    )
    config = cli.model.configure_optimizers()
    assert isinstance(config["lr_scheduler"]["scheduler"], ReduceLROnPlateau)
    assert config["lr_scheduler"]["monitor"] == "val_loss"


def test_a_model_without_configure_optimizers_and_no_optimizer_is_the_trainers_error() -> None:
    with pytest.raises(Exception, match="configure_optimizers"):
        _fit("--trainer.logger=false", save_config_callback=None)


def test_save_config_callback_none_kwargs_and_subclasses(tmp_path: Path) -> None:
    _fit(
        f"--trainer.default_root_dir={tmp_path}/a",
        "--trainer.logger=false",
        "--optimizer=SGD",
        save_config_callback=None,
    )
    assert not (tmp_path / "a" / "config.yaml").exists()
    _fit(f"--trainer.default_root_dir={tmp_path}/b", "--trainer.logger=false", "--optimizer=SGD")
    assert (tmp_path / "b" / "config.yaml").is_file()
    # An earlier run's configuration is not overwritten unless asked.
    with pytest.raises(RuntimeError, match=r"config.yaml exists .*save_config_kwargs=\{'overwrite': True\}"):
        _fit(f"--trainer.default_root_dir={tmp_path}/b", "--trainer.logger=false", "--optimizer=SGD")
    _fit(
        f"--trainer.default_root_dir={tmp_path}/b",
        "--trainer.logger=false",
        "--optimizer=Adam",
        save_config_kwargs={"overwrite": True, "config_filename": "config.yaml"},
    )
    assert "torch.optim.Adam" in (tmp_path / "b" / "config.yaml").read_text()

    stored: list[str] = []

    class Elsewhere(SaveConfigCallback):
        def save_config(self, trainer: Any, pl_module: Any, stage: str) -> None:
            stored.append(self.parser.dump(self.config, skip_unset=False))

    _fit(
        f"--trainer.default_root_dir={tmp_path}/c",
        "--trainer.logger=false",
        "--optimizer=SGD",
        save_config_callback=Elsewhere,
        save_config_kwargs={"save_to_log_dir": False},
    )
    assert (
        len(stored) == 1 and "torch.optim.SGD" in stored[0] and not (tmp_path / "c" / "config.yaml").exists()
    )
    with pytest.raises(ValueError, match=r"save_to_log_dir=False\) would save nothing"):
        _fit("--trainer.logger=false", "--optimizer=SGD", save_config_kwargs={"save_to_log_dir": False})
    with pytest.raises(
        TypeError,
        match=r"save_config_callback=\.\.\.\) expects a subclass of drivetrain.cli.SaveConfigCallback",
    ):
        _fit(save_config_callback=EarlyStopping)  # type: ignore[arg-type]


def test_linked_arguments_extra_callback_groups_and_the_hooks_in_order(tmp_path: Path) -> None:
    calls: list[str] = []

    class MyCLI(CLI):
        def add_arguments_to_parser(self, parser: CLIArgumentParser) -> None:
            calls.append("add_arguments_to_parser")
            parser.link_arguments("data.classes", "model.classes")
            parser.add_lightning_class_args(EarlyStopping, "early_stopping")
            parser.set_defaults({"early_stopping.monitor": "val_loss", "early_stopping.patience": 5})

        def before_instantiate_classes(self) -> None:
            calls.append("before_instantiate_classes")

        def after_instantiate_classes(self) -> None:
            calls.append(f"after_instantiate_classes classes={self.model.net[-1].out_features}")

        def before_fit(self) -> None:
            calls.append("before_fit")

        def after_fit(self) -> None:
            calls.append(f"after_fit step={self.trainer.global_step}")

    cli = _fit(
        "--trainer.logger=false",
        "--optimizer=SGD",
        "--data.classes=5",
        "--early_stopping.patience=2",
        cli_class=MyCLI,
        save_config_callback=None,
    )
    assert calls == [
        *["add_arguments_to_parser"] * 4,  # once per subcommand's parser
        "before_instantiate_classes",
        "after_instantiate_classes classes=5",
        "before_fit",
        "after_fit step=4",
    ]
    (stopper,) = [c for c in cli.trainer.callbacks if isinstance(c, EarlyStopping)]
    assert stopper.patience == 2 and stopper.monitor == "val_loss"
    with pytest.raises(SystemExit):  # a linked target is not an argument of its own
        _fit("--model.classes=2", cli_class=MyCLI)


def test_a_subcommand_method_on_the_cli_replaces_the_trainers(tmp_path: Path) -> None:
    class Custom(CLI):
        def fit(self, model: Any, **kwargs: Any) -> None:
            self.ran = ("fit", type(model).__name__, sorted(kwargs))

    cli = _fit("--trainer.logger=false", cli_class=Custom, save_config_callback=None)
    assert cli.ran == ("fit", "Net", ["ckpt_path", "datamodule", "weights_only"])
    assert cli.trainer.global_step == 0


def test_callback_instances_in_trainer_defaults_join_the_command_lines(tmp_path: Path) -> None:
    monitor = LearningRateMonitor()
    cli = _fit(
        f"--trainer.default_root_dir={tmp_path}",
        "--trainer.logger=csv",
        "--optimizer=SGD",
        "--trainer.callbacks+=EarlyStopping",
        "--trainer.callbacks.monitor=val_loss",
        trainer_defaults={"callbacks": [monitor], "max_epochs": 3},
        save_config_callback=None,
    )
    names = [type(c).__name__ for c in cli.trainer.callbacks]
    assert names.index("EarlyStopping") < names.index("LearningRateMonitor")
    assert monitor in cli.trainer.callbacks and cli.trainer.max_epochs == 1  # the command line wins


def test_help_lists_the_callback_and_logger_classes(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        CLI(Net, Data, args=["fit", "--help"])
    assert exit_info.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    callbacks = text[text.index("--trainer.callbacks CALLBACKS,") :][:3000]
    for name in (
        "ModelCheckpoint",
        "EarlyStopping",
        "LearningRateMonitor",
        "StochasticWeightAveraging",
        "Timer",
    ):
        assert f".{name}," in callbacks or f".{name})" in callbacks, name
    loggers = text[text.index("--trainer.logger LOGGER,") :][:3000]
    for name in ("CSVLogger", "TensorBoardLogger", "WandbLogger", "MLFlowLogger"):
        assert f".{name}" in loggers, name
    assert "--optimizer" in text and "--lr_scheduler" in text and "--seed_everything" in text
