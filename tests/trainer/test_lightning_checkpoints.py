"""Checkpoints written by real PyTorch Lightning 2.x load into drivetrain (weights, optimizer, scheduler, progress).

The checkpoints come from ``scripts/lightning_checkpoints.py`` run by the peers' interpreter
(``benchmarks/.peers-venv``, built on first use), cached between runs by the script's content.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from drivetrain.trainer import Callback, EarlyStopping, ModelCheckpoint
from helpers.peers import peers_python
from helpers.scripts import run_command
from trainer.trainer_models import Regression, loader, quiet_trainer, regression_data

SCRIPT = Path(__file__).parent / "scripts" / "lightning_checkpoints.py"


@pytest.fixture(scope="module")
def lightning_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    python = peers_python()
    key = hashlib.sha256(SCRIPT.read_bytes() + str(python).encode()).hexdigest()[:16]
    cache = getattr(request.config, "cache", None)
    out = (
        cache.mkdir(f"lightning-checkpoints-{key}")
        if cache is not None
        else tmp_path_factory.mktemp("lightning")
    )
    if not (out / "epoch_end.ckpt").exists():
        fresh = out / f"new-{os.getpid()}"  # xdist workers may fill the same entry at once
        result = run_command([str(python), str(SCRIPT), str(fresh)], timeout=300)
        assert result.returncode == 0, result.stderr[-3000:]
        for name in ("schedules.json", "mid_epoch.ckpt", "epoch_end.ckpt"):  # the one looked for last
            (fresh / name).replace(out / name)
    return out


def _data() -> Any:
    return loader(regression_data(64), batch_size=8)


class Mirror(Regression):
    """The script's LightningModule: Adam and a per-step StepLR."""

    def __init__(
        self, features: int = 4, lr: float = 0.05, dropout: float = 0.0, optimizer: str = "adam"
    ) -> None:
        super().__init__(features, lr, dropout, optimizer)

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.Adam(self.parameters(), lr=self.hparams.lr)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.5)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


class Seen(Callback):
    """The state a resumed fit starts from."""

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        optimizer = trainer.optimizers[0]
        self.epoch, self.step = trainer.current_epoch, trainer.global_step
        self.exp_avg = [optimizer.state[p]["exp_avg"].clone() for p in pl_module.parameters()]
        self.scheduler_epoch = trainer.lr_scheduler_configs[0].scheduler.last_epoch
        self.lr = optimizer.param_groups[0]["lr"]
        self.weights = {k: v.clone() for k, v in pl_module.state_dict().items()}
        stopping = trainer.early_stopping_callback
        self.best_score = stopping.best_score if stopping is not None else None
        self.first_epoch: int | None = None

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        self.first_epoch = trainer.current_epoch if self.first_epoch is None else self.first_epoch


def test_fit_resumes_from_lightnings_epoch_end_checkpoint(lightning_dir: Path) -> None:
    path = lightning_dir / "epoch_end.ckpt"
    saved = torch.load(path, weights_only=True)
    seen = Seen()
    model = Mirror()
    trainer = quiet_trainer(max_epochs=3, callbacks=[seen, EarlyStopping(monitor="val_loss", patience=5)])

    with pytest.warns(UserWarning, match=r"written by Lightning 2\.") as caught:
        trainer.fit(model, _data(), _data(), ckpt_path=path)
    report = str(caught[0].message)
    assert "1 optimizer state(s)" in report and "1 LR scheduler state(s)" in report
    assert "progress (epoch 1, global step 16)" in report and "random generator states" in report
    assert "callback states (EarlyStopping{" in report
    assert "states of callbacks this run does not have (ModelCheckpoint{" in report

    assert (seen.first_epoch, seen.step) == (2, 16)  # epoch 1 had ended: the next one starts
    for key, value in saved["state_dict"].items():
        assert torch.equal(seen.weights[key], value)
    for mine, theirs in zip(seen.exp_avg, saved["optimizer_states"][0]["state"].values()):
        assert torch.equal(mine, theirs["exp_avg"])
    assert seen.scheduler_epoch == saved["lr_schedulers"][0]["last_epoch"] == 16
    assert seen.lr == pytest.approx(0.05 * 0.5**5)  # StepLR(3, 0.5) after 16 steps, as Lightning left it
    assert trainer.global_step == 24 and trainer.current_epoch == 3
    assert seen.best_score == saved["callbacks"][_key(saved, "EarlyStopping")]["best_score"]


