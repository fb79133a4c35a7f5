"""drivetrain.cli.CLI: subcommands, --trainer/--model/--data, config files, registered names, real launches."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import drivetrain as dt
from drivetrain.cli import CLI
from drivetrain.trainer import EarlyStopping
from helpers.scripts import run_script

SCRIPT = str(Path(__file__).parent / "training_cli_script.py")
QUIET = ["--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]


@pytest.fixture(autouse=True)
def _in_tmp_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs without a logger write their config.yaml into the working folder (default_root_dir), as Lightning's."""
    monkeypatch.chdir(tmp_path)
    # seed_everything() without a seed reads the seed an earlier CLI run left in the environment.
    for name in ("DRIVETRAIN_GLOBAL_SEED", "DRIVETRAIN_SEED_WORKERS"):
        monkeypatch.setenv(name, "0")
        monkeypatch.delenv(name)


class Model(dt.TrainingModule):
    def __init__(self, width: int = 8, lr: float = 0.1) -> None:
        """A small regressor.

        Args:
            width: hidden units.
            lr: learning rate.
        """
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(4, width), nn.Tanh(), nn.Linear(width, 1))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = nn.functional.mse_loss(self.net(batch[0]), batch[1])
        self.log("loss", loss)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.log("val_loss", nn.functional.mse_loss(self.net(batch[0]), batch[1]))

    def test_step(self, batch: Any, batch_idx: int) -> None:
        self.log("seen", float(len(batch[0])), reduce_fx="sum")

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


class Data(dt.DataModule):
    def __init__(self, batch_size: int = 8) -> None:
        """Random regression data.

        Args:
            batch_size: samples per batch.
        """
        super().__init__()
        self.batch_size = batch_size

    def _loader(self) -> DataLoader:
        x = torch.randn(32, 4, generator=torch.Generator().manual_seed(0))
        return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=self.batch_size)

    def train_dataloader(self) -> DataLoader:
        return self._loader()

    def val_dataloader(self) -> DataLoader:
        return self._loader()

    def test_dataloader(self) -> DataLoader:
        return self._loader()


def test_fit_builds_everything_from_the_command_line(tmp_path: Path) -> None:
    cli = CLI(
        Model,
        Data,
        args=[
            "fit",
            *QUIET,
            f"--trainer.default_root_dir={tmp_path}",
            "--trainer.max_epochs=2",
            "--model.width=4",
            "--data.batch_size=16",
            "--trainer.callbacks+=drivetrain.trainer.EarlyStopping",
            "--trainer.callbacks.monitor=val_loss",
            "--seed_everything=3",
        ],
    )
    assert cli.subcommand == "fit"
    assert cli.trainer.global_step == 4 and cli.trainer.state.finished
    assert cli.model.hparams.width == 4 and cli.datamodule.batch_size == 16
    assert isinstance(cli.trainer.early_stopping_callback, EarlyStopping)
    saved = yaml.safe_load(Path(cli.trainer.log_dir, "config.yaml").read_text())
    assert saved["model"] == {"width": 4, "lr": 0.1} and saved["trainer"]["max_epochs"] == 2
    # The saved file reproduces the run.
    again = CLI(
        Model,
        Data,
        args=[
            "fit",
            "--config",
            str(Path(cli.trainer.log_dir, "config.yaml")),
            "--trainer.logger=false",
            "--trainer.enable_checkpointing=false",
        ],
    )
    assert again.trainer.global_step == 4 and again.model.hparams.width == 4


def test_the_local_rank_argument_a_launcher_adds_is_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    # DeepSpeed's launcher runs `python train.py --local_rank=0 fit ...` (and sets LOCAL_RANK).
    argv = ["train.py", "--local_rank=0", "fit", *QUIET, "--trainer.logger=false", "--trainer.max_steps=1"]
    monkeypatch.setattr("sys.argv", [*argv, "--trainer.enable_checkpointing=false"])
    cli = CLI(Model, Data)
    assert cli.trainer.global_step == 1


def test_config_file_and_print_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "run.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "trainer": {"max_steps": 3, "logger": False, "enable_checkpointing": False},
                "model": {"lr": 0.5},
            }
        )
    )
    cli = CLI(Model, Data, args=["fit", "--config", str(config), *QUIET])
    assert cli.trainer.global_step == 3 and cli.model.hparams.lr == 0.5
    with pytest.raises(SystemExit) as exit_info:
        CLI(Model, Data, args=["fit", "--config", str(config), "--model.width=2", "--print_config"])
    assert exit_info.value.code == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["model"] == {"width": 2, "lr": 0.5} and printed["trainer"]["max_steps"] == 3
    assert printed["trainer"]["accelerator"] == "auto" and "ckpt_path" in printed


def test_test_subcommand_with_a_checkpoint(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    fit = CLI(
        Model, Data, args=["fit", *QUIET, f"--trainer.default_root_dir={tmp_path}", "--trainer.max_epochs=1"]
    )
    best = fit.trainer.checkpoint_callback.best_model_path
    cli = CLI(Model, Data, args=["test", *QUIET, "--trainer.logger=false", f"--ckpt_path={best}"])
    assert cli.result == [{"seen": 32.0}]
    assert "seen" in capfd.readouterr().out


def test_unknown_names_list_the_registry(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        CLI(Model, Data, args=["fit", "--trainer.accelerator=quantum"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "Unknown accelerator 'quantum'. Available: cpu, cuda, hpu, mps, tpu, xla, xpu." in err
    with pytest.raises(SystemExit):
        CLI(Model, Data, args=["fit", "--trainer.strategy=ddp_quantum"])
    err = capsys.readouterr().err
    assert "Unknown strategy 'ddp_quantum'." in err and "Available: ddp," in err


def test_without_subcommands_the_script_runs_the_trainer(tmp_path: Path) -> None:
    cli = CLI(
        Model,
        Data,
        run=False,
        args=[
            *QUIET,
            "--trainer.max_steps=2",
            "--trainer.logger=false",
            "--trainer.enable_checkpointing=false",
        ],
    )
    assert cli.subcommand is None and cli.trainer.global_step == 0
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    assert cli.trainer.global_step == 2


def test_trainer_defaults_and_bad_classes(tmp_path: Path) -> None:
    cli = CLI(Model, Data, run=False, args=["--trainer.logger=false"], trainer_defaults={"max_epochs": 7})
    assert cli.trainer.max_epochs == 7
    with pytest.raises(
        TypeError, match=r"CLI\(model_class=...\) expects a subclass of drivetrain.TrainingModule"
    ):
        CLI(nn.Linear, args=[])  # type: ignore[arg-type]


@pytest.mark.multiprocess
def test_registered_custom_accelerator_from_the_command_line(tmp_path: Path) -> None:
    result = run_script(
        [
            SCRIPT,
            "fit",
            "--trainer.accelerator=xpu",
            "--trainer.devices=2",
            "--trainer.max_epochs=1",
            *QUIET,
            "--trainer.logger=false",
            "--trainer.enable_checkpointing=false",
            "--model.width=3",
            "--data.batch_size=4",
        ],
        cwd=tmp_path,
        timeout=150,
    )
    assert result.returncode == 0, result.stderr
    assert "XPUAccelerator replaces the built-in accelerator 'xpu'" in result.stderr
    lines = sorted(line for line in result.stdout.splitlines() if line.startswith("rank="))
    assert lines == [
        "rank=0 accelerator=XPUAccelerator world=2 steps=4 width=3 batch_size=4",
        "rank=1 accelerator=XPUAccelerator world=2 steps=4 width=3 batch_size=4",
    ]
