"""Lightning's info lines for the settings and moments drivetrain shares with it.

Tests and users of a migrated program look for them in the output ("`Trainer(limit_train_batches=1)`
was configured so 1 batch per epoch will be used.", "`Trainer.fit` stopped: `max_epochs=3`
reached."), so they keep Lightning's wording. They go through drivetrain's logging at INFO, from
global rank 0 (``logging.getLogger("drivetrain").setLevel(logging.WARNING)`` silences them), once
per Trainer, entry point or checkpoint: never per step.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from drivetrain._utilities.log import get_logger
from drivetrain.accelerators.selection import available_here

if TYPE_CHECKING:
    from drivetrain.strategies.strategy import Strategy
    from drivetrain.trainer.config import LoopSettings

_log = get_logger("drivetrain.trainer")

_ONE = {
    "limit_train_batches": ("1 batch per epoch will be used.", "100% of the batches per epoch will be used"),
    "val_check_interval": (
        "validation will run after every batch.",
        "validation will run at the end of the training epoch",
    ),
}
_ONE_DEFAULT = ("1 batch will be used.", "100% of the batches will be used")


def at_init(
    given: Mapping[str, Any], settings: LoopSettings, strategy: Strategy, barebones: bool, anomaly: bool
) -> None:
    """The lines Lightning writes when a Trainer is built with these arguments (``given``: as passed, ``None``
    when unset), in Lightning's order."""
    precision = strategy.precision.name
    if precision in ("16-mixed", "bf16-mixed"):
        _log.info(
            f"Using {'16bit' if precision == '16-mixed' else 'bfloat16'} Automatic Mixed Precision (AMP)"
        )
    if barebones:
        switched_off = (
            "Checkpointing: `Trainer(enable_checkpointing=True)`",
            "Progress bar: `Trainer(enable_progress_bar=True)`",
            "Model summary: `Trainer(enable_model_summary=True)`",
            "Logging: `Trainer(logger=True)`, `Trainer(log_every_n_steps>0)`, `TrainingModule.log(...)`, "
            "`TrainingModule.log_dict(...)`",
            "Sanity checking: `Trainer(num_sanity_val_steps>0)`",
            "Development run: `Trainer(fast_dev_run=True)`",
            "Anomaly detection: `Trainer(detect_anomaly=True)`",
            "Profiling: `Trainer(profiler=...)`",
        )
        _log.info(
            "You are running in `Trainer(barebones=True)` mode. All features that may impact raw speed have been "
            "disabled to facilitate analyzing the Trainer overhead. Specifically, the following features are "
            f"deactivated:{os.linesep}{os.linesep.join(' - ' + line for line in switched_off)}"
        )
    if anomaly:
        _log.info(
            "You have turned on `Trainer(detect_anomaly=True)`. This will significantly slow down compute speed and "
            "is recommended only for model debugging."
        )
    _device_lines(strategy)
    if settings.fast_dev_run:
        _log.info(
            f"Running in `fast_dev_run` mode: will run the requested loop using {settings.fast_dev_run} batch(es). "
            "Logging and checkpointing is suppressed."
        )
    else:
        for name in (
            "limit_train_batches",
            "limit_val_batches",
            "limit_test_batches",
            "limit_predict_batches",
        ):
            _limit_line(name, given.get(name))
        _limit_line("val_check_interval", given.get("val_check_interval"))


def _limit_line(name: str, value: Any) -> None:
    # Only for a value given explicitly, as Lightning: 1 (an int) and 1.0 mean different things.
    ones, everything = _ONE.get(name, _ONE_DEFAULT)
    if isinstance(value, int) and not isinstance(value, bool) and value == 1:
        _log.info(f"`Trainer({name}=1)` was configured so {ones}")
    elif isinstance(value, float) and value == 1.0:
        # Lightning's text ends in two periods; kept, as it is what its users look for.
        _log.info(f"`Trainer({name}=1.0)` was configured so {everything}..")


def _device_lines(strategy: Strategy) -> None:

    available = set(available_here())
    gpu = next((name for name in ("cuda", "mps") if name in available), None)
    kind = strategy.root_device.type
    _log.info(
        f"GPU available: {gpu is not None}{f' ({gpu})' if gpu else ''}, used: {kind in ('cuda', 'mps')}"
    )
    tpu_cores = strategy.world_size // max(strategy.num_nodes, 1) if kind == "xla" else 0
    _log.info(f"TPU available: {'xla' in available}, using: {tpu_cores} TPU cores")


def fit_started(barebones: bool) -> None:
    if barebones:
        _log.info(
            "`Trainer(barebones=True)` started running. The progress bar is disabled so you might want to manually "
            "print the progress in your model."
        )


def fit_stopped(settings: LoopSettings, epoch: int, global_step: int) -> None:
    """Why the fit loop ended, when it ended at a limit (Lightning says nothing for a stop request)."""
    if settings.max_steps != -1 and global_step >= settings.max_steps:
        _log.info(f"`Trainer.fit` stopped: `max_steps={settings.max_steps!r}` reached.")
    elif settings.max_epochs != -1 and epoch >= settings.max_epochs:
        _log.info(f"`Trainer.fit` stopped: `max_epochs={settings.max_epochs!r}` reached.")


def restoring(path: str) -> None:
    _log.info(f"Restoring states from the checkpoint path at {path}")


def restored(path: str, fitting: bool) -> None:
    _log.info(f"{'Restored all states' if fitting else 'Loaded model weights'} from the checkpoint at {path}")
