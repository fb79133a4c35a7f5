"""Log metrics, hyperparameters and checkpoints to Weights & Biases.

Needs the ``wandb`` package (``pip install 'drivetrain[wandb]'``). The run starts on global rank 0
when something is first logged (or ``experiment`` is read); other ranks never start one. Works
offline with ``WandbLogger(offline=True)`` or ``WANDB_MODE=offline``; ``wandb sync`` uploads later.

Metrics are logged with their step as ``trainer/global_step`` and every metric is plotted against
it (as Lightning's logger does), so values logged for an earlier step (validation after a resume)
are kept instead of being dropped by W&B's own monotonic ``_step``.
"""

from __future__ import annotations

import os
import secrets
import string
from argparse import Namespace
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from drivetrain._utilities.log import get_logger
from drivetrain._utilities.paths import is_remote
from drivetrain._utilities.rank_zero import global_rank
from drivetrain.loggers.checkpoint_upload import CheckpointUploads
from drivetrain.loggers.logger import (
    DEFAULT_EXPERIMENT,
    Logger,
    metrics_to_floats,
    params_to_dict,
    plain_value,
    rank_zero_experiment,
)
from drivetrain.loggers.registry import LoggerRegistry

_log = get_logger(__name__)

STEP_METRIC = "trainer/global_step"


def _is_wandb_object(value: Any) -> bool:
    return type(value).__module__.split(".")[0] == "wandb"


def _wandb_values(metrics: Mapping[str, Any]) -> dict[str, Any]:
    """Numbers as floats (checked as every logger checks them); W&B's own objects (or lists of them) as they are."""
    return {
        key: value
        if _is_wandb_object(value)
        or (isinstance(value, (list, tuple)) and value and all(_is_wandb_object(v) for v in value))
        else metrics_to_floats({key: value})[key]
        for key, value in metrics.items()
    }


def _require_online(run: Any, method: str) -> None:
    """W&B fetches and records artifacts only through its server: say so up front when offline."""
    offline = os.environ.get("WANDB_MODE", "").lower() in ("offline", "dryrun", "disabled")
    settings = getattr(run, "settings", None)
    if settings is not None and getattr(settings, "mode", None) in ("offline", "dryrun", "disabled"):
        offline = True
    if offline:
        raise ValueError(
            f"WandbLogger.{method} needs W&B's server, but W&B runs offline here (WandbLogger(offline=True) or "
            f"WANDB_MODE=offline), where artifacts can be logged but not fetched. Run online (`wandb login`) to "
            f"use or download artifacts."
        )


def new_run_id() -> str:
    """An 8-character run id in W&B's alphabet (lowercase letters and digits)."""
    alphabet = string.ascii_lowercase + string.digits
    return "".join(secrets.choice(alphabet) for _ in range(8))


