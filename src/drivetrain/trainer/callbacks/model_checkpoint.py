"""``ModelCheckpoint``: save checkpoints during fit, keep the best k by a monitored metric.

Checkpoints are written through the strategy (its CheckpointIO, atomically; sharded
strategies write their own layout) on every process's behalf. When saving is due is decided
identically on every rank: the monitored value and the file name are taken from rank 0.

When it saves (one schedule at a time, as in Lightning):
    * ``every_n_train_steps=n``: after every n-th optimizer step (in ``on_train_batch_end``);
    * ``train_time_interval=timedelta(...)``: after the first batch that ends that long after the
      previous save (the ranks agree through rank 0's clock);
    * otherwise every ``every_n_epochs`` (default 1) epochs: at the end of the training epoch when
      ``save_on_train_epoch_end`` is true, else after each validation of such an epoch. Left unset,
      it is true exactly when validation runs once at the end of every epoch, or not at all.

A checkpoint never replaces a file it did not write in this run for the same purpose: when the
name is taken (a second validation in the same epoch with ``filename="{epoch}"``, or an earlier
run's files in the same folder) the new file gets Lightning's version suffix (``-v1``, ``-v2`` …),
so a kept path (``best_model_path``) always holds the weights its score describes. Only the
checkpoint that the new one displaces from the top k may be written over.

This module is long (over 600 lines) because it is one public class with Lightning's whole surface
(arguments, attributes, hooks, naming, ranking, pruning, resuming); the file helpers at the end
(finding the last checkpoint, natural order) are the first candidates to move out.
"""

from __future__ import annotations

import datetime
import math
import os
import pickle
import re
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from drivetrain._utilities import paths
from drivetrain._utilities.log import get_logger
from drivetrain.plugins.io.atomic import is_temporary, publish_link, resolve
from drivetrain.plugins.io.safe_loading import load_torch_file
from drivetrain.trainer.callbacks.callback import Callback

_log = get_logger(__name__)

if TYPE_CHECKING:
    from drivetrain.trainer.module import TrainingModule
    from drivetrain.trainer.trainer import Trainer

_MODES = ("min", "max")
_FIELD = re.compile(r"\{([^{}:!]+)((?:![rsa])?(?::[^{}]*)?)\}")


