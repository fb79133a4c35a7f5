"""Reading checkpoints written by PyTorch Lightning 2.x: ``Trainer.fit/validate/test/predict(ckpt_path=...)``.

A Lightning checkpoint is one ``torch.save`` file with ``state_dict``, ``optimizer_states``,
``lr_schedulers``, ``loops``, ``callbacks``, ``epoch``, ``global_step``, ``hyper_parameters`` and
the precision plugin's state under its class name. :func:`translate` maps it onto drivetrain's
schema (see ``docs/checkpoints.md``): the weights always; the optimizers, schedulers, loss scaler,
progress and callback states where they correspond; everything else is listed in a report that is
logged (and warned about when something of the training state could not be carried over).
(``TrainingModule.load_from_checkpoint`` reads such files directly: its keys are Lightning's.)
"""

from __future__ import annotations

import ast
import warnings
import zipfile
from pathlib import Path
from typing import Any

from drivetrain._utilities.log import get_logger
from drivetrain.strategies.checkpointing import META, PRECISION, model_key, optimizer_key, scheduler_key

_log = get_logger(__name__)

VERSION_KEY = "pytorch-lightning_version"
#: Entries that carry nothing a drivetrain run needs (names, or Lightning-only bookkeeping).
_IGNORED = {
    VERSION_KEY,
    "hparams_name",
    "hyper_parameters",
    "datamodule_hparams_name",
    "datamodule_hyper_parameters",
}
_PRECISION_KEYS = ("MixedPrecision", "MixedPrecisionPlugin", "native_amp_scaling_state")


def is_lightning_checkpoint(path: str | Path) -> bool:
    """Whether ``path`` is a file Lightning wrote: its pickle names Lightning's version key.

    Cheap: reads the archive's small pickle record, not the tensors.
    """
    path = Path(path)
    if not path.is_file() or not zipfile.is_zipfile(path):
        return False
    with zipfile.ZipFile(path) as archive:
        record = next((name for name in archive.namelist() if name.endswith("/data.pkl")), None)
        return record is not None and VERSION_KEY.encode() in archive.read(record)


