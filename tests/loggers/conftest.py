"""Fixtures for the tracker tests: a migrated MLflow SQLite store to copy, W&B's offline runs to read."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def _migrated_mlflow_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An empty MLflow store with its schema created once (MLflow migrates a new database in ~50 steps)."""
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    path = tmp_path_factory.mktemp("mlflow-template") / "mlflow.db"
    MlflowClient(tracking_uri=f"sqlite:///{path}").search_experiments()
    return path


@pytest.fixture
def mlflow_dir(tmp_path: Path, _migrated_mlflow_db: Path) -> Path:
    """A folder for ``MLFlowLogger(save_dir=...)`` that already holds an empty, migrated store."""
    folder = tmp_path / "mlruns"
    folder.mkdir()
    shutil.copy(_migrated_mlflow_db, folder / "mlflow.db")
    return folder