def test_a_mid_epoch_checkpoint_restarts_its_epoch_and_says_so(lightning_dir: Path) -> None:
    seen = Seen()
    trainer = quiet_trainer(max_epochs=2, callbacks=[seen])
    with pytest.warns(UserWarning, match=r"restarts from its first batch"):
        trainer.fit(Mirror(), _data(), ckpt_path=lightning_dir / "mid_epoch.ckpt")
    assert (seen.first_epoch, seen.step) == (1, 11)
    assert trainer.global_step == 19  # 11 + the whole of epoch 1 again


def test_evaluation_and_load_from_checkpoint_read_lightnings_weights(
    lightning_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = lightning_dir / "epoch_end.ckpt"
    saved = torch.load(path, weights_only=True)["state_dict"]
    model = Regression()
    with caplog.at_level(logging.INFO, logger="drivetrain"):
        quiet_trainer().validate(model, _data(), ckpt_path=path, verbose=False)
    assert any("written by Lightning" in record.getMessage() for record in caplog.records)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in saved.items())

    loaded = Regression.load_from_checkpoint(path)  # Lightning's keys are ours: hyperparameters too
    assert loaded.hparams.optimizer == "adam" and loaded.hparams.lr == 0.05
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in saved.items())


def _key(checkpoint: dict[str, Any], name: str) -> str:
    return next(key for key in checkpoint["callbacks"] if key.startswith(name))


# The scenarios of scripts/lightning_checkpoints.py (ModelCheckpoint arguments, Trainer arguments).
SCENARIOS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "interval_half": ({"save_top_k": -1}, {"val_check_interval": 0.5}),
    "every_other_epoch_validation": ({"save_top_k": -1}, {"check_val_every_n_epoch": 2}),
    "once_per_epoch": ({"save_top_k": -1}, {}),
    "train_epoch_end": ({"save_top_k": -1, "save_on_train_epoch_end": True}, {"val_check_interval": 0.5}),
    "steps_with_accumulation": ({"save_top_k": -1, "every_n_train_steps": 3}, {"accumulate_grad_batches": 2}),
    "epoch_names_twice": (
        {"save_top_k": -1, "filename": "{epoch}", "save_last": True},
        {"val_check_interval": 0.5},
    ),
    # save_last when the fit saves nothing else: last.ckpt when training ends (Lightning 2.6's on_train_end).
    "last_without_top_k": ({"save_top_k": 0, "save_last": True}, {}),
    "last_after_too_few_epochs": ({"every_n_epochs": 3, "save_last": True}, {}),
    "last_after_fast_dev_run": ({"save_last": True}, {"fast_dev_run": True}),
}


def test_model_checkpoint_saves_the_files_lightning_saves(lightning_dir: Path, tmp_path: Path) -> None:
    """When it saves, what it names the files, and the version counter of a second run: as Lightning."""
    expected = json.loads((lightning_dir / "schedules.json").read_text())
    ours = {}
    for name, (checkpoint_args, trainer_args) in SCENARIOS.items():
        folder = tmp_path / name
        for run in (1, 2):  # the second run writes into the first run's folder
            callback = ModelCheckpoint(dirpath=folder, **checkpoint_args)
            trainer = quiet_trainer(
                max_epochs=2, callbacks=[callback], enable_checkpointing=True, **trainer_args
            )
            trainer.fit(Mirror(), _data(), _data())
            ours[f"{name}/{run}"] = sorted(os.listdir(folder))
    # A deliberate difference: with monitor=None Lightning lets an epoch's second save replace its
    # first ("{epoch}" twice per epoch); drivetrain keeps both (save_top_k=-1 means keep them all).
    assert expected.pop("epoch_names_twice/1") == ["epoch=0.ckpt", "epoch=1.ckpt", "last.ckpt"]
    assert ours.pop("epoch_names_twice/1") == [
        "epoch=0-v1.ckpt",
        "epoch=0.ckpt",
        "epoch=1-v1.ckpt",
        "epoch=1.ckpt",
        "last.ckpt",
    ]
    assert (
        expected.pop("epoch_names_twice/2")[-2:]
        == ours.pop("epoch_names_twice/2")[-2:]
        == [
            "last-v1.ckpt",
            "last.ckpt",
        ]
    )
    assert ours == expected
