"""W&B and MLflow from both front doors in real 2-process programs: one run each, written by rank 0 only."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers.scripts import run_script
from helpers.wandb_records import offline_runs

pytest.importorskip("wandb")
mlflow_tracking = pytest.importorskip("mlflow.tracking")

SCRIPT = str(Path(__file__).parent / "scripts" / "tracker_programs.py")

pytestmark = pytest.mark.multiprocess


def _run(case: str, root: Path) -> list[str]:
    assert (
        root / "mlruns" / "mlflow.db"
    ).exists()  # the mlflow_dir fixture's store, migrated once per session
    result = run_script([SCRIPT, case, str(root)], timeout=240)
    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    return sorted(line for line in result.stdout.splitlines() if line.startswith("rank="))


def _mlflow_runs(store: Path, experiment: str) -> tuple[object, list[object]]:
    client = mlflow_tracking.MlflowClient(tracking_uri=f"sqlite:///{store / 'mlflow.db'}")
    found = client.get_experiment_by_name(experiment)
    assert found is not None, f"no MLflow experiment {experiment!r}"
    return client, client.search_runs([found.experiment_id])


def test_trainer_ddp_logs_one_run_per_tracker_with_checkpoints(tmp_path: Path, mlflow_dir: Path) -> None:
    lines = _run("trainer", tmp_path)
    (wandb_run,) = offline_runs(tmp_path / "wandb")
    client, (mlflow_run,) = _mlflow_runs(tmp_path / "mlruns", "trainer-exp")
    assert lines[0] == f"rank=0 wandb={wandb_run.run_id} mlflow={mlflow_run.info.run_id} best=epoch=2.ckpt"
    assert lines[1] == "rank=1 wandb=None mlflow=None best=epoch=2.ckpt"

    # 32 samples / 2 ranks / 4 per batch = 4 steps per epoch, 3 epochs, logged every 2 steps, at
    # Lightning's x-axis (the steps before the logging batch's).
    assert [r["trainer/global_step"] for r in wandb_run.history if "loss" in r] == [1, 3, 5, 7, 9, 11]
    assert [r["trainer/global_step"] for r in wandb_run.history if "val_loss" in r] == [3, 7, 11]
    assert (
        len([r for r in wandb_run.history if "test_loss" in r]) == 1
    )  # trainer.test() logs into the same run
    assert (wandb_run.project, wandb_run.display_name) == ("trainer-proj", "fit")
    assert {k: wandb_run.config[k] for k in ("lr", "width")} == {"lr": 0.05, "width": 4}
    best = [a for a in wandb_run.artifacts if "best" in a["aliases"]]
    assert best[-1]["metadata"]["original_filename"] == "epoch=2.ckpt"

    run_id = mlflow_run.info.run_id
    assert mlflow_run.data.params == {"lr": "0.05", "width": "4"}
    assert [m.step for m in client.get_metric_history(run_id, "loss")] == [1, 3, 5, 7, 9, 11]
    assert [m.step for m in client.get_metric_history(run_id, "val_loss")] == [3, 7, 11]
    assert len(client.get_metric_history(run_id, "test_loss")) == 1
    uploaded = sorted(a.path for a in client.list_artifacts(run_id))
    assert uploaded == [
        "epoch=1",
        "epoch=2",
    ]  # log_model=True: the kept top-2, each in <stem>/ (Lightning's layout)


def test_trainer_ddp_spawn_by_name_logs_into_the_run_the_parent_named(
    tmp_path: Path, mlflow_dir: Path
) -> None:
    lines = _run("spawn", tmp_path)
    (wandb_run,) = offline_runs(tmp_path / "wandb")
    client, (mlflow_run,) = _mlflow_runs(tmp_path / "mlruns", "drivetrain_logs")
    # The parent prints its own loggers: they name the runs the spawned rank 0 wrote.
    assert lines == [f"rank=0 wandb={wandb_run.run_id} mlflow={mlflow_run.info.run_id} best=epoch=2.ckpt"]
    assert wandb_run.project == "drivetrain_logs"
    assert [r["trainer/global_step"] for r in wandb_run.history if "loss" in r] == [1, 3, 5, 7, 9, 11]
    assert [m.step for m in client.get_metric_history(mlflow_run.info.run_id, "val_loss")] == [3, 7, 11]


def test_accelerator_trackers_by_name_on_two_processes(tmp_path: Path, mlflow_dir: Path) -> None:
    lines = _run("accelerator", tmp_path)
    (wandb_run,) = offline_runs(tmp_path / "wandb")
    client, (mlflow_run,) = _mlflow_runs(tmp_path / "mlruns", "accelerator-proj")
    assert lines == [f"rank=0 trackers=2 wandb={wandb_run.run_id}", "rank=1 trackers=0 wandb=None"]
    assert (wandb_run.project, wandb_run.display_name, wandb_run.finished) == (
        "accelerator-proj",
        "acc-run",
        True,
    )
    assert {k: wandb_run.config[k] for k in ("lr", "model")} == {"lr": 0.1, "model": {"width": 4}}
    # 32 samples / 2 ranks / 4 per batch: 4 logged steps, once each.
    assert [r["trainer/global_step"] for r in wandb_run.history] == [0, 1, 2, 3]
    assert all(r["val/mae"] == 0.5 for r in wandb_run.history)
    assert mlflow_run.info.run_name == "acc-run" and mlflow_run.info.status == "FINISHED"
    assert mlflow_run.data.params == {"lr": "0.1", "model/width": "4"}
    assert [m.step for m in client.get_metric_history(mlflow_run.info.run_id, "loss")] == [0, 1, 2, 3]
    assert [m.value for m in client.get_metric_history(mlflow_run.info.run_id, "val/mae")] == [0.5] * 4
