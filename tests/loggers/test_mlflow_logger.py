"""MLFlowLogger against a real local tracking store, read back through mlflow's MlflowClient."""

from __future__ import annotations

import getpass
import logging
import pickle
from pathlib import Path

import pytest
import torch
import yaml

from drivetrain._utilities import imports
from drivetrain.loggers import MLFlowLogger
from trainer.trainer_models import Regression, loader, quiet_trainer

mlflow_tracking = pytest.importorskip("mlflow.tracking")


def _client(save_dir: Path) -> object:
    return mlflow_tracking.MlflowClient(tracking_uri=f"sqlite:///{save_dir / 'mlflow.db'}")


def test_params_metrics_by_step_tags_and_status_reach_the_store(mlflow_dir: Path) -> None:
    logger = MLFlowLogger(
        experiment_name="exp", run_name="first", tags={"team": "core"}, save_dir=mlflow_dir, prefix="train/"
    )
    logger.log_hyperparams({"lr": 0.1, "model": {"width": 8, "act": torch.nn.ReLU()}, "notes": "x" * 7000})
    logger.log_metrics({"loss": torch.tensor(0.5), "acc": 1}, step=3)
    logger.log_metrics({"loss": 0.25}, step=7)
    logger.finalize("success")

    client = _client(mlflow_dir)
    run = client.get_run(logger.run_id)
    assert client.get_experiment(run.info.experiment_id).name == "exp"
    assert (run.info.run_name, run.info.status, run.data.tags["team"]) == ("first", "FINISHED", "core")
    # MLflow's context tags, as mlflow.start_run (and Lightning's logger) add them.
    assert (
        run.data.tags["mlflow.user"] == getpass.getuser() and run.data.tags["mlflow.source.type"] == "LOCAL"
    )
    assert run.data.params["lr"] == "0.1" and run.data.params["model/width"] == "8"
    assert run.data.params["model/act"] == "ReLU()" and run.data.params["notes"] == "x" * 6000
    history = client.get_metric_history(logger.run_id, "train/loss")
    assert [(m.step, m.value) for m in history] == [(3, 0.5), (7, 0.25)]
    assert [(m.step, m.value) for m in client.get_metric_history(logger.run_id, "train/acc")] == [(3, 1.0)]
    assert (logger.version, logger.name) == (logger.run_id, run.info.experiment_id)
    assert logger.save_dir == str(mlflow_dir)


def test_a_second_logger_resumes_by_run_id_and_failures_are_recorded(mlflow_dir: Path) -> None:
    first = MLFlowLogger(experiment_name="exp", save_dir=mlflow_dir)
    first.log_metrics({"loss": 1.0}, step=1)
    copy = pickle.loads(pickle.dumps(first))  # what a spawned rank 0 receives: the run id, no connection
    copy.log_metrics({"loss": 0.5}, step=2)
    copy.finalize("failed")
    client = _client(mlflow_dir)
    assert [m.step for m in client.get_metric_history(first.run_id, "loss")] == [1, 2]
    assert client.get_run(first.run_id).info.status == "FAILED"
    resumed = MLFlowLogger(experiment_name="exp", save_dir=mlflow_dir, run_id=first.run_id)
    resumed.log_metrics({"loss": 0.25}, step=3)
    assert [m.step for m in client.get_metric_history(first.run_id, "loss")] == [1, 2, 3]


