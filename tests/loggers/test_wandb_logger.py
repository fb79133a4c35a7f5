"""WandbLogger in W&B's offline mode: what the run's own transaction log holds afterwards."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
import torch

from drivetrain._utilities import imports
from drivetrain.loggers import WandbLogger
from drivetrain.loggers.logger import NoExperiment
from helpers.wandb_records import offline_runs
from trainer.trainer_models import Regression, loader, quiet_trainer

wandb = pytest.importorskip("wandb")


def test_metrics_by_step_and_config_are_in_the_offline_run(tmp_path: Path) -> None:
    logger = WandbLogger(name="first", save_dir=tmp_path, project="proj", prefix="train/")
    run_id = logger.version  # fixed before the run starts
    logger.log_hyperparams({"lr": 0.1, "model": {"width": 8}, "act": torch.nn.ReLU()})
    logger.log_metrics({"loss": torch.tensor(0.5), "acc": 1}, step=3)
    logger.log_metrics({"loss": 0.25}, step=7)
    assert logger.experiment.id == run_id and logger.name == "proj"
    logger.finish()

    (run,) = offline_runs(tmp_path / "wandb")
    assert (run.run_id, run.project, run.display_name, run.finished) == (run_id, "proj", "first", True)
    assert {k: run.config[k] for k in ("lr", "model", "act")} == {
        "lr": 0.1,
        "model": {"width": 8},
        "act": "ReLU()",
    }
    rows = [(row["trainer/global_step"], row.get("train/loss"), row.get("train/acc")) for row in run.history]
    assert rows == [(3, 0.5, 1.0), (7, 0.25, None)]


def test_a_steps_going_back_are_kept_and_wandb_objects_pass_through(tmp_path: Path) -> None:
    logger = WandbLogger(save_dir=tmp_path)
    logger.log_metrics({"val_loss": 2.0}, step=10)
    logger.log_metrics({"val_loss": 1.0}, step=4)  # a resumed run validating at an earlier step
    logger.log_metrics({"table": wandb.Table(columns=["a"], data=[[1]])}, step=11)
    with pytest.raises(TypeError, match=r"The metric 'bad' has the value 'x' of type str"):
        logger.log_metrics({"bad": "x"}, step=12)
    logger.finish()
    (run,) = offline_runs(tmp_path / "wandb")
    assert [(r["trainer/global_step"], r.get("val_loss")) for r in run.history[:2]] == [(10, 2.0), (4, 1.0)]
    assert run.history[2]["table/_type"] == "table-file"


def test_the_run_id_survives_pickling_and_finish_resumes_it(tmp_path: Path) -> None:
    logger = WandbLogger(save_dir=tmp_path, offline=True)
    logger.log_metrics({"a": 1.0}, step=0)
    copy = pickle.loads(pickle.dumps(logger))  # what a spawned rank 0 gets: the id, not the live run
    assert copy.version == logger.version and copy._experiment is None
    logger.finish()
    copy.log_metrics({"a": 2.0}, step=1)
    copy.finish()
    runs = offline_runs(tmp_path / "wandb")
    assert {run.run_id for run in runs} == {logger.version}
    assert sorted(row["a"] for run in runs for row in run.history) == [1.0, 2.0]


def test_trainer_logs_hparams_metrics_and_checkpoints_as_artifacts(tmp_path: Path) -> None:
    from drivetrain.trainer import ModelCheckpoint

    logger = WandbLogger(save_dir=tmp_path, project="fit", log_model="all")
    checkpoints = ModelCheckpoint(
        dirpath=tmp_path / "ckpt", monitor="val_loss", save_top_k=1, filename="{epoch}"
    )
    trainer = quiet_trainer(
        logger=logger, callbacks=[checkpoints], enable_checkpointing=True, max_epochs=2, log_every_n_steps=4
    )
    trainer.fit(Regression(lr=0.05), loader(), loader())
    logger.finish()
    (run,) = offline_runs(tmp_path / "wandb")
    assert {k: run.config[k] for k in ("lr", "features", "optimizer")} == {
        "lr": 0.05,
        "features": 4,
        "optimizer": "sgd",
    }
    assert [r["trainer/global_step"] for r in run.history if "train_loss" in r] == [3, 7, 11, 15]
    assert [r["trainer/global_step"] for r in run.history if "val_loss" in r] == [7, 15]
    assert [a["name"] for a in run.artifacts] == [f"model-{run.run_id}"] * len(run.artifacts)
    assert {a["files"][0] for a in run.artifacts} == {"model.ckpt"}
    best = [a for a in run.artifacts if "best" in a["aliases"]]
    assert best and best[-1]["metadata"]["original_filename"] == Path(checkpoints.best_model_path).name
    assert best[-1]["metadata"]["score"] == pytest.approx(float(checkpoints.best_model_score))


def test_other_ranks_start_no_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "1")
    logger = WandbLogger(save_dir=tmp_path)
    logger.log_metrics({"a": 1.0}, step=0)
    logger.log_hyperparams({"lr": 1})
    assert isinstance(logger.experiment, NoExperiment) and logger.version is None
    logger.experiment.log_artifact("anything").whatever()  # user code runs unchanged on every rank
    logger.finish()
    assert not (tmp_path / "wandb").exists()


def test_bad_settings_and_a_missing_package_are_explained(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ValueError, match=r"log_model='best'\); use False, True \(at the end\) or 'all'"):
        WandbLogger(log_model="best")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"version='a', id='b'\) names two runs"):
        WandbLogger(version="a", id="b")
    with pytest.raises(ValueError, match=r"names two folders"):
        WandbLogger(save_dir=tmp_path, dir=tmp_path / "other")
    monkeypatch.setattr(imports, "package_available", lambda name: name != "wandb")
    with pytest.raises(ImportError, match=r"WandbLogger needs the 'wandb' package.*drivetrain\[wandb\]"):
        WandbLogger()


_NO_ACCOUNT = """
import torch
from torch.utils.data import DataLoader, TensorDataset
import drivetrain as dt
from trainer.trainer_models import Regression

