"""Trainer arguments that switch whole features on or off: ``barebones``, ``overfit_batches``,
``sync_batchnorm``, ``reload_dataloaders_every_n_epochs``, ``profiler``.

Each is checked once, when the Trainer is built; a combination that would leave one of them
unhonoured is an error naming both, as in Lightning.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from drivetrain.trainer.profiling import resolve_profiler

if TYPE_CHECKING:
    from drivetrain.profilers import Profiler


@dataclass
class RunFeatures:
    """What the feature arguments resolved to (the Trainer keeps one)."""

    barebones: bool
    overfit_batches: int | float
    sync_batchnorm: bool
    reload_dataloaders_every_n_epochs: int
    profiler: Profiler | None
    deterministic: bool | str | None = None
    benchmark: bool | None = None
    use_distributed_sampler: bool = True
    detect_anomaly: bool = False


def _flag(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} expects True or False, got {value!r}.")
    return value


def apply_barebones(barebones: Any, given: dict[str, Any]) -> dict[str, Any]:
    """The settings ``given`` with ``barebones=True`` applied: the features it disables off.

    ``given`` holds the arguments as the user passed them (``None`` when left unset). Under
    barebones, asking for a feature it disables is a ``ValueError``, as in Lightning.
    """
    if not _flag("barebones", barebones):
        defaults = {
            "logger": True,
            "enable_checkpointing": True,
            "enable_progress_bar": True,
            "enable_model_summary": True,
        }
        return {
            name: defaults[name] if given[name] is None and name in defaults else given[name]
            for name in given
        }
    conflicts = []
    for name in ("enable_checkpointing", "enable_progress_bar", "enable_model_summary"):
        if given[name]:
            conflicts.append(f"{name}={given[name]!r}")
    if given["logger"] not in (None, False):
        conflicts.append(f"logger={given['logger']!r}")
    if given["log_every_n_steps"] not in (None, 0):
        conflicts.append(f"log_every_n_steps={given['log_every_n_steps']!r}")
    if given["num_sanity_val_steps"] not in (None, 0):
        conflicts.append(f"num_sanity_val_steps={given['num_sanity_val_steps']!r}")
    if given["fast_dev_run"] not in (False, 0):
        conflicts.append(f"fast_dev_run={given['fast_dev_run']!r}")
    if given["detect_anomaly"] is not False:
        conflicts.append(f"detect_anomaly={given['detect_anomaly']!r}")
    if given["profiler"] is not None:
        conflicts.append(f"profiler={given['profiler']!r}")
    if conflicts:
        raise ValueError(
            f"Trainer(barebones=True, {', '.join(conflicts)}): barebones mode turns off checkpointing, logging, the "
            f"progress bar, the model summary, the sanity check, fast_dev_run, anomaly detection and profiling, so "
            f"{'this setting' if len(conflicts) == 1 else 'these settings'} cannot be honoured. Drop "
            f"{'it' if len(conflicts) == 1 else 'them'}, or barebones=True."
        )
    resolved = dict(given)
    resolved.update(
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        log_every_n_steps=None,
        num_sanity_val_steps=0,
    )
    return resolved


def resolve_features(
    *,
    barebones: bool,
    overfit_batches: Any,
    sync_batchnorm: Any,
    reload_dataloaders_every_n_epochs: Any,
    profiler: Any,
    limit_train_batches: Any,
    limit_val_batches: Any,
    deterministic: Any = None,
    benchmark: Any = None,
    use_distributed_sampler: Any = True,
    detect_anomaly: Any = False,
) -> RunFeatures:
    """Check the feature arguments (``barebones`` already applied by :func:`apply_barebones`)."""
    check_run_flags(deterministic, benchmark, use_distributed_sampler, detect_anomaly)
    overfit = _overfit(overfit_batches)
    if overfit:
        overridden = [
            f"{name}={value!r}"
            for name, value in (
                ("limit_train_batches", limit_train_batches),
                ("limit_val_batches", limit_val_batches),
            )
            if value is not None and value != 1.0
        ]
        if overridden:
            raise ValueError(
                f"overfit_batches={overfit!r} sets how many training and validation batches each epoch uses, so "
                f"{' and '.join(overridden)} would be ignored. Set one or the other."
            )
    reload = reload_dataloaders_every_n_epochs
    if isinstance(reload, bool) or not isinstance(reload, int) or reload < 0:
        raise ValueError(
            f"reload_dataloaders_every_n_epochs={reload!r}; use an int >= 0 (0: load the dataloaders once per fit, "
            f"n: call train_dataloader()/val_dataloader() again every n epochs)."
        )
    return RunFeatures(
        barebones=barebones,
        overfit_batches=overfit,
        sync_batchnorm=_flag("sync_batchnorm", sync_batchnorm),
        reload_dataloaders_every_n_epochs=reload,
        profiler=resolve_profiler(profiler),
        deterministic=deterministic,
        benchmark=benchmark,
        use_distributed_sampler=use_distributed_sampler,
        detect_anomaly=detect_anomaly,
    )


def check_run_flags(
    deterministic: Any, benchmark: Any, use_distributed_sampler: Any, detect_anomaly: Any
) -> None:
    """The Trainer's switches for torch's global flags and the data layer."""
    if deterministic not in (None, True, False, "warn"):
        raise ValueError(f"deterministic={deterministic!r}; use True, False, 'warn' or None.")
    if benchmark not in (None, True, False):
        raise ValueError(f"benchmark={benchmark!r}; use True, False or None.")
    _flag("use_distributed_sampler", use_distributed_sampler)
    _flag("detect_anomaly", detect_anomaly)


def _overfit(value: Any) -> int | float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(
            f"overfit_batches expects an int (batches) or a float (fraction of the training data), got {value!r}."
        )
    if value < 0 or (isinstance(value, float) and value > 1.0):
        raise ValueError(
            f"overfit_batches={value!r}; use 0 (off), a number of batches (an int) or a fraction in (0, 1]."
        )
    return value