def translate(
    checkpoint: dict[str, Any], *, training: bool, source: str, callback_keys: Any = ()
) -> dict[str, Any]:
    """A drivetrain checkpoint dict holding what ``checkpoint`` (Lightning's) has that maps.

    Args:
        checkpoint: the loaded Lightning checkpoint.
        training: whether a fit resumes from it (then what could not be mapped is warned about).
        source: the file, for the report.
        callback_keys: the ``state_key`` of each callback of the run, to report which states apply.
    """
    if "state_dict" not in checkpoint:
        raise ValueError(f"'{source}' (written by Lightning) has no 'state_dict' entry: no weights to load.")
    version = checkpoint.get(VERSION_KEY, "?")
    optimizers = list(checkpoint.get("optimizer_states", []))
    schedulers = list(checkpoint.get("lr_schedulers", []))
    converted: dict[str, Any] = {
        META: {
            "format": 1,
            "version": f"lightning {version}",
            "door": "trainer",
            "world_size": None,
            "counts": {"models": 1, "optimizers": len(optimizers), "schedulers": len(schedulers)},
        },
        model_key(0): checkpoint["state_dict"],
        "epoch": checkpoint.get("epoch", 0),
        "global_step": checkpoint.get("global_step", 0),
        "hyper_parameters": dict(checkpoint.get("hyper_parameters", {})),
    }
    mapped = ["weights (state_dict)"]
    unmapped: list[str] = []
    for index, state in enumerate(optimizers):
        converted[optimizer_key(index)] = state
    for index, state in enumerate(schedulers):
        converted[scheduler_key(index)] = state
    if optimizers:
        mapped.append(f"{len(optimizers)} optimizer state(s)")
    if schedulers:
        mapped.append(f"{len(schedulers)} LR scheduler state(s)")
    precision_key = next((key for key in _PRECISION_KEYS if key in checkpoint), None)
    if precision_key is not None:
        converted[PRECISION] = {"scaler": checkpoint[precision_key]}
        mapped.append("the loss scaler")
    else:
        converted[PRECISION] = {}  # Lightning saves no state for precisions without a scaler
    if "loops" in checkpoint:
        progress, notes = _fit_progress(checkpoint)
        converted["loops"] = {"fit": progress, "should_stop": False}
        mapped.append(f"progress (epoch {progress['epoch']}, global step {progress['global_step']})")
        unmapped.extend(notes)
    if "callbacks" in checkpoint:
        converted["callbacks"] = {
            _normalise_key(key): state for key, state in checkpoint["callbacks"].items()
        }
        keys = set(callback_keys)
        matched = sorted(key for key in checkpoint["callbacks"] if _normalise_key(key) in keys)
        others = sorted(key for key in checkpoint["callbacks"] if _normalise_key(key) not in keys)
        if matched:
            mapped.append(f"callback states ({', '.join(matched)})")
        if others:
            unmapped.append(f"states of callbacks this run does not have ({', '.join(others)})")
    unmapped.append("random generator states (Lightning does not save them): generators continue as they are")
    leftovers = sorted(
        set(checkpoint)
        - _IGNORED
        - {"state_dict", "optimizer_states", "lr_schedulers", "loops", "callbacks", "epoch", "global_step"}
        - {precision_key}
    )
    if leftovers:
        unmapped.append(f"entries drivetrain does not read: {', '.join(map(repr, leftovers))}")
        for key in leftovers:  # on_load_checkpoint hooks still see them
            converted[key] = checkpoint[key]
    report = (
        f"'{source}' was written by Lightning {version}. Loaded: {'; '.join(mapped)}. "
        f"Not carried over: {'; '.join(unmapped)}."
    )
    if training:
        warnings.warn(report, UserWarning, stacklevel=2)
    else:
        _log.info(report)
    return converted


def _fit_progress(checkpoint: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """drivetrain's fit progress from Lightning's loop counters, and what could not be mapped."""
    fit = checkpoint["loops"].get("fit_loop", {})
    epoch = int(checkpoint.get("epoch", 0))
    batches = fit.get("epoch_loop.batch_progress", {})
    done_in_epoch = int(batches.get("current", {}).get("completed", 0))
    total = int(batches.get("total", {}).get("completed", 0))
    epochs = fit.get("epoch_progress", {}).get("current", {})
    notes: list[str] = []
    # Lightning counts an epoch "processed" once its batches and validation ran, "completed" after
    # on_train_epoch_end: a checkpoint taken at the epoch end has processed > completed.
    epoch_finished = int(epochs.get("processed", 0)) > int(epochs.get("completed", 0))
    if not epoch_finished and done_in_epoch:
        notes.append(
            f"the data position: the checkpoint was taken after {done_in_epoch} batch(es) of epoch {epoch}, and "
            f"Lightning records no loader state, so epoch {epoch} restarts from its first batch (as Lightning "
            f"itself does; prefer end-of-epoch checkpoints)"
        )
        done_in_epoch = 0
    progress = {
        "epoch": epoch,
        "global_step": int(checkpoint.get("global_step", 0)),
        "batches_done": done_in_epoch if epoch_finished else 0,
        "total_batches": total,
        "validation_pending": False,
        "epoch_finished": epoch_finished,
    }
    return progress, notes


def _normalise_key(state_key: str) -> str:
    """Lightning's ``Name{'b': 1, 'a': 2}`` as drivetrain writes it (settings sorted by name).

    Keys whose settings are not plain literals stay as they are (and then match no callback).
    """
    name, brace, settings = state_key.partition("{")
    if not brace:
        return state_key
    try:
        parsed = ast.literal_eval("{" + settings)
    except (ValueError, SyntaxError):
        return state_key
    return f"{name}{dict(sorted(parsed.items()))!r}" if isinstance(parsed, dict) else state_key