class WandbLogger(Logger):
    """Send metrics, hyperparameters and (optionally) checkpoints to a W&B run.

    Args:
        name: the run's display name.
        save_dir: the folder W&B writes its local files under (``save_dir/wandb/...``).
        version: the run id, to resume a run (alias: ``id``); a new id is made when not given.
        offline: keep the run local (``wandb sync`` it later).
        dir: another name for ``save_dir``.
        id: another name for ``version``.
        anonymous: log anonymously (W&B's ``anonymous="allow"``).
        project: the W&B project (default ``"drivetrain_logs"``).
        log_model: upload checkpoints of ``ModelCheckpoint`` as W&B artifacts: ``True`` at the end
            of training, ``"all"`` each time one is saved, ``False`` never.
        experiment: an existing ``wandb`` run to log into instead of starting one.
        prefix: put in front of every metric name.
        checkpoint_name: the artifact name for checkpoints (default ``model-<run id>``).
        **kwargs: passed to ``wandb.init`` (``entity``, ``group``, ``tags``, ``notes``, ``mode`` …).

    Example:
        >>> trainer = Trainer(logger=WandbLogger(project="digits", log_model=True))  # doctest: +SKIP
        >>> accelerator = Accelerator(log_with="wandb")  # doctest: +SKIP
        >>> accelerator.init_trackers("digits", config={"lr": 0.1}, init_kwargs={"wandb": {"entity": "me"}})  # doctest: +SKIP
    """

    requirement = ("wandb", "wandb")

    def __init__(
        self,
        name: str | None = None,
        save_dir: str | Path | None = None,
        version: str | None = None,
        offline: bool = False,
        dir: str | Path | None = None,
        id: str | None = None,
        anonymous: bool | None = None,
        project: str | None = None,
        log_model: bool | Literal["all"] = False,
        experiment: Any = None,
        prefix: str = "",
        checkpoint_name: str | None = None,
        **kwargs: Any,
    ) -> None:
        self.check_available()
        if log_model not in (True, False, "all"):
            raise ValueError(f"WandbLogger(log_model={log_model!r}); use False, True (at the end) or 'all'.")
        if version is not None and id is not None and version != id:
            raise ValueError(f"WandbLogger(version={version!r}, id={id!r}) names two runs; give one of them.")
        if save_dir is not None and dir is not None and os.fspath(save_dir) != os.fspath(dir):
            raise ValueError(f"WandbLogger(save_dir={save_dir!r}, dir={dir!r}) names two folders; give one.")
        folder = save_dir if save_dir is not None else dir
        if folder is not None and is_remote(folder):
            raise ValueError(
                f"WandbLogger(save_dir={os.fspath(folder)!r}): save_dir is the local folder W&B keeps its run files "
                f"in before syncing them, and cannot be remote storage. Give a local folder (or none: ./wandb)."
            )
        self._save_dir = os.fspath(folder) if folder is not None else None
        self._project = project or DEFAULT_EXPERIMENT
        self._id = version if version is not None else id
        self._id_given = self._id is not None
        self._offline = offline
        self._prefix = prefix
        self._log_model = log_model
        self._checkpoint_name = checkpoint_name
        self._init_kwargs: dict[str, Any] = {
            "name": name,
            "anonymous": "allow" if anonymous else None,
            **kwargs,
        }
        self._experiment = experiment
        self._uploads = CheckpointUploads()

    @classmethod
    def for_experiment(cls, *, save_dir: str | None, experiment: str, **options: Any) -> WandbLogger:
        """``project`` is the door's experiment name; W&B's folder is under ``save_dir`` when there is one."""
        options.setdefault("project", experiment)
        # W&B's folder is a local staging area: a remote door folder (s3://...) leaves it at W&B's default.
        if save_dir is not None and "dir" not in options and not is_remote(save_dir):
            options.setdefault("save_dir", save_dir)
        return cls(**options)

    # -- identity ----------------------------------------------------------------------------
    @property
    def name(self) -> str:
        """The W&B project."""
        return self._project

    @property
    def version(self) -> str | None:
        """The run id: fixed on global rank 0 before the run starts, so processes spawned later agree on it.

        ``None`` on other ranks (no run starts there) unless an id was given.
        """
        if self._experiment is not None:
            return str(self._experiment.id)
        if self._id is None and global_rank() == 0:
            self._id = new_run_id()
        return self._id

    @property
    def save_dir(self) -> str | None:
        return self._save_dir

    @property
    @rank_zero_experiment
    def experiment(self) -> Any:
        """The ``wandb`` run (started on first use on global rank 0)."""
        if self._experiment is None:
            import wandb

            if wandb.run is not None and not self._id_given:
                # A run the script started itself: log into it rather than start a second one.
                _log.info(f"WandbLogger logs into the W&B run {wandb.run.id} that is already running.")
                self._experiment = wandb.run
            else:
                if self._save_dir is not None:
                    os.makedirs(self._save_dir, exist_ok=True)
                settings = {k: v for k, v in self._init_kwargs.items() if v is not None}
                if self._offline:
                    settings.setdefault("mode", "offline")
                settings.setdefault("resume", "allow")
                try:
                    self._experiment = wandb.init(
                        project=self._project, dir=self._save_dir, id=self.version, **settings
                    )
                except wandb.errors.UsageError as error:
                    if "api key" not in str(error).lower():
                        raise
                    raise wandb.errors.UsageError(
                        f"{error} The W&B logger needs an account to log online: run `wandb login` (or set "
                        f"WANDB_API_KEY), or log offline with WandbLogger(offline=True) or WANDB_MODE=offline "
                        f"(then `wandb sync` the run folder later)."
                    ) from None
            if hasattr(self._experiment, "define_metric"):
                self._experiment.define_metric(STEP_METRIC)
                self._experiment.define_metric("*", step_metric=STEP_METRIC, step_sync=True)
        return self._experiment

    # -- logging -------------------------------------------------------------------------------
    def log_hyperparams(self, params: Mapping[str, Any] | Namespace | None = None) -> None:
        """Record ``params`` in the run's config (nested mappings stay nested)."""
        values = plain_value(params_to_dict(params))
        if not self._writes_here():
            return
        self.experiment.config.update(values, allow_val_change=True)

    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        """Log numbers and one-element tensors; W&B's own objects (``wandb.Image``, ``wandb.Table`` …) pass through."""
        values: dict[str, Any] = {f"{self._prefix}{k}": v for k, v in _wandb_values(metrics).items()}
        if not self._writes_here():
            return
        if step is not None:
            values[STEP_METRIC] = step
        self.experiment.log(values)

    def watch(
        self, model: Any, log: str | None = "gradients", log_freq: int = 100, log_graph: bool = True
    ) -> None:
        """Record ``model``'s gradients and/or parameters as histograms every ``log_freq`` steps (``wandb.watch``)."""
        if self._writes_here():
            self.experiment.watch(model, log=log, log_freq=log_freq, log_graph=log_graph)

    # -- rich media (W&B's own objects, logged like metrics at ``step``) ------------------------
    def log_table(
        self,
        key: str,
        columns: Sequence[str | int] | None = None,
        data: list[list[Any]] | None = None,
        dataframe: Any = None,
        step: int | None = None,
    ) -> None:
        """Log a ``wandb.Table`` under ``key``: from ``columns`` and ``data`` (rows), or a pandas ``dataframe``.

        Cells may hold any W&B type (text, ``wandb.Image`` …). Global rank 0 only, as every logging call.
        """
        if not self._writes_here():
            return
        import wandb

        table = wandb.Table(
            columns=list(columns) if columns is not None else None, data=data, dataframe=dataframe
        )
        self.log_metrics({key: table}, step=step)

    def log_text(
        self,
        key: str,
        columns: Sequence[str] | None = None,
        data: list[list[str]] | None = None,
        dataframe: Any = None,
        step: int | None = None,
    ) -> None:
        """Log text as a table (W&B shows text in tables); the arguments are :meth:`log_table`'s."""
        self.log_table(key, columns, data, dataframe, step)

    def log_image(self, key: str, images: list[Any], step: int | None = None, **kwargs: list[Any]) -> None:
        """Log images under ``key``: tensors, NumPy arrays, PIL images or file paths.

        Args:
            key: the name in the run.
            images: the images, in a list.
            step: the x-axis value (default: none given, W&B's own count).
            **kwargs: one list per ``wandb.Image`` argument, one entry per image
                (``caption=["cat", "dog"]``, ``masks=...``, ``boxes=...``).

        Raises:
            TypeError: ``images`` is not a list.
            ValueError: a list in ``kwargs`` has another length than ``images``.
        """
        self._log_media("Image", key, images, step, kwargs)

    def log_audio(self, key: str, audios: list[Any], step: int | None = None, **kwargs: list[Any]) -> None:
        """Log sounds (NumPy arrays or file paths); ``kwargs`` as for :meth:`log_image` (``sample_rate=[...]``)."""
        self._log_media("Audio", key, audios, step, kwargs)

    def log_video(self, key: str, videos: list[Any], step: int | None = None, **kwargs: list[Any]) -> None:
        """Log videos (NumPy arrays or file paths); ``kwargs`` as for :meth:`log_image` (``fps=[...]``)."""
        self._log_media("Video", key, videos, step, kwargs)

    def _log_media(self, kind: str, key: str, items: Any, step: int | None, options: dict[str, Any]) -> None:
        noun = f"{kind.lower()}s" if kind != "Audio" else "audios"
        if not isinstance(items, list):
            raise TypeError(
                f"WandbLogger.log_{kind.lower()}({key!r}, ...) takes the {noun} as a list, got {type(items).__name__}; "
                f"wrap a single one: [{kind.lower()}]."
            )
        for name, values in options.items():
            if not isinstance(values, (list, tuple)) or len(values) != len(items):
                raise ValueError(
                    f"WandbLogger.log_{kind.lower()}({key!r}, ...): {name}= needs one entry per item ({len(items)}), "
                    f"got {values!r}."
                )
        if not self._writes_here():
            return
        import wandb

        make = getattr(wandb, kind)
        media = [
            make(item, **{name: values[i] for name, values in options.items()})
            for i, item in enumerate(items)
        ]
        self.log_metrics({key: media}, step=step)

    # -- artifacts -----------------------------------------------------------------------------
    def use_artifact(self, artifact: Any, artifact_type: str | None = None) -> Any:
        """Record that this run uses ``artifact`` (``"entity/project/name:alias"`` or a ``wandb.Artifact``).

        Returns the ``wandb`` artifact (call ``.download()`` on it for its files); ``None`` on other ranks.

        Raises:
            ValueError: the run is offline: W&B records artifact use only online.
        """
        if not self._writes_here():
            return None
        run = self.experiment
        _require_online(run, "use_artifact")
        return run.use_artifact(artifact, type=artifact_type)

    @staticmethod
    def download_artifact(
        artifact: str,
        save_dir: str | os.PathLike[str] | None = None,
        artifact_type: str | None = None,
        use_artifact: bool | None = True,
    ) -> str | None:
        """Download ``artifact`` (``"entity/project/name:alias"``) and return the local folder it went to.

        Inside a running W&B run (and with ``use_artifact``) the download is recorded as a use by
        that run; otherwise it goes through ``wandb.Api``. Runs on global rank 0 only (other ranks
        get ``None``), like Lightning's. Checkpoints uploaded with ``log_model`` come back this way:
        ``WandbLogger.download_artifact("me/proj/model-<run id>:best")``.

        Args:
            artifact: the artifact's path and alias.
            save_dir: where to put the files (default: W&B's ``./artifacts/<name>``).
            artifact_type: the artifact's type (``"model"`` …), for the lookup.
            use_artifact: record the download as a use by the running run.

        Raises:
            ValueError: W&B is in offline mode, where artifacts cannot be fetched.
        """
        if global_rank() != 0:
            return None
        import wandb

        run = wandb.run
        _require_online(run, "download_artifact")
        if run is not None and use_artifact:
            found = run.use_artifact(artifact, type=artifact_type)
        else:
            found = wandb.Api().artifact(artifact, type=artifact_type)
        return str(found.download(root=None if save_dir is None else os.fspath(save_dir)))

    # -- checkpoints ---------------------------------------------------------------------------
    def after_save_checkpoint(self, checkpoint_callback: Any) -> None:
        if self._log_model is False or not self._writes_here():
            return
        self._uploads.remember(checkpoint_callback)
        if self._log_model == "all":
            self._upload_checkpoints()

    def _upload_checkpoints(self) -> None:
        import wandb

        run = self.experiment
        for checkpoint in self._uploads.pending():
            artifact = wandb.Artifact(
                name=self._checkpoint_name or f"model-{run.id}", type="model", metadata=checkpoint.metadata
            )
            if checkpoint.is_folder:
                artifact.add_dir(checkpoint.path, name="model.ckpt")
            else:
                artifact.add_file(checkpoint.path, name="model.ckpt")
            run.log_artifact(artifact, aliases=checkpoint.aliases)
            self._uploads.done(checkpoint)

    # -- the end -------------------------------------------------------------------------------
    def finalize(self, status: str) -> None:
        """Upload the checkpoints ``log_model=True`` waits for; the run stays open for later stages."""
        if status == "success" and self._log_model is not False and self._writes_here():
            self._upload_checkpoints()

    def finish(self, status: str = "success") -> None:
        """End the W&B run (the Accelerator's ``end_training``); logging afterwards resumes the same run id."""
        self.finalize(status)
        if self._experiment is not None and self._writes_here():
            self._experiment.finish(exit_code=0 if status == "success" else 1)
            self._experiment = None

    def __getstate__(self) -> dict[str, Any]:
        # A run is tied to this process; a copy in a spawned process starts (or resumes) its own by id.
        state = dict(self.__dict__)
        if state["_experiment"] is not None:
            state["_id"] = str(state["_experiment"].id)
        state["_experiment"] = None
        return state


LoggerRegistry.register(
    "wandb", WandbLogger, description="Weights & Biases runs (pip install 'drivetrain[wandb]')"
)
