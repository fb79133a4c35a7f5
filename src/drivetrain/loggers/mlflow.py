"""Log metrics, parameters and checkpoints to an MLflow tracking store.

Needs MLflow's client (``pip install 'drivetrain[mlflow]'``: ``mlflow-skinny`` with the SQLite
store's packages; a full ``mlflow`` install works too). Without a tracking URI the logger keeps a
local store in ``save_dir``: ``save_dir/mlflow.db`` (SQLite, MLflow's own default kind of store)
with artifacts in ``save_dir/artifacts``; view it with
``mlflow ui --backend-store-uri sqlite:///<save_dir>/mlflow.db``. The run is created on global
rank 0 when first needed; other ranks never touch the store.
"""

from __future__ import annotations

import os
import re
import tempfile
import time
from argparse import Namespace
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from drivetrain._utilities.log import get_logger
from drivetrain._utilities.paths import is_remote, join
from drivetrain.loggers.checkpoint_upload import CheckpointUploads
from drivetrain.loggers.logger import (
    DEFAULT_EXPERIMENT,
    Logger,
    flatten_params,
    metrics_to_floats,
    params_to_dict,
    rank_zero_experiment,
)
from drivetrain.loggers.registry import LoggerRegistry

_log = get_logger(__name__)

#: MLflow's limits: characters in a parameter value, entries per log_batch call.
_PARAM_VALUE_LIMIT = 6000
_PARAMS_PER_BATCH = 100
_METRICS_PER_BATCH = 1000
_INVALID_KEY_CHARACTERS = re.compile(r"[^A-Za-z0-9_\-. /]")
_STATUS = {"success": "FINISHED", "failed": "FAILED", "aborted": "KILLED"}