def test_names_mlflow_refuses_are_cleaned_once_with_a_warning(
    mlflow_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    logger = MLFlowLogger(save_dir=mlflow_dir)
    with caplog.at_level(logging.WARNING, logger="drivetrain"):
        logger.log_metrics({"acc@1": 0.5}, step=0)
        logger.log_metrics({"acc@1": 0.75}, step=1)
    assert [r.getMessage() for r in caplog.records] == [
        "MLflow does not accept the name 'acc@1'; it is logged as 'acc_1'."
    ]
    assert [m.value for m in _client(mlflow_dir).get_metric_history(logger.run_id, "acc_1")] == [0.5, 0.75]


def test_trainer_logs_params_metrics_and_checkpoint_artifacts(mlflow_dir: Path, tmp_path: Path) -> None:
    from drivetrain.trainer import ModelCheckpoint

    logger = MLFlowLogger(experiment_name="fit", save_dir=mlflow_dir, log_model="all")
    checkpoints = ModelCheckpoint(dirpath=tmp_path / "ckpt", monitor="val_loss", save_top_k=1, save_last=True)
    trainer = quiet_trainer(
        logger=logger, callbacks=[checkpoints], enable_checkpointing=True, max_epochs=2, log_every_n_steps=4
    )
    trainer.fit(Regression(lr=0.05), loader(), loader())
    client = _client(mlflow_dir)
    run = client.get_run(logger.run_id)
    assert run.data.params == {"features": "4", "lr": "0.05", "dropout": "0.0", "optimizer": "sgd"}
    assert [m.step for m in client.get_metric_history(logger.run_id, "train_loss")] == [3, 7, 11, 15]
    assert [m.step for m in client.get_metric_history(logger.run_id, "val_loss")] == [7, 15]
    assert {m.value for m in client.get_metric_history(logger.run_id, "epoch")} == {0.0, 1.0}
    # Lightning's layout: <stem>/<file>.ckpt with the checkpoint's metadata.yaml and aliases.txt beside it.
    best = Path(checkpoints.best_model_path)
    assert sorted(a.path for a in client.list_artifacts(logger.run_id, best.stem)) == [
        f"{best.stem}/aliases.txt",
        f"{best.stem}/{best.name}",
        f"{best.stem}/metadata.yaml",
    ]
    assert "last/last.ckpt" in [a.path for a in client.list_artifacts(logger.run_id, "last")]
    folder = Path(client.download_artifacts(logger.run_id, best.stem, str(tmp_path / "down")))
    assert (folder / "aliases.txt").read_text() == "['latest', 'best']"
    metadata = yaml.safe_load((folder / "metadata.yaml").read_text())
    assert metadata["original_filename"] == best.name
    assert metadata["score"] == pytest.approx(float(checkpoints.best_model_score))
    assert metadata["Checkpoint"] == {
        "monitor": "val_loss",
        "mode": "min",
        "save_last": True,
        "save_top_k": 1,
        "save_weights_only": False,
    }
    assert run.info.status == "FINISHED"


def test_log_model_true_uploads_at_the_end_and_false_never(mlflow_dir: Path, tmp_path: Path) -> None:
    from drivetrain.trainer import ModelCheckpoint

    class Watch(ModelCheckpoint):
        def on_train_epoch_end(self, trainer: object, pl_module: object) -> None:
            seen.append(len(_client(mlflow_dir).list_artifacts(logger.run_id)))

    for log_model in (True, False):
        seen: list[int] = []
        logger = MLFlowLogger(experiment_name=f"end-{log_model}", save_dir=mlflow_dir, log_model=log_model)
        checkpoints = ModelCheckpoint(
            dirpath=tmp_path / f"ckpt-{log_model}", monitor="val_loss", save_top_k=2, filename="{epoch}"
        )
        trainer = quiet_trainer(
            logger=logger,
            callbacks=[checkpoints, Watch(dirpath=tmp_path)],
            enable_checkpointing=True,
            max_epochs=2,
        )
        trainer.fit(Regression(), loader(), loader())
        uploaded = sorted(a.path for a in _client(mlflow_dir).list_artifacts(logger.run_id))
        assert uploaded == (["epoch=0", "epoch=1"] if log_model else [])
        assert seen == [0, 0]  # nothing went up while training


def test_bad_settings_and_a_missing_package_are_explained(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ValueError, match=r"log_model='best'\); use False, True \(at the end\) or 'all'"):
        MLFlowLogger(save_dir=tmp_path, log_model="best")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"needs a tracking store: pass tracking_uri="):
        MLFlowLogger(save_dir=None)
    monkeypatch.setattr(imports, "package_available", lambda name: name != "mlflow")
    with pytest.raises(ImportError, match=r"pip install 'drivetrain\[mlflow\]'"):
        MLFlowLogger(save_dir=tmp_path)


def test_the_tracking_uri_comes_from_the_environment_when_not_given(
    mlflow_dir: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{mlflow_dir / 'mlflow.db'}")
    logger = MLFlowLogger(experiment_name="from-env", save_dir=tmp_path / "unused")
    logger.log_metrics({"x": 1.0}, step=0)
    assert logger.save_dir is None and not (tmp_path / "unused").exists()
    assert _client(mlflow_dir).get_metric_history(logger.run_id, "x")[0].value == 1.0