class ModelCheckpoint(Callback):
    """Save checkpoints while fitting.

    Args:
        dirpath: the folder (default: ``<log_dir>/checkpoints``, or ``default_root_dir/checkpoints``
            without a logger).
        filename: a template such as ``"{epoch}-{val_loss:.2f}"``; names are ``epoch``, ``step``
            and any logged metric. With ``auto_insert_metric_name`` each becomes ``name=value``.
            Default ``"{epoch}-{step}"``.
        monitor: the logged metric ranking checkpoints; ``None`` keeps the most recent ones.
        verbose: print a line on rank 0 for each save.
        save_last: also write ``last.ckpt`` each time a checkpoint is due; ``"link"``: make it a link to the
            latest checkpoint saved (a full checkpoint when none was saved yet; local folders only).
        save_top_k: how many to keep (``-1``: all, ``0``: none but ``last``).
        save_weights_only: only the module's weights (such files cannot resume a fit).
        mode: ``"min"`` or ``"max"``: which way the monitored metric improves.
        auto_insert_metric_name: write ``epoch=3`` rather than ``3`` in file names.
        every_n_train_steps: save after every n optimizer steps.
        train_time_interval: save after the first batch ending this long after the previous save.
        every_n_epochs: save every n epochs (default 1 unless one of the two above is set).
        save_on_train_epoch_end: save at the end of the training epoch (``True``) or after validation
            (``False``); ``None`` decides from the validation schedule (see the module docstring).
        enable_version_counter: give a new checkpoint whose name is taken a ``-v1`` (``-v2`` …) suffix
            instead of writing over the existing file.
        save_on_exception: when fit ends with an exception, save a checkpoint of the state at that
            moment (and ``last`` if ``save_last``) under a free name (single-process runs).
    """

    CHECKPOINT_NAME_LAST = "last"
    CHECKPOINT_JOIN_CHAR = "-"
    FILE_EXTENSION = ".ckpt"
    STARTING_VERSION = 1

    def __init__(
        self,
        dirpath: str | Path | None = None,
        filename: str | None = None,
        monitor: str | None = None,
        verbose: bool = False,
        save_last: bool | str | None = None,
        save_top_k: int = 1,
        save_weights_only: bool = False,
        mode: str = "min",
        auto_insert_metric_name: bool = True,
        every_n_train_steps: int | None = None,
        train_time_interval: datetime.timedelta | None = None,
        every_n_epochs: int | None = None,
        save_on_train_epoch_end: bool | None = None,
        enable_version_counter: bool = True,
        save_on_exception: bool = False,
    ) -> None:
        if mode not in _MODES:
            raise ValueError(f"ModelCheckpoint(mode={mode!r}); use 'min' or 'max'.")
        if isinstance(save_top_k, bool) or not isinstance(save_top_k, int) or save_top_k < -1:
            raise ValueError(
                f"ModelCheckpoint(save_top_k={save_top_k!r}); use -1 (all), 0 (none) or a count >= 1."
            )
        if monitor is None and save_top_k not in (-1, 0, 1):
            raise ValueError(
                f"ModelCheckpoint(save_top_k={save_top_k}, monitor=None) cannot rank checkpoints without a metric. "
                f"Name one with monitor='val_loss', or use save_top_k=1 (latest) or -1 (all)."
            )
        for name, value in (("every_n_train_steps", every_n_train_steps), ("every_n_epochs", every_n_epochs)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise ValueError(f"ModelCheckpoint({name}={value!r}); use an int >= 1 (0 turns it off).")
        if train_time_interval is not None and (
            not isinstance(train_time_interval, datetime.timedelta)
            or train_time_interval.total_seconds() <= 0
        ):
            raise ValueError(
                f"ModelCheckpoint(train_time_interval={train_time_interval!r}); use a positive datetime.timedelta, "
                f"e.g. timedelta(minutes=30)."
            )
        schedules = {
            "every_n_train_steps": every_n_train_steps,
            "every_n_epochs": every_n_epochs,
            "train_time_interval": train_time_interval,
        }
        chosen = {name: value for name, value in schedules.items() if value}
        if len(chosen) > 1:
            given = ", ".join(f"{name}={value!r}" for name, value in chosen.items())
            raise ValueError(f"ModelCheckpoint({given}): these schedules exclude each other; choose one.")
        for name, flag in (
            ("enable_version_counter", enable_version_counter),
            ("save_on_exception", save_on_exception),
        ):
            if not isinstance(flag, bool):
                raise TypeError(f"ModelCheckpoint({name}={flag!r}); use True or False.")
        if save_last not in (None, True, False, "link"):
            raise TypeError(f"ModelCheckpoint(save_last={save_last!r}); use True, False, 'link' or None.")
        if save_on_train_epoch_end not in (None, True, False):
            raise TypeError(
                f"ModelCheckpoint(save_on_train_epoch_end={save_on_train_epoch_end!r}); use True, False or None (auto)."
            )
        self.dirpath: str | None = paths.normalize(dirpath) if dirpath is not None else None
        paths.check(self.dirpath)  # s3://... without s3fs, or an unknown scheme: reported here
        if save_last == "link" and paths.is_remote(self.dirpath):
            raise ValueError(_LINK_LOCAL_ONLY.format(dirpath=self.dirpath))
        self.filename = filename
        self.monitor = monitor
        self.verbose = verbose
        self.save_last = save_last
        self.save_top_k = save_top_k
        self.save_weights_only = save_weights_only
        self.mode = mode
        self.auto_insert_metric_name = auto_insert_metric_name
        self.every_n_train_steps = every_n_train_steps or 0
        self.train_time_interval = train_time_interval
        self.every_n_epochs = (
            every_n_epochs
            if every_n_epochs is not None
            else (0 if every_n_train_steps or train_time_interval else 1)
        )
        self.save_on_train_epoch_end = save_on_train_epoch_end
        self.enable_version_counter = enable_version_counter
        self.save_on_exception = save_on_exception
        self._last_time_checked: float | None = None
        # Scores are 0-d tensors, as in Lightning (``best_model_score.item()`` in ported scripts).
        self.best_k_models: dict[str, Tensor] = {}
        self.kth_best_model_path = ""
        self.best_model_score: Tensor | None = None
        self.best_model_path = ""
        self.last_model_path = ""
        #: The score of the latest checkpoint that entered the top k (a 0-d tensor), as in Lightning.
        self.current_score: Tensor | None = None
        self._latest_saved: str | None = None  # what save_last="link" points last.ckpt at
        self._recent: list[str] = []
        self._pending_removals: list[str] = []
        self._last_global_step_saved = 0
        self._saved_in_fit = False  # whether this fit wrote any checkpoint yet (see on_train_end)

    @property
    def state_key(self) -> str:
        return self.generate_state_key(
            monitor=self.monitor,
            mode=self.mode,
            every_n_train_steps=self.every_n_train_steps,
            every_n_epochs=self.every_n_epochs,
            train_time_interval=self.train_time_interval,
        )

    # -- hooks --------------------------------------------------------------------------------
    def setup(self, trainer: Trainer, pl_module: TrainingModule, stage: str) -> None:
        if stage != "fit":
            return
        if self.save_on_exception and trainer.world_size > 1:
            raise ValueError(
                _ONE_PROCESS_ONLY.format(what="ModelCheckpoint(save_on_exception=True)", n=trainer.world_size)
            )
        dirpath = self.dirpath or _default_dirpath(trainer)
        # Loggers pick their version folder on rank 0 only; every rank must write to the same place.
        self.dirpath = trainer.strategy.broadcast(dirpath) if trainer.world_size > 1 else dirpath
        if self.save_last == "link" and paths.is_remote(self.dirpath):
            raise ValueError(_LINK_LOCAL_ONLY.format(dirpath=self.dirpath))
        self._saved_in_fit = False

    def on_train_start(self, trainer: Trainer, pl_module: TrainingModule) -> None:
        self._last_time_checked = time.monotonic()
        if (
            self.save_on_train_epoch_end is False
            and self.every_n_epochs
            and not sum(trainer.num_val_batches)
            and trainer.is_global_zero
        ):
            warnings.warn(
                "ModelCheckpoint(save_on_train_epoch_end=False) saves after validation, but this fit has no "
                "validation, so it saves no epoch checkpoint. Add validation data, or leave save_on_train_epoch_end "
                "unset.",
                UserWarning,
                stacklevel=2,
            )

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: TrainingModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        every_n, interval = self.every_n_train_steps, self.train_time_interval
        if not every_n and interval is None:
            return
        if self._skip(trainer):
            return
        due = bool(every_n) and trainer.global_step % every_n == 0
        if interval is not None:
            now = time.monotonic()
            started = self._last_time_checked if self._last_time_checked is not None else now
            time_due = now - started >= interval.total_seconds()
            if trainer.world_size > 1:  # clocks differ: rank 0's decides for all
                time_due = bool(trainer.strategy.broadcast(time_due))
            if time_due:
                self._last_time_checked = now
                due = True
        if due:
            self._save(trainer)

    def on_validation_end(self, trainer: Trainer, pl_module: TrainingModule) -> None:
        if self._skip(trainer) or self._saves_on_train_epoch_end(trainer):
            return
        if self._epoch_due(trainer):
            self._save(trainer)

    def on_train_epoch_end(self, trainer: Trainer, pl_module: TrainingModule) -> None:
        if self._skip(trainer) or not self._saves_on_train_epoch_end(trainer):
            return
        if self._epoch_due(trainer):
            self._save(trainer)

    def on_train_end(self, trainer: Trainer, pl_module: TrainingModule) -> None:
        """``save_last``: a fit that saved no checkpoint at all (no validation to save after, ``fast_dev_run``)
        still ends with ``last.ckpt``, as in Lightning 2.6."""
        if not self.save_last or self._saved_in_fit:
            return
        metrics = self._format_metrics(trainer)
        last = self._last_name(metrics)
        if trainer.world_size > 1:
            last = trainer.strategy.broadcast(last)
        self._save_last(trainer, last)
        self._prune(trainer)

    def on_exception(self, trainer: Trainer, pl_module: TrainingModule, exception: BaseException) -> None:
        if not self.save_on_exception or self._skip(trainer) or not (trainer.training or trainer.validating):
            return  # before the loop started (set-up, restoring) there is no new state to save
        metrics = self._format_metrics(trainer)
        filepath = self._free_name(metrics)
        self._write(trainer, filepath)
        if self.save_last:
            self._save_last(trainer, self._last_name(metrics))
        _log.info(
            f"{type(exception).__name__} ended the fit; saved a checkpoint of the state at that moment to {filepath}"
        )

    def _saves_on_train_epoch_end(self, trainer: Trainer) -> bool:
        if self.save_on_train_epoch_end is not None:
            return self.save_on_train_epoch_end
        if trainer.check_val_every_n_epoch != 1:
            return False  # validation only in some epochs: save after it, with a fresh score
        if not sum(trainer.num_val_batches):
            return True
        return trainer.val_check_interval == 1.0

    def _epoch_due(self, trainer: Trainer) -> bool:
        return bool(self.every_n_epochs) and (trainer.current_epoch + 1) % self.every_n_epochs == 0

    def _skip(self, trainer: Trainer) -> bool:
        return (
            bool(trainer.fast_dev_run)
            or trainer.state.fn is None
            or trainer.state.fn.value != "fit"
            or trainer.sanity_checking
            or self._last_global_step_saved == trainer.global_step
        )

    # -- saving --------------------------------------------------------------------------------
    def _save(self, trainer: Trainer) -> None:
        metrics = self._format_metrics(trainer)
        current = self._monitored(trainer, metrics)
        # Rank 0 decides what is kept and under which name (it looks at the folder); every rank follows.
        plan = (*self._plan(metrics, current), self._last_name(metrics) if self.save_last else None)
        if trainer.world_size > 1:
            plan = trainer.strategy.broadcast(plan)
        filepath, displaced, last = plan
        self._last_global_step_saved = trainer.global_step
        if filepath is not None:
            if self.monitor is None:
                self._save_recent(trainer, filepath, displaced)
            else:
                assert current is not None
                self._save_top_k(trainer, filepath, current, displaced)
        if last is not None:
            self._save_last(trainer, last)
        # Only now, with every new checkpoint of this save published, do older ones go.
        self._prune(trainer)

    def _plan(self, metrics: dict[str, Any], current: float | None) -> tuple[str | None, str | None]:
        """The new checkpoint's path (``None``: not kept) and the kept one it displaces, if any."""
        k = self.save_top_k
        if k == 0 or (self.monitor is not None and current is None):
            return None, None
        displaced: str | None = None
        if self.monitor is None:
            if k != -1 and len(self._recent) >= k:
                displaced = self._recent[0]
        elif k != -1 and len(self.best_k_models) >= k:
            worst = self.kth_best_model_path
            if not self._better(current, float(self.best_k_models[worst])):  # type: ignore[arg-type]
                return None, None
            displaced = worst
        return self._free_name(metrics, reusable=displaced), displaced

    def _free_name(
        self, metrics: dict[str, Any], filename: str | None = None, reusable: str | None = None
    ) -> str:
        """The formatted name, with ``-v1``, ``-v2`` … while it is taken by anything but ``reusable``."""
        path = self.format_checkpoint_name(metrics, filename)
        if not self.enable_version_counter:
            return path
        version = self.STARTING_VERSION
        while path != reusable and self._taken(path):
            path = self.format_checkpoint_name(metrics, filename, ver=version)
            version += 1
        return path

    def _taken(self, path: str) -> bool:

        return path in self.best_k_models or path in self._recent or resolve(path) is not None

    def _last_name(self, metrics: dict[str, Any]) -> str:
        # This run's own last checkpoint is rewritten; one left by an earlier run in the folder is not.
        return self._free_name(metrics, self.CHECKPOINT_NAME_LAST, reusable=self.last_model_path or None)

    def _save_last(self, trainer: Trainer, last: str) -> None:
        previous = self.last_model_path
        self.last_model_path = last
        target = self._latest_saved if self.save_last == "link" and self.save_top_k != 0 else None
        if target is None or not self._link(trainer, target, last):
            self._write(trainer, last)
        if previous and previous != last:
            self._pending_removals.append(previous)

    def _link(self, trainer: Trainer, target: str, last: str) -> bool:
        """``last`` becomes a link to the latest checkpoint saved (Lightning's ``save_last="link"``); whether it did."""

        linked = publish_link(target, last) if trainer.is_global_zero else True
        if trainer.world_size > 1:
            linked = trainer.strategy.broadcast(linked)  # also: no rank reads last before it exists
        return linked

    def to_yaml(self, filepath: str | Path | None = None) -> None:
        """Write the top-k checkpoints and their scores to a YAML file (default ``dirpath/best_k_models.yaml``)."""
        import yaml

        if filepath is None:
            if self.dirpath is None:
                raise ValueError("ModelCheckpoint.to_yaml() needs a filepath before fit() has set dirpath.")
            filepath = paths.join(self.dirpath, "best_k_models.yaml")
        scores = {path: float(score) for path, score in self.best_k_models.items()}
        with paths.open_file(filepath, "w") as file:
            yaml.safe_dump(scores, file)

    def _monitored(self, trainer: Trainer, metrics: dict[str, Any]) -> float | None:
        if self.monitor is None:
            return None
        if self.monitor not in metrics:
            available = ", ".join(sorted(k for k in metrics if k not in ("epoch", "step"))) or "nothing"
            message = (
                f"ModelCheckpoint(monitor={self.monitor!r}) found no logged metric {self.monitor!r} (logged: "
                f"{available}). Log it with self.log({self.monitor!r}, value), or fix the name."
            )
            if sum(trainer.num_val_batches) and trainer.fit_progress.validations_run == 0:
                warnings.warn(
                    message + " Skipping top-k until validation has run.", UserWarning, stacklevel=3
                )
                return None
            raise ValueError(message)
        value = float(metrics[self.monitor])
        if math.isnan(value):  # a NaN never ranks above a real score
            value = math.inf if self.mode == "min" else -math.inf
        return value

    def _better(self, current: float, reference: float) -> bool:
        return current < reference if self.mode == "min" else current > reference

    def _save_top_k(self, trainer: Trainer, filepath: str, current: float, displaced: str | None) -> None:
        # The ranking the new checkpoint records includes itself; it takes effect only if the write
        # succeeds, and the displaced file is deleted only after it (see _prune).
        previous = self._ranking()
        self.best_k_models[filepath] = _score(current)
        if displaced is not None and displaced != filepath:
            del self.best_k_models[displaced]
            self._pending_removals.append(displaced)
        self._rank()
        try:
            self._write(trainer, filepath)
        except BaseException:
            self._restore_ranking(previous)
            raise
        self.current_score, self._latest_saved = _score(current), filepath
        if self.verbose:
            _log.info(
                f"Epoch {trainer.current_epoch}, step {trainer.global_step}: {self.monitor}={current:.6g}, saved {filepath}"
            )

    def _save_recent(self, trainer: Trainer, filepath: str, displaced: str | None) -> None:
        previous = self._ranking()
        recent = [path for path in self._recent if path not in (displaced, filepath)] + [filepath]
        if displaced is not None and displaced != filepath:
            self._pending_removals.append(displaced)
        self._recent = recent
        self.best_model_path = filepath
        try:
            self._write(trainer, filepath)
        except BaseException:
            self._restore_ranking(previous)
            raise
        self._latest_saved = filepath
        if self.verbose:
            _log.info(f"Epoch {trainer.current_epoch}, step {trainer.global_step}: saved {filepath}")

    def _rank(self) -> None:
        scores = self.best_k_models
        pick_worst = max if self.mode == "min" else min
        self.kth_best_model_path = pick_worst(scores, key=lambda path: float(scores[path]))
        best = (min if self.mode == "min" else max)(scores, key=lambda path: float(scores[path]))
        self.best_model_path, self.best_model_score = best, scores[best]

    def _ranking(self) -> dict[str, Any]:
        return {
            "best_k_models": dict(self.best_k_models),
            "kth_best_model_path": self.kth_best_model_path,
            "best_model_path": self.best_model_path,
            "best_model_score": self.best_model_score,
            "recent": list(self._recent),
            "pending_removals": list(self._pending_removals),
        }

    def _restore_ranking(self, ranking: dict[str, Any]) -> None:
        self.best_k_models = ranking["best_k_models"]
        self.kth_best_model_path = ranking["kth_best_model_path"]
        self.best_model_path = ranking["best_model_path"]
        self.best_model_score = ranking["best_model_score"]
        self._recent = ranking["recent"]
        self._pending_removals = ranking["pending_removals"]

    def _prune(self, trainer: Trainer) -> None:
        """Delete the checkpoints that left the top k (or the most recent k) once their successors are saved.

        Pending removals are part of this callback's state, so a run resumed after a crash between
        publishing a checkpoint and pruning finishes the pruning at its first save. Nothing outside
        this callback's own folder is ever deleted, nor the checkpoint a fit was explicitly told to
        resume from (as in Lightning: the user named it, so it stays).
        """
        kept = {*self.best_k_models, *self._recent, self.last_model_path, self.best_model_path}
        resumed = trainer.ckpt_path if trainer.ckpt_path_requested not in (None, "last", "hpc") else None
        for path in self._pending_removals:
            if path in kept or not self.dirpath or not paths.is_entry_of(path, self.dirpath):
                continue
            if resumed is not None and _same_file(path, resumed):
                continue
            trainer.strategy.remove_checkpoint(path)
        self._pending_removals = []

    def _write(self, trainer: Trainer, filepath: str) -> None:
        trainer.save_checkpoint(filepath, weights_only=self.save_weights_only)
        self._saved_in_fit = True
        if trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.after_save_checkpoint(self)

    # -- names ---------------------------------------------------------------------------------
    def _format_metrics(self, trainer: Trainer) -> dict[str, Any]:
        metrics: dict[str, Any] = {k: float(v) for k, v in trainer.callback_metrics.items()}
        metrics["epoch"] = trainer.current_epoch
        metrics["step"] = trainer.global_step
        return metrics

    def format_checkpoint_name(
        self, metrics: dict[str, Any], filename: str | None = None, ver: int | None = None
    ) -> str:
        """The checkpoint path for ``metrics`` (with ``epoch`` and ``step``) under :attr:`dirpath`.

        Args:
            metrics: values for the template's fields.
            filename: a template other than :attr:`filename` (``CHECKPOINT_NAME_LAST`` for ``last``).
            ver: a version number to append (``-v1``), as the version counter does for a taken name.
        """
        template = filename or self.filename or "{epoch}-{step}"
        names: list[str] = []
        missing: list[str] = []

        def field(match: re.Match[str]) -> str:
            name, spec = match.group(1), match.group(2)
            if name not in metrics:
                missing.append(name)
            names.append(name)
            prefix = f"{name.replace('/', '_')}=" if self.auto_insert_metric_name else ""
            # Positional stand-ins: str.format cannot take names such as "val/loss".
            return prefix + "{m" + str(len(names) - 1) + spec + "}"

        text = _FIELD.sub(field, template)
        if missing:
            raise ValueError(
                f"ModelCheckpoint(filename={template!r}) names {', '.join(map(repr, missing))}, which "
                f"{'was' if len(missing) == 1 else 'were'} not logged (available: {', '.join(sorted(metrics))})."
            )
        name = text.format(**{f"m{i}": metrics[n] for i, n in enumerate(names)})
        if ver is not None:
            name = f"{name}{self.CHECKPOINT_JOIN_CHAR}v{ver}"
        return paths.join(self.dirpath or "", name + self.FILE_EXTENSION)

    def find_last(self, dirpath: str | None = None) -> str | None:
        """The newest complete checkpoint in :attr:`dirpath` (or ``dirpath``): normally ``last.ckpt`` (or
        ``last-v1.ckpt`` …), but a top-k file written after it (a crash between the two) wins.

        A checkpoint a crash left incomplete or damaged is passed over (with a warning), so a resumed
        run starts from the newest one that is whole; ``None`` when there is none.
        """
        from drivetrain.plugins.io.atomic import is_complete, is_temporary, published_at, resolve

        folder = dirpath if dirpath is not None else self.dirpath
        if folder is None or not paths.isdir(folder):
            return None
        last_name = re.compile(
            rf"{re.escape(self.CHECKPOINT_NAME_LAST)}({re.escape(self.CHECKPOINT_JOIN_CHAR)}v\d+)?"
            rf"{re.escape(self.FILE_EXTENSION)}"
        )
        names = [n for n in paths.listdir(folder) if n.endswith(self.FILE_EXTENSION) and not is_temporary(n)]
        lasts = [
            os.fspath(found)
            for n in names
            if last_name.fullmatch(n) and (found := resolve(paths.join(folder, n))) is not None
        ]
        if not lasts:  # a crash may have left only the half-replaced form of last.ckpt
            found = resolve(paths.join(folder, self.CHECKPOINT_NAME_LAST + self.FILE_EXTENSION))
            lasts = [os.fspath(found)] if found is not None else []
        others = [paths.join(folder, n) for n in names if not last_name.fullmatch(n)]
        # Newest first: a save writes its top-k file before last.ckpt, so a crash between the two
        # leaves a top-k file newer than last.ckpt, and resuming from last would lose that step.
        # A remote folder is dated by its completion marker (object stores keep no folder times). On a
        # tie (stores that keep whole seconds) the step recorded decides below, then last.ckpt, then the
        # name that sorts last with numbers compared as numbers (step=10 after step=9).
        modified = {p: published_at(p) for p in [*lasts, *others]}
        candidates = sorted(
            [*lasts, *(p for p in others if p not in lasts)],
            key=lambda p: (modified[p], p in lasts, _natural_order(paths.name(p))),
            reverse=True,
        )
        for index, candidate in enumerate(candidates):
            if is_complete(candidate):
                if index:
                    skipped = ", ".join(f"'{p}'" for p in candidates[:index])
                    warnings.warn(
                        f"Skipping incomplete or damaged checkpoint(s) {skipped}; resuming from '{candidate}'.",
                        UserWarning,
                        stacklevel=2,
                    )
                # Object stores keep whole seconds: checkpoints of one second are ordered by the step
                # they hold (read only then), last.ckpt first among equals.
                tied = [p for p in candidates[index + 1 :] if modified[p] == modified[candidate]]
                tied = [candidate, *(p for p in tied if is_complete(p))]
                if len(tied) > 1:
                    candidate = max(tied, key=lambda p: (_recorded_step(p), p in lasts))
                return os.fspath(candidate)
        return None

    # -- state -----------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "monitor": self.monitor,
            "best_model_score": self.best_model_score,
            "current_score": self.current_score,
            "best_model_path": self.best_model_path,
            "best_k_models": dict(self.best_k_models),
            "kth_best_model_path": self.kth_best_model_path,
            "last_model_path": self.last_model_path,
            "recent": list(self._recent),
            "pending_removals": list(self._pending_removals),
            "dirpath": self.dirpath,
            "last_global_step_saved": self._last_global_step_saved,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the ranking of a resumed fit; the files it names are taken from this folder's own listing.

        A checkpoint file is data from anywhere, so what it says is only a hint: a path it names is
        kept (and may later be pruned) only when it is a checkpoint this callback could have written
        (its file-name template or ``last``) that exists directly in this callback's folder.
        Anything else (another folder, ``../x``, a file of another name) is dropped, never deleted.
        """
        score = state_dict.get("best_model_score")
        self.best_model_score = None if score is None else _score(score)
        current = state_dict.get("current_score")
        self.current_score = None if current is None else _score(current)
        self.best_model_path = state_dict.get("best_model_path", "")
        self._last_global_step_saved = state_dict.get("last_global_step_saved", self._last_global_step_saved)
        saved_in = state_dict.get("dirpath")
        if not self.dirpath or not isinstance(saved_in, str) or not paths.same_folder(saved_in, self.dirpath):
            self.last_model_path = ""
            return  # rankings only carry over when the files are in this callback's folder
        own = self._own_checkpoints()

        def ours(path: Any) -> str | None:
            if not isinstance(path, str) or not paths.is_entry_of(path, self.dirpath or ""):
                return None
            local = paths.join(self.dirpath or "", paths.name(path))
            return local if local in own else None

        self.last_model_path = ours(state_dict.get("last_model_path")) or ""
        ranked = state_dict.get("best_k_models", {})
        self.best_k_models = {
            path: _score(value)
            for saved, value in (ranked.items() if isinstance(ranked, dict) else ())
            if (path := ours(saved)) is not None
        }
        self.kth_best_model_path = ""
        if self.best_k_models:
            self._rank()
        self._recent = [path for saved in state_dict.get("recent", []) if (path := ours(saved)) is not None]
        self._pending_removals = [
            path for saved in state_dict.get("pending_removals", []) if (path := ours(saved)) is not None
        ]

    def _own_checkpoints(self) -> set[str]:
        """The checkpoints in this callback's folder named as it names them (template or ``last``, any version)."""

        if not self.dirpath:
            return set()
        pattern = self._name_pattern()
        return {
            paths.join(self.dirpath, name)
            for name in paths.listdir(self.dirpath)
            if pattern.fullmatch(name) and not is_temporary(name)
        }

    def _name_pattern(self) -> re.Pattern[str]:
        template = self.filename or "{epoch}-{step}"
        pieces, end = [], 0
        for match in _FIELD.finditer(template):
            pieces += [re.escape(template[end : match.start()]), ".*"]
            end = match.end()
        pieces.append(re.escape(template[end:]))
        names = f"(?:{''.join(pieces)}|{re.escape(self.CHECKPOINT_NAME_LAST)})"
        version = rf"(?:{re.escape(self.CHECKPOINT_JOIN_CHAR)}v\d+)?"
        return re.compile(names + version + re.escape(self.FILE_EXTENSION))


_ONE_PROCESS_ONLY = (
    "{what} saves only in single-process runs: with {n} processes, an exception in one leaves the others "
    "elsewhere in the loop, so no complete checkpoint can be written at that moment. Save periodically instead "
    "(ModelCheckpoint(every_n_train_steps=...) or train_time_interval=...), or run in one process."
)


_LINK_LOCAL_ONLY = (
    "ModelCheckpoint(save_last='link') makes last.ckpt a link, which needs a local folder; dirpath={dirpath} is "
    "remote. Use save_last=True there."
)


def _score(value: float | Tensor) -> Tensor:
    """A score as Lightning keeps it: a 0-d tensor (float64 here, so no float32 rounding of a Python float)."""
    if isinstance(value, Tensor):
        return value.detach().cpu()
    return torch.tensor(float(value), dtype=torch.float64)


def _default_dirpath(trainer: Trainer) -> str:
    """``<save_dir>/<name>/<version>/checkpoints`` of the first logger with a folder, else ``<default_root_dir>/checkpoints``."""
    for logger in trainer.loggers:
        if logger.save_dir is not None:
            version = logger.version
            version_folder = version if isinstance(version, str) else f"version_{version}"
            return paths.join(
                logger.save_dir, *([logger.name] if logger.name else []), version_folder, "checkpoints"
            )
    return paths.join(trainer.default_root_dir, "checkpoints")


def _same_file(a: str, b: str) -> bool:
    return paths.name(a) == paths.name(b) and paths.same_folder(paths.parent(a), paths.parent(b))


def _recorded_step(path: str) -> int:
    """The global step the checkpoint at ``path`` records (a file, or a sharded folder's state file); -1 if unreadable."""

    try:
        if paths.isdir(path):  # FSDP and DeepSpeed folders keep the plain values in one state file
            state = load_torch_file(paths.join(path, "drivetrain_state.pt"), map_location="cpu").get(
                "values", {}
            )
        else:
            state = load_torch_file(path, map_location="cpu")
        return int(state.get("global_step", -1))
    except (OSError, ValueError, TypeError, AttributeError, pickle.UnpicklingError):
        return -1


def _natural_order(name: str) -> tuple[Any, ...]:
    """``name`` as a sort key in which runs of digits compare as numbers."""
    return tuple(int(part) if index % 2 else part for index, part in enumerate(re.split(r"(\d+)", name)))