class MLFlowLogger(Logger):
    """Send metrics, hyperparameters (as MLflow params) and optionally checkpoints to an MLflow run.

    Args:
        experiment_name: the MLflow experiment (created when it does not exist).
        run_name: the run's name in the MLflow UI.
        tracking_uri: where the tracking store is (``sqlite:///...``, ``http://server:5000`` …);
            default: the ``MLFLOW_TRACKING_URI`` environment variable, else a SQLite store in ``save_dir``.
        tags: tags set on the new run.
        save_dir: the folder of the local store (used when no tracking URI is given).
        log_model: upload ``ModelCheckpoint``'s checkpoints as run artifacts (under ``checkpoints/``):
            ``True`` at the end of training, ``"all"`` each time one is saved, ``False`` never.
        prefix: put in front of every metric name.
        artifact_location: where a new experiment keeps its artifacts (default ``save_dir/artifacts``
            for the local store, the server's choice otherwise).
        run_id: log into this existing run instead of creating one (to resume).

    Example:
        >>> trainer = Trainer(logger=MLFlowLogger(experiment_name="digits", log_model=True))  # doctest: +SKIP
        >>> accelerator = Accelerator(log_with="mlflow", project_dir="runs")  # doctest: +SKIP
    """

    requirement = ("mlflow", "mlflow")

    def __init__(
        self,
        experiment_name: str = DEFAULT_EXPERIMENT,
        run_name: str | None = None,
        tracking_uri: str | None = None,
        tags: Mapping[str, Any] | None = None,
        save_dir: str | Path | None = "./mlruns",
        log_model: bool | Literal["all"] = False,
        prefix: str = "",
        artifact_location: str | None = None,
        run_id: str | None = None,
    ) -> None:
        self.check_available()
        if log_model not in (True, False, "all"):
            raise ValueError(f"MLFlowLogger(log_model={log_model!r}); use False, True (at the end) or 'all'.")
        if not isinstance(experiment_name, str) or not experiment_name:
            raise ValueError(f"MLFlowLogger(experiment_name={experiment_name!r}); give a non-empty name.")
        tracking_uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
        self._local_dir: str | None = None
        if tracking_uri is None:
            if save_dir is None:
                raise ValueError(
                    "MLFlowLogger needs a tracking store: pass tracking_uri= (or set MLFLOW_TRACKING_URI), or "
                    "save_dir= for a local SQLite store."
                )
            if is_remote(save_dir):
                raise ValueError(
                    f"MLFlowLogger(save_dir={os.fspath(save_dir)!r}): without a tracking_uri MLflow keeps its runs in a "
                    f"local SQLite store under save_dir, which cannot live on remote storage. Pass tracking_uri= (or set "
                    f"MLFLOW_TRACKING_URI) for a tracking server, or give a local save_dir."
                )
            self._local_dir = os.path.abspath(os.fspath(save_dir))
            tracking_uri = f"sqlite:///{os.path.join(self._local_dir, 'mlflow.db')}"
            if artifact_location is None:
                artifact_location = Path(self._local_dir, "artifacts").as_uri()
        self._tracking_uri = tracking_uri
        self._experiment_name = experiment_name
        self._run_name = run_name
        self._tags = dict(tags or {})
        self._log_model = log_model
        self._prefix = prefix
        self._artifact_location = artifact_location
        self._run_id = run_id
        self._experiment_id: str | None = None
        self._client: Any = None
        self._uploads = CheckpointUploads()
        self._warned_keys: set[str] = set()

    @classmethod
    def for_experiment(cls, *, save_dir: str | None, experiment: str, **options: Any) -> MLFlowLogger:
        """The experiment is the door's experiment name; the local store goes to ``save_dir/mlruns``."""
        options.setdefault("experiment_name", experiment)
        if save_dir is not None:
            options.setdefault("save_dir", join(save_dir, "mlruns"))
        return cls(**options)

    # -- identity ----------------------------------------------------------------------------
    @property
    def tracking_uri(self) -> str:
        return self._tracking_uri

    @property
    @rank_zero_experiment
    def experiment(self) -> Any:
        """The ``MlflowClient`` (the run is created on first use on global rank 0)."""
        if self._client is None:
            from mlflow.tracking import MlflowClient

            if self._local_dir is not None:
                os.makedirs(self._local_dir, exist_ok=True)
            self._client = MlflowClient(tracking_uri=self._tracking_uri)
        if self._run_id is None:
            self._start_run(self._client)
        return self._client

    def _start_run(self, client: Any) -> None:
        found = client.get_experiment_by_name(self._experiment_name)
        if found is not None:
            self._experiment_id = found.experiment_id
        else:
            self._experiment_id = client.create_experiment(
                self._experiment_name, artifact_location=self._artifact_location
            )
        # MLflow's context tags (mlflow.user, mlflow.source.name …) as mlflow.start_run and Lightning add them.
        from mlflow.tracking.context.registry import resolve_tags

        run = client.create_run(self._experiment_id, run_name=self._run_name, tags=resolve_tags(self._tags))
        self._run_id = run.info.run_id

    @property
    def run_id(self) -> str | None:
        """The MLflow run id (the run is created when this is first read on rank 0)."""
        _ = self.experiment
        return self._run_id

    @property
    def experiment_id(self) -> str | None:
        if self._experiment_id is None and self.run_id is not None and self._client is not None:
            self._experiment_id = self._client.get_run(self._run_id).info.experiment_id
        return self._experiment_id

    @property
    def name(self) -> str | None:
        """The experiment id (as Lightning's logger names it)."""
        return self.experiment_id

    @property
    def version(self) -> str | None:
        """The run id."""
        return self.run_id

    @property
    def save_dir(self) -> str | None:
        """The local store's folder (``None`` for a remote tracking server)."""
        return self._local_dir

    # -- logging -------------------------------------------------------------------------------
    def log_hyperparams(self, params: Mapping[str, Any] | Namespace | None = None) -> None:
        """Record ``params`` as MLflow params (nested mappings as ``outer/inner``; long values cut to 6000 characters)."""
        flat = flatten_params(params_to_dict(params))
        if not self._writes_here():
            return
        client = self.experiment  # the run starts here at the latest, also without parameters
        from mlflow.entities import Param

        entries = [Param(self._key(k), str(v)[:_PARAM_VALUE_LIMIT]) for k, v in flat.items()]
        for start in range(0, len(entries), _PARAMS_PER_BATCH):
            client.log_batch(self._run_id, params=entries[start : start + _PARAMS_PER_BATCH])

    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        values = metrics_to_floats(metrics)
        if not self._writes_here() or not values:
            return
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        entries = [Metric(self._key(f"{self._prefix}{k}"), v, now, step or 0) for k, v in values.items()]
        client = self.experiment
        for start in range(0, len(entries), _METRICS_PER_BATCH):
            client.log_batch(self._run_id, metrics=entries[start : start + _METRICS_PER_BATCH])

    def _key(self, key: str) -> str:
        clean = _INVALID_KEY_CHARACTERS.sub("_", key)
        if clean != key and key not in self._warned_keys:
            self._warned_keys.add(key)
            _log.warning(f"MLflow does not accept the name {key!r}; it is logged as {clean!r}.")
        return clean

    # -- checkpoints ---------------------------------------------------------------------------
    def after_save_checkpoint(self, checkpoint_callback: Any) -> None:
        if self._log_model is False or not self._writes_here():
            return
        self._uploads.remember(checkpoint_callback)
        if self._log_model == "all":
            self._upload_checkpoints()

    def _upload_checkpoints(self) -> None:
        """Each checkpoint goes to ``<stem>/`` with ``metadata.yaml`` and ``aliases.txt``, as Lightning lays it out."""
        import yaml

        client = self.experiment
        for checkpoint in self._uploads.pending():
            name = os.path.basename(checkpoint.path.rstrip(os.sep))
            folder = Path(name).stem
            if checkpoint.is_folder:
                client.log_artifacts(self._run_id, checkpoint.path, f"{folder}/{name}")
            else:
                client.log_artifact(self._run_id, checkpoint.path, folder)
            settings = [v for k, v in checkpoint.metadata.items() if k not in ("score", "original_filename")]
            # Lightning's MLflow logger files the callback's settings under "Checkpoint".
            metadata = {
                "score": checkpoint.metadata["score"],
                "original_filename": name,
                "Checkpoint": settings[0] if settings else {},
            }
            with tempfile.TemporaryDirectory() as notes:
                Path(notes, "metadata.yaml").write_text(yaml.safe_dump(metadata, default_flow_style=False))
                Path(notes, "aliases.txt").write_text(str(checkpoint.aliases))
                client.log_artifacts(self._run_id, notes, folder)
            self._uploads.done(checkpoint)

    # -- the end -------------------------------------------------------------------------------
    def finalize(self, status: str) -> None:
        """Upload the checkpoints ``log_model=True`` waits for, and mark the run finished (or failed)."""
        if not self._writes_here() or self._client is None or self._run_id is None:
            return
        if status == "success" and self._log_model is not False:
            self._upload_checkpoints()
        self._client.set_terminated(self._run_id, _STATUS.get(status, "FINISHED"))

    def __getstate__(self) -> dict[str, Any]:
        # The client holds a database connection; a copy in another process opens its own.
        state = dict(self.__dict__)
        state["_client"] = None
        return state


LoggerRegistry.register(
    "mlflow",
    MLFlowLogger,
    description="MLflow runs, local SQLite store or a server (pip install 'drivetrain[mlflow]')",
)