x = torch.randn(16, 4)
trainer = dt.Trainer(accelerator="cpu", max_steps=1, logger="wandb", default_root_dir={root!r},
                     enable_progress_bar=False, enable_model_summary=False)
trainer.fit(Regression(), DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8))
"""


def test_without_an_account_the_error_says_how_to_log_in_or_log_offline(tmp_path: Path) -> None:
    # A fresh process (W&B keeps its login state per process), a home without credentials, online mode.
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update(
        HOME=str(tmp_path), WANDB_CONFIG_DIR=str(tmp_path / "config"), PYTHONPATH=os.pathsep.join(sys.path)
    )
    done = subprocess.run(
        [sys.executable, "-c", _NO_ACCOUNT.format(root=str(tmp_path / "run"))],
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    assert (
        "run `wandb login` (or set WANDB_API_KEY), or log offline with WandbLogger(offline=True)"
        in done.stderr
    )


def test_tables_text_images_audio_and_video_are_in_the_offline_run(tmp_path: Path) -> None:
    np = pytest.importorskip("numpy")
    logger = WandbLogger(save_dir=tmp_path)
    logger.log_table("samples", columns=["input", "label"], data=[["a", 1], ["b", 0]], step=3)
    logger.log_text("generated", columns=["prompt", "text"], data=[["hi", "hello there"]], step=4)
    pixels = np.zeros((4, 4, 3), dtype=np.uint8)
    logger.log_image("inputs", [pixels, torch.ones(3, 4, 4)], step=5, caption=["zeros", "ones"])
    with pytest.raises(
        TypeError, match=r"log_image\('inputs', \.\.\.\) takes the images as a list, got ndarray"
    ):
        logger.log_image("inputs", pixels)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"caption= needs one entry per item \(2\), got \['one'\]"):
        logger.log_image("inputs", [pixels, pixels], caption=["one"])
    # log_audio and log_video take the same path (wandb.Audio needs the soundfile package, not installed).
    with pytest.raises(TypeError, match=r"log_audio\('sound', \.\.\.\) takes the audios as a list"):
        logger.log_audio("sound", "silence.wav")  # type: ignore[arg-type]
    logger.finish()

    (run,) = offline_runs(tmp_path / "wandb")
    by_step = {row["trainer/global_step"]: row for row in run.history}
    assert by_step[3]["samples/_type"] == by_step[4]["generated/_type"] == "table-file"
    table = json.loads((run.path / "files" / by_step[3]["samples/path"]).read_text())
    assert table["columns"] == ["input", "label"] and table["data"] == [["a", 1], ["b", 0]]
    text = json.loads((run.path / "files" / by_step[4]["generated/path"]).read_text())
    assert text["data"] == [["hi", "hello there"]]
    assert by_step[5]["inputs/_type"] == "images/separated" and by_step[5]["inputs/captions"] == [
        "zeros",
        "ones",
    ]
    assert all((run.path / "files" / name).is_file() for name in by_step[5]["inputs/filenames"])


def test_artifacts_offline_are_a_clear_error(tmp_path: Path) -> None:
    logger = WandbLogger(save_dir=tmp_path, offline=True)
    with pytest.raises(ValueError, match=r"use_artifact needs W&B's server, but W&B runs offline here"):
        logger.use_artifact("me/proj/model-abc:best", artifact_type="model")
    with pytest.raises(ValueError, match=r"download_artifact needs W&B's server"):
        WandbLogger.download_artifact("me/proj/model-abc:best", save_dir=tmp_path / "got")
    logger.finish()


class _OnlineRun:
    """A stand-in for an online ``wandb`` run and its artifacts (no W&B server is reachable from tests)."""

    id = "standin1"

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.settings = type("Settings", (), {"mode": "online"})()
        self.used: list[tuple[object, object]] = []

    def define_metric(self, *args: object, **kwargs: object) -> None: ...

    def use_artifact(self, artifact: object, type: object = None) -> object:
        self.used.append((artifact, type))
        run = self

        class Artifact:
            def download(self, root: str | None = None) -> str:
                target = Path(root or run.folder / "artifacts")
                target.mkdir(parents=True, exist_ok=True)
                (target / "model.ckpt").write_bytes(b"weights")
                return str(target)

        return Artifact()


def test_use_and_download_artifact_go_through_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("WANDB_MODE", raising=False)
    run = _OnlineRun(tmp_path)
    logger = WandbLogger(experiment=run)
    assert logger.use_artifact("me/proj/data:v3", artifact_type="dataset") is not None
    monkeypatch.setattr(wandb, "run", run)
    folder = WandbLogger.download_artifact(
        "me/proj/model-x:best", save_dir=tmp_path / "got", artifact_type="model"
    )
    assert folder == str(tmp_path / "got") and (tmp_path / "got" / "model.ckpt").read_bytes() == b"weights"
    assert run.used == [("me/proj/data:v3", "dataset"), ("me/proj/model-x:best", "model")]
    monkeypatch.setenv("RANK", "1")
    assert WandbLogger.download_artifact("me/proj/model-x:best") is None  # rank 0 only, as Lightning
    assert len(run.used) == 2
